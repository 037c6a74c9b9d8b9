//! Every packet-flow table of upstream's nftables `proxier_test.go` (1.37) through our table.
//! The tables are iptables mode's (`crate::proxier::flows`); what the nftables file expects
//! otherwise is said here, flow by flow.

use super::run;
use crate::proxier::flows::{self, Scenario, Verdict, case, untouched};

/// TestInternalExternalMasquerade in the nftables file: no localhost flows (nftables mode
/// serves no NodePort on the loopback: with no localhost proxy, no rule of ours touches them).
pub(super) fn masquerade(masquerade_all: bool, detector: bool) -> Scenario {
    let mut scenario = flows::internal_external_masquerade(masquerade_all, detector);
    for name in [
        "localhost to NodePort",
        "localhost to NodePort with eTP:Local",
        "localhost to NodePort with iTP:Local",
    ] {
        scenario.differs(name, untouched());
    }
    scenario
}

#[test]
fn internal_external_masquerade() {
    run(&masquerade(false, true));
}

#[test]
fn internal_external_masquerade_without_a_local_traffic_detector() {
    run(&masquerade(false, false));
}

#[test]
fn internal_external_masquerade_with_masquerade_all() {
    run(&masquerade(true, true));
}

#[test]
fn internal_external_masquerade_with_masquerade_all_and_no_detector() {
    run(&masquerade(true, false));
}

#[test]
fn node_ports() {
    flows::node_ports_nftables().iter().for_each(run);
}

#[test]
fn no_endpoints_reject() {
    run(&flows::no_endpoints_reject());
}

/// The nftables file rejects a ClusterIP's other ports (cluster-ips-check) and drops traffic
/// to an unallocated address of the ServiceCIDR, where iptables mode lets both through.
#[test]
fn cluster_ip_general() {
    let mut scenario = flows::cluster_ip_general();
    scenario
        .differs("TCP-only port does not match UDP traffic", Verdict::Reject)
        .differs("svc1 does not accept svc2's ports", Verdict::Reject)
        .adds(case(
            "packet to unallocated cluster ip",
            ("10.180.0.2", "172.30.0.50", 80),
            Verdict::Drop,
        ));
    run(&scenario);
}

#[test]
fn load_balancer_with_source_ranges() {
    run(&flows::load_balancer());
}

#[test]
fn external_traffic_policy_local() {
    run(&flows::external_traffic_policy_local());
}

#[test]
fn external_traffic_policy_cluster() {
    run(&flows::external_traffic_policy_cluster());
}

#[test]
fn terminating_endpoints_under_a_cluster_policy() {
    flows::terminating_endpoints_cluster().iter().for_each(run);
}

#[test]
fn terminating_endpoints_under_a_local_policy() {
    flows::terminating_endpoints_local().iter().for_each(run);
}

#[test]
fn internal_traffic_policy() {
    flows::internal_traffic_policy().iter().for_each(run);
}
