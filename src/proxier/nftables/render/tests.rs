//! Golden tests of the nftables renderer against upstream's own expectations (the inputs and
//! expected table of TestOverallNFTablesRules), compared as upstream compares.

use super::*;
use crate::proxier::fixtures::{NODE, NODE_IP, Svc, family_context, overall_services};
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

/// Upstream's 1.35 expected text (`TestOverallNFTablesRules`, `TestSyncProxyRulesRepeated` of
/// IPv4 fakes with the pod CIDR 10.0.0.0/8 and mark 0x4000) in the layout upstream moved to in
/// 1.36, change by change (docs/nftables.md, "Upstream's tests"):
/// - no `mark-for-masquerade` chain (kubernetes#135800): its jumps become its statement;
/// - `masquerading` in two rules, the second for the hairpin set (#136499), which is declared;
/// - the ClusterIP masquerade rule of each service chain becomes one rule at the top of
///   `services`, for every ClusterIP;
/// - endpoint chains no longer mark their own endpoint's traffic (the hairpin set does).
///
/// The hairpin set's elements are not derived (which endpoints are local is not in the text).
pub(crate) fn as_of_1_36(text: &str) -> String {
    const MARK: &str = "mark set mark or 0x4000";
    let prefix = "add rule ip kube-proxy ";
    let mut out = String::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let (kind, object) = (words.get(1).copied(), words.get(4).copied());
        let rule = line.strip_prefix(prefix).and_then(|r| r.split_once(' '));
        match (kind, object, rule) {
            (Some("chain" | "rule"), Some("mark-for-masquerade"), _) => continue,
            (Some("table"), _, _) => {
                out.push_str(line);
                out.push_str("\nadd set ip kube-proxy hairpin-connections { type ipv4_addr . ipv4_addr . inet_proto . inet_service ; comment \"service hairpin connections\" ; }\n");
                continue;
            }
            (_, _, Some(("masquerading", "mark and 0x4000 == 0 return"))) => {
                out.push_str(&format!(
                    "{prefix}masquerading mark and 0x4000 != 0 mark set mark xor 0x4000 masquerade fully-random\n\
                     {prefix}masquerading ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random\n"
                ));
                continue;
            }
            (_, _, Some(("masquerading", _))) => continue,
            (_, _, Some(("services", "ip daddr . meta l4proto . th dport vmap @service-ips"))) => {
                out.push_str(&format!(
                    "{prefix}services ip daddr @cluster-ips ip saddr != 10.0.0.0/8 {MARK} comment \"masquerade clusterIP traffic from outside cluster\"\n"
                ));
            }
            (_, _, Some((chain, rule)))
                if rule.ends_with(" jump mark-for-masquerade")
                    && (chain.starts_with("endpoint-")
                        || (rule.starts_with("ip daddr ") && !chain.starts_with("external-"))) =>
            {
                continue;
            }
            _ => {}
        }
        out.push_str(&line.replace("jump mark-for-masquerade", MARK));
        out.push('\n');
    }
    out
}

#[test]
fn upstreams_1_35_text_moves_to_1_36_change_by_change() {
    let moved = as_of_1_36(
        "add table ip kube-proxy { comment \"rules for kube-proxy\" ; }\n\
         add chain ip kube-proxy mark-for-masquerade\n\
         add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000\n\
         add rule ip kube-proxy masquerading mark and 0x4000 == 0 return\n\
         add rule ip kube-proxy masquerading mark set mark xor 0x4000\n\
         add rule ip kube-proxy masquerading masquerade fully-random\n\
         add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips\n\
         add rule ip kube-proxy service-X ip daddr 172.30.0.41 ip saddr != 10.0.0.0/8 jump mark-for-masquerade\n\
         add rule ip kube-proxy endpoint-Y ip saddr 10.180.0.1 jump mark-for-masquerade\n\
         add rule ip kube-proxy external-Z fib saddr type local jump mark-for-masquerade comment \"masquerade local traffic\"\n\
         add rule ip kube-proxy external-Z jump mark-for-masquerade\n",
    );
    assert_eq!(
        moved,
        "add table ip kube-proxy { comment \"rules for kube-proxy\" ; }\n\
         add set ip kube-proxy hairpin-connections { type ipv4_addr . ipv4_addr . inet_proto . inet_service ; comment \"service hairpin connections\" ; }\n\
         add rule ip kube-proxy masquerading mark and 0x4000 != 0 mark set mark xor 0x4000 masquerade fully-random\n\
         add rule ip kube-proxy masquerading ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random\n\
         add rule ip kube-proxy services ip daddr @cluster-ips ip saddr != 10.0.0.0/8 mark set mark or 0x4000 comment \"masquerade clusterIP traffic from outside cluster\"\n\
         add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips\n\
         add rule ip kube-proxy external-Z fib saddr type local mark set mark or 0x4000 comment \"masquerade local traffic\"\n\
         add rule ip kube-proxy external-Z mark set mark or 0x4000\n"
    );
}

/// The lines of a table outside what our layout replaces (docs/nftables.md): the rules of
/// service chains without session affinity, the endpoint maps they DNAT through, the endpoint
/// chains of those services, and the hairpin set's elements.
pub(crate) fn outside_our_changes(text: &str) -> String {
    let affinity_services: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("add rule") && l.contains(" @affinity-"))
        .filter_map(|l| l.split_whitespace().nth(4))
        .collect();
    text.lines()
        .filter(|line| {
            !line.starts_with(&format!("add element ip kube-proxy {HAIRPIN_CONNECTIONS} "))
        })
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

/// Upstream's expected table (1.35, moved to 1.36's layout), and ours, compared as upstream
/// compares outside the constructs our layout replaces; ours is pinned in overall-ours.nft
/// (`UPDATE_GOLDEN=1` rewrites it).
#[test]
fn upstreams_overall_table() {
    let ctx = context();
    let ours = dump(&table(&overall_services(), &ctx), &ctx);
    assert_same_table(
        &outside_our_changes(&ours),
        &outside_our_changes(&as_of_1_36(&golden("overall"))),
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
    assert!(!objects.elements.contains_key(HAIRPIN_CONNECTIONS));
    let mut local = svc5.endpoints.clone();
    local.values_mut().for_each(|endpoints| {
        endpoints
            .iter_mut()
            .for_each(|ep| ep.node_name = Some(NODE.into()))
    });
    let objects = render_service(&svc5.ports, Some(&local), &ctx, &mut SlotTable::default());
    let hairpins: Vec<&str> = objects.elements[HAIRPIN_CONNECTIONS].keys().collect();
    assert_eq!(hairpins, ["10.180.0.3 . 10.180.0.3 . tcp . 80"]);
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
