//! Upstream's packet-flow tables (`pkg/proxy/iptables/proxier_test.go`, 1.37's development
//! copy) through our rules: the same services, the same flows and the same expected endpoints
//! and masquerading, traced and explained.

use super::tracer::Verdict;
use super::tracer_cases::{Case, NODE_ADDRESSES, POD, accept, run_on};
use super::*;
use crate::proxier::local::LocalDetector;

/// Upstream's `testExternalClient`.
pub(super) const EXTERNAL: &str = "203.0.113.2";
pub(super) const LOCALHOST: &str = "127.0.0.1";

/// TestInternalExternalMasquerade's services: svc1 all Cluster, svc2 externalTrafficPolicy
/// Local, svc3 internalTrafficPolicy Local; each a LoadBalancer with one endpoint on this
/// node and one on another.
fn masquerade_services() -> Vec<Svc> {
    let lb = |ns: &str, name: &str, n: u8, edit: fn(&mut crate::model::ServicePort)| {
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

/// Both endpoints of svc `n`, or the local one only.
fn both(n: u8) -> Vec<String> {
    vec![format!("10.180.0.{n}:80"), format!("10.180.1.{n}:80")]
}
fn local(n: u8) -> Vec<String> {
    vec![format!("10.180.0.{n}:80")]
}

/// A flow of TCP to `dst:port` and what it meets, sent by the node itself when its source is
/// the node's.
pub(super) fn case(
    name: &'static str,
    (src, dst, port): (&'static str, &'static str, u16),
    want: Verdict,
) -> Case {
    Case {
        name,
        src,
        dst,
        port,
        protocol: Protocol::Tcp,
        from_node: src == NODE_IP || src == LOCALHOST,
        want,
    }
}

/// A flow delivered to these endpoints, masqueraded or not.
pub(super) fn flow(
    name: &'static str,
    target: (&'static str, &'static str, u16),
    endpoints: Vec<String>,
    masquerade: bool,
) -> Case {
    let endpoints: Vec<&str> = endpoints.iter().map(String::as_str).collect();
    case(name, target, accept(&endpoints, masquerade))
}

/// TestInternalExternalMasquerade's flows for the normal case (a local-traffic detector, no
/// masqueradeAll).
fn masquerade_flows() -> Vec<Case> {
    #[rustfmt::skip]
    let flows = vec![
        flow("pod to ClusterIP", (POD, "172.30.0.41", 80), both(1), false),
        flow("pod to NodePort", (POD, NODE_IP, 3001), both(1), true),
        flow("pod to LB", (POD, "1.2.3.4", 80), both(1), true),
        flow("node to ClusterIP", (NODE_IP, "172.30.0.41", 80), both(1), true),
        flow("node to NodePort", (NODE_IP, NODE_IP, 3001), both(1), true),
        flow("localhost to NodePort", (LOCALHOST, LOCALHOST, 3001), both(1), true),
        flow("node to LB", (NODE_IP, "1.2.3.4", 80), both(1), true),
        flow("external to ClusterIP", (EXTERNAL, "172.30.0.41", 80), both(1), true),
        flow("external to NodePort", (EXTERNAL, NODE_IP, 3001), both(1), true),
        flow("external to LB", (EXTERNAL, "1.2.3.4", 80), both(1), true),
        flow("pod to ClusterIP with eTP:Local", (POD, "172.30.0.42", 80), both(2), false),
        flow("pod to NodePort with eTP:Local", (POD, NODE_IP, 3002), both(2), false),
        flow("pod to LB with eTP:Local", (POD, "5.6.7.8", 80), both(2), false),
        flow("node to ClusterIP with eTP:Local", (NODE_IP, "172.30.0.42", 80), both(2), true),
        // Upstream's case sends this one to svc1's NodePort (3001), as written there.
        flow("node to NodePort with eTP:Local", (NODE_IP, NODE_IP, 3001), both(1), true),
        flow("localhost to NodePort with eTP:Local", (LOCALHOST, LOCALHOST, 3002), both(2), true),
        flow("node to LB with eTP:Local", (NODE_IP, "5.6.7.8", 80), both(2), true),
        flow("external to ClusterIP with eTP:Local", (EXTERNAL, "172.30.0.42", 80), both(2), true),
        flow("external to NodePort with eTP:Local", (EXTERNAL, NODE_IP, 3002), local(2), false),
        flow("external to LB with eTP:Local", (EXTERNAL, "5.6.7.8", 80), local(2), false),
        flow("pod to ClusterIP with iTP:Local", (POD, "172.30.0.43", 80), local(3), false),
        flow("pod to NodePort with iTP:Local", (POD, NODE_IP, 3003), both(3), true),
        flow("pod to LB with iTP:Local", (POD, "9.10.11.12", 80), both(3), true),
        flow("node to ClusterIP with iTP:Local", (NODE_IP, "172.30.0.43", 80), local(3), true),
        flow("node to NodePort with iTP:Local", (NODE_IP, NODE_IP, 3003), both(3), true),
        flow("localhost to NodePort with iTP:Local", (LOCALHOST, LOCALHOST, 3003), both(3), true),
        flow("node to LB with iTP:Local", (NODE_IP, "9.10.11.12", 80), both(3), true),
        flow("external to ClusterIP with iTP:Local", (EXTERNAL, "172.30.0.43", 80), local(3), true),
        flow("external to NodePort with iTP:Local", (EXTERNAL, NODE_IP, 3003), both(3), true),
        flow("external to LB with iTP:Local", (EXTERNAL, "9.10.11.12", 80), both(3), true),
    ];
    flows
}

/// What a variant changes in a flow's expectation: the other masquerade, or other endpoints.
enum Override {
    Masquerade(bool),
    Endpoints(Vec<String>),
}

/// Runs the flows in one of upstream's variants, with its overrides; as upstream, an override
/// must name a flow and change what it expects.
fn masquerade_variant(masquerade_all: bool, detector: bool, overrides: &[(&str, Override)]) {
    let mut ctx = context();
    ctx.common.masquerade_all = masquerade_all;
    if !detector {
        ctx.common.local_detector = LocalDetector::None;
    }
    let mut cases = masquerade_flows();
    for (name, change) in overrides {
        let case = cases.iter_mut().find(|c| c.name == *name);
        let Some(Case {
            want:
                Verdict::Accept {
                    endpoints,
                    masquerade,
                },
            ..
        }) = case
        else {
            panic!("override of no accepted flow: {name}");
        };
        match change {
            Override::Masquerade(m) => {
                assert_ne!(m, masquerade, "{name}: override changes nothing");
                *masquerade = *m;
            }
            Override::Endpoints(e) => {
                let e: std::collections::BTreeSet<String> = e.iter().cloned().collect();
                assert_ne!(&e, endpoints, "{name}: override changes nothing");
                *endpoints = e;
            }
        }
    }
    run_on(&masquerade_services(), &ctx, NODE_ADDRESSES, &cases);
}

#[test]
fn internal_external_masquerade() {
    masquerade_variant(false, true, &[]);
}

#[test]
fn internal_external_masquerade_without_a_local_traffic_detector() {
    use Override::*;
    masquerade_variant(
        false,
        false,
        &[
            // Every ClusterIP flow is taken for a pod's: none is masqueraded.
            ("node to ClusterIP", Masquerade(false)),
            ("node to ClusterIP with eTP:Local", Masquerade(false)),
            ("node to ClusterIP with iTP:Local", Masquerade(false)),
            ("external to ClusterIP", Masquerade(false)),
            ("external to ClusterIP with eTP:Local", Masquerade(false)),
            ("external to ClusterIP with iTP:Local", Masquerade(false)),
            // No short-circuit for pods: eTP Local gives them the local endpoint only.
            ("pod to NodePort with eTP:Local", Endpoints(local(2))),
            ("pod to LB with eTP:Local", Endpoints(local(2))),
        ],
    );
}

#[test]
fn internal_external_masquerade_with_masquerade_all() {
    use Override::*;
    masquerade_variant(
        true,
        true,
        &[
            ("pod to ClusterIP", Masquerade(true)),
            ("pod to ClusterIP with eTP:Local", Masquerade(true)),
            ("pod to ClusterIP with iTP:Local", Masquerade(true)),
        ],
    );
}

#[test]
fn internal_external_masquerade_with_masquerade_all_and_no_detector() {
    use Override::*;
    masquerade_variant(
        true,
        false,
        &[
            ("pod to ClusterIP", Masquerade(true)),
            ("pod to ClusterIP with eTP:Local", Masquerade(true)),
            ("pod to ClusterIP with iTP:Local", Masquerade(true)),
            ("pod to NodePort with eTP:Local", Endpoints(local(2))),
            ("pod to LB with eTP:Local", Endpoints(local(2))),
        ],
    );
}

/// One of TestNodePorts's subcases: a NodePort Service (3001) with an endpoint on no node and
/// one on this node, under localhostNodePorts and nodePortAddresses as given.
struct NodePortsCase {
    name: &'static str,
    family: IpFamily,
    localhost_node_ports: bool,
    node_port_addresses: &'static [&'static str],
    /// NodePort traffic to the node's second address is accepted.
    alt_node_ip: bool,
    /// NodePort traffic to the loopback address is accepted (upstream: IPv4 with
    /// localhostNodePorts, and a loopback address among nodePortAddresses when they are set).
    localhost: bool,
}

fn node_ports_flows(case: &NodePortsCase) {
    let v4 = case.family == IpFamily::V4;
    // Upstream's fake network (lo and eth0) and addresses for the family.
    let (addresses, node_ip, alt_ip, pod, external, localhost): (&[&str], _, _, _, _, _) = if v4 {
        let addresses: &[&str] = &["127.0.0.1", NODE_IP, "192.168.1.2", "192.168.99.11"];
        (addresses, NODE_IP, "192.168.1.2", POD, EXTERNAL, LOCALHOST)
    } else {
        let addresses: &[&str] = &["::1", "2001:db8::1", "2001:db8:1::2"];
        (
            addresses,
            "2001:db8::1",
            "2001:db8:1::2",
            "fd00:10::2",
            "2600:5200::1",
            "::1",
        )
    };
    let (cluster_ip, ep1, ep2) = if v4 {
        ("172.30.0.41", "10.180.0.1", "10.180.2.1")
    } else {
        ("fd00:172:30::41", "fd00:10:180::1", "fd00:10:180::2:1")
    };
    let service = svc("ns1", "svc1", cluster_ip, |s| s.node_port = Some(3001))
        .with_endpoints(vec![ep(ep1, 80, ""), ep(ep2, 80, NODE)]);
    let mut ctx = context();
    ctx.common = if v4 {
        family_context(IpFamily::V4, NODE_IP, "10.0.0.0/8")
    } else {
        family_context(IpFamily::V6, "2001:db8::1", "fd00:10::/64")
    };
    ctx.localhost_node_ports = case.localhost_node_ports;
    let configured: Vec<String> = case
        .node_port_addresses
        .iter()
        .map(|a| a.to_string())
        .collect();
    let local = || addresses.iter().map(|a| a.parse().unwrap()).collect();
    let selection = crate::proxier::local::NodePortSelection::new(&configured);
    ctx.node_port_addresses = selection.addresses(ctx.common.node_ip, local);
    let both = [
        std::net::SocketAddr::new(ep1.parse().unwrap(), 80).to_string(),
        std::net::SocketAddr::new(ep2.parse().unwrap(), 80).to_string(),
    ];
    let both: Vec<&str> = both.iter().map(String::as_str).collect();
    let untouched = accept(&[], false);
    #[rustfmt::skip]
    let cases = [
        Case { name: "pod to cluster IP", src: pod, dst: cluster_ip, port: 80, protocol: Protocol::Tcp, from_node: false, want: accept(&both, false) },
        Case { name: "external to nodePort", src: external, dst: node_ip, port: 3001, protocol: Protocol::Tcp, from_node: false, want: accept(&both, true) },
        Case { name: "node to nodePort", src: node_ip, dst: node_ip, port: 3001, protocol: Protocol::Tcp, from_node: true, want: accept(&both, true) },
        Case { name: "localhost to nodePort", src: localhost, dst: localhost, port: 3001, protocol: Protocol::Tcp, from_node: true, want: if case.localhost { accept(&both, true) } else { untouched.clone() } },
        Case { name: "external to nodePort on secondary IP", src: external, dst: alt_ip, port: 3001, protocol: Protocol::Tcp, from_node: false, want: if case.alt_node_ip { accept(&both, true) } else { untouched.clone() } },
    ];
    // Printed with a failure's output: which subcase it is.
    eprintln!("TestNodePorts, case {:?}", case.name);
    run_on(&[service], &ctx, addresses, &cases);
}

#[test]
fn node_ports_under_localhost_node_ports_and_node_port_addresses() {
    use IpFamily::{V4, V6};
    let multiple: &[&str] = &["192.168.0.0/24", "192.168.1.0/24", "2001:db8::/64"];
    #[rustfmt::skip]
    let cases = [
        NodePortsCase { name: "ipv4, localhost-nodeports enabled", family: V4, localhost_node_ports: true, node_port_addresses: &[], alt_node_ip: true, localhost: true },
        NodePortsCase { name: "ipv4, localhost-nodeports disabled", family: V4, localhost_node_ports: false, node_port_addresses: &[], alt_node_ip: true, localhost: false },
        NodePortsCase { name: "ipv4, localhost-nodeports disabled, localhost in nodeport-addresses", family: V4, localhost_node_ports: false, node_port_addresses: &["192.168.0.0/24", "127.0.0.1/32"], alt_node_ip: false, localhost: false },
        NodePortsCase { name: "ipv4, localhost-nodeports enabled, multiple nodeport-addresses", family: V4, localhost_node_ports: false, node_port_addresses: multiple, alt_node_ip: true, localhost: false },
        NodePortsCase { name: "ipv6, localhost-nodeports enabled", family: V6, localhost_node_ports: true, node_port_addresses: &[], alt_node_ip: true, localhost: false },
        NodePortsCase { name: "ipv6, localhost-nodeports disabled", family: V6, localhost_node_ports: false, node_port_addresses: &[], alt_node_ip: true, localhost: false },
        NodePortsCase { name: "ipv6, localhost-nodeports disabled, multiple nodeport-addresses", family: V6, localhost_node_ports: false, node_port_addresses: multiple, alt_node_ip: false, localhost: false },
        // Ours, the same way: 1.37's keywords, mixed with each other and with CIDRs.
        NodePortsCase { name: "ipv4, primary and localhost", family: V4, localhost_node_ports: true, node_port_addresses: &["primary", "localhost"], alt_node_ip: false, localhost: true },
        NodePortsCase { name: "ipv4, primary only", family: V4, localhost_node_ports: true, node_port_addresses: &["primary"], alt_node_ip: false, localhost: false },
        NodePortsCase { name: "ipv4, all and a CIDR", family: V4, localhost_node_ports: true, node_port_addresses: &["all", "192.168.0.0/24"], alt_node_ip: true, localhost: true },
        NodePortsCase { name: "ipv6, primary and localhost", family: V6, localhost_node_ports: true, node_port_addresses: &["primary", "localhost"], alt_node_ip: false, localhost: false },
        NodePortsCase { name: "ipv6, localhost and a CIDR", family: V6, localhost_node_ports: true, node_port_addresses: &["localhost", "2001:db8::/64"], alt_node_ip: false, localhost: false },
    ];
    for case in &cases {
        node_ports_flows(case);
    }
}
