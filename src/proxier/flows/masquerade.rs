//! TestInternalExternalMasquerade: three LoadBalancers, each with an endpoint on this node and
//! one on another (svc1 all Cluster, svc2 externalTrafficPolicy Local, svc3
//! internalTrafficPolicy Local), reached from a pod, the node, the loopback and outside; in
//! four variants (masqueradeAll, and no local-traffic detector).

use super::{EXTERNAL, LOCALHOST, POD, Scenario, Verdict, flow};
use crate::model::ServicePort;
use crate::proxier::fixtures::{NODE, NODE_IP, Svc, ep, svc};
use crate::proxier::local::LocalDetector;

fn services() -> Vec<Svc> {
    let lb = |ns: &str, name: &str, n: u8, edit: fn(&mut ServicePort)| {
        svc(ns, name, &format!("172.30.0.4{n}"), |s| {
            s.node_port = Some(3000 + u16::from(n));
            edit(s);
            // Upstream sets one on each; the API keeps it for externalTrafficPolicy Local only.
            s.health_check_node_port = s.external_policy_local.then_some(30000 + u16::from(n));
        })
        .with_endpoints(vec![
            ep(&format!("10.180.0.{n}"), 80, NODE),
            ep(&format!("10.180.1.{n}"), 80, "remote"),
        ])
    };
    vec![
        lb("ns1", "svc1", 1, |s| {
            s.load_balancer_ips = vec!["1.2.3.4".parse().unwrap()];
        }),
        lb("ns2", "svc2", 2, |s| {
            s.load_balancer_ips = vec!["5.6.7.8".parse().unwrap()];
            s.external_policy_local = true;
        }),
        lb("ns3", "svc3", 3, |s| {
            s.load_balancer_ips = vec!["9.10.11.12".parse().unwrap()];
            s.internal_policy_local = true;
        }),
    ]
}

const SVC1: &[&str] = &["10.180.0.1:80", "10.180.1.1:80"];
const SVC2: &[&str] = &["10.180.0.2:80", "10.180.1.2:80"];
const SVC2_LOCAL: &[&str] = &["10.180.0.2:80"];
const SVC3: &[&str] = &["10.180.0.3:80", "10.180.1.3:80"];
const SVC3_LOCAL: &[&str] = &["10.180.0.3:80"];

