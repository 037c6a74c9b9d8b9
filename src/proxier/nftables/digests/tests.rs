use super::*;
use crate::proxier::nftables::render::{Chain, Elements, SetDef};

fn service(chain: &str, rules: &[&str], elements: &[(&str, &str, &str)]) -> Objects {
    let mut objects = Objects::default();
    objects.chains.insert(
        chain.to_string(),
        Chain {
            spec: String::new(),
            rules: rules.iter().map(|r| r.to_string()).collect(),
        },
    );
    for (set, key, rest) in elements {
        objects
            .elements
            .get_or_insert_with(set.to_string(), Elements::default)
            .insert(key, rest);
    }
    objects
}

fn base() -> Objects {
    let mut base = Objects::default();
    base.sets.insert(
        "cluster-ips".into(),
        SetDef {
            kind: "set",
            spec: "{ type ipv4_addr ; }".into(),
        },
    );
    base.chains.insert(
        "services".into(),
        Chain {
            spec: "{ }".into(),
            rules: vec!["ip daddr @cluster-ips drop".into()],
        },
    );
    base
}

/// Service `name`, ClusterIP 172.30.0.`n`, one endpoint 10.0.0.`n`.
fn one(name: &str, n: u8) -> Objects {
    service(
        &format!("service-{name}-ns/{name}/tcp/p80"),
        &[&format!("dnat to 10.0.0.{n}")],
        &[
            ("cluster-ips", &format!("172.30.0.{n}"), ""),
            (
                "hairpin-connections",
                &format!("10.0.0.{n} . 10.0.0.{n} . tcp . 80"),
                "",
            ),
        ],
    )
}

fn a() -> Objects {
    one("a", 1)
}

fn b() -> Objects {
    one("b", 2)
}

#[test]
fn the_same_table_has_the_same_digests_whatever_the_order() {
    let (a, b) = (a(), b());
    assert_eq!(
        Digests::of(&base(), [&a, &b]),
        Digests::of(&base(), [&b, &a])
    );
}

#[test]
fn adding_and_removing_a_service_updates_the_digests_it_touches() {
    let (a, b) = (a(), b());
    let before = Digests::of(&base(), [&a]);
    let mut digests = before.clone();
    digests.add(&b);
    assert_eq!(digests, Digests::of(&base(), [&a, &b]));
    assert!(!digests.same_elements(&before, "cluster-ips"));
    assert!(!digests.same_elements(&before, "hairpin-connections"));
    assert!(digests.same_layout(&before));
    assert!(!digests.chains_alike(&before)("service-b-ns/b/tcp/p80"));
    digests.remove(&b);
    assert_eq!(digests, before);
}

#[test]
fn each_part_tells_its_own_change() {
    let a = a();
    let digests = Digests::of(&base(), [&a]);
    // Another endpoint for the service: its chain and its hairpin element differ, its ClusterIP
    // does not.
    let moved = service(
        "service-a-ns/a/tcp/p80",
        &["dnat to 10.0.0.9"],
        &[
            ("cluster-ips", "172.30.0.1", ""),
            ("hairpin-connections", "10.0.0.9 . 10.0.0.9 . tcp . 80", ""),
        ],
    );
    let other = Digests::of(&base(), [&moved]);
    assert!(other.same_elements(&digests, "cluster-ips"));
    assert!(!other.same_elements(&digests, "hairpin-connections"));
    assert!(!other.chains_alike(&digests)("service-a-ns/a/tcp/p80"));
    assert!(other.same_layout(&digests));
    // An element's data counts, not only its key.
    let mut remapped = a.clone();
    remapped
        .elements
        .get_mut("cluster-ips")
        .unwrap()
        .insert("172.30.0.1", " : goto other");
    assert!(!Digests::of(&base(), [&remapped]).same_elements(&digests, "cluster-ips"));
    // A base chain's rules are the layout's.
    let mut changed_base = base();
    changed_base
        .chains
        .get_mut("services")
        .unwrap()
        .rules
        .clear();
    assert!(!Digests::of(&changed_base, [&a]).same_layout(&digests));
}

#[test]
fn an_empty_table_has_no_digest_and_the_digest_chain_counts_for_nothing() {
    assert_eq!(Digests::of(&Objects::default(), []), Digests::default());
    assert!(Digests::default().comments().is_empty());
    let mut with_chain = base();
    with_chain.chains.insert(
        DIGEST_CHAIN.into(),
        Chain {
            spec: String::new(),
            rules: vec!["counter comment \"layout=1\"".into()],
        },
    );
    assert_eq!(Digests::of(&with_chain, []), Digests::of(&base(), []));
}

#[test]
fn comments_are_short_and_read_back_as_written() {
    let services: Vec<Objects> = (0..300)
        .map(|i| {
            service(
                &format!("service-{i}-ns/s{i}/tcp/p80"),
                &["dnat"],
                &[(&format!("endpoints-tcp-{}", i % 64), &format!("{i}"), "")],
            )
        })
        .collect();
    let digests = Digests::of(&base(), &services);
    let comments = digests.comments();
    assert!(comments.len() > 1);
    assert!(
        comments.iter().all(|c| c.len() <= COMMENT_LENGTH),
        "{comments:?}"
    );
    assert_eq!(
        Digests::parse(comments.iter().map(String::as_str)),
        Some(digests.clone())
    );
    let rules = digests.rules();
    assert!(rules[0].starts_with("counter comment \""), "{rules:?}");
}

#[test]
fn a_comment_that_is_not_ours_is_not_trusted() {
    for comment in ["someone's note", "layout=zz", "layout=0", "a=1 a=1", "=1"] {
        assert_eq!(Digests::parse([comment]), None, "{comment}");
    }
    assert!(Digests::parse(["layout=1f chains-3=2"]).is_some());
}

#[test]
fn digests_that_share_no_part_vouch_for_nothing() {
    let ours = Digests::of(&base(), [&a(), &one("b", 2)]);
    assert!(ours.share_a_part(&ours));
    // One service changed: the layout and the other parts are still shared.
    let changed = Digests::of(&base(), [&a(), &one("b", 3)]);
    assert!(ours.share_a_part(&changed));
    // Every value another (as another build would hash them): nothing is shared, not even
    // the parts both leave out.
    let foreign = ours.each_value_other();
    assert!(!foreign.share_a_part(&ours));
    assert!(!Digests::default().share_a_part(&ours));
}
