//! The transaction texts: declarations before references, deletions before additions, sets
//! deleted last, and nothing for a service whose objects did not change.

use std::collections::BTreeMap;

use super::*;
use crate::model::NamespacedName;
use crate::proxier::fixtures::overall_services;
use crate::proxier::nftables::render::tests::context;
use crate::proxier::nftables::render::{render_base, render_service};
use crate::proxier::nftables::slots::{SlotTable, is_endpoint_map, maps_of};
use crate::sys::nf_tables::SetElements;

fn rendered() -> BTreeMap<NamespacedName, Objects> {
    let ctx = context();
    let mut slots = SlotTable::default();
    overall_services()
        .into_iter()
        .map(|s| {
            (
                s.key.clone(),
                render_service(&s.ports, Some(&s.endpoints), &ctx, &mut slots),
            )
        })
        .collect()
}

fn position(text: &str, needle: &str) -> usize {
    text.find(needle)
        .unwrap_or_else(|| panic!("{needle:?} not in\n{text}"))
}

#[test]
fn a_full_sync_declares_before_it_refers_and_flushes_what_exists() {
    let base = render_base(&context());
    let services = rendered();
    let existing = Existing {
        chains: [
            "services".to_string(),
            "service-OLD00000-ns/gone/tcp/p80".to_string(),
        ]
        .into_iter()
        .collect(),
        sets: ["affinity-OLD00000-ns/gone/tcp/p80__10.1.1.1/80".to_string()].into(),
        adopted: Default::default(),
        elements: None,
        ..Existing::default()
    };
    let (transactions, stats, removed) = full("ip", &base, &services, &existing, false, None);
    assert_eq!(
        transactions.len(),
        3,
        "declarations, services, base and maps"
    );
    let text = transactions.concat();
    assert_eq!(
        removed.chains,
        vec!["service-OLD00000-ns/gone/tcp/p80".to_string()]
    );
    let first_rule = position(&text, "add rule ");
    assert!(position(&text, "add chain ip kube-proxy services") < first_rule);
    assert!(
        position(&text, "flush chain ip kube-proxy services\n")
            < position(&text, "add rule ip kube-proxy services ")
    );
    assert!(
        position(&text, "flush map ip kube-proxy service-ips") < position(&text, "add element")
    );
    assert!(
        !text.contains("flush chain ip kube-proxy nat-prerouting"),
        "new chains need no flush"
    );
    assert!(
        text.ends_with("delete set ip kube-proxy affinity-OLD00000-ns/gone/tcp/p80__10.1.1.1/80\n")
    );
    assert_eq!(
        stats.lines + 1,
        text.lines().count(),
        "the table line is not counted"
    );
    // The services' chains are written before the base refers to them, and flushed where they
    // exist.
    assert!(transactions[1].contains("add rule ip kube-proxy service-"));
    assert!(!transactions[1].contains("add element"));
    assert!(transactions[2].contains("flush chain ip kube-proxy service-OLD00000"));
}

#[test]
fn a_partial_sync_writes_only_differences() {
    let services = rendered();
    let svc1 = &services[&NamespacedName::new("ns1", "svc1")];
    assert!(
        partial(
            "ip",
            &[Delta {
                old: Some(svc1),
                new: Some(svc1)
            }],
            &|_, _| false,
        )
        .is_none()
    );

    let (text, _, removed) = partial(
        "ip",
        &[Delta {
            old: Some(svc1),
            new: None,
        }],
        &|_, _| false,
    )
    .unwrap();
    assert_eq!(removed.chains.len(), svc1.chains.len());
    assert!(!text.contains("add "), "{text}");
    assert!(position(&text, "flush chain") < position(&text, "delete element"));

    let svc5 = &services[&NamespacedName::new("ns5", "svc5")];
    let (text, _, _) = partial(
        "ip",
        &[Delta {
            old: None,
            new: Some(svc5),
        }],
        &|_, _| false,
    )
    .unwrap();
    assert!(position(&text, "add set ip kube-proxy affinity-") < position(&text, "add rule"));
    assert!(position(&text, "add chain") < position(&text, "add element"));
    let (text, _, _) = partial(
        "ip",
        &[Delta {
            old: Some(svc5),
            new: None,
        }],
        &|_, _| false,
    )
    .unwrap();
    assert!(position(&text, "flush chain") < position(&text, "delete set ip kube-proxy affinity-"));
}

