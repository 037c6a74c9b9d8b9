use super::*;
use crate::model::fixtures::{endpoint, hinted, service_port, terminating};
use crate::model::types::ServicePort;

const NODE: NodeContext<'static> = NodeContext {
    node_name: "node-a",
    zone: Some("zone-a"),
};

fn ips(eps: &[&Endpoint]) -> Vec<String> {
    eps.iter().map(|e| e.ip.to_string()).collect()
}

/// One row: the service's policies, its endpoints, and what each set must hold.
struct Case {
    name: &'static str,
    internal_local: bool,
    external_local: bool,
    node_port: bool,
    endpoints: Vec<Endpoint>,
    cluster: &'static [&'static str],
    local: &'static [&'static str],
    all: &'static [&'static str],
    has_any: bool,
}

fn service(case: &Case) -> ServicePort {
    let mut svc = service_port("ns", "svc", "p");
    svc.internal_policy_local = case.internal_local;
    svc.external_policy_local = case.external_local;
    svc.node_port = case.node_port.then_some(30080);
    svc
}

#[test]
fn selection_table() {
    let a1 = || endpoint("10.0.0.1", "node-a");
    let a2 = || endpoint("10.0.0.2", "node-a");
    let b1 = || endpoint("10.0.1.1", "node-b");
    let b2 = || endpoint("10.0.1.2", "node-b");
    let cases = vec![
        Case {
            name: "cluster policy uses every ready endpoint",
            internal_local: false,
            external_local: false,
            node_port: false,
            endpoints: vec![a1(), b1(), terminating(b2())],
            cluster: &["10.0.0.1", "10.0.1.1"],
            local: &[],
            all: &["10.0.0.1", "10.0.1.1"],
            has_any: true,
        },
        Case {
            name: "no ready endpoints: serving terminating ones are used",
            internal_local: false,
            external_local: false,
            node_port: false,
            endpoints: vec![terminating(a1()), terminating(b1())],
            cluster: &["10.0.0.1", "10.0.1.1"],
            local: &[],
            all: &["10.0.0.1", "10.0.1.1"],
            has_any: true,
        },
        Case {
            name: "terminating and not serving is never used",
            internal_local: false,
            external_local: false,
            node_port: false,
            endpoints: vec![{
                let mut ep = terminating(a1());
                ep.serving = false;
                ep
            }],
            cluster: &[],
            local: &[],
            all: &[],
            has_any: false,
        },
        Case {
            name: "no endpoints at all",
            internal_local: false,
            external_local: false,
            node_port: false,
            endpoints: vec![],
            cluster: &[],
            local: &[],
            all: &[],
            has_any: false,
        },
        Case {
            name: "internal Local uses only this node's endpoints",
            internal_local: true,
            external_local: false,
            node_port: false,
            endpoints: vec![a1(), b1()],
            cluster: &[],
            local: &["10.0.0.1"],
            all: &["10.0.0.1"],
            has_any: true,
        },
        Case {
            name: "internal Local with no local endpoints still knows others exist (drop, not reject)",
            internal_local: true,
            external_local: false,
            node_port: false,
            endpoints: vec![b1(), b2()],
            cluster: &[],
            local: &[],
            all: &[],
            has_any: true,
        },
        Case {
            name: "external Local on a NodePort: cluster set for internal traffic, local for external",
            internal_local: false,
            external_local: true,
            node_port: true,
            endpoints: vec![a1(), a2(), b1()],
            cluster: &["10.0.0.1", "10.0.0.2", "10.0.1.1"],
            local: &["10.0.0.1", "10.0.0.2"],
            all: &["10.0.0.1", "10.0.0.2", "10.0.1.1"],
            has_any: true,
        },
        Case {
            name: "external Local falls back to local terminating endpoints; union adds them",
            internal_local: false,
            external_local: true,
            node_port: true,
            endpoints: vec![terminating(a1()), b1()],
            cluster: &["10.0.1.1"],
            local: &["10.0.0.1"],
            all: &["10.0.0.1", "10.0.1.1"],
            has_any: true,
        },
        Case {
            name: "external Local without an external address behaves as Cluster",
            internal_local: false,
            external_local: true,
            node_port: false,
            endpoints: vec![a1(), b1()],
            cluster: &["10.0.0.1", "10.0.1.1"],
            local: &[],
            all: &["10.0.0.1", "10.0.1.1"],
            has_any: true,
        },
        Case {
            name: "topology hints for this zone narrow the cluster set",
            internal_local: false,
            external_local: false,
            node_port: false,
            endpoints: vec![
                hinted(a1(), &["zone-a"]),
                hinted(b1(), &["zone-b"]),
                hinted(b2(), &["zone-a", "zone-b"]),
            ],
            cluster: &["10.0.0.1", "10.0.1.2"],
            local: &[],
            all: &["10.0.0.1", "10.0.1.2"],
            has_any: true,
        },
        Case {
            name: "hints ignored when one ready endpoint has none",
            internal_local: false,
            external_local: false,
            node_port: false,
            endpoints: vec![hinted(a1(), &["zone-a"]), b1()],
            cluster: &["10.0.0.1", "10.0.1.1"],
            local: &[],
            all: &["10.0.0.1", "10.0.1.1"],
            has_any: true,
        },
        Case {
            name: "hints ignored when none names this zone",
            internal_local: false,
            external_local: false,
            node_port: false,
            endpoints: vec![hinted(a1(), &["zone-c"]), hinted(b1(), &["zone-b"])],
            cluster: &["10.0.0.1", "10.0.1.1"],
            local: &[],
            all: &["10.0.0.1", "10.0.1.1"],
            has_any: true,
        },
        Case {
            name: "topology plus external Local: union of hinted cluster set and local set",
            internal_local: false,
            external_local: true,
            node_port: true,
            endpoints: vec![hinted(a1(), &["zone-b"]), hinted(b1(), &["zone-a"])],
            cluster: &["10.0.1.1"],
            local: &["10.0.0.1"],
            all: &["10.0.0.1", "10.0.1.1"],
            has_any: true,
        },
    ];
    for case in &cases {
        let svc = service(case);
        let got = select_endpoints(&svc, &case.endpoints, NODE);
        assert_eq!(ips(&got.cluster), case.cluster, "{}: cluster", case.name);
        assert_eq!(ips(&got.local), case.local, "{}: local", case.name);
        assert_eq!(ips(&got.all_reachable), case.all, "{}: all", case.name);
        assert_eq!(
            got.has_any_endpoints, case.has_any,
            "{}: has_any",
            case.name
        );
    }
}

