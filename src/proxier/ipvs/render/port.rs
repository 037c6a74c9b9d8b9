//! One service port's share of the IPVS state, part by part: the hairpin entries of its local
//! endpoints, then its cluster IP, external IPs, load-balancer IPs (with their source ranges),
//! NodePort and health-check port, each a virtual server and the set entries its rules match.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use super::{FLAG_SCHED_MH, Fragment, IpvsContext};
use crate::model::{Endpoint, NodeContext, Protocol, ServicePort, select_endpoints};
use crate::sys::ipvs::VirtualServer;
use crate::sys::ipvs::codec::FLAG_PERSISTENT;

/// A port and what every part of its share needs.
pub(super) struct Port<'a> {
    port: &'a ServicePort,
    endpoints: &'a [Endpoint],
    ctx: &'a IpvsContext,
    proto: &'static str,
    /// The real servers of internal and of external traffic.
    internal: BTreeSet<SocketAddr>,
    external: BTreeSet<SocketAddr>,
    scheduler: String,
    flags: u32,
}

impl<'a> Port<'a> {
    pub(super) fn new(
        port: &'a ServicePort,
        endpoints: &'a [Endpoint],
        node: NodeContext<'_>,
        ctx: &'a IpvsContext,
    ) -> Self {
        let selected = select_endpoints(port, endpoints, node);
        // Local policy: local endpoints, or (as upstream) the cluster ones when there are none
        // here.
        let pick = |local_policy: bool| -> BTreeSet<SocketAddr> {
            let chosen = if local_policy && !selected.local.is_empty() {
                &selected.local
            } else {
                &selected.cluster
            };
            chosen
                .iter()
                .map(|ep| SocketAddr::new(ep.ip, ep.port))
                .collect()
        };
        let scheduler = if ctx.scheduler.is_empty() {
            "rr".to_string()
        } else {
            ctx.scheduler.clone()
        };
        let mut flags = if port.session_affinity_seconds.is_some() {
            FLAG_PERSISTENT
        } else {
            0
        };
        if scheduler == "mh" {
            flags |= FLAG_SCHED_MH;
        }
        Port {
            internal: pick(port.internal_policy_local),
            external: pick(port.external_policy_local),
            proto: port.name.protocol.lower(),
            port,
            endpoints,
            ctx,
            scheduler,
            flags,
        }
    }

    pub(super) fn render(&self, fragment: &mut Fragment) {
        self.loop_back(fragment);
        self.cluster_ip(fragment);
        self.external_ips(fragment);
        self.load_balancer_ips(fragment);
        self.node_port(fragment);
        self.health_check(fragment);
    }

    /// A virtual server on `address:port` to `reals`; `bind` puts the address on kube-ipvs0.
    fn virtual_server(
        &self,
        address: IpAddr,
        port: u16,
        reals: &BTreeSet<SocketAddr>,
        bind: bool,
        fragment: &mut Fragment,
    ) {
        let vs = VirtualServer {
            address,
            protocol: self.port.name.protocol,
            port,
            scheduler: self.scheduler.clone(),
            flags: self.flags,
            timeout: self.port.session_affinity_seconds.unwrap_or(0),
        };
        fragment.services.insert(vs.key(), (vs, reals.clone()));
        if bind {
            fragment.bound.insert(address);
        }
    }

    /// `address,proto:port`, as the hash:ip,port sets hold it.
    fn entry(&self, address: &IpAddr) -> String {
        ip_port(address, self.proto, self.port.port)
    }

    /// Local endpoints reaching their own service (hairpin) are masqueraded.
    fn loop_back(&self, fragment: &mut Fragment) {
        let node = &self.ctx.common.node_name;
        for ep in self.endpoints.iter().filter(|ep| ep.is_local(node)) {
            fragment.entries.insert((
                "KUBE-LOOP-BACK",
                format!("{},{}:{},{}", ep.ip, self.proto, ep.port, ep.ip),
            ));
        }
    }

    fn cluster_ip(&self, fragment: &mut Fragment) {
        let cluster_ip = self.port.cluster_ips[0];
        fragment
            .entries
            .insert(("KUBE-CLUSTER-IP", self.entry(&cluster_ip)));
        self.virtual_server(cluster_ip, self.port.port, &self.internal, true, fragment);
    }

    /// External IPs; one that is an address of the node's is not bound to kube-ipvs0.
    fn external_ips(&self, fragment: &mut Fragment) {
        let port = self.port;
        let base = if port.external_policy_local {
            "KUBE-EXTERNAL-IP-LOCAL"
        } else {
            "KUBE-EXTERNAL-IP"
        };
        for ip in &port.external_ips {
            fragment.entries.insert((base, self.entry(ip)));
            let bind = !self.ctx.local_addresses.contains(ip);
            self.virtual_server(*ip, port.port, &self.external, bind, fragment);
        }
    }

