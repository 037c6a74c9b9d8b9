//! Upstream's table of endpoint categorization cases (pkg/proxy/topology_test.go), as data.

use super::*;

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