#[test]
fn a_hairpin_element_two_services_share_stays_while_one_keeps_it() {
    let services = rendered();
    let svc4 = &services[&NamespacedName::new("ns4", "svc4")];
    let hairpin = svc4.elements.get(HAIRPIN_CONNECTIONS).unwrap();
    let key = hairpin.keys().next().unwrap().to_string();
    // svc4 goes; another service outside this sync has the same endpoint.
    let gone = Delta {
        old: Some(svc4),
        new: None,
    };
    let (text, _, _) = partial("ip", &[gone], &|set, k| {
        set == HAIRPIN_CONNECTIONS && k == key
    })
    .unwrap();
    assert!(!text.contains(&format!("{{ {key} }}")), "{text}");
    let gone = Delta {
        old: Some(svc4),
        new: None,
    };
    let (text, _, _) = partial("ip", &[gone], &|_, _| false).unwrap();
    assert!(
        text.contains(&format!(
            "delete element ip kube-proxy {HAIRPIN_CONNECTIONS} {{ {key} }}"
        )),
        "{text}"
    );
    // Another service of this sync takes the endpoint over.
    let mut other = svc4.clone();
    other.chains = Default::default();
    let (text, _, _) = partial(
        "ip",
        &[
            Delta {
                old: Some(svc4),
                new: None,
            },
            Delta {
                old: None,
                new: Some(&other),
            },
        ],
        &|_, _| false,
    )
    .unwrap();
    assert!(
        !text.contains(&format!(
            "delete element ip kube-proxy {HAIRPIN_CONNECTIONS}"
        )),
        "{text}"
    );
}

#[test]
fn a_restart_writes_only_the_elements_that_differ() {
    let base = render_base(&context());
    let services = rendered();
    // What an earlier run left: everything as wanted, but one stale element, one element with
    // other data and one missing. Every set is read back, the empty ones too.
    let mut present: SetElements = base
        .sets
        .keys()
        .map(|name| (name.clone(), Default::default()))
        .collect();
    for objects in std::iter::once(&base).chain(services.values()) {
        for (set, elements) in &objects.elements {
            present
                .entry(set.clone())
                .or_default()
                .extend(elements.iter().map(|(k, r)| (k.to_string(), r.to_string())));
        }
    }
    let service_ips = present.get_mut("service-ips").unwrap();
    let (changed, _) = service_ips
        .iter()
        .next()
        .map(|(k, r)| (k.clone(), r.clone()))
        .unwrap();
    service_ips.insert(
        changed.clone(),
        " : goto service-OTHER000-ns/x/tcp/p80".into(),
    );
    service_ips.insert("10.99.0.1 . tcp . 80".into(), " : goto service-OLD".into());
    let cluster_ips = present.get_mut("cluster-ips").unwrap();
    let missing = cluster_ips.keys().next().unwrap().clone();
    cluster_ips.remove(&missing);
    let existing = Existing {
        chains: base.chains.keys().cloned().collect(),
        sets: base.sets.keys().cloned().collect(),
        adopted: Default::default(),
        elements: Some(present),
        ..Existing::default()
    };
    let (transactions, _, _) = full("ip", &base, &services, &existing, false, None);
    let all = transactions.concat();
    let elements: Vec<&str> = all
        .lines()
        .filter(|l| {
            l.contains(" element ") || l.starts_with("flush set") || l.starts_with("flush map")
        })
        .collect();
    assert_eq!(
        elements,
        [
            format!("delete element ip kube-proxy service-ips {{ {changed} }}").as_str(),
            "delete element ip kube-proxy service-ips { 10.99.0.1 . tcp . 80 }",
            format!("add element ip kube-proxy cluster-ips {{ {missing} }}").as_str(),
            format!(
                "add element ip kube-proxy service-ips {{ {changed}{} }}",
                services
                    .values()
                    .find_map(|o| o.elements.get("service-ips")?.get(&changed))
                    .unwrap()
            )
            .as_str(),
        ]
    );
}

#[test]
fn a_full_sync_empties_the_digest_chain_first_and_fills_it_last() {
    let base = render_base(&context());
    let services = rendered();
    let digests = Digests::of(&base, services.values());
    let existing = Existing::default();
    let (transactions, _, _) = full("ip", &base, &services, &existing, false, Some(&digests));
    assert!(transactions.len() > 1);
    let first = &transactions[0];
    let last = transactions.last().unwrap();
    let flush = format!("flush chain ip kube-proxy {DIGEST_CHAIN}\n");
    let rule = format!("add rule ip kube-proxy {DIGEST_CHAIN} counter comment");
    assert!(first.contains(&flush) && !first.contains(&rule), "{first}");
    assert!(last.contains(&rule), "{last}");
    assert!(
        transactions[1..transactions.len() - 1]
            .iter()
            .all(|t| !t.contains(DIGEST_CHAIN))
    );
    // Unchanged digests: the chain is left alone.
    let (transactions, _, _) = full("ip", &base, &services, &existing, false, None);
    assert!(!transactions.concat().contains(DIGEST_CHAIN));
}

