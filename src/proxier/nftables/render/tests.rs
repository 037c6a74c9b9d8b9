//! Golden tests of the nftables renderer against upstream's own expectations (the inputs and
//! expected table of TestOverallNFTablesRules), compared as upstream compares.

use super::*;
use crate::config::KubeProxyConfiguration;
use crate::proxier::fixtures::{
    NODE, NODE_IP, Svc, ep, family_context, overall_services, svc_port,
};
use crate::proxier::local::LOCALHOST_NODE_PORTS_GATE;
use crate::proxier::nftables::names;
use crate::proxier::nftables::slots::Placement;

/// Upstream's test context: pod CIDR 10.0.0.0/8, mark 0x4000, NodePorts on 192.168.0.2, the
/// ServiceCIDR 172.30.0.0/16.
pub fn context() -> NftContext {
    NftContext {
        common: family_context(IpFamily::V4, NODE_IP, "10.0.0.0/8"),
        node_port_addresses: NodePortAddresses::Only(vec![NODE_IP.parse().unwrap()]),
        service_cidrs: vec!["172.30.0.0/16".parse().unwrap()],
        localhost_rejects: Vec::new(),
        offload_after_packets: None,
    }
}

/// Base and services merged, as one table.
pub fn table(services: &[Svc], ctx: &NftContext) -> Objects {
    let mut all = render_base(ctx);
    let mut slots = SlotTable::default();
    for svc in services {
        let rendered = render_service(&svc.ports, Some(&svc.endpoints), ctx, &mut slots);
        all.chains.extend(rendered.chains);
        all.sets.extend(rendered.sets);
        for (set, elements) in rendered.elements {
            all.elements
                .get_or_insert_with(set, Default::default)
                .extend(&elements);
        }
    }
    keep_maps_in_use(&mut all, &slots.maps_in_use());
    all
}

/// Leaves out of `objects` the endpoint maps no chain draws from: the table declares only
/// those in `in_use`.
pub fn keep_maps_in_use(objects: &mut Objects, in_use: &std::collections::BTreeSet<String>) {
    let unused: Vec<String> = objects
        .sets
        .keys()
        .filter(|name| slots::is_endpoint_map(name) && !in_use.contains(*name))
        .cloned()
        .collect();
    for name in unused {
        objects.sets.remove(&name);
    }
}

/// The table as `nft -f` text, one object a line.
pub fn dump(objects: &Objects, ctx: &NftContext) -> String {
    let ip = ctx.ip();
    let mut out = format!("add table {ip} {TABLE} {{ comment \"rules for kube-proxy\" ; }}\n");
    for (name, set) in &objects.sets {
        out.push_str(&format!(
            "add {} {ip} {TABLE} {name} {}\n",
            set.kind, set.spec
        ));
    }
    for name in &objects.counters {
        out.push_str(&format!("add counter {ip} {TABLE} {name}\n"));
    }
    for (name, chain) in &objects.chains {
        if chain.spec.is_empty() {
            out.push_str(&format!("add chain {ip} {TABLE} {name}\n"));
        } else {
            out.push_str(&format!("add chain {ip} {TABLE} {name} {}\n", chain.spec));
        }
        for rule in &chain.rules {
            out.push_str(&format!("add rule {ip} {TABLE} {name} {rule}\n"));
        }
    }
    for (set, elements) in &objects.elements {
        for (key, rest) in elements {
            out.push_str(&format!(
                "add element {ip} {TABLE} {set} {{ {key}{rest} }}\n"
            ));
        }
    }
    out
}

/// Lines sorted as upstream's sortNFTablesTransaction sorts them: blank and comment lines
/// dropped; by kind (table, chain, rule, set, map, element), then by object name; rules keep
/// their order within a chain; other lines of one name sorted.
pub fn sorted(text: &str) -> Vec<String> {
    let order = |kind: &str| match kind {
        "table" => 0,
        "chain" => 1,
        "rule" => 2,
        "set" => 3,
        "map" => 4,
        _ => 5,
    };
    let mut lines: Vec<(usize, String, usize, String)> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .enumerate()
        .map(|(index, line)| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let kind = words.get(1).copied().unwrap_or("");
            let name = words.get(4).copied().unwrap_or("").to_string();
            let position = if kind == "rule" { index } else { 0 };
            (order(kind), name, position, line.to_string())
        })
        .collect();
    lines.sort_by(|a, b| {
        (a.0, &a.1, a.2).cmp(&(b.0, &b.1, b.2)).then_with(|| {
            if a.0 == 2 {
                std::cmp::Ordering::Equal
            } else {
                a.3.cmp(&b.3)
            }
        })
    });
    lines.into_iter().map(|(_, _, _, line)| line).collect()
}

