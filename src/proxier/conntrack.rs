//! UDP conntrack cleanup after a sync, in both modes. UDP has no connection to close: once a
//! client's flow is tracked, its packets keep the DNAT chosen for the first one, so a client that
//! keeps sending from the same port to a service whose pod was replaced sends to the dead pod
//! until the flow times out. After a sync we delete every UDP flow addressed to a changed
//! service (its IPs and port, or its NodePort on this node) whose replies do not come from one of
//! the service's serving endpoints; the next packet is tracked anew and meets the new rules.
//! A flow that was rejected while the service had no endpoints answers from the service IP
//! itself, so it goes too: that is "flush when it goes from no endpoints to some".

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::model::{ChangeSummary, IpFamily, NamespacedName, Protocol, ProxyState};
use crate::sys::conntrack::{Conntrack, ConntrackError, UdpFlow};

/// An address and port: where a service is reached, or where an endpoint answers from.
type Socket = (IpAddr, u16);

/// Where the UDP ports of some services are reached, and which endpoints may answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UdpTargets {
    /// Service IP:port (cluster, external and load-balancer IPs) -> serving endpoints.
    pub by_address: HashMap<Socket, BTreeSet<Socket>>,
    /// NodePort -> serving endpoints.
    pub by_node_port: HashMap<u16, BTreeSet<Socket>>,
}

impl UdpTargets {
    /// The UDP targets of one service (none when it is gone or has no UDP port).
    pub fn of_service(state: &ProxyState, name: &NamespacedName) -> UdpTargets {
        let mut targets = UdpTargets::default();
        let endpoints = state.endpoints.get(name);
        for (port_name, port) in state.services.get(name).into_iter().flatten() {
            if port_name.protocol != Protocol::Udp {
                continue;
            }
            let serving: BTreeSet<Socket> = endpoints
                .and_then(|by_port| by_port.get(port_name))
                .into_iter()
                .flatten()
                .filter(|endpoint| endpoint.serving)
                .map(|endpoint| (endpoint.ip, endpoint.port))
                .collect();
            let addresses = port
                .cluster_ips
                .iter()
                .chain(&port.external_ips)
                .chain(&port.load_balancer_ips);
            for ip in addresses {
                targets
                    .by_address
                    .entry((*ip, port.port))
                    .or_default()
                    .extend(&serving);
            }
            if let Some(node_port) = port.node_port {
                targets
                    .by_node_port
                    .entry(node_port)
                    .or_default()
                    .extend(&serving);
            }
        }
        targets
    }

    /// Adds `other`'s targets; a target both have is served by the endpoints of both.
    fn merge(&mut self, other: &UdpTargets) {
        for (socket, serving) in &other.by_address {
            self.by_address.entry(*socket).or_default().extend(serving);
        }
        for (port, serving) in &other.by_node_port {
            self.by_node_port.entry(*port).or_default().extend(serving);
        }
    }

    fn is_empty(&self) -> bool {
        self.by_address.is_empty() && self.by_node_port.is_empty()
    }
}

/// The service sockets and NodePorts whose flows a cleanup looks at.
#[derive(Debug, Default)]
pub struct Checked {
    pub addresses: HashSet<Socket>,
    pub node_ports: HashSet<u16>,
}

impl Checked {
    fn add(&mut self, targets: &UdpTargets) {
        self.addresses.extend(targets.by_address.keys());
        self.node_ports.extend(targets.by_node_port.keys());
    }

    fn is_empty(&self) -> bool {
        self.addresses.is_empty() && self.node_ports.is_empty()
    }
}

