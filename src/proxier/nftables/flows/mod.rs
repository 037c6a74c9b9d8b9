//! Upstream's packet-flow tables (`crate::proxier::flows`) through nftables mode: the table
//! rendered for each scenario is applied to the stateful fake, then each flow is traced by the
//! nf_tables tracer (`crate::sys::nf_tables::trace`, on the fake's state compiled as the kernel
//! holds it) and explained by `explain` (reading the same fake), and both must say what the
//! table expects. Where upstream's nftables file expects otherwise than its iptables file, the
//! tests follow the nftables file and say so.

mod mutations;
mod upstream;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use super::explain::Session;
use super::render::NftContext;
use super::render::tests::{dump, table};
use crate::model::IpFamily;
use crate::proxier::explanation::{Explanation, Flow, Outcome};
use crate::proxier::flows::{Case, Scenario, Verdict, explained};
use crate::proxier::local::{NodePortAddresses, NodePortSelection};
use crate::sys::nf_tables::Nftables;
use crate::sys::nf_tables::fake::FakeNftables;
use crate::sys::nf_tables::trace::{Fate, Packet, Path, Ruleset, trace};

/// The ServiceCIDRs of upstream's nftables fake proxier.
const SERVICE_CIDRS: [&str; 2] = ["172.30.0.0/16", "fd00:10:96::/112"];

/// Upstream's nftables fake proxier for a scenario: nodePortAddresses the node's primary
/// address unless the scenario sets them, the ServiceCIDR of its family, no localhost NodePorts.
pub fn context(scenario: &Scenario) -> NftContext {
    let common = scenario.common.clone();
    let node_port_addresses = match &scenario.node_port_addresses {
        Some(configured) => {
            NodePortSelection::new(configured).addresses(common.node_ip, || scenario.addresses())
        }
        None => NodePortAddresses::Only(common.node_ip.into_iter().collect()),
    };
    let service_cidrs = SERVICE_CIDRS
        .iter()
        .map(|c| c.parse().unwrap())
        .filter(|c: &ipnet::IpNet| IpFamily::of(&c.addr()) == common.family)
        .collect();
    NftContext {
        common,
        node_port_addresses,
        service_cidrs,
        localhost_rejects: Vec::new(),
    }
}

/// The fake holding the scenario's table: every object declared before the rules and
/// elements that name it, as a full sync writes them.
pub fn programmed(scenario: &Scenario, ctx: &NftContext) -> FakeNftables {
    let text = dump(&table(&scenario.services, ctx), ctx);
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_by_key(|line| {
        ["add rule ", "add element "]
            .iter()
            .position(|p| line.starts_with(p))
    });
    let mut nft = FakeNftables::default();
    nft.apply(&lines.join("\n"))
        .expect("the fake takes the rendered table");
    nft
}

/// The paths a trace finds, as a flow's verdict: every path dropped or rejected, or the
/// endpoints the accepted paths reach and whether any is masqueraded. Each path's weight is
/// checked too: together they make one.
pub fn traced(paths: &[Path]) -> Verdict {
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
                .filter_map(|p| p.dnat.map(|d| d.to_string()))
                .collect(),
            masquerade: paths.iter().any(|p| p.masquerade),
        },
        mixed => panic!("paths with different fates {mixed:?}: {paths:#?}"),
    }
}

/// Each endpoint's probability, as the trace's paths weigh it.
fn shares(paths: &[Path]) -> BTreeMap<SocketAddr, f64> {
    let mut shares = BTreeMap::new();
    for path in paths {
        if let Some(endpoint) = path.dnat {
            *shares.entry(endpoint).or_default() += path.weight;
        }
    }
    shares
}

/// Each endpoint's probability, as `explain` gives it.
fn explained_shares(explanation: &Explanation) -> BTreeMap<SocketAddr, f64> {
    match &explanation.outcome {
        Outcome::Dnat { candidates } | Outcome::Relayed { candidates, .. } => candidates
            .iter()
            .map(|c| (c.endpoint, c.probability))
            .collect(),
        _ => BTreeMap::new(),
    }
}

fn same_shares(a: &BTreeMap<SocketAddr, f64>, b: &BTreeMap<SocketAddr, f64>) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|((x, p), (y, q))| x == y && (p - q).abs() < 1e-9)
}

/// The trace of one case through `ruleset`.
pub fn trace_case(ruleset: &Ruleset, local: &[IpAddr], case: &Case) -> Vec<Path> {
    let packet = Packet {
        src: case.src.parse().unwrap(),
        dst: case.dst.parse().unwrap(),
        sport: 40000,
        dport: case.port,
        protocol: case.protocol,
        from_node: case.from_node,
    };
    trace(ruleset, local, &packet).unwrap_or_else(|e| panic!("{}: tracing: {e}", case.name))
}

/// Runs a scenario: every flow traced and explained, both as the table expects.
pub fn run(scenario: &Scenario) {
    let ctx = context(scenario);
    let nft = programmed(scenario, &ctx);
    let wrong = disagreements(scenario, &nft);
    assert!(wrong.is_empty(), "{}:\n{}", scenario.name, wrong.join("\n"));
}

/// Where the tracer or `explain`, each on the table `nft` holds, says otherwise than the
/// scenario expects: one line per flow and witness.
pub fn disagreements(scenario: &Scenario, nft: &FakeNftables) -> Vec<String> {
    let local = scenario.addresses();
    let ruleset = Ruleset::from_fake(nft, scenario.common.family).expect("the fake's ruleset");
    let mut explaining = Session::with(Box::new(nft.clone()), local.clone());
    let mut wrong = Vec::new();
    for case in &scenario.cases {
        let paths = trace_case(&ruleset, &local, case);
        let verdict = traced(&paths);
        if verdict != case.want {
            wrong.push(format!(
                "traced {:?}: {verdict:?}, expected {:?}; paths {paths:#?}",
                case.name, case.want
            ));
        }
        let destination = SocketAddr::new(case.dst.parse().unwrap(), case.port);
        let flow = Flow::parse(
            &format!("{destination}/{}", case.protocol.lower()),
            Some(case.src),
        )
        .unwrap();
        let explanation = explaining.explain(&flow).unwrap();
        let verdict = explained(&explanation);
        if verdict != case.want {
            wrong.push(format!(
                "explained {:?}: {verdict:?}, expected {:?}; {explanation:#?}",
                case.name, case.want
            ));
        } else if !same_shares(&shares(&paths), &explained_shares(&explanation)) {
            wrong.push(format!(
                "probabilities of {:?}: traced {:?}, explained {:?}",
                case.name,
                shares(&paths),
                explained_shares(&explanation)
            ));
        }
    }
    wrong
}
