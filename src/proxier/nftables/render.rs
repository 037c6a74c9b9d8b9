//! The pure renderer of nftables mode: model -> the objects of one family's `kube-proxy` table,
//! in upstream's 1.37 layout (pkg/proxy/nftables/proxier.go): base chains at upstream's hooks
//! and priorities, the fixed chains and their rules, the sets and verdict maps, and per service
//! port its chains, affinity sets and map elements. Objects are kept per service so a sync can
//! write only the services that changed.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use ipnet::IpNet;

use super::slots::{self, Claim, DRAWS, MAPS_PER_PROTOCOL, PROTOCOLS, SlotTable};
use super::text::ElementText;
use crate::model::{EndpointsMap, IpFamily, Protocol, ServicePortMap, VecMap, ports_in_family};
use crate::proxier::context::FamilyContext;
use crate::proxier::local::{LocalDetector, NodePortAddresses};

/// Our table's name, in both families.
pub const TABLE: &str = "kube-proxy";

pub const CLUSTER_IPS: &str = "cluster-ips";
pub const NODEPORT_IPS: &str = "nodeport-ips";
pub const SERVICE_IPS: &str = "service-ips";
pub const SERVICE_NODEPORTS: &str = "service-nodeports";
pub const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
pub const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
pub const FIREWALL_IPS: &str = "firewall-ips";
pub const HAIRPIN_CONNECTIONS: &str = "hairpin-connections";
pub const REJECT_CHAIN: &str = "reject-chain";
/// Upstream 1.37's map of the localhost NodePorts whose packets are rejected and counted.
pub const LOCALHOST_REJECT_PORTS: &str = "localhost-nodeport-reject-ports";

/// The flowtable Service connections are offloaded to (KEP-4963's name).
pub const FLOWTABLE: &str = "kube-proxy-flowtable";
/// Its spec, with `devices` added to those it holds: the ingress hook of its devices. The
/// table declares it with none; they are added apart (see `FlowtableDevices`).
pub fn flowtable_spec(devices: &[String]) -> String {
    if devices.is_empty() {
        return "{ hook ingress priority filter ; }".into();
    }
    let quoted: Vec<String> = devices.iter().map(|name| format!("\"{name}\"")).collect();
    format!(
        "{{ hook ingress priority filter ; devices = {{ {} }} ; }}",
        quoted.join(", ")
    )
}
/// The named counter of the packets that asked for their connection to be offloaded.
pub const OFFLOAD_REQUESTS: &str = "flow-offload-requests";

/// The chain that rejects localhost NodePort packets of `protocol`.
pub fn localhost_reject_chain(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Tcp => "localhost-nodeport-reject-tcp",
        Protocol::Udp => "localhost-nodeport-reject-udp",
        Protocol::Sctp => "localhost-nodeport-reject-sctp",
    }
}

/// The named counter of the localhost NodePort packets of `protocol` rejected.
pub fn localhost_rejected_counter(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Tcp => "localhost-nodeport-rejected-tcp",
        Protocol::Udp => "localhost-nodeport-rejected-udp",
        Protocol::Sctp => "localhost-nodeport-rejected-sctp",
    }
}

/// Everything besides the model that shapes one family's table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NftContext {
    /// The node and family (its primary address: a source range holding it lets the
    /// load-balancer IPs in too, hairpin through a VIP bound on the node).
    pub common: FamilyContext,
    pub node_port_addresses: NodePortAddresses,
    /// The ServiceCIDRs of this family: traffic to an unallocated address in them is dropped.
    pub service_cidrs: Vec<IpNet>,
    /// The protocols whose NodePorts on this family's loopback address are rejected and
    /// counted (the feature gate KubeProxyNFTablesLocalhostNodePorts on: UDP and SCTP, and TCP
    /// too when the userspace proxy does not serve this family).
    pub localhost_rejects: Vec<Protocol>,
    /// Connections to a ClusterIP that have seen more packets than this are offloaded to
    /// [`FLOWTABLE`] (`--offload-packet-threshold`; none when off or the kernel cannot).
    pub offload_after_packets: Option<u32>,
}