/// The flows to delete: addressed to one of `checked` (a service socket, or a NodePort on one of
/// `node_ips`) and answered by something that is not a serving endpoint of what `current` says is
/// there now (nothing, for a service that is gone).
pub fn stale_flows(
    flows: &[UdpFlow],
    checked: &Checked,
    current: &UdpTargets,
    node_ips: &HashSet<IpAddr>,
) -> Vec<UdpFlow> {
    let no_endpoints = BTreeSet::new();
    flows
        .iter()
        .filter(|flow| {
            let reply = (flow.reply_src, flow.reply_src_port);
            let service = (flow.orig_dst, flow.orig_dst_port);
            let by_address = checked
                .addresses
                .contains(&service)
                .then(|| current.by_address.get(&service).unwrap_or(&no_endpoints));
            let by_node_port = (checked.node_ports.contains(&flow.orig_dst_port)
                && node_ips.contains(&flow.orig_dst))
            .then(|| {
                current
                    .by_node_port
                    .get(&flow.orig_dst_port)
                    .unwrap_or(&no_endpoints)
            });
            [by_address, by_node_port]
                .into_iter()
                .flatten()
                .any(|serving| !serving.contains(&reply))
        })
        .copied()
        .collect()
}

/// What one cleanup did in one family: the table was read (and the stale flows deleted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FamilyCleanup {
    pub family: IpFamily,
    pub elapsed: Duration,
    pub deleted: usize,
}

/// What one cleanup did; empty when it had nothing to check (no UDP service changed), which
/// reads nothing from the kernel.
pub type CleanupReport = Vec<FamilyCleanup>;

/// Runs the cleanup after each successful sync, remembering each service's UDP targets so that
/// the flows of a deleted service (or an IP a service no longer has) go too.
pub struct UdpConntrackCleaner {
    conntrack: Box<dyn Conntrack>,
    /// The UDP targets of every service at the last cleanup.
    known: BTreeMap<NamespacedName, UdpTargets>,
    /// Until the first cleanup, every service is checked: flows may have gone stale while no
    /// proxy was running.
    first: bool,
}

impl UdpConntrackCleaner {
    pub fn new(conntrack: Box<dyn Conntrack>) -> Self {
        UdpConntrackCleaner {
            conntrack,
            known: BTreeMap::new(),
            first: true,
        }
    }

    /// Deletes the stale flows of the services `changes` names (of all services when `full`).
    /// `node_ips` are this node's addresses, where NodePorts are reached.
    pub fn after_sync(
        &mut self,
        state: &ProxyState,
        changes: &ChangeSummary,
        full: bool,
        node_ips: impl FnOnce() -> Vec<IpAddr>,
    ) -> Result<CleanupReport, ConntrackError> {
        let everything = full || changes.node_changed || std::mem::take(&mut self.first);
        let names: BTreeSet<NamespacedName> = if everything {
            state
                .services
                .keys()
                .chain(self.known.keys())
                .cloned()
                .collect()
        } else {
            changes.changed_services.clone()
        };
        // What to check: each named service's targets now and at the last cleanup.
        let mut checked = Checked::default();
        for name in &names {
            let now = UdpTargets::of_service(state, name);
            if let Some(before) = self.known.remove(name) {
                checked.add(&before);
            }
            checked.add(&now);
            if !now.is_empty() {
                self.known.insert(name.clone(), now);
            }
        }
        if checked.is_empty() {
            return Ok(CleanupReport::new());
        }
        // Who serves what now, over all services: an address a changed service gave up may
        // already belong to another one.
        let mut current = UdpTargets::default();
        for targets in self.known.values() {
            current.merge(targets);
        }
        let node_ips: HashSet<IpAddr> = node_ips().into_iter().collect();
        let result = self.clean(&checked, &current, &node_ips);
        // Checked services are already remembered as they are now: after a failure, check
        // everything next time rather than forget what this one was to delete.
        self.first = result.is_err();
        result
    }

