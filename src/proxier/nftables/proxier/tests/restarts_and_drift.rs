//! Drift another program causes, repaired from memory, and restarts that read the table back.

use super::*;
use crate::proxier::nftables::render::LOCALHOST_REJECT_PORTS;

/// A proxier told of the kernel's change events (a fake, fed by [`report_drift`]), synced once
/// with `state`.
fn synced_with_events(
    state: &ProxyState,
) -> (
    NftablesProxier<FakeNftables>,
    crate::sys::nf_tables::events::FakeEvents,
) {
    let events = crate::sys::nf_tables::events::FakeEvents::default();
    let mut p = proxier(FakeNftables::default()).with_change_events(Box::new(events.clone()));
    p.sync(state, &ChangeSummary::default()).unwrap();
    (p, events)
}

/// Reports that another program changed these objects of our IPv4 table (a set as `@name`).
fn report_drift(events: &crate::sys::nf_tables::events::FakeEvents, names: &[&str]) {
    *events.pending.lock().unwrap() = crate::sys::nf_tables::events::Drift {
        chains: names
            .iter()
            .map(|name| (V4, TABLE.to_string(), name.to_string()))
            .collect(),
        lost: false,
    };
}

#[test]
fn what_another_program_changes_is_rewritten_from_memory() {
    let state = state();
    let (mut p, events) = synced_with_events(&state);
    let chain = programmed(&p)
        .chains
        .keys()
        .find(|c| c.starts_with("service-") && c.contains("ns4/svc4"))
        .unwrap()
        .clone();
    p.nft
        .apply(&format!(
            "flush chain ip kube-proxy {chain}\nflush map ip kube-proxy service-ips\n\
             add chain ip kube-proxy intruder\n"
        ))
        .unwrap();
    report_drift(&events, &[&chain, "@service-ips", "intruder"]);
    let report = p.sync(&state, &ChangeSummary::default()).unwrap();
    assert_eq!(report.repaired_chains, 2);
    let text = &p.last_transactions.last().unwrap().1;
    assert_eq!(
        text.matches("flush chain").count(),
        1,
        "only what changed: {text}"
    );
    assert!(!text.contains("intruder"), "{text}");
    // The unknown chain makes the next sync full, which flushes it, and then deletes it.
    p.sync(&state, &ChangeSummary::default()).unwrap();
    p.sync(&state, &ChangeSummary::default()).unwrap();
    assert_table(&mut p, &state);
}

#[test]
fn what_another_program_changes_is_rewritten_by_a_full_sync_from_memory_and_the_digests_too() {
    let state = state();
    let (mut p, events) = synced_with_events(&state);
    // The table's digest chain emptied: rewritten from memory by the next partial sync.
    p.nft
        .apply(&format!("flush chain ip kube-proxy {DIGEST_CHAIN}\n"))
        .unwrap();
    report_drift(&events, &[DIGEST_CHAIN]);
    let report = p.sync(&state, &ChangeSummary::default()).unwrap();
    assert_eq!(report.repaired_chains, 1);
    assert_table(&mut p, &state);
    // A chain changed just before a full sync that works from memory (the hourly one with
    // change events, which writes only what differs from memory): rewritten all the same.
    let chain = programmed(&p)
        .chains
        .keys()
        .find(|c| c.starts_with("service-") && c.contains("ns1/svc1"))
        .unwrap()
        .clone();
    p.nft
        .apply(&format!("flush chain ip kube-proxy {chain}\n"))
        .unwrap();
    report_drift(&events, &[&chain]);
    p.force_full_sync();
    let report = p.sync(&state, &ChangeSummary::default()).unwrap();
    assert!(report.full);
    assert_eq!(report.repaired_chains, 1);
    assert_table(&mut p, &state);
}