impl NftContext {
    /// `ip` or `ip6`: the table's family and the address match's keyword.
    pub fn ip(&self) -> &'static str {
        match self.common.family {
            IpFamily::V4 => "ip",
            IpFamily::V6 => "ip6",
        }
    }

    fn addr_type(&self) -> &'static str {
        match self.common.family {
            IpFamily::V4 => "ipv4_addr",
            IpFamily::V6 => "ipv6_addr",
        }
    }

    fn loopback(&self) -> &'static str {
        match self.common.family {
            IpFamily::V4 => "127.0.0.0/8",
            IpFamily::V6 => "::1",
        }
    }

    /// The statement that marks a packet for masquerading, written in each rule that marks
    /// (upstream 1.36's `masqueradeRule`).
    fn mark_for_masquerade(&self) -> String {
        format!("mark set mark or {:#x}", self.common.masquerade_mark)
    }

    /// The match for traffic from this node's pods, and for traffic that is not, if possible.
    fn local_matches(&self) -> Option<(String, String)> {
        let ip = self.ip();
        match &self.common.local_detector {
            LocalDetector::None => None,
            LocalDetector::Cidrs(nets) => {
                let set = if nets.len() == 1 {
                    nets[0].to_string()
                } else {
                    format!(
                        "{{ {} }}",
                        nets.iter()
                            .map(|n| n.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                Some((format!("{ip} saddr {set}"), format!("{ip} saddr != {set}")))
            }
            LocalDetector::Bridge(name) => Some((
                format!("iifname {}", quoted(name)),
                format!("iifname != {}", quoted(name)),
            )),
            LocalDetector::InterfacePrefix(prefix) => Some((
                format!("iifname {}", quoted(&format!("{prefix}*"))),
                format!("iifname != {}", quoted(&format!("{prefix}*"))),
            )),
        }
    }
}

/// A string in nft's quotes; characters that could end it or the line become `_` (names from
/// the API are checked before they get here; this is the second line of defence).
pub fn quoted(text: &str) -> String {
    let safe: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || " /:;.,_-=()>[]*+".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("\"{safe}\"")
}

/// A chain: its spec (`{ type nat hook prerouting priority -100 ; }` for base chains, `{ comment
/// ... ; }`, or empty) and its rules, each the text after `add rule <family> kube-proxy <chain> `.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    pub spec: String,
    pub rules: Vec<String>,
}

/// A set or map: `set` or `map`, and its spec (`{ type ... ; }`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetDef {
    pub kind: &'static str,
    pub spec: String,
}

pub use super::elements::Elements;

/// Objects of one family's table: chains, sets/maps, elements.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Objects {
    pub chains: VecMap<String, Chain>,
    pub sets: VecMap<String, SetDef>,
    pub elements: VecMap<String, Elements>,
    /// Service ports with no usable local endpoints for internal / external traffic.
    pub no_local_endpoints: (usize, usize),
    /// The endpoint-map slots the policy chains hold.
    pub slots: Vec<Claim>,
    /// Named counters (the base's).
    pub counters: BTreeSet<String>,
    /// Flowtables (the base's), each declared with `flowtable_spec(&[])`.
    pub flowtables: BTreeSet<String>,
}

impl Objects {
    fn chain(&mut self, name: &str) -> &mut Chain {
        self.chains.get_or_insert_by_ref(name, Chain::default)
    }

    fn rule(&mut self, chain: &str, rule: String) {
        self.chain(chain).rules.push(rule);
    }

    fn element(&mut self, set: &str, key: &str, rest: &str) {
        self.elements_of(set).insert(key, rest);
    }

    fn elements_of(&mut self, set: &str) -> &mut Elements {
        self.elements.get_or_insert_by_ref(set, Elements::default)
    }

    /// Gives back the spare capacity of everything (objects kept in memory for long).
    pub fn shrink_to_fit(&mut self) {
        self.chains.shrink_to_fit();
        for chain in self.chains.values_mut() {
            chain.rules.shrink_to_fit();
            for rule in &mut chain.rules {
                rule.shrink_to_fit();
            }
        }
        self.sets.shrink_to_fit();
        self.elements.shrink_to_fit();
        self.slots.shrink_to_fit();
        for elements in self.elements.values_mut() {
            elements.shrink_to_fit();
        }
    }

    /// True when the service adds nothing to this family.
    pub fn is_empty(&self) -> bool {
        self.chains.is_empty()
            && self.sets.is_empty()
            && self.elements.is_empty()
            && self.counters.is_empty()
            && self.flowtables.is_empty()
    }
}

