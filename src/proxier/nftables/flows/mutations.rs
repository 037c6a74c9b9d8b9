//! Each table broken on purpose: one object of the programmed table removed, after which the
//! tracer and `explain` must both disagree with the table somewhere (so neither passes a table
//! whatever the rules say).

use super::upstream::masquerade;
use super::{context, disagreements, programmed};
use crate::proxier::flows::{self, Scenario, Verdict, assert_broken, case};
use crate::sys::nf_tables::Nftables;

fn breaks(scenario: &Scenario, mutation: &str) {
    let mut nft = programmed(scenario, &context(scenario));
    nft.apply(mutation).expect("the fake takes the mutation");
    assert_broken(scenario, mutation, &disagreements(scenario, &nft));
}

const DELETE: &str = "delete element ip kube-proxy";

#[test]
fn each_masquerade_variant_fails_without_a_load_balancer_ip() {
    for (all, detector) in [(false, true), (false, false), (true, true), (true, false)] {
        breaks(
            &masquerade(all, detector),
            &format!("{DELETE} service-ips {{ 1.2.3.4 . tcp . 80 }}"),
        );
    }
}

#[test]
fn node_ports_fail_without_the_node_address() {
    let scenarios = flows::node_ports_nftables();
    breaks(
        &scenarios[0],
        &format!("{DELETE} nodeport-ips {{ 192.168.0.2 }}"),
    );
    breaks(
        &scenarios[2],
        "delete element ip6 kube-proxy nodeport-ips { 2001:db8::1 }",
    );
}

#[test]
fn no_endpoints_reject_fails_without_its_refusal() {
    breaks(
        &flows::no_endpoints_reject(),
        &format!("{DELETE} no-endpoint-services {{ 1.2.3.4 . tcp . 80 }}"),
    );
}

#[test]
fn cluster_ip_general_fails_without_a_cluster_ip() {
    let mut scenario = flows::cluster_ip_general();
    scenario.adds(case(
        "packet to unallocated cluster ip",
        ("10.180.0.2", "172.30.0.50", 80),
        Verdict::Drop,
    ));
    scenario
        .differs("TCP-only port does not match UDP traffic", Verdict::Reject)
        .differs("svc1 does not accept svc2's ports", Verdict::Reject);
    breaks(
        &scenario,
        &format!("{DELETE} service-ips {{ 172.30.0.41 . tcp . 80 }}"),
    );
}

#[test]
fn load_balancer_fails_without_its_source_ranges() {
    breaks(
        &flows::load_balancer(),
        &format!("{DELETE} firewall-ips {{ 1.2.3.4 . tcp . 80 }}"),
    );
}

#[test]
fn external_traffic_policies_fail_without_their_node_port() {
    for scenario in [
        flows::external_traffic_policy_local(),
        flows::external_traffic_policy_cluster(),
    ] {
        breaks(
            &scenario,
            &format!("{DELETE} service-nodeports {{ tcp . 3001 }}"),
        );
    }
}

#[test]
fn terminating_endpoints_and_internal_policy_fail_without_their_cluster_ip() {
    let mutation = format!("{DELETE} service-ips {{ 172.30.1.1 . tcp . 80 }}");
    for scenario in [
        &flows::terminating_endpoints_cluster()[0],
        &flows::terminating_endpoints_local()[0],
        &flows::internal_traffic_policy()[0],
    ] {
        breaks(scenario, &mutation);
    }
}
