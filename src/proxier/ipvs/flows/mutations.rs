//! Each table broken on purpose: one object of what the sync left removed or added, after
//! which the tracer and `explain` must both disagree with the table somewhere.

use super::{Node, disagreements, programmed};
use crate::proxier::flows::{self, Scenario, Verdict, assert_broken};
use crate::sys::ipset::Ipsets;
use crate::sys::ipvs::codec::CMD_NEW_DEST;
use crate::sys::ipvs::{Ipvs, RealServer};

fn breaks(scenario: &Scenario, what: &str, mutate: impl Fn(&mut Node)) {
    let mut node = programmed(scenario);
    mutate(&mut node);
    assert_broken(scenario, what, &disagreements(scenario, &node));
}

/// Removes virtual server `key`.
fn without(key: &'static str) -> impl Fn(&mut Node) {
    move |node| {
        let (vs, _) = node.ipvs.state().remove(key).expect("the virtual server");
        node.ipvs.delete_service(&vs).unwrap();
    }
}

#[test]
fn each_masquerade_variant_fails_without_a_load_balancer_ip() {
    for (all, detector) in [(false, true), (false, false), (true, true), (true, false)] {
        let scenario = flows::internal_external_masquerade(all, detector);
        breaks(
            &scenario,
            "no virtual server on 1.2.3.4:80",
            without("1.2.3.4:80/TCP"),
        );
    }
}

#[test]
fn node_ports_fail_without_their_virtual_server() {
    let scenario = &flows::node_ports()[0];
    breaks(
        scenario,
        "no NodePort virtual server",
        without("192.168.0.2:3001/TCP"),
    );
}

#[test]
fn no_endpoints_reject_fails_with_a_real_server() {
    breaks(&flows::no_endpoints_reject(), "a real server", |node| {
        let (vs, _) = node.ipvs.state().remove("172.30.0.41:80/TCP").unwrap();
        let real = RealServer::new("10.180.0.1".parse().unwrap(), 80, 1);
        node.ipvs
            .change_destination(CMD_NEW_DEST, &vs, &real)
            .unwrap();
    });
}

#[test]
fn cluster_ip_general_fails_without_a_cluster_ip() {
    let mut scenario = flows::cluster_ip_general();
    scenario
        .differs("TCP-only port does not match UDP traffic", Verdict::Reject)
        .differs("svc1 does not accept svc2's ports", Verdict::Reject);
    breaks(
        &scenario,
        "no virtual server on the ClusterIP",
        without("172.30.0.41:80/TCP"),
    );
}

#[test]
fn load_balancer_fails_without_its_source_ranges() {
    breaks(&flows::load_balancer(), "no firewall entry", |node| {
        node.ipset
            .restore("del KUBE-LOAD-BALANCER-FW 1.2.3.4,tcp:80\n")
            .unwrap();
    });
}

#[test]
fn external_traffic_policies_fail_without_their_node_port() {
    for scenario in [
        flows::external_traffic_policy_local(),
        flows::external_traffic_policy_cluster(),
    ] {
        breaks(
            &scenario,
            "no NodePort virtual server",
            without("192.168.0.2:3001/TCP"),
        );
    }
}

#[test]
fn terminating_endpoints_and_internal_policy_fail_without_their_cluster_ip() {
    for scenario in [
        &flows::terminating_endpoints_cluster()[0],
        &flows::terminating_endpoints_local()[0],
        &flows::internal_traffic_policy()[0],
    ] {
        breaks(
            scenario,
            "no virtual server on the ClusterIP",
            without("172.30.1.1:80/TCP"),
        );
    }
}