/// The base chains: name, type, hook, priority.
pub const BASE_CHAINS: [(&str, &str, &str, i32); 8] = [
    ("filter-prerouting-pre-dnat", "filter", "prerouting", -110),
    ("filter-output-pre-dnat", "filter", "output", -110),
    ("filter-forward", "filter", "forward", 0),
    ("filter-input", "filter", "input", 0),
    ("filter-output", "filter", "output", 0),
    ("nat-prerouting", "nat", "prerouting", -100),
    ("nat-output", "nat", "output", -100),
    ("nat-postrouting", "nat", "postrouting", 100),
];

/// The regular chains every sync writes, besides the base chains.
pub const FIXED_CHAINS: [&str; 7] = [
    "cluster-ips-check",
    "firewall-check",
    "masquerading",
    "nodeport-endpoints-check",
    REJECT_CHAIN,
    "services",
    "service-endpoints-check",
];

/// The table's service-independent objects.
pub fn render_base(ctx: &NftContext) -> Objects {
    let mut out = Objects::default();
    base_sets(ctx, &mut out);
    base_chains(&mut out);
    base_rules(ctx, &mut out);
    node_port_rules(ctx, &mut out);
    localhost_rejects(ctx, &mut out);
    offload(ctx, &mut out);
    out
}

/// KEP-4963's fast path: a forwarded connection to a ClusterIP past the threshold is given to
/// the flowtable, whose ingress hook then takes its packets straight to their way out.
fn offload(ctx: &NftContext, out: &mut Objects) {
    let Some(threshold) = ctx.offload_after_packets else {
        return;
    };
    out.flowtables.insert(FLOWTABLE.into());
    out.counters.insert(OFFLOAD_REQUESTS.into());
    out.rule(
        "filter-forward",
        format!(
            "ct original {} daddr @{CLUSTER_IPS} ct packets > {threshold} counter name \"{OFFLOAD_REQUESTS}\" flow add @{FLOWTABLE}",
            ctx.ip()
        ),
    );
}

/// Packets to the loopback address's NodePorts of the rejected protocols: counted and rejected
/// (upstream 1.37; the kernel would refuse them anyway, no socket being there, but uncounted).
fn localhost_rejects(ctx: &NftContext, out: &mut Objects) {
    if ctx.localhost_rejects.is_empty() {
        return;
    }
    out.sets.insert(
        LOCALHOST_REJECT_PORTS.into(),
        SetDef {
            kind: "map",
            spec: "{ type inet_proto . inet_service : verdict ; comment \"localhost NodePorts rejected by kube-proxy\" ; }".into(),
        },
    );
    for protocol in &ctx.localhost_rejects {
        let counter = localhost_rejected_counter(*protocol);
        out.rule(
            localhost_reject_chain(*protocol),
            format!("counter name \"{counter}\" reject"),
        );
        out.counters.insert(counter.to_string());
    }
    let (ip, loopback) = (ctx.ip(), ctx.loopback());
    out.rule(
        "nodeport-endpoints-check",
        format!("{ip} daddr {loopback} meta l4proto . th dport vmap @{LOCALHOST_REJECT_PORTS}"),
    );
}

/// The top-level sets and maps, and the shared endpoint maps.
fn base_sets(ctx: &NftContext, out: &mut Objects) {
    let (ip, addr) = (ctx.ip(), ctx.addr_type());
    let set = |spec: String| SetDef { kind: "set", spec };
    let map = |spec: String| SetDef { kind: "map", spec };
    let match_all = ctx.node_port_addresses == NodePortAddresses::All;
    out.sets.insert(
        CLUSTER_IPS.into(),
        set(format!(
            "{{ type {addr} ; comment \"Active ClusterIPs\" ; }}"
        )),
    );
    if !match_all {
        out.sets.insert(
            NODEPORT_IPS.into(),
            set(format!(
                "{{ type {addr} ; comment \"IPs that accept NodePort traffic\" ; }}"
            )),
        );
    }
    let maps = [
        (
            FIREWALL_IPS,
            format!("{addr} . inet_proto . inet_service"),
            "destinations that are subject to LoadBalancerSourceRanges",
        ),
        (
            NO_ENDPOINT_NODEPORTS,
            "inet_proto . inet_service".to_string(),
            "vmap to drop or reject packets to service nodeports with no endpoints",
        ),
        (
            NO_ENDPOINT_SERVICES,
            format!("{addr} . inet_proto . inet_service"),
            "vmap to drop or reject packets to services with no endpoints",
        ),
        (
            SERVICE_IPS,
            format!("{addr} . inet_proto . inet_service"),
            "ClusterIP, ExternalIP and LoadBalancer IP traffic",
        ),
        (
            SERVICE_NODEPORTS,
            "inet_proto . inet_service".to_string(),
            "NodePort traffic",
        ),
    ];
    for protocol in PROTOCOLS {
        for index in 0..MAPS_PER_PROTOCOL {
            out.sets.insert(
                slots::map_name(protocol, index),
                map(format!(
                    "{{ typeof numgen random mod {DRAWS} : {ip} daddr . {protocol} dport ; flags interval ; comment \"endpoint addresses of service chains, by draw\" ; }}"
                )),
            );
        }
    }
    // Upstream 1.36's: connections DNATed to their own source, masqueraded in postrouting.
    out.sets.insert(
        HAIRPIN_CONNECTIONS.into(),
        set(format!(
            "{{ type {addr} . {addr} . inet_proto . inet_service ; comment \"service hairpin connections\" ; }}"
        )),
    );
    for (name, key, comment) in maps {
        out.sets.insert(
            name.into(),
            map(format!(
                "{{ type {key} : verdict ; comment \"{comment}\" ; }}"
            )),
        );
    }
}

