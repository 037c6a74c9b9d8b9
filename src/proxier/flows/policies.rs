//! The traffic policies: TestExternalTrafficPolicyLocal and ...Cluster, terminating endpoints
//! under each (TestTerminatingEndpointsTrafficPolicyLocal and ...Cluster), and
//! TestInternalTrafficPolicy.

use super::{Case, EXTERNAL, POD, Scenario, Verdict, accept, case, flow};
use crate::model::{Endpoint, Protocol};
use crate::proxier::fixtures::{NODE, NODE_IP, Svc, ep, svc, svc_port};

/// A LoadBalancer with an external IP, one endpoint on no node and one on this node.
fn external_service(local: bool) -> Svc {
    svc("ns1", "svc1", "172.30.0.41", |s| {
        s.node_port = Some(3001);
        s.external_ips = vec!["192.168.99.11".parse().unwrap()];
        s.load_balancer_ips = vec!["1.2.3.4".parse().unwrap()];
        s.external_policy_local = local;
        s.health_check_node_port = local.then_some(30000);
    })
    .with_endpoints(vec![ep("10.180.0.1", 80, ""), ep("10.180.2.1", 80, NODE)])
}

const BOTH: &[&str] = &["10.180.0.1:80", "10.180.2.1:80"];
const LOCAL: &[&str] = &["10.180.2.1:80"];

pub fn external_traffic_policy_local() -> Scenario {
    #[rustfmt::skip]
    let cases = vec![
        flow("pod to cluster IP hits both endpoints, unmasqueraded", (POD, "172.30.0.41", 80), BOTH, false),
        flow("pod to external IP hits both endpoints, unmasqueraded", (POD, "192.168.99.11", 80), BOTH, false),
        flow("external to external IP hits only local endpoint, unmasqueraded", (EXTERNAL, "192.168.99.11", 80), LOCAL, false),
        flow("pod to LB IP hits only both endpoints, unmasqueraded", (POD, "1.2.3.4", 80), BOTH, false),
        flow("external to LB IP hits only local endpoint, unmasqueraded", (EXTERNAL, "1.2.3.4", 80), LOCAL, false),
        flow("pod to NodePort hits both endpoints, unmasqueraded", (POD, NODE_IP, 3001), BOTH, false),
        flow("external to NodePort hits only local endpoint, unmasqueraded", (EXTERNAL, NODE_IP, 3001), LOCAL, false),
    ];
    Scenario::new(
        "TestExternalTrafficPolicyLocal",
        vec![external_service(true)],
        cases,
    )
}

pub fn external_traffic_policy_cluster() -> Scenario {
    #[rustfmt::skip]
    let cases = vec![
        flow("pod to cluster IP hits both endpoints, unmasqueraded", (POD, "172.30.0.41", 80), BOTH, false),
        flow("pod to external IP hits both endpoints, masqueraded", (POD, "192.168.99.11", 80), BOTH, true),
        flow("external to external IP hits both endpoints, masqueraded", (EXTERNAL, "192.168.99.11", 80), BOTH, true),
        flow("pod to LB IP hits both endpoints, masqueraded", (POD, "1.2.3.4", 80), BOTH, true),
        flow("external to LB IP hits both endpoints, masqueraded", (EXTERNAL, "1.2.3.4", 80), BOTH, true),
        flow("pod to NodePort hits both endpoints, masqueraded", (POD, NODE_IP, 3001), BOTH, true),
        flow("external to NodePort hits both endpoints, masqueraded", (EXTERNAL, NODE_IP, 3001), BOTH, true),
    ];
    Scenario::new(
        "TestExternalTrafficPolicyCluster",
        vec![external_service(false)],
        cases,
    )
}

/// An endpoint at `ip:80` with these conditions (ready, serving, terminating), on `node`.
fn with_conditions(
    ip: &str,
    node: &str,
    (ready, serving, terminating): (bool, bool, bool),
) -> Endpoint {
    Endpoint {
        ready,
        serving,
        terminating,
        ..ep(ip, 80, node)
    }
}

