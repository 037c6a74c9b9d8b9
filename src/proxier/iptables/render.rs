//! The pure renderer: model -> the iptables rules of one IP family, service by service, with
//! upstream's chains, jumps, comments and ordering (pkg/proxy/iptables/proxier.go syncProxyRules).
//! Rules are kept per service so a sync can rewrite only the services that changed.

use super::names;
use super::nfacct::{CT_STATE_INVALID_DROPPED, NfacctCounters};
use crate::model::{
    Endpoint, EndpointsMap, IpFamily, ServicePort, ServicePortMap, ports_in_family,
};
use crate::proxier::context::FamilyContext;
pub use crate::proxier::local::{LocalDetector, NodePortAddresses};
use crate::proxier::xtables::JumpRule;

mod port;
use port::render_port;
use std::collections::BTreeMap;

pub const KUBE_SERVICES: &str = "KUBE-SERVICES";
pub const KUBE_EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
pub const KUBE_NODEPORTS: &str = "KUBE-NODEPORTS";
pub const KUBE_FORWARD: &str = "KUBE-FORWARD";
pub const KUBE_PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
pub const KUBE_FIREWALL: &str = "KUBE-FIREWALL";
pub const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
pub const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
pub const KUBE_PROXY_CANARY: &str = "KUBE-PROXY-CANARY";

/// The filter chains a full sync declares (and so flushes); KUBE-FIREWALL only where a rule of
/// ours goes into it (see [`BaseRules::filter_chains`]).
pub const FILTER_CHAINS: [&str; 6] = [
    KUBE_SERVICES,
    KUBE_EXTERNAL_SERVICES,
    KUBE_FORWARD,
    KUBE_NODEPORTS,
    KUBE_PROXY_FIREWALL,
    KUBE_FIREWALL,
];
/// The nat chains every sync declares.
pub const NAT_CHAINS: [&str; 4] = [
    KUBE_SERVICES,
    KUBE_NODEPORTS,
    KUBE_POSTROUTING,
    KUBE_MARK_MASQ,
];

impl LocalDetector {
    fn if_local(&self) -> Option<String> {
        match self {
            LocalDetector::None => None,
            LocalDetector::Cidrs(nets) => Some(
                nets.iter()
                    .map(|n| format!("-s {n}"))
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            LocalDetector::Bridge(name) => Some(format!("-i {name}")),
            LocalDetector::InterfacePrefix(prefix) => Some(format!("-i {prefix}+")),
        }
    }

    /// The match for traffic that is not from a local pod (`! -s 10.244.0.0/16`), if one can be made.
    pub fn if_not_local(&self) -> Option<String> {
        match self {
            LocalDetector::None => None,
            LocalDetector::Cidrs(nets) => Some(
                nets.iter()
                    .map(|n| format!("! -s {n}"))
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            LocalDetector::Bridge(name) => Some(format!("! -i {name}")),
            LocalDetector::InterfacePrefix(prefix) => Some(format!("! -i {prefix}+")),
        }
    }
}

/// Everything besides the model that shapes one family's rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderContext {
    pub common: FamilyContext,
    /// IPv4 NodePorts on 127.0.0.1 are served by the rules (route_localnet).
    pub localhost_node_ports: bool,
    /// IPv4 NodePorts on 127.0.0.1 are served by the userspace proxy: no rule stops a
    /// connection before it reaches the proxy's socket.
    pub localhost_proxy: bool,
    pub node_port_addresses: NodePortAddresses,
    /// conntrack.tcpBeLiberal: INVALID packets are not dropped.
    pub tcp_be_liberal: bool,
    /// The kernel's packet counters that rules may name.
    pub nfacct: NfacctCounters,
}

/// One rule in one of our shared chains (KUBE-SERVICES, KUBE-FORWARD, ...): `-A <chain> <spec>`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rule {
    pub chain: &'static str,
    pub spec: String,
}

impl Rule {
    pub(super) fn new(chain: &'static str, spec: String) -> Self {
        Rule { chain, spec }
    }
}

/// One service's rules in one family.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceRules {
    /// Rules it adds to the shared filter chains.
    pub filter: Vec<Rule>,
    /// Rules it adds to the shared nat chains (KUBE-SERVICES, KUBE-NODEPORTS).
    pub nat: Vec<Rule>,
    /// Its own nat chains (KUBE-SVC/SVL/EXT/FW/SEP) with their rules in order.
    pub chains: BTreeMap<String, Vec<String>>,
    /// Service ports with no usable endpoint on this node for internal / external traffic.
    pub no_local_endpoints_internal: usize,
    pub no_local_endpoints_external: usize,
}

impl ServiceRules {
    /// True when the service adds nothing to this family.
    pub fn is_empty(&self) -> bool {
        self.filter.is_empty() && self.nat.is_empty() && self.chains.is_empty()
    }