/// The base chains at upstream's hooks and priorities, and the fixed chains.
fn base_chains(out: &mut Objects) {
    for (name, kind, hook, priority) in BASE_CHAINS {
        out.chain(name).spec = format!("{{ type {kind} hook {hook} priority {priority} ; }}");
    }
    for name in FIXED_CHAINS {
        out.chain(name);
    }
    out.chain(REJECT_CHAIN).spec =
        "{ comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\" ; }".into();
}

/// The base chains' jumps and the fixed chains' rules, NodePorts aside.
fn base_rules(ctx: &NftContext, out: &mut Objects) {
    let ip = ctx.ip();
    let jumps = [
        (
            "filter-prerouting-pre-dnat",
            "ct state new jump firewall-check",
        ),
        ("filter-output-pre-dnat", "ct state new jump firewall-check"),
        (
            "filter-forward",
            "ct state new jump service-endpoints-check",
        ),
        ("filter-forward", "ct state new jump cluster-ips-check"),
        ("filter-input", "ct state new jump nodeport-endpoints-check"),
        ("filter-input", "ct state new jump service-endpoints-check"),
        ("filter-output", "ct state new jump service-endpoints-check"),
        ("filter-output", "ct state new jump cluster-ips-check"),
        ("nat-prerouting", "jump services"),
        ("nat-output", "jump services"),
        ("nat-postrouting", "jump masquerading"),
    ];
    for (chain, rule) in jumps {
        out.rule(chain, rule.into());
    }
    out.rule(
        "cluster-ips-check",
        format!("{ip} daddr @{CLUSTER_IPS} reject comment \"Reject traffic to invalid ports of ClusterIPs\""),
    );
    if !ctx.service_cidrs.is_empty() {
        let cidrs: Vec<String> = ctx.service_cidrs.iter().map(|c| c.to_string()).collect();
        out.rule(
            "cluster-ips-check",
            format!(
                "{ip} daddr {{ {} }} drop comment \"Drop traffic to unallocated ClusterIPs\"",
                cidrs.join(", ")
            ),
        );
    }
    out.rule(
        "firewall-check",
        format!("{ip} daddr . meta l4proto . th dport vmap @{FIREWALL_IPS}"),
    );
    let mark = format!("{:#x}", ctx.common.masquerade_mark);
    out.rule(
        "masquerading",
        format!("mark and {mark} != 0 mark set mark xor {mark} masquerade fully-random"),
    );
    // Connections DNATed to their own source: a pod reaching itself through a service.
    out.rule(
        "masquerading",
        format!("ct status dnat {ip} saddr . {ip} daddr . meta l4proto . th dport @{HAIRPIN_CONNECTIONS} masquerade fully-random"),
    );
    out.rule(REJECT_CHAIN, "reject".into());
    if let Some(rule) = cluster_ip_masquerade(ctx) {
        out.rule("services", rule);
    }
    out.rule(
        "services",
        format!("{ip} daddr . meta l4proto . th dport vmap @{SERVICE_IPS}"),
    );
    out.rule(
        "service-endpoints-check",
        format!("{ip} daddr . meta l4proto . th dport vmap @{NO_ENDPOINT_SERVICES}"),
    );
}

