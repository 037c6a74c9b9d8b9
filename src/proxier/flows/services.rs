//! TestNoEndpointsReject, TestClusterIPGeneral and TestLoadBalancer: a Service without
//! endpoints, ClusterIP basics over protocols and ports, load balancers with source ranges.

use super::{Case, EXTERNAL, POD, Scenario, Verdict, case, flow};
use crate::model::Protocol;
use crate::proxier::fixtures::{NODE, NODE_IP, ep, svc, svc_port};

/// Upstream's `testExternalClientBlocked`: outside every source range below.
const BLOCKED: &str = "203.0.113.130";

pub fn no_endpoints_reject() -> Scenario {
    let service = svc("ns1", "svc1", "172.30.0.41", |s| {
        s.node_port = Some(3001);
        s.external_ips = vec!["192.168.99.11".parse().unwrap()];
        s.load_balancer_ips = vec!["1.2.3.4".parse().unwrap()];
    });
    let reject = || Verdict::Reject;
    #[rustfmt::skip]
    let cases = vec![
        case("pod to cluster IP with no endpoints", (POD, "172.30.0.41", 80), reject()),
        case("external to external IP with no endpoints", (EXTERNAL, "192.168.99.11", 80), reject()),
        case("pod to NodePort with no endpoints", (POD, NODE_IP, 3001), reject()),
        case("external to NodePort with no endpoints", (EXTERNAL, NODE_IP, 3001), reject()),
        case("pod to LoadBalancer IP with no endpoints", (POD, "1.2.3.4", 80), reject()),
        case("external to LoadBalancer IP with no endpoints", (EXTERNAL, "1.2.3.4", 80), reject()),
    ];
    Scenario::new("TestNoEndpointsReject", vec![service], cases)
}

pub fn cluster_ip_general() -> Scenario {
    const SOURCE: &str = "10.180.0.2";
    let svc1 = svc_port(
        "ns1",
        "svc1",
        "http",
        Protocol::Tcp,
        80,
        "172.30.0.41",
        |_| {},
    )
    .with_endpoints(vec![ep("10.180.0.1", 80, NODE)]);
    let both = |port: u16| {
        vec![
            ep("10.180.0.1", port, NODE),
            ep("10.180.2.1", port, "node2"),
        ]
    };
    let svc2 = svc_port(
        "ns2",
        "svc2",
        "http",
        Protocol::Tcp,
        80,
        "172.30.0.42",
        |_| {},
    )
    .with_endpoints(both(80))
    .add_port("https", Protocol::Tcp, 443, both(8443))
    .add_port("dns-udp", Protocol::Udp, 53, both(53))
    .add_port("dns-tcp", Protocol::Tcp, 53, both(5353))
    .add_port("dns-sctp", Protocol::Sctp, 53, both(53));
    let on = |protocol: Protocol, case: Case| Case { protocol, ..case };
    #[rustfmt::skip]
    let cases = vec![
        flow("simple clusterIP", (SOURCE, "172.30.0.41", 80), &["10.180.0.1:80"], false),
        flow("hairpin to cluster IP", ("10.180.0.1", "172.30.0.41", 80), &["10.180.0.1:80"], true),
        flow("clusterIP with multiple endpoints", (SOURCE, "172.30.0.42", 80), &["10.180.0.1:80", "10.180.2.1:80"], false),
        flow("clusterIP with TargetPort", (SOURCE, "172.30.0.42", 443), &["10.180.0.1:8443", "10.180.2.1:8443"], false),
        flow("clusterIP with TCP, UDP, and SCTP on same port (TCP)", (SOURCE, "172.30.0.42", 53), &["10.180.0.1:5353", "10.180.2.1:5353"], false),
        on(Protocol::Udp, flow("clusterIP with TCP, UDP, and SCTP on same port (UDP)", (SOURCE, "172.30.0.42", 53), &["10.180.0.1:53", "10.180.2.1:53"], false)),
        on(Protocol::Sctp, flow("clusterIP with TCP, UDP, and SCTP on same port (SCTP)", (SOURCE, "172.30.0.42", 53), &["10.180.0.1:53", "10.180.2.1:53"], false)),
        on(Protocol::Udp, flow("TCP-only port does not match UDP traffic", (SOURCE, "172.30.0.42", 80), &[], false)),
        flow("svc1 does not accept svc2's ports", (SOURCE, "172.30.0.41", 443), &[], false),
    ];
    Scenario::new("TestClusterIPGeneral", vec![svc1, svc2], cases)
}

pub fn load_balancer() -> Scenario {
    let service = svc("ns1", "svc1", "172.30.0.41", |s| {
        s.node_port = Some(3001);
        s.load_balancer_ips = vec!["1.2.3.4".parse().unwrap(), "5.6.7.8".parse().unwrap()];
        // Upstream's " 203.0.113.0/25" (with a blank) is read by the conversion from the API.
        s.load_balancer_source_ranges = vec![
            "192.168.0.0/24".parse().unwrap(),
            "203.0.113.0/25".parse().unwrap(),
        ];
    })
    .with_endpoints(vec![ep("10.180.0.1", 80, "")]);
    const ENDPOINT: &[&str] = &["10.180.0.1:80"];
    #[rustfmt::skip]
    let cases = vec![
        flow("pod to cluster IP", (POD, "172.30.0.41", 80), ENDPOINT, false),
        flow("external to nodePort", (EXTERNAL, NODE_IP, 3001), ENDPOINT, true),
        flow("nodePort bypasses LoadBalancerSourceRanges", (BLOCKED, NODE_IP, 3001), ENDPOINT, true),
        flow("accepted external to LB1", (EXTERNAL, "1.2.3.4", 80), ENDPOINT, true),
        flow("accepted external to LB2", (EXTERNAL, "5.6.7.8", 80), ENDPOINT, true),
        case("blocked external to LB1", (BLOCKED, "1.2.3.4", 80), Verdict::Drop),
        case("blocked external to LB2", (BLOCKED, "5.6.7.8", 80), Verdict::Drop),
        case("pod to LB1 (blocked by LoadBalancerSourceRanges)", (POD, "1.2.3.4", 80), Verdict::Drop),
        case("pod to LB2 (blocked by LoadBalancerSourceRanges)", (POD, "5.6.7.8", 80), Verdict::Drop),
        flow("node to LB1 (allowed by LoadBalancerSourceRanges)", (NODE_IP, "1.2.3.4", 80), ENDPOINT, true),
        flow("node to LB2 (allowed by LoadBalancerSourceRanges)", (NODE_IP, "5.6.7.8", 80), ENDPOINT, true),
        // A node's connection to its LB IP, SNATted to that IP by something else: allowed,
        // because the source ranges hold the node's address.
        flow("same node to LB1, SNATted to LB1 (implicitly allowed)", ("1.2.3.4", "1.2.3.4", 80), ENDPOINT, true),
        flow("same node to LB2, SNATted to LB2 (implicitly allowed)", ("5.6.7.8", "5.6.7.8", 80), ENDPOINT, true),
    ];
    Scenario::new("TestLoadBalancer", vec![service], cases)
}
