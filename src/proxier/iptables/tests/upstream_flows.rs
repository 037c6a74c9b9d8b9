//! Upstream's packet-flow tables (`crate::proxier::flows`, from
//! `pkg/proxy/iptables/proxier_test.go`) through our rules: each flow traced and explained,
//! which agree with the table. iptables mode is the tables' reference: nothing differs.

use super::tracer_cases::{run_scenario, scenario_disagreements};
use crate::proxier::flows;
use crate::sys::xtables::Iptables;
use crate::sys::xtables::fake::FakeIptables;

#[test]
fn internal_external_masquerade() {
    run_scenario(&flows::internal_external_masquerade(false, true));
}

#[test]
fn internal_external_masquerade_without_a_local_traffic_detector() {
    run_scenario(&flows::internal_external_masquerade(false, false));
}

#[test]
fn internal_external_masquerade_with_masquerade_all() {
    run_scenario(&flows::internal_external_masquerade(true, true));
}

#[test]
fn internal_external_masquerade_with_masquerade_all_and_no_detector() {
    run_scenario(&flows::internal_external_masquerade(true, false));
}

#[test]
fn node_ports_under_localhost_node_ports_and_node_port_addresses() {
    flows::node_ports().iter().for_each(run_scenario);
}

#[test]
fn no_endpoints_reject() {
    run_scenario(&flows::no_endpoints_reject());
}

#[test]
fn cluster_ip_general() {
    run_scenario(&flows::cluster_ip_general());
}

#[test]
fn load_balancer_with_source_ranges() {
    run_scenario(&flows::load_balancer());
}

#[test]
fn external_traffic_policy_local() {
    run_scenario(&flows::external_traffic_policy_local());
}

#[test]
fn external_traffic_policy_cluster() {
    run_scenario(&flows::external_traffic_policy_cluster());
}

#[test]
fn terminating_endpoints_under_a_cluster_policy() {
    flows::terminating_endpoints_cluster()
        .iter()
        .for_each(run_scenario);
}

#[test]
fn terminating_endpoints_under_a_local_policy() {
    flows::terminating_endpoints_local()
        .iter()
        .for_each(run_scenario);
}

#[test]
fn internal_traffic_policy() {
    flows::internal_traffic_policy()
        .iter()
        .for_each(run_scenario);
}

/// Each table broken on purpose: nat's and filter's service chains emptied, after which the
/// tracer and `explain` must both disagree with the table somewhere.
#[test]
fn each_table_fails_without_the_service_chains() {
    let emptied = |ipt: &mut FakeIptables| {
        let input = "*nat\n-F KUBE-SERVICES\n-F KUBE-NODEPORTS\nCOMMIT\n*filter\n-F KUBE-SERVICES\n-F KUBE-EXTERNAL-SERVICES\n-F KUBE-PROXY-FIREWALL\nCOMMIT\n";
        ipt.restore(crate::model::IpFamily::V4, input).unwrap();
    };
    let mut tables = vec![
        flows::internal_external_masquerade(false, true),
        flows::internal_external_masquerade(false, false),
        flows::internal_external_masquerade(true, true),
        flows::internal_external_masquerade(true, false),
        flows::node_ports().remove(0),
        flows::no_endpoints_reject(),
        flows::cluster_ip_general(),
        flows::load_balancer(),
        flows::external_traffic_policy_local(),
        flows::external_traffic_policy_cluster(),
    ];
    tables.push(flows::terminating_endpoints_cluster().remove(0));
    tables.push(flows::terminating_endpoints_local().remove(0));
    tables.push(flows::internal_traffic_policy().remove(0));
    for scenario in &tables {
        let wrong = scenario_disagreements(scenario, emptied);
        flows::assert_broken(scenario, "the service chains emptied", &wrong);
    }
}