    pub(super) fn push_chain_rule(&mut self, chain: &str, spec: String) {
        self.chains.entry(chain.to_string()).or_default().push(spec);
    }

    pub(super) fn add_filter(&mut self, rule: Rule) {
        if !self.filter.contains(&rule) {
            self.filter.push(rule);
        }
    }

    pub(super) fn add_nat(&mut self, rule: Rule) {
        if !self.nat.contains(&rule) {
            self.nat.push(rule);
        }
    }
}

/// `-m comment --comment X`, quoted as upstream does when the text has spaces.
///
/// Names from the API are checked when objects are converted; as a second line of defence any
/// character outside the few that comments use (letters, digits, space and `/:;.,_-=()>[]`) becomes
/// `_`, so no text can end the quoted string or the line and add a rule of its own.
pub fn comment(text: &str) -> String {
    let text: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || " /:;.,_-=()>[]".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if text.contains(' ') {
        format!("-m comment --comment \"{text}\"")
    } else {
        format!("-m comment --comment {text}")
    }
}

/// Upstream's probability format: ten decimals.
pub fn probability(remaining: usize) -> String {
    format!("{:.10}", 1.0 / remaining as f64)
}

/// Renders every port of one service in `ctx.common.family`.
pub fn render_service(
    ports: &ServicePortMap,
    endpoints: Option<&EndpointsMap>,
    ctx: &RenderContext,
) -> ServiceRules {
    let mut rules = ServiceRules::default();
    for (port, endpoints) in ports_in_family(ports, endpoints, ctx.common.family) {
        render_port(&port, &endpoints, ctx, &mut rules);
    }
    rules
}

/// A policy chain's rules: affinity checks first, then one `statistic` rule per endpoint.
pub(super) fn endpoint_selection_rules(
    out: &mut ServiceRules,
    chain: &str,
    port: &ServicePort,
    endpoints: &[&Endpoint],
) {
    out.chains.entry(chain.to_string()).or_default();
    let name = port.name.to_string();
    if let Some(seconds) = port.session_affinity_seconds {
        for ep in endpoints {
            let address = ep.address();
            let sep = names::endpoint_chain(&port.name, &address);
            let text = comment(&format!("{name} -> {address}"));
            out.push_chain_rule(
                chain,
                format!(
                    "{text} -m recent --name {sep} --rcheck --seconds {seconds} --reap -j {sep}"
                ),
            );
        }
    }
    let count = endpoints.len();
    for (i, ep) in endpoints.iter().enumerate() {
        let address = ep.address();
        let sep = names::endpoint_chain(&port.name, &address);
        let text = comment(&format!("{name} -> {address}"));
        let spec = if i + 1 < count {
            format!(
                "{text} -m statistic --mode random --probability {} -j {sep}",
                probability(count - i)
            )
        } else {
            format!("{text} -j {sep}")
        };
        out.push_chain_rule(chain, spec);
    }
}

/// The rules that do not depend on services: masquerading, forwarding, the localnet firewall and
/// the jump to KUBE-NODEPORTS that must stay last in nat KUBE-SERVICES.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BaseRules {
    pub filter: Vec<Rule>,
    pub nat: Vec<Rule>,
    /// The last rules of nat KUBE-SERVICES.
    pub nat_services_tail: Vec<Rule>,
}

impl BaseRules {
    /// Whether this family writes the localnet rule into KUBE-FIREWALL (IPv4 with localhost
    /// NodePorts). The chain is the kubelet's too: elsewhere we neither declare (flush) it nor
    /// jump to it, as upstream.
    pub fn writes_firewall(&self) -> bool {
        self.filter.iter().any(|rule| rule.chain == KUBE_FIREWALL)
    }

    /// The filter chains this family declares.
    pub fn filter_chains(&self) -> Vec<&'static str> {
        FILTER_CHAINS
            .into_iter()
            .filter(|chain| *chain != KUBE_FIREWALL || self.writes_firewall())
            .collect()
    }

    /// The jumps from built-in chains this family's chains need.
    pub fn jumps(&self) -> Vec<JumpRule> {
        JUMP_RULES
            .into_iter()
            .filter(|jump| jump.to != KUBE_FIREWALL || self.writes_firewall())
            .collect()
    }
}