#[test]
fn with_change_events_a_full_sync_writes_only_what_differs() {
    use crate::sys::nf_tables::events::FakeEvents;
    let mut state = state();
    let mut p =
        proxier(FakeNftables::default()).with_change_events(Box::new(FakeEvents::default()));
    p.sync(&state, &ChangeSummary::default()).unwrap();
    p.force_full_sync();
    let report = p.sync(&state, &ChangeSummary::default()).unwrap();
    assert!(report.full);
    assert!(p.last_transactions.is_empty(), "{:?}", p.last_transactions);
    // The node's addresses change (NodePorts move): the base's set and nothing else is rewritten.
    state.node.addresses = vec!["192.168.0.3".parse().unwrap()];
    p.sync(
        &state,
        &ChangeSummary {
            node_changed: true,
            ..ChangeSummary::default()
        },
    )
    .unwrap();
    let text = &without_digest_chain(&p.last_transactions[0].1);
    assert!(!text.contains("add rule"), "{text}");
    assert!(text.contains("192.168.0.3"), "{text}");
    assert_table(&mut p, &state);
}

#[test]
fn a_restart_leaves_what_is_right_alone_and_rewrites_what_differs() {
    let mut state = state();
    let mut first = proxier(FakeNftables::default());
    first.sync(&state, &ChangeSummary::default()).unwrap();
    let mut kernel = first.nft.clone();
    kernel.transactions.clear();

    let rewritten = |nft: &FakeNftables| -> BTreeSet<String> {
        nft.transactions
            .concat()
            .lines()
            .filter(|l| l.starts_with("add rule"))
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|chain| chain.contains('/'))
            .map(str::to_string)
            .collect()
    };

    // Nothing changed while no daemon ran: the table's digests say everything is right, and
    // nothing else is read or written.
    let mut second = restarted_on(&kernel);
    second.sync(&state, &ChangeSummary::default()).unwrap();
    assert_eq!(second.nft.chains_read, [DIGEST_CHAIN]);
    assert_eq!(second.nft.element_reads, 0);
    assert_eq!(second.nft.transactions, Vec::<String>::new());
    assert_table(&mut second, &state);
    // The sync after it reads the whole table back (another program may have changed it while
    // no daemon watched): every chain's rule count and comments (a chain whose every rule has a
    // comment of upstream's carries no digest: its comments are compared), every set's
    // elements. It finds everything right and writes nothing.
    let report = second.sync(&state, &ChangeSummary::default()).unwrap();
    assert!(report.full);
    assert_eq!(second.nft.element_reads, 1);
    let undigested: BTreeSet<String> = programmed(&first)
        .chains
        .iter()
        .filter(|(name, chain)| name.contains('/') && digest_of(chain).is_none())
        .map(|(name, _)| name.clone())
        .collect();
    assert!(!undigested.is_empty());
    let read: BTreeSet<&String> = second.nft.chains_read.iter().collect();
    assert!(
        programmed(&first).chains.keys().all(|c| read.contains(c)),
        "every chain read: {read:?}"
    );
    assert_eq!(second.nft.transactions, Vec::<String>::new());
    // ... and then syncs from memory again.
    let reads = (second.nft.name_reads, second.nft.element_reads);
    second.sync(&state, &ChangeSummary::default()).unwrap();
    assert_eq!((second.nft.name_reads, second.nft.element_reads), reads);

    // svc4 gained an endpoint and someone inserted a rule into svc1's chain.
    let svc4 = NamespacedName::new("ns4", "svc4");
    add_endpoint(&mut state, &svc4, ep("10.180.0.9", 80, NODE));
    let svc1_chain = programmed(&first)
        .chains
        .keys()
        .find(|c| c.starts_with("service-") && c.contains("ns1/svc1"))
        .unwrap()
        .clone();
    kernel
        .apply(&format!("add rule ip kube-proxy {svc1_chain} drop\n"))
        .unwrap();
    // ... and emptied a base chain, and swapped another's one rule for another.
    kernel
        .apply(
            "flush chain ip kube-proxy masquerading\n\
             flush chain ip kube-proxy nat-output\nadd rule ip kube-proxy nat-output drop\n",
        )
        .unwrap();
    let mut third = restarted_on(&kernel);
    third.sync(&state, &ChangeSummary::default()).unwrap();
    // The restart reads back only the sets whose digests differ (svc4's slot's endpoint map
    // and the hairpin set) and writes their differing elements and the new digests.
    let mut sets_read = third.nft.sets_read.clone();
    sets_read.sort();
    assert_eq!(sets_read, ["endpoints-tcp-13", "hairpin-connections"]);
    let written = without_digest_chain(&third.nft.transactions.concat());
    assert!(
        written.contains(
            "add element ip kube-proxy hairpin-connections { 10.180.0.9 . 10.180.0.9 . tcp . 80 }"
        ),
        "{written}"
    );
    assert!(
        written.lines().all(|l| l.contains(" element ")),
        "{written}"
    );
    // The inserted rule and the changed base chains are found by the sync after it, which
    // rewrites those chains (the base with its declarations) and nothing of another service.
    third.nft.transactions.clear();
    third.sync(&state, &ChangeSummary::default()).unwrap();
    assert_eq!(rewritten(&third.nft), BTreeSet::from([svc1_chain]));
    let written = third.nft.transactions.concat();
    for base_chain in ["masquerading", "nat-output"] {
        assert!(
            written.contains(&format!("add rule ip kube-proxy {base_chain} ")),
            "{written}"
        );
    }
    assert_table(&mut third, &state);
}

