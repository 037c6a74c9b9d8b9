//! Upstream's packet-flow tables as data, for every mode to run through its rules, its own
//! packet tracer and `explain` (`pkg/proxy/iptables/proxier_test.go` and
//! `pkg/proxy/nftables/proxier_test.go`, 1.37's development copies). A table is a list of
//! [`Scenario`]s: the Services, the node, and the flows with what each meets. Where a mode's
//! rules differ from iptables mode's by design, its tests say so with [`Scenario::differs`],
//! which must name a flow and change what it expects.

mod masquerade;
mod node_ports;
mod policies;
mod services;

use std::collections::{BTreeMap, BTreeSet};

pub use masquerade::internal_external_masquerade;
pub use node_ports::{node_ports, node_ports_nftables};
pub use policies::{
    external_traffic_policy_cluster, external_traffic_policy_local, internal_traffic_policy,
    terminating_endpoints_cluster, terminating_endpoints_local,
};
pub use services::{cluster_ip_general, load_balancer, no_endpoints_reject};

use crate::model::Protocol;
use crate::proxier::context::FamilyContext;
use crate::proxier::explanation::{Explanation, Flow, Outcome};
use crate::proxier::fixtures::{NODE_IP, Svc};

/// What a flow meets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Delivered: to these endpoints (none: delivered unchanged), masqueraded or not.
    Accept {
        endpoints: BTreeSet<String>,
        masquerade: bool,
    },
    Drop,
    Reject,
}

/// Delivered to `endpoints` (`ip:port`), masqueraded or not.
pub fn accept(endpoints: &[&str], masquerade: bool) -> Verdict {
    Verdict::Accept {
        endpoints: endpoints.iter().map(|e| e.to_string()).collect(),
        masquerade,
    }
}

/// Delivered unchanged: no rule of ours touches it.
pub fn untouched() -> Verdict {
    accept(&[], false)
}

/// One flow: the first packet of a connection.
#[derive(Clone, Debug)]
pub struct Case {
    pub name: &'static str,
    pub src: &'static str,
    pub dst: &'static str,
    pub port: u16,
    pub protocol: Protocol,
    /// Sent by a process on the node rather than arriving.
    pub from_node: bool,
    pub want: Verdict,
}

/// A TCP flow to `dst:port` and what it meets; sent by the node itself when its source is
/// the node's address or the loopback.
pub fn case(
    name: &'static str,
    (src, dst, port): (&'static str, &'static str, u16),
    want: Verdict,
) -> Case {
    Case {
        name,
        src,
        dst,
        port,
        protocol: Protocol::Tcp,
        from_node: src == NODE_IP || src == LOCALHOST || src == "::1" || src == NODE_IP6,
        want,
    }
}

/// A flow delivered to `endpoints`, masqueraded or not.
pub fn flow(
    name: &'static str,
    target: (&'static str, &'static str, u16),
    endpoints: &[&str],
    masquerade: bool,
) -> Case {
    case(name, target, accept(endpoints, masquerade))
}

/// Upstream's test addresses: a pod on this node, a client outside the cluster, the loopback,
/// and the node's IPv6 address.
pub const POD: &str = "10.0.0.2";
pub const EXTERNAL: &str = "203.0.113.2";
pub const LOCALHOST: &str = "127.0.0.1";
pub const NODE_IP6: &str = "2001:db8::1";

/// Upstream's fake network's IPv4 addresses (lo and eth0): its external IP is the node's too.
pub const NODE_ADDRESSES: &[&str] = &["127.0.0.1", NODE_IP, "192.168.1.2", "192.168.99.11"];

/// One run of a table: the Services on a node, and the flows.
pub struct Scenario {
    /// The upstream test and subcase, printed with a failure.
    pub name: String,
    pub services: Vec<Svc>,
    /// The family, node, masquerading and local-traffic detection.
    pub common: FamilyContext,
    /// localhostNodePorts (iptables mode's flag).
    pub localhost_node_ports: bool,
    /// nodePortAddresses as configured; `None`: the mode's default.
    pub node_port_addresses: Option<Vec<String>>,
    /// The node's addresses.
    pub addresses: Vec<&'static str>,
    pub cases: Vec<Case>,
}

impl Scenario {
    /// Upstream's fake proxier's node (IPv4, pod CIDR 10.0.0.0/8, mark 0x4000) with `services`.
    pub fn new(name: impl Into<String>, services: Vec<Svc>, cases: Vec<Case>) -> Self {
        Scenario {
            name: name.into(),
            services,
            common: crate::proxier::fixtures::family_context(
                crate::model::IpFamily::V4,
                NODE_IP,
                "10.0.0.0/8",
            ),
            localhost_node_ports: true,
            node_port_addresses: None,
            addresses: NODE_ADDRESSES.to_vec(),
            cases,
        }
    }

    /// Flow `name` meets `want` in this mode instead: the mode differs there by design. The
    /// flow must exist and the expectation change.
    pub fn differs(&mut self, name: &str, want: Verdict) -> &mut Self {
        let Some(case) = self.cases.iter_mut().find(|c| c.name == name) else {
            panic!("{}: no flow {name:?} to differ from", self.name);
        };
        assert_ne!(
            case.want, want,
            "{}: {name:?} differs in nothing",
            self.name
        );
        case.want = want;
        self
    }

    /// A flow only this mode's upstream file has.
    pub fn adds(&mut self, case: Case) -> &mut Self {
        assert!(
            self.cases.iter().all(|c| c.name != case.name),
            "{}: {:?} is there already",
            self.name,
            case.name
        );
        self.cases.push(case);
        self
    }

    /// The node's addresses, parsed.
    pub fn addresses(&self) -> Vec<std::net::IpAddr> {
        self.addresses.iter().map(|a| a.parse().unwrap()).collect()
    }
}