/// The flows of the normal case (a local-traffic detector, no masqueradeAll).
#[rustfmt::skip]
fn flows() -> Vec<super::Case> {
    vec![
        flow("pod to ClusterIP", (POD, "172.30.0.41", 80), SVC1, false),
        flow("pod to NodePort", (POD, NODE_IP, 3001), SVC1, true),
        flow("pod to LB", (POD, "1.2.3.4", 80), SVC1, true),
        flow("node to ClusterIP", (NODE_IP, "172.30.0.41", 80), SVC1, true),
        flow("node to NodePort", (NODE_IP, NODE_IP, 3001), SVC1, true),
        flow("localhost to NodePort", (LOCALHOST, LOCALHOST, 3001), SVC1, true),
        flow("node to LB", (NODE_IP, "1.2.3.4", 80), SVC1, true),
        flow("external to ClusterIP", (EXTERNAL, "172.30.0.41", 80), SVC1, true),
        flow("external to NodePort", (EXTERNAL, NODE_IP, 3001), SVC1, true),
        flow("external to LB", (EXTERNAL, "1.2.3.4", 80), SVC1, true),
        flow("pod to ClusterIP with eTP:Local", (POD, "172.30.0.42", 80), SVC2, false),
        flow("pod to NodePort with eTP:Local", (POD, NODE_IP, 3002), SVC2, false),
        flow("pod to LB with eTP:Local", (POD, "5.6.7.8", 80), SVC2, false),
        flow("node to ClusterIP with eTP:Local", (NODE_IP, "172.30.0.42", 80), SVC2, true),
        // Upstream's case sends this one to svc1's NodePort (3001), as written there.
        flow("node to NodePort with eTP:Local", (NODE_IP, NODE_IP, 3001), SVC1, true),
        flow("localhost to NodePort with eTP:Local", (LOCALHOST, LOCALHOST, 3002), SVC2, true),
        flow("node to LB with eTP:Local", (NODE_IP, "5.6.7.8", 80), SVC2, true),
        flow("external to ClusterIP with eTP:Local", (EXTERNAL, "172.30.0.42", 80), SVC2, true),
        flow("external to NodePort with eTP:Local", (EXTERNAL, NODE_IP, 3002), SVC2_LOCAL, false),
        flow("external to LB with eTP:Local", (EXTERNAL, "5.6.7.8", 80), SVC2_LOCAL, false),
        flow("pod to ClusterIP with iTP:Local", (POD, "172.30.0.43", 80), SVC3_LOCAL, false),
        flow("pod to NodePort with iTP:Local", (POD, NODE_IP, 3003), SVC3, true),
        flow("pod to LB with iTP:Local", (POD, "9.10.11.12", 80), SVC3, true),
        flow("node to ClusterIP with iTP:Local", (NODE_IP, "172.30.0.43", 80), SVC3_LOCAL, true),
        flow("node to NodePort with iTP:Local", (NODE_IP, NODE_IP, 3003), SVC3, true),
        flow("localhost to NodePort with iTP:Local", (LOCALHOST, LOCALHOST, 3003), SVC3, true),
        flow("node to LB with iTP:Local", (NODE_IP, "9.10.11.12", 80), SVC3, true),
        flow("external to ClusterIP with iTP:Local", (EXTERNAL, "172.30.0.43", 80), SVC3_LOCAL, true),
        flow("external to NodePort with iTP:Local", (EXTERNAL, NODE_IP, 3003), SVC3, true),
        flow("external to LB with iTP:Local", (EXTERNAL, "9.10.11.12", 80), SVC3, true),
    ]
}

/// Flow `name`, masqueraded as `masquerade` says instead.
pub fn masquerade(scenario: &mut Scenario, name: &str, masquerade: bool) {
    let want = match scenario.cases.iter().find(|c| c.name == name) {
        Some(super::Case {
            want: Verdict::Accept { endpoints, .. },
            ..
        }) => Verdict::Accept {
            endpoints: endpoints.clone(),
            masquerade,
        },
        _ => panic!("{}: no accepted flow {name:?}", scenario.name),
    };
    scenario.differs(name, want);
}

/// One variant, with upstream's overrides of the normal case's flows.
pub fn internal_external_masquerade(masquerade_all: bool, detector: bool) -> Scenario {
    let mut scenario = Scenario::new(
        format!(
            "TestInternalExternalMasquerade (masqueradeAll {masquerade_all}, local detector {detector})"
        ),
        services(),
        flows(),
    );
    scenario.common.masquerade_all = masquerade_all;
    if !detector {
        scenario.common.local_detector = LocalDetector::None;
        // Every ClusterIP flow is taken for a pod's: none is masqueraded, unless all are.
        for name in [
            "node to ClusterIP",
            "node to ClusterIP with eTP:Local",
            "node to ClusterIP with iTP:Local",
            "external to ClusterIP",
            "external to ClusterIP with eTP:Local",
            "external to ClusterIP with iTP:Local",
        ] {
            if !masquerade_all {
                masquerade(&mut scenario, name, false);
            }
        }
        // No short-circuit for pods: eTP Local gives them the local endpoint only.
        for name in ["pod to NodePort with eTP:Local", "pod to LB with eTP:Local"] {
            scenario.differs(name, super::accept(SVC2_LOCAL, false));
        }
    }
    if masquerade_all {
        for name in [
            "pod to ClusterIP",
            "pod to ClusterIP with eTP:Local",
            "pod to ClusterIP with iTP:Local",
        ] {
            masquerade(&mut scenario, name, true);
        }
    }
    scenario
}