/// The rule that marks traffic to ClusterIPs for masquerading, for every service at once: all
/// of it with masqueradeAll, else what does not come from this node's pods (none without a
/// local detector).
fn cluster_ip_masquerade(ctx: &NftContext) -> Option<String> {
    let (ip, mark) = (ctx.ip(), ctx.mark_for_masquerade());
    if ctx.common.masquerade_all {
        Some(format!(
            "{ip} daddr @{CLUSTER_IPS} {mark} comment \"masquerade all clusterIP traffic\""
        ))
    } else {
        ctx.local_matches().map(|(_, not_local)| {
            format!("{ip} daddr @{CLUSTER_IPS} {not_local} {mark} comment \"masquerade clusterIP traffic from outside cluster\"")
        })
    }
}

/// Where NodePorts are served: every local address but loopback, or the NodePort addresses.
fn node_port_rules(ctx: &NftContext, out: &mut Objects) {
    let (ip, loopback) = (ctx.ip(), ctx.loopback());
    match &ctx.node_port_addresses {
        NodePortAddresses::All => {
            out.rule(
                "services",
                format!("fib daddr type local {ip} daddr != {loopback} meta l4proto . th dport vmap @{SERVICE_NODEPORTS}"),
            );
            out.rule(
                "nodeport-endpoints-check",
                format!(
                    "{ip} daddr != {loopback} meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS}"
                ),
            );
        }
        NodePortAddresses::Only(ips) => {
            out.rule(
                "services",
                format!(
                    "{ip} daddr @{NODEPORT_IPS} meta l4proto . th dport vmap @{SERVICE_NODEPORTS}"
                ),
            );
            out.rule(
                "nodeport-endpoints-check",
                format!("{ip} daddr @{NODEPORT_IPS} meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS}"),
            );
            // Localhost NodePorts are not served in this mode (as upstream).
            for node_ip in ips
                .iter()
                .filter(|ip| IpFamily::of(ip) == ctx.common.family && !ip.is_loopback())
            {
                out.element(NODEPORT_IPS, &node_ip.to_string(), "");
            }
        }
    }
}

/// Renders every port of one service in `ctx.common.family`; its policy chains take their
/// endpoint-map slots in `slots`.
pub fn render_service(
    ports: &ServicePortMap,
    endpoints: Option<&EndpointsMap>,
    ctx: &NftContext,
    slots: &mut SlotTable,
) -> Objects {
    let mut out = Objects::default();
    let mut text = ElementText::default();
    let local_matches = ctx.local_matches();
    for (port, endpoints) in ports_in_family(ports, endpoints, ctx.common.family) {
        let port = Port::new(&port, &endpoints, ctx, local_matches.as_ref());
        port.render(slots, &mut text, &mut out);
    }
    out
}

/// What starts the comment that carries a chain's digest.
pub const DIGEST_PREFIX: &str = "kube-proxy-rs:";

/// Marks each chain with a digest of its rules, as the comment of its last rule that has none
/// (upstream's text has no comment there): a daemon that reads our table back (after a restart,
/// a failure) reads the rules' comments and counts and leaves alone every chain whose digest and
/// rule count match what it would write. A chain whose rules all carry comments gets no digest
/// (its comments and count are compared instead).
pub fn stamp_digests(objects: &mut Objects) {
    for chain in objects.chains.values_mut() {
        let Some(last) = chain
            .rules
            .iter()
            .rposition(|rule| !rule.contains(" comment \""))
        else {
            continue;
        };
        let lines = chain.rules.iter().flat_map(|rule| ["\n", rule.as_str()]);
        let digest = crate::proxier::naming::base32_sha256_of(
            std::iter::once(chain.spec.as_str()).chain(lines),
            16,
        );
        let _ = write!(chain.rules[last], " comment \"{DIGEST_PREFIX}{digest}\"");
    }
}

/// The comment a rule of ours ends with, if it has one.
pub fn comment_of(rule: &str) -> Option<&str> {
    rule.rsplit_once(" comment \"")?.1.strip_suffix('"')
}

/// The digest comment a stamped chain carries, if it has one.
pub fn digest_of(chain: &Chain) -> Option<&str> {
    chain
        .rules
        .iter()
        .filter_map(|rule| comment_of(rule))
        .find(|comment| comment.starts_with(DIGEST_PREFIX))
}

mod port;

use port::Port;

#[cfg(test)]
pub(crate) mod tests;