#[test]
fn a_change_right_after_a_restart_waits_for_no_read_back() {
    let mut state = state();
    let mut first = proxier(FakeNftables::default());
    first.sync(&state, &ChangeSummary::default()).unwrap();
    let mut restarted = restarted_on(&first.nft);
    restarted.verify_delay = Duration::from_secs(3600);
    restarted.sync(&state, &ChangeSummary::default()).unwrap();
    assert_eq!(restarted.nft.chains_read, [DIGEST_CHAIN]);

    // svc4 gains an endpoint before the read-back is due: a partial sync writes it from
    // memory, and reads nothing.
    let svc4 = NamespacedName::new("ns4", "svc4");
    add_endpoint(&mut state, &svc4, ep("10.180.0.9", 80, NODE));
    let reads = (restarted.nft.name_reads, restarted.nft.element_reads);
    let report = restarted.sync(&state, &changed(&[&svc4])).unwrap();
    assert!(!report.full);
    assert_eq!(
        (restarted.nft.name_reads, restarted.nft.element_reads),
        reads
    );
    assert_eq!(restarted.nft.chains_read, [DIGEST_CHAIN]);
    assert!(
        restarted
            .nft
            .transactions
            .concat()
            .contains("10.180.0.9 . 10.180.0.9 . tcp . 80"),
        "{:?}",
        restarted.nft.transactions
    );
    assert_table(&mut restarted, &state);

    // Once it is due, the next sync reads the table back, finds it right and writes nothing.
    restarted.unverified.insert(V4, Instant::now());
    restarted.nft.transactions.clear();
    let report = restarted.sync(&state, &ChangeSummary::default()).unwrap();
    assert!(report.full);
    assert_eq!(restarted.nft.element_reads, reads.1 + 1);
    assert_eq!(restarted.nft.transactions, Vec::<String>::new());
}