    fn load_balancer_ips(&self, fragment: &mut Fragment) {
        let port = self.port;
        for ip in &port.load_balancer_ips {
            let entry = self.entry(ip);
            fragment
                .entries
                .insert(("KUBE-LOAD-BALANCER", entry.clone()));
            if port.external_policy_local {
                fragment
                    .entries
                    .insert(("KUBE-LOAD-BALANCER-LOCAL", entry.clone()));
            }
            if port.has_source_ranges() {
                self.source_ranges(ip, entry, fragment);
            }
            let bind = !self.ctx.local_addresses.contains(ip);
            self.virtual_server(*ip, port.port, &self.external, bind, fragment);
        }
    }

    /// The sources allowed to load-balancer IP `ip` (its set entry `entry`); the node itself
    /// when a range holds its address, else the node's own packets to it are dropped.
    fn source_ranges(&self, ip: &IpAddr, entry: String, fragment: &mut Fragment) {
        let ranges = &self.port.load_balancer_source_ranges;
        for net in ranges.iter().flat_map(storable) {
            fragment.entries.insert((
                "KUBE-LOAD-BALANCER-SOURCE-CIDR",
                format!("{entry},{}", as_saved(&net)),
            ));
        }
        let node_allowed = self
            .ctx
            .common
            .node_ip
            .is_some_and(|node_ip| ranges.iter().any(|n| n.contains(&node_ip)));
        if node_allowed {
            fragment
                .entries
                .insert(("KUBE-LOAD-BALANCER-SOURCE-IP", format!("{entry},{ip}")));
        } else {
            fragment
                .no_node_access
                .insert((*ip, self.proto, self.port.port));
        }
        fragment.entries.insert(("KUBE-LOAD-BALANCER-FW", entry));
    }

    /// The NodePort, on every NodePort address: its port in the protocol's set (SCTP's by
    /// address), and a virtual server per address.
    fn node_port(&self, fragment: &mut Fragment) {
        let ips = &self.ctx.node_port_ips;
        let Some(node_port) = self.port.node_port.filter(|_| !ips.is_empty()) else {
            return;
        };
        let local = self.port.external_policy_local;
        let mut insert = |base: &'static str, entry: String| {
            fragment.entries.insert((base, entry));
        };
        match self.port.name.protocol {
            Protocol::Sctp => {
                for ip in ips {
                    insert("KUBE-NODE-PORT-SCTP-HASH", ip_port(ip, "sctp", node_port));
                    if local {
                        let entry = ip_port(ip, "sctp", node_port);
                        insert("KUBE-NODE-PORT-LOCAL-SCTP-HASH", entry);
                    }
                }
            }
            Protocol::Tcp | Protocol::Udp => {
                let (all, local_only) = if self.port.name.protocol == Protocol::Tcp {
                    ("KUBE-NODE-PORT-TCP", "KUBE-NODE-PORT-LOCAL-TCP")
                } else {
                    ("KUBE-NODE-PORT-UDP", "KUBE-NODE-PORT-LOCAL-UDP")
                };
                insert(all, node_port.to_string());
                if local {
                    insert(local_only, node_port.to_string());
                }
            }
        }
        for ip in ips {
            self.virtual_server(*ip, node_port, &self.external, false, fragment);
        }
    }

    fn health_check(&self, fragment: &mut Fragment) {
        if let Some(health_port) = self.port.health_check_node_port {
            fragment
                .entries
                .insert(("KUBE-HEALTH-CHECK-NODE-PORT", health_port.to_string()));
        }
    }
}

fn ip_port(ip: &IpAddr, proto: &str, port: u16) -> String {
    format!("{ip},{proto}:{port}")
}

/// A net as `ipset save` prints it, which is how the sync compares entries: a single address
/// (/32, /128) without its prefix length. Written with one, it would differ from what ipset
/// reads back, and every sync would delete and add it again.
fn as_saved(net: &IpNet) -> String {
    if net.prefix_len() == net.max_prefix_len() {
        net.addr().to_string()
    } else {
        net.to_string()
    }
}

/// A source range as hash:ip,port,net can store it: a /0 (every source) is refused by ipset,
/// which would fail the whole sync, so it becomes its two /1 halves.
fn storable(net: &IpNet) -> Vec<IpNet> {
    if net.prefix_len() == 0 {
        net.subnets(1)
            .map(|halves| halves.collect())
            .unwrap_or_default()
    } else {
        vec![*net]
    }
}
