//! Upstream's nfacct metrics in iptables mode: the kernel's accounting objects read at each
//! scrape, as `kubeproxy_iptables_ct_state_invalid_dropped_packets_total` and
//! `kubeproxy_iptables_localhost_nodeports_accepted_packets_total`. A counter the kernel cannot
//! give (no nfnetlink_acct, the object missing) is left out of the scrape, as upstream does.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus::core::{Collector, Desc};
use prometheus::{IntCounter, proto};
use tracing::warn;

use crate::proxier::iptables::nfacct::{CT_STATE_INVALID_DROPPED, LOCALHOST_NODEPORTS_ACCEPTED};
use crate::sys::nfacct::Nfacct;

/// The metrics read from nfacct objects, by object name.
const COUNTERS: [(&str, &str, &str); 2] = [
    (
        CT_STATE_INVALID_DROPPED,
        "kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
        "packets dropped by iptables to work around conntrack problems",
    ),
    (
        LOCALHOST_NODEPORTS_ACCEPTED,
        "kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
        "Number of packets accepted on nodeports of loopback interface",
    ),
];

/// Reads the kernel's counters when Prometheus scrapes.
pub struct NfacctCollector {
    reader: Mutex<Box<dyn Nfacct>>,
    counters: Vec<(&'static str, IntCounter)>,
    descs: Vec<Desc>,
    /// Whether a failed read was logged (once: a scrape every few seconds would flood the log).
    warned: AtomicBool,
}

impl NfacctCollector {
    pub fn new(reader: Box<dyn Nfacct>) -> prometheus::Result<Self> {
        let mut counters = Vec::new();
        let mut descs = Vec::new();
        for (object, name, help) in COUNTERS {
            let counter = IntCounter::new(name, help)?;
            descs.extend(counter.desc().into_iter().cloned());
            counters.push((object, counter));
        }
        Ok(NfacctCollector {
            reader: Mutex::new(reader),
            counters,
            descs,
            warned: AtomicBool::new(false),
        })
    }
}

impl Collector for NfacctCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<proto::MetricFamily> {
        let mut reader = self.reader.lock().unwrap_or_else(|p| p.into_inner());
        let mut families = Vec::new();
        for (object, counter) in &self.counters {
            match reader.packets(object) {
                Ok(packets) => {
                    counter.reset();
                    counter.inc_by(packets);
                    families.extend(counter.collect());
                }
                Err(err) => {
                    if !self.warned.swap(true, Ordering::Relaxed) {
                        warn!(error = %err, "Failed to collect nfacct counter");
                    }
                }
            }
        }
        families
    }
}