/// Renders the rules that do not depend on services.
pub fn render_base(ctx: &RenderContext) -> BaseRules {
    let mark = format!("{:#x}", ctx.common.masquerade_mark);
    let mut base = BaseRules::default();
    let v4 = ctx.common.family == IpFamily::V4;
    // Also with the userspace proxy, which leaves route_localnet as it found it: a node where
    // it is on (an earlier iptables mode's, say) must still drop martian localnet traffic.
    if v4 && (ctx.localhost_node_ports || ctx.localhost_proxy) {
        base.filter.push(Rule::new(
            KUBE_FIREWALL,
            format!(
                "{} -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
                comment("block incoming localnet connections")
            ),
        ));
    }
    if !ctx.tcp_be_liberal {
        let counted = if ctx.nfacct.invalid_dropped {
            format!(" -m nfacct --nfacct-name {CT_STATE_INVALID_DROPPED}")
        } else {
            String::new()
        };
        base.filter.push(Rule::new(
            KUBE_FORWARD,
            format!("-m conntrack --ctstate INVALID{counted} -j DROP"),
        ));
    }
    base.filter.push(Rule::new(
        KUBE_FORWARD,
        format!(
            "{} -m mark --mark {mark}/{mark} -j ACCEPT",
            comment("kubernetes forwarding rules")
        ),
    ));
    base.filter.push(Rule::new(
        KUBE_FORWARD,
        format!(
            "{} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            comment("kubernetes forwarding conntrack rule")
        ),
    ));

    base.nat.push(Rule::new(
        KUBE_POSTROUTING,
        format!("-m mark ! --mark {mark}/{mark} -j RETURN"),
    ));
    base.nat.push(Rule::new(
        KUBE_POSTROUTING,
        format!("-j MARK --xor-mark {mark}"),
    ));
    base.nat.push(Rule::new(
        KUBE_POSTROUTING,
        format!(
            "{} -j MASQUERADE --random-fully",
            comment("kubernetes service traffic requiring SNAT")
        ),
    ));
    base.nat.push(Rule::new(
        KUBE_MARK_MASQ,
        format!("-j MARK --or-mark {mark}"),
    ));

    let last =
        comment("kubernetes service nodeports; NOTE: this must be the last rule in this chain");
    match &ctx.node_port_addresses {
        NodePortAddresses::All => {
            let exclude = if !v4 {
                " ! -d ::1/128"
            } else if !ctx.localhost_node_ports {
                " ! -d 127.0.0.0/8"
            } else {
                ""
            };
            base.nat_services_tail.push(Rule::new(
                KUBE_SERVICES,
                format!("{last} -m addrtype --dst-type LOCAL{exclude} -j {KUBE_NODEPORTS}"),
            ));
        }
        NodePortAddresses::Only(ips) => {
            for ip in ips
                .iter()
                .filter(|ip| IpFamily::of(ip) == ctx.common.family)
            {
                if ip.is_loopback() && (!v4 || !ctx.localhost_node_ports) {
                    continue;
                }
                base.nat_services_tail.push(Rule::new(
                    KUBE_SERVICES,
                    format!("{last} -d {ip} -j {KUBE_NODEPORTS}"),
                ));
            }
        }
    }
    base
}

/// upstream's iptablesJumpChains plus the kubelet's KUBE-FIREWALL jumps.
pub const JUMP_RULES: [JumpRule; 14] = [
    JumpRule {
        table: "filter",
        from: "INPUT",
        to: KUBE_EXTERNAL_SERVICES,
        spec: "-m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\"",
    },
    JumpRule {
        table: "filter",
        from: "FORWARD",
        to: KUBE_EXTERNAL_SERVICES,
        spec: "-m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\"",
    },
    JumpRule {
        table: "filter",
        from: "INPUT",
        to: KUBE_NODEPORTS,
        spec: "-m comment --comment \"kubernetes health check service ports\"",
    },
    JumpRule {
        table: "filter",
        from: "FORWARD",
        to: KUBE_SERVICES,
        spec: "-m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\"",
    },
    JumpRule {
        table: "filter",
        from: "OUTPUT",
        to: KUBE_SERVICES,
        spec: "-m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\"",
    },
    JumpRule {
        table: "filter",
        from: "FORWARD",
        to: KUBE_FORWARD,
        spec: "-m comment --comment \"kubernetes forwarding rules\"",
    },
    JumpRule {
        table: "filter",
        from: "INPUT",
        to: KUBE_PROXY_FIREWALL,
        spec: "-m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\"",
    },
    JumpRule {
        table: "filter",
        from: "OUTPUT",
        to: KUBE_PROXY_FIREWALL,
        spec: "-m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\"",
    },
    JumpRule {
        table: "filter",
        from: "FORWARD",
        to: KUBE_PROXY_FIREWALL,
        spec: "-m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\"",
    },
    JumpRule {
        table: "nat",
        from: "OUTPUT",
        to: KUBE_SERVICES,
        spec: "-m comment --comment \"kubernetes service portals\"",
    },
    JumpRule {
        table: "nat",
        from: "PREROUTING",
        to: KUBE_SERVICES,
        spec: "-m comment --comment \"kubernetes service portals\"",
    },
    JumpRule {
        table: "nat",
        from: "POSTROUTING",
        to: KUBE_POSTROUTING,
        spec: "-m comment --comment \"kubernetes postrouting rules\"",
    },
    JumpRule {
        table: "filter",
        from: "INPUT",
        to: KUBE_FIREWALL,
        spec: "",
    },
    JumpRule {
        table: "filter",
        from: "OUTPUT",
        to: KUBE_FIREWALL,
        spec: "",
    },
];
