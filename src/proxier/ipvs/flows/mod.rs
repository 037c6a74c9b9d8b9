//! Upstream's packet-flow tables (`crate::proxier::flows`) through IPVS mode, on its fakes: each
//! scenario is synced by the IPVS proxier into fakes of IPVS, the links, ipset and iptables,
//! then each flow is traced (iptables' nat and filter rules with their set matches, IPVS's
//! virtual server, then postrouting's masquerade) and explained by `explain` reading the same
//! fakes, and both must say what the table expects. Upstream has no IPVS flow tables: the
//! expectations are iptables mode's, and where IPVS differs by design the tests say so.

mod mutations;
mod tracer;
mod upstream;

use std::cell::RefCell;
use std::net::IpAddr;

use super::explain::Session;
use super::proxier::{DUMMY_LINK, IpvsKernel, IpvsProxier};
use super::settings::IpvsSettings;
use crate::config::KubeProxyConfiguration;
use crate::model::{ChangeSummary, NodeInfo, ProxyState};
use crate::proxier::Proxier;
use crate::proxier::fixtures::NODE;
use crate::proxier::flows::{Scenario, disagreements_of, flow_of};
use crate::proxier::local::LocalDetector;
use crate::sys::host::link::fake::FakeLinks;
use crate::sys::host::net::{FakeSysctl, FixedAddresses};
use crate::sys::ipset::fake::FakeIpset;
use crate::sys::ipvs::fake::FakeIpvs;
use crate::sys::xtables::fake::{FakeIptables, SharedIptables};

/// What a sync leaves in the fakes.
pub struct Node {
    pub ipvs: FakeIpvs,
    pub ipset: FakeIpset,
    pub iptables: FakeIptables,
    /// The node's addresses, and kube-ipvs0's.
    pub local: Vec<IpAddr>,
}

/// IPVS mode's settings for a scenario: its masquerading, local-traffic detection and
/// nodePortAddresses.
fn settings(scenario: &Scenario) -> IpvsSettings {
    let mut config = KubeProxyConfiguration {
        cluster_cidr: match &scenario.common.local_detector {
            LocalDetector::Cidrs(cidrs) => cidrs
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(","),
            _ => String::new(),
        },
        node_port_addresses: scenario.node_port_addresses.clone().unwrap_or_default(),
        ..KubeProxyConfiguration::default()
    };
    config.iptables.masquerade_all = scenario.common.masquerade_all;
    config.apply_defaults();
    IpvsSettings::from_config(&config)
}

/// The scenario synced by IPVS mode into fresh fakes.
pub fn programmed(scenario: &Scenario) -> Node {
    let iptables = SharedIptables::default();
    let addresses: Vec<IpAddr> = scenario
        .addresses()
        .into_iter()
        .filter(|a| !a.is_loopback())
        .collect();
    let kernel = IpvsKernel {
        ipvs: FakeIpvs::default(),
        links: FakeLinks::default(),
        ipset: FakeIpset::default(),
        iptables: Box::new(iptables.clone()),
        sysctl: Box::new(FakeSysctl::default()),
        addresses: Box::new(FixedAddresses(addresses.clone())),
    };
    let mut proxier: IpvsProxier<FakeIpvs, FakeLinks, FakeIpset> =
        IpvsProxier::on(kernel, settings(scenario));
    let mut state = ProxyState {
        node: NodeInfo {
            name: NODE.into(),
            addresses: scenario.common.node_ip.into_iter().collect(),
            ..NodeInfo::default()
        },
        ..ProxyState::default()
    };
    for s in &scenario.services {
        state.services.insert(s.key.clone(), s.ports.clone());
        state.endpoints.insert(s.key.clone(), s.endpoints.clone());
    }
    proxier
        .sync(&state, &ChangeSummary::default())
        .expect("the fakes take the sync");
    let mode = proxier.mode;
    let mut local = addresses;
    local.extend(mode.links.bound(DUMMY_LINK));
    let iptables = iptables.fake();
    Node {
        ipvs: mode.ipvs,
        ipset: mode.ipset,
        iptables,
        local,
    }
}

/// Runs a scenario: every flow traced and explained, both as the table expects.
pub fn run(scenario: &Scenario) {
    let node = programmed(scenario);
    let wrong = disagreements(scenario, &node);
    assert!(wrong.is_empty(), "{}:\n{}", scenario.name, wrong.join("\n"));
}

/// Where the tracer or `explain`, each on the fakes `node` holds, says otherwise than the
/// scenario expects.
pub fn disagreements(scenario: &Scenario, node: &Node) -> Vec<String> {
    let ipset = RefCell::new(node.ipset.clone());
    let mut session = Session::with(
        Box::new(node.ipvs.clone()),
        Box::new(node.ipset.clone()),
        node.local.clone(),
    );
    let mut wrong = Vec::new();
    for case in &scenario.cases {
        let traced = tracer::trace(node, &ipset, scenario.common.family, case);
        let mut iptables = node.iptables.clone();
        let explanation = session
            .explain_with_masquerade(&flow_of(case), &mut iptables)
            .unwrap();
        wrong.extend(disagreements_of(case, &traced, &explanation));
    }
    wrong
}
