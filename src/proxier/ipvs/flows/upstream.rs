//! Upstream's flow tables through IPVS mode. Upstream has no IPVS flow tables: the
//! expectations are iptables mode's, and each difference IPVS makes by design (upstream's IPVS
//! proxier does the same) is said here, flow by flow:
//! - no short-circuit: traffic policy Local sends a pod's (and the node's) connections to the
//!   external addresses of a Service to this node's endpoints only, unmasqueraded;
//! - with no local endpoint, a Local policy falls back to the Service's cluster endpoints
//!   (upstream's #97081); a Service with neither has a virtual server with no real server,
//!   which answers port unreachable: rejected, where iptables mode drops;
//! - no NodePort on the loopback (IPVS does not serve 127.0.0.1);
//! - the access filter (KUBE-IPVS-FILTER) rejects other ports of a Service IP, as nftables
//!   mode does.
//!
//! The virtual server's scheduler (rr: each real server with weight in turn) gives each
//! endpoint its share; the tracer and `explain` compare those shares too.

use super::run;
use crate::proxier::flows::{self, Scenario, Verdict, accept, untouched};

/// The NodePorts on the loopback, untouched.
fn no_localhost_node_ports(scenario: &mut Scenario) {
    let names: Vec<&'static str> = scenario
        .cases
        .iter()
        .filter(|c| c.dst == "127.0.0.1" && c.want != untouched())
        .map(|c| c.name)
        .collect();
    for name in names {
        scenario.differs(name, untouched());
    }
}

fn masquerade(masquerade_all: bool, detector: bool) -> Scenario {
    let mut scenario = flows::internal_external_masquerade(masquerade_all, detector);
    no_localhost_node_ports(&mut scenario);
    const SVC2_LOCAL: &[&str] = &["10.180.0.2:80"];
    for name in ["pod to NodePort with eTP:Local", "pod to LB with eTP:Local"] {
        // Without a local-traffic detector iptables mode sends these to the local endpoint too.
        if scenario
            .cases
            .iter()
            .any(|c| c.name == name && c.want != accept(SVC2_LOCAL, false))
        {
            scenario.differs(name, accept(SVC2_LOCAL, false));
        }
    }
    scenario.differs("node to LB with eTP:Local", accept(SVC2_LOCAL, false));
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
    for mut scenario in flows::node_ports() {
        no_localhost_node_ports(&mut scenario);
        run(&scenario);
    }
}

#[test]
fn no_endpoints_reject() {
    run(&flows::no_endpoints_reject());
}

#[test]
fn cluster_ip_general() {
    let mut scenario = flows::cluster_ip_general();
    scenario
        .differs("TCP-only port does not match UDP traffic", Verdict::Reject)
        .differs("svc1 does not accept svc2's ports", Verdict::Reject);
    run(&scenario);
}

#[test]
fn load_balancer_with_source_ranges() {
    run(&flows::load_balancer());
}

#[test]
fn external_traffic_policy_local() {
    let mut scenario = flows::external_traffic_policy_local();
    const LOCAL: &[&str] = &["10.180.2.1:80"];
    for name in [
        "pod to external IP hits both endpoints, unmasqueraded",
        "pod to LB IP hits only both endpoints, unmasqueraded",
        "pod to NodePort hits both endpoints, unmasqueraded",
    ] {
        scenario.differs(name, accept(LOCAL, false));
    }
    run(&scenario);
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
    for mut scenario in flows::terminating_endpoints_local() {
        if scenario
            .name
            .ends_with("terminating endpoints on remote node")
        {
            scenario.differs("external to LB", accept(&["10.0.1.5:80"], false));
        }
        run(&scenario);
    }
}

#[test]
fn internal_traffic_policy() {
    for mut scenario in flows::internal_traffic_policy() {
        if scenario.name.ends_with("there are no local endpoints") {
            scenario.differs("no endpoints", Verdict::Reject);
        }
        run(&scenario);
    }
}
