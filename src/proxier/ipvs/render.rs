//! The pure IPVS renderer: model -> what one family's kernel should hold in IPVS mode (upstream's
//! pkg/proxy/ipvs syncProxyRules): virtual servers with their real servers, the addresses bound to
//! kube-ipvs0, the ipset entries, and the iptables rules, which stay constant in number because
//! they match the sets rather than each service.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use crate::model::{
    Endpoint, EndpointsMap, IpFamily, NodeContext, ServicePort, ServicePortMap, ports_in_family,
    select_endpoints,
};
use crate::proxier::context::FamilyContext;
use crate::sys::ipset::{SetSpec, SetType};
use crate::sys::ipvs::VirtualServer;
use crate::sys::ipvs::codec::FLAG_PERSISTENT;

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

fn ip_port(ip: &IpAddr, proto: &str, port: u16) -> String {
    format!("{ip},{proto}:{port}")
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
        render_port(&port, &endpoints, node, ctx, &mut fragment);
    }
    let bound: Vec<(&'static str, String)> = fragment
        .bound
        .iter()
        .map(|ip| ("KUBE-IPVS-IPS", ip.to_string()))
        .collect();
    fragment.entries.extend(bound);
    fragment
}

fn render_port(
    port: &ServicePort,
    endpoints: &[Endpoint],
    node: NodeContext<'_>,
    ctx: &IpvsContext,
    fragment: &mut Fragment,
) {
    let selected = select_endpoints(port, endpoints, node);
    let proto = port.name.protocol.lower();
    // Local policy: local endpoints, or (as upstream) the cluster ones when there are none here.
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
    let internal = pick(port.internal_policy_local);
    let external = pick(port.external_policy_local);
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
    let mut add = |address: IpAddr, service_port: u16, real: &BTreeSet<SocketAddr>, bind: bool| {
        let vs = VirtualServer {
            address,
            protocol: port.name.protocol,
            port: service_port,
            scheduler: scheduler.clone(),
            flags,
            timeout: port.session_affinity_seconds.unwrap_or(0),
        };
        fragment.services.insert(vs.key(), (vs, real.clone()));
        if bind {
            fragment.bound.insert(address);
        }
    };

    for ep in endpoints
        .iter()
        .filter(|ep| ep.is_local(&ctx.common.node_name))
    {
        fragment.entries.insert((
            "KUBE-LOOP-BACK",
            format!("{},{proto}:{},{}", ep.ip, ep.port, ep.ip),
        ));
    }
    let cluster_ip = port.cluster_ips[0];
    fragment
        .entries
        .insert(("KUBE-CLUSTER-IP", ip_port(&cluster_ip, proto, port.port)));
    add(cluster_ip, port.port, &internal, true);

    for ip in &port.external_ips {
        let base = if port.external_policy_local {
            "KUBE-EXTERNAL-IP-LOCAL"
        } else {
            "KUBE-EXTERNAL-IP"
        };
        fragment
            .entries
            .insert((base, ip_port(ip, proto, port.port)));
        add(*ip, port.port, &external, !ctx.local_addresses.contains(ip));
    }
    for ip in &port.load_balancer_ips {
        let entry = ip_port(ip, proto, port.port);
        fragment
            .entries
            .insert(("KUBE-LOAD-BALANCER", entry.clone()));
        if port.external_policy_local {
            fragment
                .entries
                .insert(("KUBE-LOAD-BALANCER-LOCAL", entry.clone()));
        }
        if port.has_source_ranges() {
            fragment
                .entries
                .insert(("KUBE-LOAD-BALANCER-FW", entry.clone()));
            for net in port.load_balancer_source_ranges.iter().flat_map(storable) {
                fragment
                    .entries
                    .insert(("KUBE-LOAD-BALANCER-SOURCE-CIDR", format!("{entry},{net}")));
            }
            if ctx.common.node_ip.is_some_and(|node_ip| {
                port.load_balancer_source_ranges
                    .iter()
                    .any(|n| n.contains(&node_ip))
            }) {
                fragment
                    .entries
                    .insert(("KUBE-LOAD-BALANCER-SOURCE-IP", format!("{entry},{ip}")));
            } else {
                fragment.no_node_access.insert((*ip, proto, port.port));
            }
        }
        add(*ip, port.port, &external, !ctx.local_addresses.contains(ip));
    }
    if let Some(node_port) = port.node_port
        && !ctx.node_port_ips.is_empty()
    {
        let local = port.external_policy_local;
        match port.name.protocol {
            crate::model::Protocol::Sctp => {
                for ip in &ctx.node_port_ips {
                    fragment
                        .entries
                        .insert(("KUBE-NODE-PORT-SCTP-HASH", ip_port(ip, "sctp", node_port)));
                    if local {
                        fragment.entries.insert((
                            "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
                            ip_port(ip, "sctp", node_port),
                        ));
                    }
                }
            }
            crate::model::Protocol::Tcp => {
                fragment
                    .entries
                    .insert(("KUBE-NODE-PORT-TCP", node_port.to_string()));
                if local {
                    fragment
                        .entries
                        .insert(("KUBE-NODE-PORT-LOCAL-TCP", node_port.to_string()));
                }
            }
            crate::model::Protocol::Udp => {
                fragment
                    .entries
                    .insert(("KUBE-NODE-PORT-UDP", node_port.to_string()));
                if local {
                    fragment
                        .entries
                        .insert(("KUBE-NODE-PORT-LOCAL-UDP", node_port.to_string()));
                }
            }
        }
        for ip in &ctx.node_port_ips {
            add(*ip, node_port, &external, false);
        }
    }
    if let Some(health_port) = port.health_check_node_port {
        fragment
            .entries
            .insert(("KUBE-HEALTH-CHECK-NODE-PORT", health_port.to_string()));
    }
}

