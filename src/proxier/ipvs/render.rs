//! The pure IPVS renderer: model -> what one family's kernel should hold in IPVS mode (upstream's
//! pkg/proxy/ipvs syncProxyRules): virtual servers with their real servers, the addresses bound to
//! kube-ipvs0, the ipset entries, and the iptables rules, which stay constant in number because
//! they match the sets rather than each service.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use crate::model::{EndpointsMap, IpFamily, ServicePortMap, ports_in_family};
use crate::proxier::context::FamilyContext;
use crate::sys::ipset::{SetSpec, SetType};
use crate::sys::ipvs::VirtualServer;

/// IP_VS_SVC_F_SCHED2: what upstream sets for the `mh` scheduler (source hashing with port).
const FLAG_SCHED_MH: u32 = 0x10;

/// Everything besides the model that shapes one family's IPVS state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpvsContext {
    pub common: FamilyContext,
    /// Addresses NodePorts listen on: this family's local addresses but kube-ipvs0's.
    pub node_port_ips: Vec<IpAddr>,
    /// Every local address not on kube-ipvs0 (external and LB IPs among them are not bound).
    pub local_addresses: Vec<IpAddr>,
    /// The scheduler (`rr` when empty).
    pub scheduler: String,
}

/// One family's desired IPVS state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredIpvs {
    /// Virtual servers by `address:port/PROTO`, with their real servers (address, port).
    pub services: BTreeMap<String, (VirtualServer, BTreeSet<SocketAddr>)>,
    /// Addresses kube-ipvs0 must hold.
    pub bound: BTreeSet<IpAddr>,
    /// Every set of upstream's table with its entries (empty sets exist too).
    pub sets: BTreeMap<SetSpec, BTreeSet<String>>,
    /// The iptables restore input (nat and filter).
    pub iptables: String,
}

/// The sets upstream creates: base name, type, comment (used in the rules that match them).
pub const SETS: [(&str, SetType, &str); 17] = [
    (
        "KUBE-LOOP-BACK",
        SetType::HashIpPortIp,
        "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose",
    ),
    (
        "KUBE-CLUSTER-IP",
        SetType::HashIpPort,
        "Kubernetes service cluster ip + port for masquerade purpose",
    ),
    (
        "KUBE-EXTERNAL-IP",
        SetType::HashIpPort,
        "Kubernetes service external ip + port for masquerade and filter purpose",
    ),
    (
        "KUBE-EXTERNAL-IP-LOCAL",
        SetType::HashIpPort,
        "Kubernetes service external ip + port with externalTrafficPolicy=local",
    ),
    (
        "KUBE-LOAD-BALANCER",
        SetType::HashIpPort,
        "Kubernetes service lb portal",
    ),
    (
        "KUBE-LOAD-BALANCER-FW",
        SetType::HashIpPort,
        "Kubernetes service load balancer ip + port for load balancer with sourceRange",
    ),
    (
        "KUBE-LOAD-BALANCER-LOCAL",
        SetType::HashIpPort,
        "Kubernetes service load balancer ip + port with externalTrafficPolicy=local",
    ),
    (
        "KUBE-LOAD-BALANCER-SOURCE-IP",
        SetType::HashIpPortIp,
        "Kubernetes service load balancer ip + port + source IP for packet filter purpose",
    ),
    (
        "KUBE-LOAD-BALANCER-SOURCE-CIDR",
        SetType::HashIpPortNet,
        "Kubernetes service load balancer ip + port + source cidr for packet filter purpose",
    ),
    (
        "KUBE-NODE-PORT-TCP",
        SetType::BitmapPort,
        "Kubernetes nodeport TCP port for masquerade purpose",
    ),
    (
        "KUBE-NODE-PORT-LOCAL-TCP",
        SetType::BitmapPort,
        "Kubernetes nodeport TCP port with externalTrafficPolicy=local",
    ),
    (
        "KUBE-NODE-PORT-UDP",
        SetType::BitmapPort,
        "Kubernetes nodeport UDP port for masquerade purpose",
    ),
    (
        "KUBE-NODE-PORT-LOCAL-UDP",
        SetType::BitmapPort,
        "Kubernetes nodeport UDP port with externalTrafficPolicy=local",
    ),
    (
        "KUBE-NODE-PORT-SCTP-HASH",
        SetType::HashIpPort,
        "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'",
    ),
    (
        "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
        SetType::HashIpPort,
        "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'",
    ),
    (
        "KUBE-HEALTH-CHECK-NODE-PORT",
        SetType::BitmapPort,
        "Kubernetes health check node port",
    ),
    (
        "KUBE-IPVS-IPS",
        SetType::HashIp,
        "Addresses on the ipvs interface",
    ),
];

/// A set's name in a family: IPv6 sets are `KUBE-6-...`, cut to ipset's 31 characters.
pub fn set_name(base: &str, family: IpFamily) -> String {
    match family {
        IpFamily::V4 => base.to_string(),
        IpFamily::V6 => {
            let mut name = format!("KUBE-6-{}", base.trim_start_matches("KUBE-"));
            name.truncate(31);
            name
        }
    }
}

/// One service's share of a family's IPVS state; the aggregate (see `aggregate.rs`) counts
/// shares, so a set entry or an address two services need stays until neither does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fragment {
    pub services: BTreeMap<String, (VirtualServer, BTreeSet<SocketAddr>)>,
    pub bound: BTreeSet<IpAddr>,
    /// (set base name, entry).
    pub entries: BTreeSet<(&'static str, String)>,
    /// LB IP:port/proto whose source ranges leave the node out: the node's own packets to them are
    /// dropped in KUBE-IPVS-OUT-FILTER, since IPVS would answer them locally.
    pub no_node_access: BTreeSet<(IpAddr, &'static str, u16)>,
}

/// Renders one service's ports in one family.
pub fn render_service(
    ports: Option<&ServicePortMap>,
    endpoints: Option<&EndpointsMap>,
    ctx: &IpvsContext,
) -> Fragment {
    let mut fragment = Fragment::default();
    let node = ctx.common.node();
    let Some(ports) = ports else {
        return fragment;
    };
    for (port, endpoints) in ports_in_family(ports, endpoints, ctx.common.family) {
        Port::new(&port, &endpoints, node, ctx).render(&mut fragment);
    }
    let bound: Vec<(&'static str, String)> = fragment
        .bound
        .iter()
        .map(|ip| ("KUBE-IPVS-IPS", ip.to_string()))
        .collect();
    fragment.entries.extend(bound);
    fragment
}

/// The nat chains IPVS mode owns.
pub const NAT_CHAINS: [&str; 5] = [
    "KUBE-SERVICES",
    "KUBE-POSTROUTING",
    "KUBE-NODE-PORT",
    "KUBE-LOAD-BALANCER",
    "KUBE-MARK-MASQ",
];
/// The filter chains IPVS mode owns.
pub const FILTER_CHAINS: [&str; 6] = [
    "KUBE-FORWARD",
    "KUBE-NODE-PORT",
    "KUBE-PROXY-FIREWALL",
    "KUBE-SOURCE-RANGES-FIREWALL",
    "KUBE-IPVS-FILTER",
    "KUBE-IPVS-OUT-FILTER",
];

mod port;
mod rules;

use port::Port;
pub(super) use rules::{RuleInputs, iptables_rules};

#[cfg(test)]
pub(in crate::proxier::ipvs) mod tests;