/// Compares two tables as upstream does, with a readable diff.
pub fn assert_same_table(got: &str, want: &str) {
    let (got, want) = (sorted(got), sorted(want));
    if got == want {
        return;
    }
    let missing: Vec<String> = want
        .iter()
        .filter(|l| !got.contains(l))
        .map(|l| format!("- {l}"))
        .collect();
    let unexpected: Vec<String> = got
        .iter()
        .filter(|l| !want.contains(l))
        .map(|l| format!("+ {l}"))
        .collect();
    panic!(
        "tables differ\nmissing:\n{}\nunexpected:\n{}\nsame lines, other order: {}\n\nfull table:\n{}",
        missing.join("\n"),
        unexpected.join("\n"),
        missing.is_empty() && unexpected.is_empty(),
        got.join("\n")
    );
}

pub fn golden(name: &str) -> String {
    let path = format!(
        "{}/tests/golden/nftables/{name}.nft",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The lines of a table outside what our layout replaces (docs/nftables.md): the rules of
/// service chains without session affinity, the endpoint maps they DNAT through, and the
/// endpoint chains of those services.
pub(crate) fn outside_our_changes(text: &str) -> String {
    let affinity_services: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("add rule") && l.contains(" @affinity-"))
        .filter_map(|l| l.split_whitespace().nth(4))
        .collect();
    text.lines()
        .filter(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let object = words.get(4).copied().unwrap_or("");
            let with_affinity = |suffix: &str| text.contains(&format!("affinity-{suffix}"));
            match (words.get(1).copied(), object.split_once('-')) {
                (Some("chain" | "rule"), Some(("endpoint", suffix))) => with_affinity(suffix),
                (Some("rule"), Some(("service", _))) => affinity_services.contains(&object),
                (Some("map" | "element"), Some(("endpoints", _))) => false,
                _ => true,
            }
        })
        .map(|line| format!("{line}\n"))
        .collect()
}

/// Upstream 1.37's expected table, and ours, compared as upstream compares outside the
/// constructs our layout replaces; ours is pinned in overall-ours.nft (`UPDATE_GOLDEN=1`
/// rewrites it). Upstream's test turns the localhost NodePorts gate on without a loopback
/// address in nodePortAddresses: every protocol's loopback NodePorts are rejected.
#[test]
fn upstreams_overall_table() {
    let ctx = NftContext {
        localhost_rejects: vec![Protocol::Tcp, Protocol::Udp, Protocol::Sctp],
        offload_after_packets: None,
        ..context()
    };
    let ours = dump(&table(&overall_services(), &ctx), &ctx);
    assert_same_table(
        &outside_our_changes(&ours),
        &outside_our_changes(&golden("overall")),
    );
    let path = format!(
        "{}/tests/golden/nftables/overall-ours.nft",
        env!("CARGO_MANIFEST_DIR")
    );
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &ours).unwrap();
    }
    assert_same_table(&ours, &golden("overall-ours"));
}

/// A chain whose slot another chain holds DNATs through upstream's anonymous map, and takes
/// nothing from the holder.
#[test]
fn a_chain_whose_slot_is_taken_keeps_the_anonymous_map() {
    let ctx = context();
    let svc4 = &overall_services()[3];
    let name = names::service_chain(&svc4.ports.values().next().unwrap().name);
    // The chain's own slot, held by another chain.
    let (_, (key, _, _)) = SlotTable::default().claim("tcp", &name, &svc4.key).unwrap();
    // ... by a chain whose name hashes lower (it keeps the slot).
    let mut slots = SlotTable::default();
    slots.add(&[(key, 0, 0)]);
    let objects = render_service(&svc4.ports, Some(&svc4.endpoints), &ctx, &mut slots);
    assert_eq!(
        objects.chains[&name].rules[0],
        "meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.180.0.4 . 80 , 1 : 10.180.0.5 . 80 }"
    );
    assert!(objects.slots.is_empty());
    assert!(
        !objects
            .elements
            .keys()
            .any(|set| set.starts_with("endpoints-"))
    );
}