#[test]
fn a_restart_whose_every_digest_differs_reads_everything_once() {
    // As after an upgrade whose digests are computed otherwise: the table's digest chain holds
    // a value for every part, and every one differs from ours.
    let state = state();
    let mut first = proxier(FakeNftables::default());
    first.sync(&state, &ChangeSummary::default()).unwrap();
    let mut kernel = first.nft.clone();
    let table = programmed(&first);
    let held = table.chains[DIGEST_CHAIN].rules.iter();
    let held = Digests::parse(held.filter_map(|rule| comment_of(rule))).unwrap();
    let other = held.each_value_other();
    let mut text = format!("flush chain ip kube-proxy {DIGEST_CHAIN}\n");
    for rule in other.rules() {
        text.push_str(&format!("add rule ip kube-proxy {DIGEST_CHAIN} {rule}\n"));
    }
    kernel.apply(&text).unwrap();

    // The restart reads every chain and set back and finds them right: it writes no element
    // and no service's chain but those without a digest of their own (their comments say
    // nothing of rules an earlier build wrote otherwise); the base, whose declarations the
    // digests no longer vouch for, is declared and written again, and the digests.
    let mut restarted = restarted_on(&kernel);
    restarted.sync(&state, &ChangeSummary::default()).unwrap();
    assert_eq!(restarted.nft.element_reads, 1);
    let read: BTreeSet<&String> = restarted.nft.chains_read.iter().collect();
    assert!(
        programmed(&first).chains.keys().all(|c| read.contains(c)),
        "every chain read: {read:?}"
    );
    let written = restarted.nft.transactions.concat();
    assert!(written.contains(DIGEST_CHAIN), "{written}");
    let undigested: BTreeSet<&String> = table
        .chains
        .iter()
        .filter(|(name, chain)| name.contains('/') && digest_of(chain).is_none())
        .map(|(name, _)| name)
        .collect();
    assert!(!undigested.is_empty());
    let services_written: BTreeSet<&str> = written
        .lines()
        .filter(|line| {
            line.contains(" element ") || line.split(' ').nth(4).unwrap_or_default().contains('/')
        })
        .filter_map(|line| line.split(' ').nth(4))
        .collect();
    assert_eq!(
        services_written,
        undigested
            .iter()
            .map(|name| name.as_str())
            .collect::<BTreeSet<_>>()
    );
    assert_table(&mut restarted, &state);
    // Nothing was taken on the digests' word: the table is not read back again.
    let reads = (restarted.nft.name_reads, restarted.nft.element_reads);
    let report = restarted.sync(&state, &ChangeSummary::default()).unwrap();
    assert!(!report.full);
    assert_eq!(
        (restarted.nft.name_reads, restarted.nft.element_reads),
        reads
    );
}

/// Without change events a forced full sync works from memory: the endpoint maps it finds
/// there are those the table declares (the ones in use), so it deletes none that is absent.
#[test]
fn a_full_sync_from_memory_knows_which_endpoint_maps_the_table_declares() {
    let state = state();
    let mut p = proxier(FakeNftables::default());
    p.sync(&state, &ChangeSummary::default()).unwrap();
    p.force_full_sync();
    let report = p.sync(&state, &ChangeSummary::default()).unwrap();
    assert!(report.full);
    assert_table(&mut p, &state);
}

/// A kernel holding upstream's expected table `golden` (tests/golden/nftables/), applied
/// declarations first (the text is sorted by object).
fn upstream_table(golden: &str) -> FakeNftables {
    let mut kernel = FakeNftables::default();
    let upstream = crate::proxier::nftables::render::tests::golden(golden);
    let mut lines: Vec<&str> = upstream.lines().filter(|l| l.starts_with("add ")).collect();
    lines.sort_by_key(|line| match line.split(' ').nth(1) {
        Some("table") => 0,
        Some("set" | "map" | "counter") => 1,
        Some("chain") => 2,
        Some("rule") => 3,
        _ => 4,
    });
    kernel.apply(&(lines.join("\n") + "\n")).unwrap();
    kernel
}