#[test]
fn hints_need_a_zone_on_the_node() {
    let svc = service_port("ns", "svc", "p");
    let eps = vec![
        hinted(endpoint("10.0.0.1", "a"), &["zone-a"]),
        hinted(endpoint("10.0.0.2", "b"), &["zone-b"]),
    ];
    let got = select_endpoints(
        &svc,
        &eps,
        NodeContext {
            node_name: "a",
            zone: None,
        },
    );
    assert_eq!(got.cluster.len(), 2);
}

/// An endpoint written as upstream's test table writes it: `ip:port` and flags `R` ready, `S`
/// serving, `T` terminating, `L` local, `z=a,b` zone hints, `n=a,b` node hints.
fn upstream_endpoint(text: &str, node: &str) -> Endpoint {
    let mut words = text.split_whitespace();
    let address: std::net::SocketAddr = words.next().unwrap().parse().unwrap();
    let mut ep = Endpoint {
        ip: address.ip(),
        port: address.port(),
        ready: false,
        serving: false,
        terminating: false,
        node_name: Some("elsewhere".into()),
        zone: None,
        zone_hints: Default::default(),
        node_hints: Default::default(),
    };
    for word in words {
        if let Some(zones) = word.strip_prefix("z=") {
            ep.zone_hints = zones.split(',').map(str::to_string).collect();
        } else if let Some(nodes) = word.strip_prefix("n=") {
            ep.node_hints = nodes.split(',').map(str::to_string).collect();
        } else {
            for flag in word.chars() {
                match flag {
                    'R' => ep.ready = true,
                    'S' => ep.serving = true,
                    'T' => ep.terminating = true,
                    'L' => ep.node_name = Some(node.into()),
                    other => panic!("unknown flag {other}"),
                }
            }
        }
    }
    ep
}

mod upstream_table;