#[test]
fn what_the_digests_vouch_for_is_neither_declared_nor_written() {
    let base = render_base(&context());
    let services = rendered();
    let chains: ChainSet = std::iter::once(&base)
        .chain(services.values())
        .flat_map(|o| o.chains.keys().cloned())
        .collect();
    // The table declares the endpoint maps the chains draw from, and no other.
    let in_use = maps_of(services.values().flat_map(|o| &o.slots));
    let existing = Existing {
        chains: chains.clone(),
        sets: std::iter::once(&base)
            .chain(services.values())
            .flat_map(|o| o.sets.keys().cloned())
            .filter(|name| !is_endpoint_map(name) || in_use.contains(name))
            .collect(),
        adopted: chains,
        elements: Some(SetElements::new()),
        trusted_sets: base.sets.keys().cloned().collect(),
        base_kept: true,
        counters: Default::default(),
        flowtables: Default::default(),
    };
    let (transactions, stats, _) = full("ip", &base, &services, &existing, false, None);
    assert_eq!(transactions, Vec::<String>::new());
    assert_eq!(stats.lines, 0);
    // An endpoint map no chain draws from goes; one a chain draws from that the table lacks
    // is declared, though the base is kept.
    let (unused, used) = (
        "endpoints-udp-7",
        in_use.iter().next().expect("a map in use"),
    );
    assert!(!in_use.contains(unused));
    let mut older = existing.clone();
    older.sets.insert(unused.to_string());
    older.sets.remove(used);
    let (transactions, _, _) = full("ip", &base, &services, &older, false, None);
    let text = transactions.concat();
    assert!(
        text.starts_with(&format!("add map ip kube-proxy {used} ")),
        "{text}"
    );
    assert!(
        text.ends_with(&format!("delete map ip kube-proxy {unused}\n")),
        "{text}"
    );
    assert_eq!(text.lines().count(), 2, "{text}");
    // A set the digests do not vouch for (and not read back) is refilled; the others stay as
    // they are.
    let mut one_set = existing.clone();
    one_set.trusted_sets.remove("cluster-ips");
    let (transactions, _, _) = full("ip", &base, &services, &one_set, false, None);
    let text = transactions.concat();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "flush set ip kube-proxy cluster-ips", "{text}");
    assert!(lines.len() > 1);
    assert!(
        lines[1..]
            .iter()
            .all(|l| l.starts_with("add element ip kube-proxy cluster-ips ")),
        "{text}"
    );
}

/// A base whose counters change: a new counter is declared before the rule that counts with
/// it, and one no longer wanted is deleted after its chain's flush, in a transaction the fake
/// (which refuses a counter missing or in use) accepts both ways.
#[test]
fn counters_come_before_their_rules_and_go_after_them() {
    use crate::model::Protocol;
    use crate::sys::nf_tables::Nftables;
    use crate::sys::nf_tables::fake::FakeNftables;
    let without = render_base(&context());
    let with = render_base(&crate::proxier::nftables::render::NftContext {
        localhost_rejects: vec![Protocol::Udp],
        offload_after_packets: None,
        ..context()
    });
    let mut nft = FakeNftables::default();
    let (first, _, _) = full(
        "ip",
        &without,
        &BTreeMap::new(),
        &Existing::default(),
        false,
        None,
    );
    nft.apply(&first.concat()).unwrap();
    let delta = |old, new| Delta {
        old: Some(old),
        new: Some(new),
    };
    let (adding, _, _) = partial("ip", &[delta(&without, &with)], &|_, _| false).unwrap();
    assert!(
        position(
            &adding,
            "add counter ip kube-proxy localhost-nodeport-rejected-udp"
        ) < position(&adding, "counter name")
    );
    nft.apply(&adding).unwrap();
    let (removing, _, removed) = partial("ip", &[delta(&with, &without)], &|_, _| false).unwrap();
    assert!(
        position(
            &removing,
            "flush chain ip kube-proxy localhost-nodeport-reject-udp"
        ) < position(&removing, "delete counter")
    );
    assert_eq!(removed.chains, ["localhost-nodeport-reject-udp"]);
    nft.apply(&removing).unwrap();
}