/// What an explanation says, as a flow's verdict: its endpoints, and whether a step marks the
/// flow for masquerading (or masquerades it as a hairpin).
pub fn explained(explanation: &Explanation) -> Verdict {
    let masquerade = explanation.steps.iter().any(|step| {
        step.contains(": marked for masquerade") || step.contains("back to itself (hairpin)")
    });
    match &explanation.outcome {
        Outcome::Dnat { candidates } | Outcome::Relayed { candidates, .. } => Verdict::Accept {
            endpoints: candidates.iter().map(|c| c.endpoint.to_string()).collect(),
            masquerade,
        },
        Outcome::Untouched { .. } => Verdict::Accept {
            endpoints: BTreeSet::new(),
            masquerade,
        },
        Outcome::Drop { .. } => Verdict::Drop,
        Outcome::Reject { .. } => Verdict::Reject,
    }
}

/// How a traced path ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fate {
    Accepted,
    Dropped,
    Rejected,
}

/// One way a mode's tracer found through the node, as the tables compare it.
#[derive(Clone, Debug)]
pub struct Traced {
    /// Its probability.
    pub weight: f64,
    pub fate: Fate,
    /// Where DNAT sent it.
    pub endpoint: Option<std::net::SocketAddr>,
    pub masquerade: bool,
}

/// The paths as a flow's verdict: every path dropped or rejected, or the endpoints the
/// accepted ones reach and whether any is masqueraded. Their weights make one.
pub fn traced_verdict(paths: &[Traced]) -> Verdict {
    let total: f64 = paths.iter().map(|p| p.weight).sum();
    assert!(
        (total - 1.0).abs() < 1e-9,
        "weights add up to {total}: {paths:#?}"
    );
    let fates: BTreeSet<Fate> = paths.iter().map(|p| p.fate).collect();
    match fates.into_iter().collect::<Vec<_>>().as_slice() {
        [Fate::Dropped] => Verdict::Drop,
        [Fate::Rejected] => Verdict::Reject,
        [Fate::Accepted] => Verdict::Accept {
            endpoints: paths
                .iter()
                .filter_map(|p| p.endpoint.map(|e| e.to_string()))
                .collect(),
            masquerade: paths.iter().any(|p| p.masquerade),
        },
        mixed => panic!("paths with different fates {mixed:?}: {paths:#?}"),
    }
}

/// Each endpoint's probability, as the paths weigh it.
fn traced_shares(paths: &[Traced]) -> BTreeMap<std::net::SocketAddr, f64> {
    let mut shares = BTreeMap::new();
    for path in paths {
        if let Some(endpoint) = path.endpoint {
            *shares.entry(endpoint).or_default() += path.weight;
        }
    }
    shares
}

/// Each endpoint's probability, as `explain` gives it.
fn explained_shares(explanation: &Explanation) -> BTreeMap<std::net::SocketAddr, f64> {
    match &explanation.outcome {
        Outcome::Dnat { candidates } | Outcome::Relayed { candidates, .. } => candidates
            .iter()
            .map(|c| (c.endpoint, c.probability))
            .collect(),
        _ => BTreeMap::new(),
    }
}

/// The flow `explain` is asked about for `case`.
pub fn flow_of(case: &Case) -> Flow {
    let destination = std::net::SocketAddr::new(case.dst.parse().unwrap(), case.port);
    Flow::parse(
        &format!("{destination}/{}", case.protocol.lower()),
        Some(case.src),
    )
    .unwrap()
}

/// Where a case's trace or explanation says otherwise than the table (or they give an
/// endpoint different probabilities): one line per witness.
pub fn disagreements_of(case: &Case, traced: &[Traced], explanation: &Explanation) -> Vec<String> {
    let mut wrong = Vec::new();
    let verdict = traced_verdict(traced);
    if verdict != case.want {
        wrong.push(format!(
            "traced {:?}: {verdict:?}, expected {:?}; {traced:#?}",
            case.name, case.want
        ));
    }
    let verdict = explained(explanation);
    if verdict != case.want {
        wrong.push(format!(
            "explained {:?}: {verdict:?}, expected {:?}; {explanation:#?}",
            case.name, case.want
        ));
        return wrong;
    }
    let accepted: BTreeSet<bool> = traced
        .iter()
        .filter(|p| p.fate == Fate::Accepted)
        .map(|p| p.masquerade)
        .collect();
    if accepted.len() > 1 {
        wrong.push(format!(
            "traced {:?}: masqueraded on some paths only; {traced:#?}",
            case.name
        ));
    }
    let (ours, theirs) = (traced_shares(traced), explained_shares(explanation));
    // Every endpoint of these tables is as good as the others: each gets an equal share (the
    // draws of an endpoint map split as evenly as they go).
    let even = 1.0 / ours.len().max(1) as f64;
    if ours.values().any(|share| (share - even).abs() > 1e-3) {
        wrong.push(format!("traced {:?}: shares {ours:?}, not even", case.name));
    }
    let same = ours.len() == theirs.len()
        && ours
            .iter()
            .zip(&theirs)
            .all(|((x, p), (y, q))| x == y && (p - q).abs() < 1e-9);
    if !same {
        wrong.push(format!(
            "probabilities of {:?}: traced {ours:?}, explained {theirs:?}",
            case.name
        ));
    }
    wrong
}

/// A table broken on purpose (`what`) must make both the tracer and `explain` disagree.
pub fn assert_broken(scenario: &Scenario, what: &str, wrong: &[String]) {
    for witness in ["traced", "explained"] {
        assert!(
            wrong.iter().any(|w| w.starts_with(witness)),
            "{}: with {what}, nothing {witness} disagrees: {wrong:#?}",
            scenario.name
        );
    }
}
