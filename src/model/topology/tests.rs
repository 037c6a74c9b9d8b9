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

/// Upstream's TestCategorizeEndpoints (pkg/proxy/topology_test.go, 1.33-1.35) as data, with its
/// PreferSameNode cases; compared as upstream compares (sets; `None`: the kind is not used).
/// `(name, zone, node, (iTP Local, eTP Local, NodePort), endpoints, cluster, local, all,
/// only remote endpoints)`. The case with the PreferSameTrafficDistribution gate off is left
/// out: the gate is locked on in 1.35.
#[test]
fn upstreams_categorize_endpoints_table() {
    type Row = (
        &'static str,
        Option<&'static str>,
        &'static str,
        (bool, bool, bool),
        &'static [&'static str],
        Option<&'static [&'static str]>,
        Option<&'static [&'static str]>,
        Option<&'static [&'static str]>,
        bool,
    );
    let four_zoned: &[&str] = &[
        "10.1.2.3:80 R z=zone-a",
        "10.1.2.4:80 R z=zone-b",
        "10.1.2.5:80 R z=zone-c",
        "10.1.2.6:80 R z=zone-a",
    ];
    let local_zoned: &[&str] = &[
        "10.1.2.3:80 RL z=zone-a",
        "10.1.2.4:80 RL z=zone-b",
        "10.1.2.5:80 R z=zone-c",
        "10.1.2.6:80 R z=zone-a",
    ];
    let node_hinted: &[&str] = &[
        "10.1.2.3:80 RS z=zone-a n=node-1",
        "10.1.2.4:80 RS z=zone-b n=node-2",
        "10.1.2.5:80 RS z=zone-c n=node-3",
        "10.1.2.6:80 RS z=zone-a n=node-4",
    ];
    let rows: Vec<Row> = vec![
        (
            "should use topology since all endpoints have hints, node has a zone label and and there are endpoints for the node's zone",
            Some("zone-a"),
            "",
            (false, false, false),
            four_zoned,
            Some(&["10.1.2.3:80", "10.1.2.6:80"]),
            None,
            None,
            false,
        ),
        (
            "externalTrafficPolicy: Local, topology ignored for Local endpoints",
            Some("zone-a"),
            "",
            (false, true, true),
            local_zoned,
            Some(&["10.1.2.3:80", "10.1.2.6:80"]),
            Some(&["10.1.2.3:80", "10.1.2.4:80"]),
            Some(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"]),
            false,
        ),
        (
            "internalTrafficPolicy: Local, topology ignored for Local endpoints",
            Some("zone-a"),
            "",
            (true, false, true),
            local_zoned,
            Some(&["10.1.2.3:80", "10.1.2.6:80"]),
            Some(&["10.1.2.3:80", "10.1.2.4:80"]),
            Some(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"]),
            false,
        ),
        (
            "empty node labels",
            None,
            "",
            (false, false, false),
            &["10.1.2.3:80 R z=zone-a"],
            Some(&["10.1.2.3:80"]),
            None,
            None,
            false,
        ),
        (
            "empty zone label",
            Some(""),
            "",
            (false, false, false),
            &["10.1.2.3:80 R z=zone-a"],
            Some(&["10.1.2.3:80"]),
            None,
            None,
            false,
        ),
        (
            "node in different zone, no endpoint filtering",
            Some("zone-b"),
            "",
            (false, false, false),
            &["10.1.2.3:80 R z=zone-a"],
            Some(&["10.1.2.3:80"]),
            None,
            None,
            false,
        ),
        (
            "unready endpoint",
            Some("zone-a"),
            "",
            (false, false, false),
            &[
                "10.1.2.3:80 R z=zone-a",
                "10.1.2.4:80 R z=zone-b",
                "10.1.2.5:80 R z=zone-c",
                "10.1.2.6:80 z=zone-a",
            ],
            Some(&["10.1.2.3:80"]),
            None,
            None,
            false,
        ),
        (
            "only unready endpoints in same zone (should not filter)",
            Some("zone-a"),
            "",
            (false, false, false),
            &[
                "10.1.2.3:80 z=zone-a",
                "10.1.2.4:80 R z=zone-b",
                "10.1.2.5:80 R z=zone-c",
                "10.1.2.6:80 z=zone-a",
            ],
            Some(&["10.1.2.4:80", "10.1.2.5:80"]),
            None,
            None,
            false,
        ),
        (
            "missing hints, no filtering applied",
            Some("zone-a"),
            "",
            (false, false, false),
            &[
                "10.1.2.3:80 R z=zone-a",
                "10.1.2.4:80 R z=zone-b",
                "10.1.2.5:80 R",
                "10.1.2.6:80 R z=zone-a",
            ],
            Some(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80", "10.1.2.6:80"]),
            None,
            None,
            false,
        ),
        (
            "multiple hints per endpoint, filtering includes any endpoint with zone included",
            Some("zone-c"),
            "",
            (false, false, false),
            &[
                "10.1.2.3:80 R z=zone-a,zone-b,zone-c",
                "10.1.2.4:80 R z=zone-b,zone-c",
                "10.1.2.5:80 R z=zone-b,zone-d",
                "10.1.2.6:80 R z=zone-c",
            ],
            Some(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"]),
            None,
            None,
            false,
        ),
        (
            "PreferSameNode available",
            Some("zone-a"),
            "node-1",
            (false, false, false),
            node_hinted,
            Some(&["10.1.2.3:80"]),
            None,
            None,
            false,
        ),
        (
            "PreferSameNode ignored if some endpoints unhinted",
            Some("zone-a"),
            "node-1",
            (false, false, false),
            &[
                "10.1.2.3:80 RS z=zone-a n=node-1",
                "10.1.2.4:80 RS",
                "10.1.2.5:80 RS z=zone-c n=node-3",
                "10.1.2.6:80 RS z=zone-a n=node-4",
            ],
            Some(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80", "10.1.2.6:80"]),
            None,
            None,
            false,
        ),
        (
            "PreferSameNode falls back to PreferSameZone if no endpoint for node",
            Some("zone-a"),
            "node-0",
            (false, false, false),
            node_hinted,
            Some(&["10.1.2.3:80", "10.1.2.6:80"]),
            None,
            None,
            false,
        ),
        (
            "conflicting topology and localness require merging allEndpoints",
            Some("zone-a"),
            "",
            (false, true, true),
            &[
                "10.0.0.0:80 RL z=zone-a",
                "10.0.0.1:80 RL z=zone-b",
                "10.0.0.2:80 R z=zone-a",
                "10.0.0.3:80 R z=zone-b",
            ],
            Some(&["10.0.0.0:80", "10.0.0.2:80"]),
            Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            Some(&["10.0.0.0:80", "10.0.0.1:80", "10.0.0.2:80"]),
            false,
        ),
        (
            "internalTrafficPolicy: Local, with empty endpoints",
            None,
            "",
            (true, false, false),
            &[],
            None,
            Some(&[]),
            None,
            false,
        ),
        (
            "internalTrafficPolicy: Local, but all endpoints are remote",
            None,
            "",
            (true, false, false),
            &["10.0.0.0:80 R", "10.0.0.1:80 R"],
            None,
            Some(&[]),
            None,
            true,
        ),
        (
            "internalTrafficPolicy: Local, all endpoints are local",
            None,
            "",
            (true, false, false),
            &["10.0.0.0:80 RL", "10.0.0.1:80 RL"],
            None,
            Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            None,
            false,
        ),
        (
            "internalTrafficPolicy: Local, some endpoints are local",
            None,
            "",
            (true, false, false),
            &["10.0.0.0:80 RL", "10.0.0.1:80 R"],
            None,
            Some(&["10.0.0.0:80"]),
            None,
            false,
        ),
        (
            "Cluster traffic policy, endpoints not Ready",
            None,
            "",
            (false, false, false),
            &["10.0.0.0:80", "10.0.0.1:80"],
            Some(&[]),
            None,
            None,
            false,
        ),
        (
            "Cluster traffic policy, some endpoints are Ready",
            None,
            "",
            (false, false, false),
            &["10.0.0.0:80", "10.0.0.1:80 R"],
            Some(&["10.0.0.1:80"]),
            None,
            None,
            false,
        ),
        (
            "Cluster traffic policy, all endpoints are terminating",
            None,
            "",
            (false, false, false),
            &["10.0.0.0:80 STL", "10.0.0.1:80 ST"],
            Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            None,
            None,
            false,
        ),
        (
            "iTP: Local, eTP: Cluster, some endpoints local",
            None,
            "",
            (true, false, true),
            &["10.0.0.0:80 RL", "10.0.0.1:80 R"],
            Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            Some(&["10.0.0.0:80"]),
            Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            false,
        ),
        (
            "iTP: Cluster, eTP: Local, some endpoints local",
            None,
            "",
            (false, true, true),
            &["10.0.0.0:80 RL", "10.0.0.1:80 R"],
            Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            Some(&["10.0.0.0:80"]),
            Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            false,
        ),
        (
            "iTP: Local, eTP: Local, some endpoints local",
            None,
            "",
            (true, true, true),
            &["10.0.0.0:80 RL", "10.0.0.1:80 R"],
            Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            Some(&["10.0.0.0:80"]),
            Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            false,
        ),
        (
            "iTP: Local, eTP: Local, all endpoints remote",
            None,
            "",
            (true, true, true),
            &["10.0.0.0:80 R", "10.0.0.1:80 R"],
            Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            Some(&[]),
            Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            false,
        ),
        (
            "iTP: Local, eTP: Local, all endpoints remote and terminating",
            None,
            "",
            (true, true, true),
            &["10.0.0.0:80 ST", "10.0.0.1:80 ST"],
            Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            Some(&[]),
            Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            true,
        ),
        (
            "iTP: Cluster, eTP: Local, with terminating endpoints",
            None,
            "",
            (false, true, true),
            &[
                "10.0.0.0:80 R",
                "10.0.0.1:80 L",
                "10.0.0.2:80 STL",
                "10.0.0.3:80 ST",
            ],
            Some(&["10.0.0.0:80"]),
            Some(&["10.0.0.2:80"]),
            Some(&["10.0.0.0:80", "10.0.0.2:80"]),
            false,
        ),
        (
            "externalTrafficPolicy ignored if not externally accessible",
            None,
            "",
            (false, true, false),
            &["10.0.0.0:80 R", "10.0.0.1:80 RL"],
            Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            None,
            Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            false,
        ),
        (
            "no cluster endpoints for iTP:Local internal-only service",
            None,
            "",
            (true, false, false),
            &["10.0.0.0:80 R", "10.0.0.1:80 RL"],
            None,
            Some(&["10.0.0.1:80"]),
            Some(&["10.0.0.1:80"]),
            false,
        ),
    ];
    for (name, zone, node, (itp, etp, node_port), endpoints, cluster, local, all, only_remote) in
        rows
    {
        let node_name = if node.is_empty() { "this-node" } else { node };
        let eps: Vec<Endpoint> = endpoints
            .iter()
            .map(|text| upstream_endpoint(text, node_name))
            .collect();
        let mut svc = service_port("ns", "svc", "p");
        svc.internal_policy_local = itp;
        svc.external_policy_local = etp;
        svc.node_port = node_port.then_some(8080);
        let ctx = NodeContext {
            node_name,
            zone: zone.filter(|z| !z.is_empty()),
        };
        let selected = select_endpoints(&svc, &eps, ctx);
        let set = |v: &[&Endpoint]| -> std::collections::BTreeSet<String> {
            v.iter().map(|e| e.address()).collect()
        };
        let want = |v: Option<&[&str]>| -> std::collections::BTreeSet<String> {
            v.unwrap_or_default()
                .iter()
                .map(|s| s.to_string())
                .collect()
        };
        assert_eq!(set(&selected.cluster), want(cluster), "{name}: cluster");
        assert_eq!(set(&selected.local), want(local), "{name}: local");
        let expected_all = match (cluster, local) {
            (Some(_), None) => want(cluster),
            (None, Some(_)) => want(local),
            _ => want(all),
        };
        assert_eq!(set(&selected.all_reachable), expected_all, "{name}: all");
        assert_eq!(
            selected.has_any_endpoints,
            !expected_all.is_empty() || only_remote,
            "{name}: has any endpoints"
        );
    }
}