    /// Reads each family's UDP flows and deletes the stale ones.
    fn clean(
        &mut self,
        checked: &Checked,
        current: &UdpTargets,
        node_ips: &HashSet<IpAddr>,
    ) -> Result<CleanupReport, ConntrackError> {
        let mut report = CleanupReport::new();
        for family in [IpFamily::V4, IpFamily::V6] {
            let started = Instant::now();
            let flows = self.conntrack.udp_flows(family)?;
            let stale = stale_flows(&flows, checked, current, node_ips);
            let deleted = match stale.is_empty() {
                true => 0,
                false => self.conntrack.delete(&stale)?,
            };
            report.push(FamilyCleanup {
                family,
                elapsed: started.elapsed(),
                deleted,
            });
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Endpoint, ServicePort, ServicePortName};
    use std::sync::{Arc, Mutex};

    use crate::sys::conntrack::FakeConntrack;

    const CLIENT: &str = "10.0.0.5";
    const NODE: &str = "192.168.0.2";
    const CLUSTER_IP: &str = "10.96.0.10";

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn flow(dst: &str, dport: u16, reply: &str, rport: u16, sport: u16) -> UdpFlow {
        UdpFlow {
            orig_src: ip(CLIENT),
            orig_src_port: sport,
            orig_dst: ip(dst),
            orig_dst_port: dport,
            reply_src: ip(reply),
            reply_src_port: rport,
            zone: 0,
        }
    }

    /// One UDP service `ns/dns` on CLUSTER_IP:53 and NodePort 30053, served by `endpoints`
    /// (target port 5353); `protocol` lets a test make it TCP instead.
    fn state(endpoints: &[(&str, bool)], protocol: Protocol) -> ProxyState {
        let name = ServicePortName::new("ns", "dns", "", protocol);
        let port = ServicePort {
            node_port: Some(30053),
            ..ServicePort::new(name.clone(), ip(CLUSTER_IP), 53)
        };
        let endpoints = endpoints
            .iter()
            .map(|(address, serving)| Endpoint {
                serving: *serving,
                ready: *serving,
                ..Endpoint::ready(ip(address), 5353, None)
            })
            .collect();
        let mut state = ProxyState::default();
        let service = NamespacedName::new("ns", "dns");
        state.services.insert(
            service.clone(),
            crate::model::VecMap::from([(name.clone(), port)]),
        );
        state
            .endpoints
            .insert(service, crate::model::VecMap::from([(name, endpoints)]));
        state
    }

    fn changed() -> ChangeSummary {
        ChangeSummary {
            changed_services: BTreeSet::from([NamespacedName::new("ns", "dns")]),
            ..ChangeSummary::default()
        }
    }

    type Table = Arc<Mutex<FakeConntrack>>;

    fn cleaner(flows: Vec<UdpFlow>) -> (UdpConntrackCleaner, Table) {
        let table = Arc::new(Mutex::new(FakeConntrack { flows, dumps: 0 }));
        (UdpConntrackCleaner::new(Box::new(table.clone())), table)
    }

    fn remaining(table: &Table) -> (Vec<UdpFlow>, usize) {
        let fake = table.lock().unwrap();
        (fake.flows.clone(), fake.dumps)
    }

    #[test]
    fn flows_to_a_replaced_pod_go_and_flows_to_serving_pods_stay() {
        let to_old = flow(CLUSTER_IP, 53, "10.244.1.1", 5353, 40000);
        let to_new = flow(CLUSTER_IP, 53, "10.244.1.2", 5353, 40001);
        let node_port_to_old = flow(NODE, 30053, "10.244.1.1", 5353, 40002);
        let unrelated = flow("10.96.0.99", 53, "10.244.1.1", 5353, 40003);
        let (mut cleaner, fake) = cleaner(vec![to_old, to_new, node_port_to_old, unrelated]);
        let report = cleaner
            .after_sync(
                &state(&[("10.244.1.2", true)], Protocol::Udp),
                &changed(),
                false,
                || vec![ip(NODE)],
            )
            .unwrap();
        let deleted: Vec<_> = report.iter().map(|f| (f.family, f.deleted)).collect();
        assert_eq!(deleted, vec![(IpFamily::V4, 2), (IpFamily::V6, 0)]);
        assert_eq!(remaining(&fake).0, vec![to_new, unrelated]);
    }

    #[test]
    fn rejected_flows_go_when_endpoints_appear() {
        // Rejected while there were no endpoints: never DNATed, the "reply" is the service IP.
        let rejected = flow(CLUSTER_IP, 53, CLUSTER_IP, 53, 40000);
        let (mut cleaner, fake) = cleaner(vec![rejected]);
        cleaner
            .after_sync(
                &state(&[("10.244.1.2", true)], Protocol::Udp),
                &changed(),
                false,
                Vec::new,
            )
            .unwrap();
        assert!(remaining(&fake).0.is_empty());
    }

    #[test]
    fn terminating_but_serving_endpoints_keep_their_flows_and_others_lose_them() {
        let to_serving = flow(CLUSTER_IP, 53, "10.244.1.1", 5353, 40000);
        let to_not_serving = flow(CLUSTER_IP, 53, "10.244.1.3", 5353, 40001);
        let wrong_port = flow(CLUSTER_IP, 53, "10.244.1.1", 9999, 40002);
        let (mut cleaner, fake) = cleaner(vec![to_serving, to_not_serving, wrong_port]);
        cleaner
            .after_sync(
                &state(
                    &[("10.244.1.1", true), ("10.244.1.3", false)],
                    Protocol::Udp,
                ),
                &changed(),
                false,
                Vec::new,
            )
            .unwrap();
        assert_eq!(remaining(&fake).0, vec![to_serving]);
    }

    #[test]
    fn node_port_flows_are_only_those_addressed_to_this_node() {
        // The node's own outgoing flow to a remote port that happens to equal a NodePort.
        let outgoing = flow("172.16.9.9", 30053, "172.16.9.9", 30053, 40000);
        let (mut cleaner, fake) = cleaner(vec![outgoing]);
        cleaner
            .after_sync(
                &state(&[("10.244.1.2", true)], Protocol::Udp),
                &changed(),
                false,
                || vec![ip(NODE)],
            )
            .unwrap();
        assert_eq!(remaining(&fake).0, vec![outgoing]);
    }

    #[test]
    fn a_deleted_service_loses_its_flows() {
        let to_pod = flow(CLUSTER_IP, 53, "10.244.1.2", 5353, 40000);
        let (mut cleaner, fake) = cleaner(vec![to_pod]);
        let live = state(&[("10.244.1.2", true)], Protocol::Udp);
        cleaner
            .after_sync(&live, &changed(), false, Vec::new)
            .unwrap();
        assert_eq!(remaining(&fake).0, vec![to_pod]);
        cleaner
            .after_sync(&ProxyState::default(), &changed(), false, Vec::new)
            .unwrap();
        assert!(remaining(&fake).0.is_empty());
    }

    #[test]
    fn syncs_without_udp_changes_do_not_read_the_table() {
        let to_pod = flow(CLUSTER_IP, 53, "10.244.1.9", 5353, 40000);
        let (mut cleaner, fake) = cleaner(vec![to_pod]);
        let tcp = state(&[("10.244.1.2", true)], Protocol::Tcp);
        // The first cleanup looks at everything; a TCP-only cluster still has nothing to read.
        let report = cleaner
            .after_sync(&tcp, &changed(), false, Vec::new)
            .unwrap();
        assert!(report.is_empty());
        cleaner
            .after_sync(&tcp, &ChangeSummary::default(), false, Vec::new)
            .unwrap();
        assert_eq!(remaining(&fake), (vec![to_pod], 0));
        // A change sync naming no service reads nothing even with UDP services around.
        let udp = state(&[("10.244.1.9", true)], Protocol::Udp);
        cleaner
            .after_sync(&udp, &changed(), false, Vec::new)
            .unwrap();
        let dumps = remaining(&fake).1;
        cleaner
            .after_sync(&udp, &ChangeSummary::default(), false, Vec::new)
            .unwrap();
        assert_eq!(remaining(&fake).1, dumps);
    }
}
