//! nftables mode's named counters, read from our table at each scrape: upstream 1.37's
//! `kubeproxy_nftables_localhost_nodeport_rejected_packets_total` (rejected localhost NodePort
//! packets), and our `kubeproxy_nftables_flow_offload_requests_total` (packets that asked for
//! their connection to take the flowtable fast path). A family whose table or counter is
//! missing (the counter of TCP while the userspace proxy serves it; the offload counter of a
//! kernel without flowtables) is left out of the scrape.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use prometheus::core::{Collector, Desc};
use prometheus::{IntCounterVec, Opts, proto};
use tracing::warn;

use crate::model::{IpFamily, Protocol};
use crate::proxier::nftables::render::{OFFLOAD_REQUESTS, TABLE, localhost_rejected_counter};
use crate::sys::netlink::NetlinkError;

const NAME: &str = "kubeproxy_nftables_localhost_nodeport_rejected_packets_total";
const OFFLOAD_NAME: &str = "kubeproxy_nftables_flow_offload_requests_total";
const OFFLOAD_HELP: &str = "Packets of connections to ClusterIPs past --offload-packet-threshold that asked the kernel to offload their connection to the flowtable (kube-proxy-rs): one per connection when every link it crosses is in the flowtable";
const HELP: &str = "Number of packets rejected on localhost NodePorts. UDP and SCTP are always rejected; TCP is rejected when the localhost NodePort proxy is not running";

/// Reads the packets each named counter of a family's table has counted, by name.
pub type CounterReader =
    Box<dyn Fn(IpFamily, &str) -> Result<BTreeMap<String, u64>, NetlinkError> + Send + Sync>;

/// Which of the table's counters are exported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Exported {
    /// The rejected localhost NodePort packets (the gate KubeProxyNFTablesLocalhostNodePorts).
    pub localhost_rejects: bool,
    /// The flow offload requests (`--offload-packet-threshold`).
    pub offload_requests: bool,
}

/// The metric vectors `exported` asks for, empty (each scrape fills vectors of its own, so that
/// two at once do not mix).
struct Vectors {
    rejected: Option<IntCounterVec>,
    offload: Option<IntCounterVec>,
}

impl Vectors {
    fn new(exported: Exported) -> prometheus::Result<Self> {
        Ok(Vectors {
            rejected: exported
                .localhost_rejects
                .then(|| IntCounterVec::new(Opts::new(NAME, HELP), &["ip_family", "protocol"]))
                .transpose()?,
            offload: exported
                .offload_requests
                .then(|| IntCounterVec::new(Opts::new(OFFLOAD_NAME, OFFLOAD_HELP), &["ip_family"]))
                .transpose()?,
        })
    }

    fn all(&self) -> impl Iterator<Item = &IntCounterVec> {
        self.rejected.iter().chain(self.offload.iter())
    }
}

/// Reads each family's counters once per scrape, for every metric exported.
pub struct NftCountersCollector {
    read: CounterReader,
    exported: Exported,
    desc: Vec<Desc>,
    /// The families whose failed read was logged (once each: a scrape every few seconds would
    /// flood the log).
    warned: Mutex<BTreeSet<IpFamily>>,
}

impl NftCountersCollector {
    pub fn new(read: CounterReader, exported: Exported) -> prometheus::Result<Self> {
        let desc = Vectors::new(exported)?
            .all()
            .flat_map(|vector| vector.desc().into_iter().cloned())
            .collect();
        Ok(NftCountersCollector {
            read,
            exported,
            desc,
            warned: Mutex::new(BTreeSet::new()),
        })
    }
}

impl Collector for NftCountersCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.desc.iter().collect()
    }

    fn collect(&self) -> Vec<proto::MetricFamily> {
        let Ok(vectors) = Vectors::new(self.exported) else {
            return Vec::new();
        };
        // A family without our table has no counter to read.
        for family in [IpFamily::V4, IpFamily::V6] {
            let counted = match (self.read)(family, TABLE) {
                Ok(counted) => counted,
                Err(err) => {
                    let mut warned = self.warned.lock().unwrap_or_else(|p| p.into_inner());
                    if warned.insert(family) {
                        warn!(error = %err, ?family, "Failed to read the nftables counters");
                    }
                    continue;
                }
            };
            if let Some(rejected) = &vectors.rejected {
                for protocol in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
                    if let Some(packets) = counted.get(localhost_rejected_counter(protocol)) {
                        rejected
                            .with_label_values(&[family.name(), &protocol.to_string()])
                            .inc_by(*packets);
                    }
                }
            }
            if let (Some(offload), Some(packets)) =
                (&vectors.offload, counted.get(OFFLOAD_REQUESTS))
            {
                offload.with_label_values(&[family.name()]).inc_by(*packets);
            }
        }
        vectors.all().flat_map(|vector| vector.collect()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_familys_counters_by_protocol_and_none_for_what_is_missing() {
        let read: CounterReader = Box::new(|family, table| {
            assert_eq!(table, "kube-proxy");
            Ok(match family {
                IpFamily::V4 => BTreeMap::from([
                    ("localhost-nodeport-rejected-udp".to_string(), 7),
                    ("localhost-nodeport-rejected-sctp".to_string(), 0),
                    ("something-else".to_string(), 9),
                ]),
                IpFamily::V6 => {
                    BTreeMap::from([("localhost-nodeport-rejected-tcp".to_string(), 2)])
                }
            })
        });
        let exported = Exported {
            localhost_rejects: true,
            offload_requests: false,
        };
        let collector = NftCountersCollector::new(read, exported).unwrap();
        let registry = prometheus::Registry::new();
        registry.register(Box::new(collector)).unwrap();
        let mut text = Vec::new();
        prometheus::Encoder::encode(
            &prometheus::TextEncoder::new(),
            &registry.gather(),
            &mut text,
        )
        .unwrap();
        let text = String::from_utf8(text).unwrap();
        let mut series: Vec<&str> = text.lines().filter(|l| l.starts_with(NAME)).collect();
        series.sort();
        assert_eq!(
            series,
            [
                "kubeproxy_nftables_localhost_nodeport_rejected_packets_total{ip_family=\"IPv4\",protocol=\"SCTP\"} 0",
                "kubeproxy_nftables_localhost_nodeport_rejected_packets_total{ip_family=\"IPv4\",protocol=\"UDP\"} 7",
                "kubeproxy_nftables_localhost_nodeport_rejected_packets_total{ip_family=\"IPv6\",protocol=\"TCP\"} 2",
            ]
        );
    }

    #[test]
    fn the_offload_counter_of_each_family_that_has_one() {
        let read: CounterReader = Box::new(|family, _| {
            Ok(match family {
                IpFamily::V4 => BTreeMap::from([("flow-offload-requests".to_string(), 12)]),
                IpFamily::V6 => BTreeMap::new(),
            })
        });
        let registry = prometheus::Registry::new();
        registry
            .register(Box::new(
                NftCountersCollector::new(
                    read,
                    Exported {
                        localhost_rejects: false,
                        offload_requests: true,
                    },
                )
                .unwrap(),
            ))
            .unwrap();
        let mut text = Vec::new();
        prometheus::Encoder::encode(
            &prometheus::TextEncoder::new(),
            &registry.gather(),
            &mut text,
        )
        .unwrap();
        let text = String::from_utf8(text).unwrap();
        let series: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(OFFLOAD_NAME))
            .collect();
        assert_eq!(
            series,
            ["kubeproxy_nftables_flow_offload_requests_total{ip_family=\"IPv4\"} 12"]
        );
    }
}