/// A node moved from upstream 1.35's table (its `mark-for-masquerade` chain, which its service,
/// external and endpoint chains jump to): the first sync takes the table over, writes the
/// current layout and deletes the chain nothing jumps to any more, in transactions the kernel
/// accepts (the fake refuses to delete a chain a rule still jumps to).
#[test]
fn a_restart_on_upstreams_1_35_table_moves_it_to_the_current_layout() {
    let state = state();
    let kernel = upstream_table("overall-1.35");
    assert!(
        kernel
            .table(V4, TABLE)
            .unwrap()
            .chains
            .contains_key("mark-for-masquerade")
    );
    let mut p = restarted_on(&kernel);
    p.sync(&state, &ChangeSummary::default()).unwrap();
    let no_jump_to_it = |p: &NftablesProxier<FakeNftables>| {
        programmed(p)
            .chains
            .values()
            .flat_map(|chain| &chain.rules)
            .all(|rule| !rule.contains("mark-for-masquerade"))
    };
    // Stale: flushed at once, deleted by a sync a moment later, as any stale chain.
    assert!(no_jump_to_it(&p));
    assert!(
        programmed(&p).chains["mark-for-masquerade"]
            .rules
            .is_empty()
    );
    p.sync(&state, &ChangeSummary::default()).unwrap();
    assert!(!programmed(&p).chains.contains_key("mark-for-masquerade"));
    assert_table(&mut p, &state);
    // ... and then nothing is left to write.
    p.nft.transactions.clear();
    p.sync(&state, &ChangeSummary::default()).unwrap();
    assert_eq!(p.nft.transactions, Vec::<String>::new());
}

/// A node moved from upstream 1.37 (its table of TestOverallNFTablesRules: the localhost
/// NodePorts gate on, without the proxy): with the gate on, the first sync takes the table over
/// (its reject map, chains and counters kept, its service chains rewritten to ours) and the
/// next writes nothing; with the gate off, the reject objects go, in transactions the kernel
/// accepts.
#[test]
fn a_restart_on_upstreams_1_37_table_takes_it_over() {
    let state = state();
    let kernel = upstream_table("overall");
    for gate in [true, false] {
        let mut p = restarted_on(&kernel);
        p.settings.localhost_gate = gate;
        p.sync(&state, &ChangeSummary::default()).unwrap();
        if gate {
            // Never deleted (declaring one again changes nothing): the counters' packets go
            // on counting.
            let written = p.nft.transactions.join("\n");
            assert!(
                !written.contains("delete counter ip kube-proxy localhost-nodeport-rejected-")
                    && !written
                        .contains("delete map ip kube-proxy localhost-nodeport-reject-ports"),
                "{written}"
            );
        }
        p.sync(&state, &ChangeSummary::default()).unwrap();
        assert_table(&mut p, &state);
        let counters = p.nft.table(V4, TABLE).unwrap().counters.len();
        assert_eq!(counters, if gate { 3 } else { 0 }, "gate {gate}");
        let rejects = programmed(&p).sets.contains_key(LOCALHOST_REJECT_PORTS);
        assert_eq!(rejects, gate);
        p.nft.transactions.clear();
        p.sync(&state, &ChangeSummary::default()).unwrap();
        assert_eq!(p.nft.transactions, Vec::<String>::new(), "gate {gate}");
    }
}

