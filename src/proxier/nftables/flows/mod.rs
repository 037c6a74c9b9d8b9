//! Upstream's packet-flow tables (`crate::proxier::flows`) through nftables mode: the table
//! rendered for each scenario is applied to the stateful fake, then each flow is traced by the
//! nf_tables tracer (`crate::sys::nf_tables::trace`, on the fake's state compiled as the kernel
//! holds it) and explained by `explain` (reading the same fake), and both must say what the
//! table expects. Where upstream's nftables file expects otherwise than its iptables file, the
//! tests follow the nftables file and say so.

mod mutations;
mod upstream;

use std::net::IpAddr;

use super::explain::Session;
use super::render::NftContext;
use super::render::tests::{dump, table};
use crate::model::IpFamily;
use crate::proxier::flows::{Case, Fate, Scenario, Traced, disagreements_of, flow_of};
use crate::proxier::local::{NodePortAddresses, NodePortSelection};
use crate::sys::nf_tables::Nftables;
use crate::sys::nf_tables::fake::FakeNftables;
use crate::sys::nf_tables::trace::{self, Packet, Ruleset, trace};

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
        offload_after_packets: None,
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

/// The trace of one case through `ruleset`, as the tables compare paths.
pub fn trace_case(ruleset: &Ruleset, local: &[IpAddr], case: &Case) -> Vec<Traced> {
    let packet = Packet {
        src: case.src.parse().unwrap(),
        dst: case.dst.parse().unwrap(),
        sport: 40000,
        dport: case.port,
        protocol: case.protocol,
        from_node: case.from_node,
    };
    let paths =
        trace(ruleset, local, &packet).unwrap_or_else(|e| panic!("{}: tracing: {e}", case.name));
    paths
        .into_iter()
        .map(|path| Traced {
            weight: path.weight,
            fate: match path.fate {
                trace::Fate::Accepted => Fate::Accepted,
                trace::Fate::Dropped => Fate::Dropped,
                trace::Fate::Rejected => Fate::Rejected,
            },
            endpoint: path.dnat,
            masquerade: path.masquerade,
        })
        .collect()
}

/// Runs a scenario: every flow traced and explained, both as the table expects.
pub fn run(scenario: &Scenario) {
    let ctx = context(scenario);
    let nft = programmed(scenario, &ctx);
    let wrong = disagreements(scenario, &nft);
    assert!(wrong.is_empty(), "{}:\n{}", scenario.name, wrong.join("\n"));
}

/// Where the tracer or `explain`, each on the table `nft` holds, says otherwise than the
/// scenario expects.
pub fn disagreements(scenario: &Scenario, nft: &FakeNftables) -> Vec<String> {
    let local = scenario.addresses();
    let ruleset = Ruleset::from_fake(nft, scenario.common.family).expect("the fake's ruleset");
    let mut explaining = Session::with(Box::new(nft.clone()), local.clone());
    let mut wrong = Vec::new();
    for case in &scenario.cases {
        let traced = trace_case(&ruleset, &local, case);
        let explanation = explaining.explain(&flow_of(case)).unwrap();
        wrong.extend(disagreements_of(case, &traced, &explanation));
    }
    wrong
}