fn comment_of(base: &str) -> &'static str {
    SETS.iter()
        .find(|(name, _, _)| *name == base)
        .map(|(_, _, c)| *c)
        .unwrap_or("")
}

/// What the iptables rules depend on besides the context: which sets have entries, and the LB
/// addresses the node itself may not reach.
pub(super) struct RuleInputs<'a> {
    pub non_empty: BTreeSet<&'static str>,
    pub no_node_access: Vec<&'a (IpAddr, &'static str, u16)>,
}

impl RuleInputs<'_> {
    fn has(&self, base: &str) -> bool {
        self.non_empty.contains(base)
    }
}

/// Upstream's rules for IPVS mode, in its order; a set-matching rule exists only when its set has entries.
pub(super) fn iptables_rules(ctx: &IpvsContext, sets: &RuleInputs<'_>) -> String {
    let set_name = |base: &str| set_name(base, ctx.common.family);
    let mark = format!("{:#010x}", ctx.common.masquerade_mark);
    let mut nat = String::new();
    let mut filter = String::new();
    let loopback = if ctx.common.family == IpFamily::V4 {
        "127.0.0.0/8"
    } else {
        "::1/128"
    };
    let _ = writeln!(nat, "-A KUBE-SERVICES -s {loopback} -j RETURN");

    let set_rule = |out: &mut String,
                    base: &str,
                    from: &str,
                    proto: Option<&str>,
                    matching: &str,
                    to: &str| {
        if sets.has(base) {
            let proto = proto.map(|p| format!("-p {p} ")).unwrap_or_default();
            let _ = writeln!(
                out,
                "-A {from} {proto}-m comment --comment \"{}\" -m set --match-set {} {matching} -j {to}",
                comment_of(base),
                set_name(base)
            );
        }
    };
    set_rule(
        &mut nat,
        "KUBE-LOOP-BACK",
        "KUBE-POSTROUTING",
        None,
        "dst,dst,src",
        "MASQUERADE",
    );
    set_rule(
        &mut nat,
        "KUBE-LOAD-BALANCER",
        "KUBE-SERVICES",
        None,
        "dst,dst",
        "KUBE-LOAD-BALANCER",
    );
    set_rule(
        &mut nat,
        "KUBE-LOAD-BALANCER-LOCAL",
        "KUBE-LOAD-BALANCER",
        None,
        "dst,dst",
        "RETURN",
    );
    set_rule(
        &mut nat,
        "KUBE-NODE-PORT-LOCAL-TCP",
        "KUBE-NODE-PORT",
        Some("tcp"),
        "dst",
        "RETURN",
    );
    set_rule(
        &mut nat,
        "KUBE-NODE-PORT-TCP",
        "KUBE-NODE-PORT",
        Some("tcp"),
        "dst",
        "KUBE-MARK-MASQ",
    );
    set_rule(
        &mut nat,
        "KUBE-NODE-PORT-LOCAL-UDP",
        "KUBE-NODE-PORT",
        Some("udp"),
        "dst",
        "RETURN",
    );
    set_rule(
        &mut nat,
        "KUBE-NODE-PORT-UDP",
        "KUBE-NODE-PORT",
        Some("udp"),
        "dst",
        "KUBE-MARK-MASQ",
    );
    set_rule(
        &mut nat,
        "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
        "KUBE-NODE-PORT",
        Some("sctp"),
        "dst,dst",
        "RETURN",
    );
    set_rule(
        &mut nat,
        "KUBE-NODE-PORT-SCTP-HASH",
        "KUBE-NODE-PORT",
        Some("sctp"),
        "dst,dst",
        "KUBE-MARK-MASQ",
    );
    set_rule(
        &mut filter,
        "KUBE-LOAD-BALANCER-FW",
        "KUBE-PROXY-FIREWALL",
        None,
        "dst,dst",
        "KUBE-SOURCE-RANGES-FIREWALL",
    );
    set_rule(
        &mut filter,
        "KUBE-LOAD-BALANCER-SOURCE-CIDR",
        "KUBE-SOURCE-RANGES-FIREWALL",
        None,
        "dst,dst,src",
        "RETURN",
    );
    set_rule(
        &mut filter,
        "KUBE-LOAD-BALANCER-SOURCE-IP",
        "KUBE-SOURCE-RANGES-FIREWALL",
        None,
        "dst,dst,src",
        "RETURN",
    );

    if sets.has("KUBE-CLUSTER-IP") {
        let prefix = format!(
            "-A KUBE-SERVICES -m comment --comment \"{}\" -m set --match-set {}",
            comment_of("KUBE-CLUSTER-IP"),
            set_name("KUBE-CLUSTER-IP")
        );
        if ctx.common.masquerade_all {
            let _ = writeln!(nat, "{prefix} dst,dst -j KUBE-MARK-MASQ");
        } else if let Some(not_local) = ctx.common.local_detector.if_not_local() {
            let _ = writeln!(nat, "{prefix} dst,dst {not_local} -j KUBE-MARK-MASQ");
        } else {
            let _ = writeln!(nat, "{prefix} src,dst -j KUBE-MARK-MASQ");
        }
    }
    for (base, masquerade) in [
        ("KUBE-EXTERNAL-IP", true),
        ("KUBE-EXTERNAL-IP-LOCAL", false),
    ] {
        if sets.has(base) {
            let prefix = format!(
                "-A KUBE-SERVICES -m comment --comment \"{}\" -m set --match-set {} dst,dst",
                comment_of(base),
                set_name(base)
            );
            if masquerade {
                let _ = writeln!(nat, "{prefix} -j KUBE-MARK-MASQ");
            }
            let _ = writeln!(
                nat,
                "{prefix} -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT"
            );
            let _ = writeln!(nat, "{prefix} -m addrtype --dst-type LOCAL -j ACCEPT");
        }
    }
    let _ = writeln!(
        nat,
        "-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT"
    );
    let _ = writeln!(nat, "-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ");
    let _ = writeln!(filter, "-A KUBE-SOURCE-RANGES-FIREWALL -j DROP");
    for (ip, proto, port) in &sets.no_node_access {
        let _ = writeln!(
            filter,
            "-A KUBE-IPVS-OUT-FILTER -s {ip} -m ipvs --vaddr {ip} --vproto {proto} --vport {port} -j DROP"
        );
    }
    for (base, to) in [
        ("KUBE-CLUSTER-IP", "ACCEPT"),
        ("KUBE-LOAD-BALANCER", "ACCEPT"),
    ] {
        if sets.has(base) {
            let _ = writeln!(
                nat,
                "-A KUBE-SERVICES -m set --match-set {} dst,dst -j {to}",
                set_name(base)
            );
        }
    }
    let _ = writeln!(
        filter,
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {mark}/{mark} -j ACCEPT"
    );
    let _ = writeln!(
        filter,
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
    );
    let _ = writeln!(
        filter,
        "-A KUBE-NODE-PORT -m comment --comment \"Kubernetes health check node port\" -m set --match-set {} dst -j ACCEPT",
        set_name("KUBE-HEALTH-CHECK-NODE-PORT")
    );
    for (base, matching) in [
        ("KUBE-LOAD-BALANCER", "dst,dst"),
        ("KUBE-CLUSTER-IP", "dst,dst"),
        ("KUBE-EXTERNAL-IP", "dst,dst"),
        ("KUBE-EXTERNAL-IP-LOCAL", "dst,dst"),
        ("KUBE-HEALTH-CHECK-NODE-PORT", "dst"),
    ] {
        let _ = writeln!(
            filter,
            "-A KUBE-IPVS-FILTER -m set --match-set {} {matching} -j RETURN",
            set_name(base)
        );
    }
    let _ = writeln!(
        filter,
        "-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set {} dst -j REJECT",
        set_name("KUBE-IPVS-IPS")
    );
    let _ = writeln!(
        nat,
        "-A KUBE-POSTROUTING -m mark ! --mark {mark}/{mark} -j RETURN"
    );
    let _ = writeln!(nat, "-A KUBE-POSTROUTING -j MARK --xor-mark {mark}");
    let _ = writeln!(
        nat,
        "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully"
    );
    let _ = writeln!(nat, "-A KUBE-MARK-MASQ -j MARK --or-mark {mark}");

    let mut out = String::from("*nat\n");
    for chain in NAT_CHAINS {
        let _ = writeln!(out, ":{chain} - [0:0]");
    }
    out.push_str(&nat);
    out.push_str("COMMIT\n*filter\n");
    for chain in FILTER_CHAINS {
        let _ = writeln!(out, ":{chain} - [0:0]");
    }
    out.push_str(&filter);
    out.push_str("COMMIT\n");
    out
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

#[cfg(test)]
pub(super) mod tests;