/// With the feature gate KubeProxyNFTablesLocalhostNodePorts on, NodePorts on the loopback
/// address are rejected and counted (all protocols without the proxy, UDP and SCTP with it); a
/// restart keeps that as it is, and a restart with the gate off takes the map, its chains and
/// their counters away, in transactions the kernel accepts.
#[test]
fn localhost_node_ports_are_rejected_and_counted_while_the_gate_is_on() {
    let state = state();
    let with_gate = |nft: FakeNftables, proxy: bool| {
        let mut p = proxier(nft);
        p.settings.localhost_gate = true;
        p.settings.localhost_proxy = if proxy { vec![V4] } else { vec![] };
        p
    };
    let mut p = with_gate(FakeNftables::default(), false);
    p.sync(&state, &ChangeSummary::default()).unwrap();
    let table = programmed(&p);
    let kernel = p.nft.table(V4, TABLE).unwrap();
    assert_eq!(
        kernel.counters.iter().collect::<Vec<_>>(),
        [
            "localhost-nodeport-rejected-sctp",
            "localhost-nodeport-rejected-tcp",
            "localhost-nodeport-rejected-udp"
        ]
    );
    assert!(
        table.chains["nodeport-endpoints-check"]
            .rules
            .iter()
            .any(|rule| rule.starts_with(
                "ip daddr 127.0.0.0/8 meta l4proto . th dport vmap @localhost-nodeport-reject-ports"
            )),
        "{:?}",
        table.chains["nodeport-endpoints-check"]
    );
    assert!(
        table.chains["localhost-nodeport-reject-udp"].rules[0]
            .starts_with("counter name \"localhost-nodeport-rejected-udp\" reject")
    );
    // Every TCP NodePort of the test services (3001, 3002, 3003), none of another protocol.
    let rejected: Vec<&str> = table.elements["localhost-nodeport-reject-ports"]
        .iter()
        .map(|(key, rest)| {
            assert_eq!(rest, " : goto localhost-nodeport-reject-tcp");
            key
        })
        .collect();
    assert_eq!(rejected, ["tcp . 3001", "tcp . 3002", "tcp . 3003"]);

    // Restarted as it was: nothing written.
    let mut same = with_gate(p.nft.clone(), false);
    same.nft.transactions.clear();
    same.sync(&state, &ChangeSummary::default()).unwrap();
    same.sync(&state, &ChangeSummary::default()).unwrap();
    assert_eq!(same.nft.transactions, Vec::<String>::new());

    // With the proxy serving TCP: its NodePorts are no longer rejected, nor counted.
    let mut proxied = with_gate(p.nft.clone(), true);
    proxied.sync(&state, &ChangeSummary::default()).unwrap();
    proxied.sync(&state, &ChangeSummary::default()).unwrap();
    let kernel = proxied.nft.table(V4, TABLE).unwrap();
    assert!(!kernel.chains.contains_key("localhost-nodeport-reject-tcp"));
    assert_eq!(kernel.counters.len(), 2);
    assert!(
        kernel.sets["localhost-nodeport-reject-ports"]
            .elements
            .is_empty()
    );

    // The gate off: the map, the chains and the counters go.
    let mut off = restarted_on(&proxied.nft);
    off.sync(&state, &ChangeSummary::default()).unwrap();
    off.sync(&state, &ChangeSummary::default()).unwrap();
    let kernel = off.nft.table(V4, TABLE).unwrap();
    assert!(kernel.counters.is_empty());
    assert!(!kernel.sets.contains_key("localhost-nodeport-reject-ports"));
    assert!(!kernel.chains.keys().any(|c| c.starts_with("localhost-")));
    assert_table(&mut off, &state);
}

/// Another program empties a rejecting chain and deletes its counter: the repair declares the
/// counter again before the rule that counts with it.
#[test]
fn a_rejecting_chain_emptied_with_its_counter_is_repaired_whole() {
    let state = state();
    let events = crate::sys::nf_tables::events::FakeEvents::default();
    let mut p = proxier(FakeNftables::default()).with_change_events(Box::new(events.clone()));
    p.settings.localhost_gate = true;
    p.sync(&state, &ChangeSummary::default()).unwrap();
    p.nft
        .apply(
            "flush chain ip kube-proxy localhost-nodeport-reject-tcp\n\
             delete counter ip kube-proxy localhost-nodeport-rejected-tcp\n",
        )
        .unwrap();
    report_drift(&events, &["localhost-nodeport-reject-tcp"]);
    let report = p.sync(&state, &ChangeSummary::default()).unwrap();
    assert_eq!(report.repaired_chains, 1);
    let kernel = p.nft.table(V4, TABLE).unwrap();
    assert!(kernel.counters.contains("localhost-nodeport-rejected-tcp"));
    assert_eq!(kernel.chains["localhost-nodeport-reject-tcp"].1.len(), 1);
}