/// A subcase: its name, the slice's endpoints, and where a pod's flow to the ClusterIP and an
/// outside client's to the LB IP go.
type Subcase = (&'static str, Vec<Endpoint>, [Verdict; 2]);

const READY: (bool, bool, bool) = (true, true, false);
const TERMINATING: (bool, bool, bool) = (false, true, true);
const GONE: (bool, bool, bool) = (false, false, true);

/// Each subcase's flows, then the same flows rejected once the slice is deleted.
fn terminating_endpoints(
    external_local: bool,
    test: &str,
    subcases: Vec<Subcase>,
) -> Vec<Scenario> {
    let service = |endpoints: Vec<Endpoint>| {
        svc_port("ns1", "svc1", "", Protocol::Tcp, 80, "172.30.1.1", |s| {
            s.load_balancer_ips = vec!["1.2.3.4".parse().unwrap()];
            s.external_policy_local = external_local;
            s.health_check_node_port = external_local.then_some(30000);
        })
        .with_endpoints(endpoints)
    };
    let flows = |wants: [Verdict; 2]| {
        let to = [
            ("pod to clusterIP", (POD, "172.30.1.1", 80)),
            ("external to LB", (EXTERNAL, "1.2.3.4", 80)),
        ];
        to.into_iter()
            .zip(wants)
            .map(|((name, target), want)| case(name, target, want))
            .collect::<Vec<Case>>()
    };
    let mut scenarios = Vec::new();
    for (name, endpoints, wants) in subcases {
        scenarios.push(Scenario::new(
            format!("{test}, {name}"),
            vec![service(endpoints)],
            flows(wants),
        ));
        scenarios.push(Scenario::new(
            format!("{test}, {name}, slice deleted"),
            vec![service(Vec::new())],
            flows([Verdict::Reject, Verdict::Reject]),
        ));
    }
    scenarios
}

pub fn terminating_endpoints_cluster() -> Vec<Scenario> {
    const SERVED: &[&str] = &["10.0.1.1:80", "10.0.1.2:80", "10.0.1.5:80"];
    const TERMINATING_ONLY: &[&str] = &["10.0.1.2:80", "10.0.1.3:80", "10.0.1.5:80"];
    #[rustfmt::skip]
    let subcases = vec![
        ("ready endpoints exist", vec![
            with_conditions("10.0.1.1", NODE, READY),
            with_conditions("10.0.1.2", NODE, READY),
            with_conditions("10.0.1.3", "another-node", TERMINATING),
            with_conditions("10.0.1.4", "another-node", GONE),
            with_conditions("10.0.1.5", "another-node", READY),
        ], [accept(SERVED, false), accept(SERVED, true)]),
        ("only terminating endpoints exist", vec![
            with_conditions("10.0.1.2", NODE, TERMINATING),
            with_conditions("10.0.1.3", NODE, TERMINATING),
            with_conditions("10.0.1.4", "another-node", GONE),
            with_conditions("10.0.1.5", "another-node", TERMINATING),
        ], [accept(TERMINATING_ONLY, false), accept(TERMINATING_ONLY, true)]),
        ("terminating endpoints on remote node", vec![
            with_conditions("10.0.1.5", "node-1", TERMINATING),
        ], [accept(&["10.0.1.5:80"], false), accept(&["10.0.1.5:80"], true)]),
        ("no usable endpoints on any node", vec![
            with_conditions("10.0.1.5", NODE, GONE),
            with_conditions("10.0.1.5", "node-1", GONE),
        ], [Verdict::Reject, Verdict::Reject]),
    ];
    terminating_endpoints(
        false,
        "TestTerminatingEndpointsTrafficPolicyCluster",
        subcases,
    )
}

pub fn terminating_endpoints_local() -> Vec<Scenario> {
    #[rustfmt::skip]
    let subcases = vec![
        ("ready endpoints exist", vec![
            with_conditions("10.0.1.1", NODE, READY),
            with_conditions("10.0.1.2", NODE, READY),
            with_conditions("10.0.1.3", NODE, TERMINATING),
            with_conditions("10.0.1.4", NODE, GONE),
            with_conditions("10.0.1.5", "node-1", READY),
        ], [accept(&["10.0.1.1:80", "10.0.1.2:80", "10.0.1.5:80"], false), accept(&["10.0.1.1:80", "10.0.1.2:80"], false)]),
        ("only terminating endpoints exist", vec![
            with_conditions("10.0.1.2", NODE, TERMINATING),
            with_conditions("10.0.1.3", NODE, TERMINATING),
            with_conditions("10.0.1.4", NODE, GONE),
            with_conditions("10.0.1.5", "node-1", READY),
        ], [accept(&["10.0.1.5:80"], false), accept(&["10.0.1.2:80", "10.0.1.3:80"], false)]),
        // The remote endpoint is not used from outside, but it keeps the service from being
        // rejected: outside traffic is dropped.
        ("terminating endpoints on remote node", vec![
            with_conditions("10.0.1.5", "node-1", TERMINATING),
        ], [accept(&["10.0.1.5:80"], false), Verdict::Drop]),
        ("no usable endpoints on any node", vec![
            with_conditions("10.0.1.5", NODE, GONE),
            with_conditions("10.0.1.5", "node-1", GONE),
        ], [Verdict::Reject, Verdict::Reject]),
    ];
    terminating_endpoints(true, "TestTerminatingEndpointsTrafficPolicyLocal", subcases)
}

/// A subcase: its name, whether the policy is Local, the endpoints and their nodes, and where
/// a pod's flow to the ClusterIP goes, under the flow's name.
type PolicySubcase = (
    &'static str,
    bool,
    &'static [(&'static str, &'static str)],
    &'static str,
    Verdict,
);

pub fn internal_traffic_policy() -> Vec<Scenario> {
    let service = |local: bool, endpoints: &[(&str, &str)]| {
        svc_port("ns1", "svc1", "", Protocol::Tcp, 80, "172.30.1.1", |s| {
            s.internal_policy_local = local;
        })
        .with_endpoints(
            endpoints
                .iter()
                .map(|(ip, node)| ep(ip, 80, node))
                .collect(),
        )
    };
    let pod = |name: &'static str, want: Verdict| vec![case(name, (POD, "172.30.1.1", 80), want)];
    #[rustfmt::skip]
    let subcases: [PolicySubcase; 4] = [
        ("internalTrafficPolicy is cluster", false,
            &[("10.0.1.1", NODE), ("10.0.1.2", "node1"), ("10.0.1.3", "node2")],
            "pod to ClusterIP hits all endpoints",
            accept(&["10.0.1.1:80", "10.0.1.2:80", "10.0.1.3:80"], false)),
        ("internalTrafficPolicy is local and there is one local endpoint", true,
            &[("10.0.1.1", NODE), ("10.0.1.2", "node1"), ("10.0.1.3", "node2")],
            "pod to ClusterIP hits only local endpoint",
            accept(&["10.0.1.1:80"], false)),
        ("internalTrafficPolicy is local and there are multiple local endpoints", true,
            &[("10.0.1.1", NODE), ("10.0.1.2", NODE), ("10.0.1.3", "node2")],
            "pod to ClusterIP hits all local endpoints",
            accept(&["10.0.1.1:80", "10.0.1.2:80"], false)),
        ("internalTrafficPolicy is local and there are no local endpoints", true,
            &[("10.0.1.1", "node0"), ("10.0.1.2", "node1"), ("10.0.1.3", "node2")],
            "no endpoints",
            Verdict::Drop),
    ];
    let mut scenarios = Vec::new();
    for (name, local, endpoints, flow_name, want) in subcases {
        let test = format!("TestInternalTrafficPolicy, {name}");
        scenarios.push(Scenario::new(
            test.clone(),
            vec![service(local, endpoints)],
            pod(flow_name, want),
        ));
        scenarios.push(Scenario::new(
            format!("{test}, endpoints deleted"),
            vec![service(local, &[])],
            pod("endpoints deleted", Verdict::Reject),
        ));
    }
    scenarios
}