#[test]
fn services_without_affinity_dnat_through_a_map_and_count_hairpins() {
    let ctx = context();
    let svc4 = &overall_services()[3];
    let objects = render_service(
        &svc4.ports,
        Some(&svc4.endpoints),
        &ctx,
        &mut SlotTable::default(),
    );
    assert!(
        !objects.chains.keys().any(|c| c.starts_with("endpoint-")),
        "{objects:?}"
    );
    let name = names::service_chain(&svc4.ports.values().next().unwrap().name);
    let chain = &objects.chains[&name];
    // The chain's slot: its name's, in one of the shared tcp maps.
    let (Placement { map, offset }, _) =
        SlotTable::default().claim("tcp", &name, &svc4.key).unwrap();
    assert_eq!(
        chain.rules,
        [format!(
            "meta l4proto tcp dnat ip addr . port to numgen random mod 16384 offset {offset} map @{map}"
        )]
    );
    assert!(objects.sets.is_empty(), "{:?}", objects.sets);
    let shares: Vec<(&str, &str)> = objects.elements[&map].iter().collect();
    let half = offset + 8192;
    assert_eq!(
        shares,
        [
            (
                format!("{offset}-{}", half - 1).as_str(),
                " : 10.180.0.4 . 80"
            ),
            (
                format!("{half}-{}", offset + 16383).as_str(),
                " : 10.180.0.5 . 80"
            ),
        ]
    );
    // Only this node's endpoints can be their own client (10.180.0.4 runs elsewhere).
    let hairpins: Vec<&str> = objects.elements[HAIRPIN_CONNECTIONS].keys().collect();
    assert_eq!(hairpins, ["10.180.0.5 . 10.180.0.5 . tcp . 80"]);
    // With session affinity, upstream's endpoint chains stay (they update the affinity sets),
    // without a rule for hairpin traffic: the set has it, when the endpoint is on this node.
    let svc5 = &overall_services()[4];
    let objects = render_service(
        &svc5.ports,
        Some(&svc5.endpoints),
        &ctx,
        &mut SlotTable::default(),
    );
    let endpoint = objects
        .chains
        .iter()
        .find(|(name, _)| name.starts_with("endpoint-"))
        .map(|(_, chain)| chain.rules.clone());
    assert_eq!(
        endpoint.unwrap(),
        [
            "update @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { ip saddr }",
            "meta l4proto tcp dnat to 10.180.0.3:80"
        ]
    );
    let hairpins: Vec<&str> = objects.elements[HAIRPIN_CONNECTIONS].keys().collect();
    assert_eq!(hairpins, ["10.180.0.3 . 10.180.0.3 . tcp . 80"]);
    let mut remote = svc5.endpoints.clone();
    remote.values_mut().for_each(|endpoints| {
        endpoints
            .iter_mut()
            .for_each(|ep| ep.node_name = Some("other-node".into()))
    });
    let objects = render_service(&svc5.ports, Some(&remote), &ctx, &mut SlotTable::default());
    assert!(!objects.elements.contains_key(HAIRPIN_CONNECTIONS));
}

#[test]
fn counts_ports_without_local_endpoints() {
    let ctx = context();
    let counts: (usize, usize) = overall_services()
        .iter()
        .map(|s| {
            render_service(
                &s.ports,
                Some(&s.endpoints),
                &ctx,
                &mut SlotTable::default(),
            )
            .no_local_endpoints
        })
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    assert_eq!(
        counts,
        (0, 1),
        "svc2: Local external policy, no local endpoint"
    );
}

#[test]
fn element_comments_are_cut_to_what_nft_accepts() {
    use crate::model::Protocol;
    use crate::proxier::fixtures::svc_port;
    // The longest names a Service may have: 63, 63 and 15 bytes make 143 with the separators.
    let (namespace, name, port) = ("n".repeat(63), "s".repeat(63), "p".repeat(15));
    let long = svc_port(
        &namespace,
        &name,
        &port,
        Protocol::Tcp,
        80,
        "172.30.0.99",
        |_| {},
    );
    let objects = render_service(&long.ports, None, &context(), &mut SlotTable::default());
    let comments: Vec<&str> = objects
        .elements
        .values()
        .flat_map(|elements| elements.iter())
        .filter_map(|(_, value)| value.split(" comment \"").nth(1))
        .map(|rest| rest.split('"').next().unwrap_or_default())
        .collect();
    assert!(!comments.is_empty(), "{objects:?}");
    for comment in comments {
        assert_eq!(comment.len(), 128, "{comment}");
        assert!(format!("{namespace}/{name}:{port}").starts_with(comment));
    }
}

/// One of upstream's localhost NodePort tests: its nodePortAddresses, its services, the lines
/// it requires, and whether the proxy serves TCP (no TCP reject then).
struct LocalhostCase {
    name: &'static str,
    addresses: &'static [&'static str],
    services: Vec<Svc>,
    wanted: Vec<&'static str>,
    tcp_served: bool,
}

/// Upstream 1.37's TestLocalhostNodePortReject, TestLocalhostNodePortRejectAll and
/// TestLocalhostNodePortProxy: the gate on, nodePortAddresses as each sets it, the lines each
/// requires in the table (verbatim), and the TCP lines each forbids while the proxy serves TCP.
#[test]
fn upstreams_localhost_node_port_cases() {
    let tcp = svc_port(
        "ns1",
        "svc-tcp",
        "p80",
        Protocol::Tcp,
        80,
        "172.30.0.41",
        |s| s.node_port = Some(30080),
    )
    .with_endpoints(vec![ep("10.180.0.1", 80, NODE)]);
    let udp = svc_port(
        "ns1",
        "svc-udp",
        "p53",
        Protocol::Udp,
        53,
        "172.30.0.42",
        |s| s.node_port = Some(30053),
    );
    let sctp = svc_port(
        "ns3",
        "svc-sctp",
        "p9",
        Protocol::Sctp,
        9,
        "172.30.0.43",
        |s| s.node_port = Some(30009),
    );
    let reject_udp = [
        "add counter ip kube-proxy localhost-nodeport-rejected-udp",
        "add counter ip kube-proxy localhost-nodeport-rejected-sctp",
        "add rule ip kube-proxy localhost-nodeport-reject-udp counter name \"localhost-nodeport-rejected-udp\" reject",
        "add rule ip kube-proxy localhost-nodeport-reject-sctp counter name \"localhost-nodeport-rejected-sctp\" reject",
        "add rule ip kube-proxy nodeport-endpoints-check ip daddr 127.0.0.0/8 meta l4proto . th dport vmap @localhost-nodeport-reject-ports",
    ];
    let cases = [
        LocalhostCase {
            name: "TestLocalhostNodePortReject",
            addresses: &["127.0.0.0/8"],
            services: vec![udp],
            wanted: [&reject_udp[..], &["add element ip kube-proxy localhost-nodeport-reject-ports { udp . 30053 : goto localhost-nodeport-reject-udp }"]].concat(),
            tcp_served: true,
        },
        LocalhostCase {
            name: "TestLocalhostNodePortRejectAll",
            addresses: &["192.168.0.2/32"],
            services: vec![
                svc_port("ns1", "svc-tcp", "p80", Protocol::Tcp, 80, "172.30.0.41", |s| {
                    s.node_port = Some(30080)
                }),
                svc_port("ns2", "svc-udp", "p53", Protocol::Udp, 53, "172.30.0.42", |s| {
                    s.node_port = Some(30053)
                }),
                sctp,
            ],
            wanted: [
                &reject_udp[..],
                &[
                    "add counter ip kube-proxy localhost-nodeport-rejected-tcp",
                    "add rule ip kube-proxy localhost-nodeport-reject-tcp counter name \"localhost-nodeport-rejected-tcp\" reject",
                    "add element ip kube-proxy localhost-nodeport-reject-ports { tcp . 30080 : goto localhost-nodeport-reject-tcp }",
                    "add element ip kube-proxy localhost-nodeport-reject-ports { udp . 30053 : goto localhost-nodeport-reject-udp }",
                    "add element ip kube-proxy localhost-nodeport-reject-ports { sctp . 30009 : goto localhost-nodeport-reject-sctp }",
                ],
            ]
            .concat(),
            tcp_served: false,
        },
        LocalhostCase {
            name: "TestLocalhostNodePortProxy",
            addresses: &["192.168.0.2/32", "127.0.0.0/8"],
            services: vec![tcp],
            wanted: [&reject_udp[..], &["add element ip kube-proxy service-nodeports { tcp . 30080 : goto external-"]].concat(),
            tcp_served: true,
        },
    ];
    for LocalhostCase {
        name,
        addresses,
        services,
        wanted,
        tcp_served,
    } in cases
    {
        let config = KubeProxyConfiguration {
            feature_gates: [(LOCALHOST_NODE_PORTS_GATE.to_string(), true)].into(),
            node_port_addresses: addresses.iter().map(|a| a.to_string()).collect(),
            ..KubeProxyConfiguration::default()
        };
        let settings = crate::proxier::nftables::NftablesSettings::from_config(&config);
        let ctx = NftContext {
            localhost_rejects: settings.localhost_rejects(IpFamily::V4),
            offload_after_packets: None,
            ..context()
        };
        let ours = dump(&table(&services, &ctx), &ctx);
        for line in wanted {
            assert!(ours.contains(line), "{name}: no {line:?} in\n{ours}");
        }
        if tcp_served {
            assert!(
                !ours.contains("localhost-nodeport-rejected-tcp"),
                "{name}:\n{ours}"
            );
            assert!(
                !ours.contains("localhost-nodeport-reject-ports { tcp ."),
                "{name}:\n{ours}"
            );
        }
    }
}
