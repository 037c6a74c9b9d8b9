//! Adoption against the stateful fake: a full sync leaves alone every chain that already holds
//! what it would write, rewrites the ones that differ, and, where the back end cannot tell how
//! it holds a rule, rewrites everything as before.

use super::incremental::{V4, canonical, changed, fresh, proxier, state};
use super::*;
use crate::model::ChangeSummary;
use crate::proxier::Proxier;
use crate::sys::xtables::fake::FakeIptables;

/// A node programmed by an earlier run from `state`.
fn programmed(state: &crate::model::ProxyState) -> FakeIptables {
    let mut earlier = proxier(FakeIptables::default());
    earlier.sync(state, &ChangeSummary::default()).unwrap();
    let mut node = earlier.iptables().clone();
    node.restores.clear();
    node.reads.clear();
    node
}

/// The chains a restore input declares (and so flushes), as `table/chain`.
fn declared(input: &str) -> Vec<String> {
    let mut table = "";
    let mut out = Vec::new();
    for line in input.lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = name;
        } else if let Some(decl) = line.strip_prefix(':') {
            out.push(format!(
                "{table}/{}",
                decl.split(' ').next().unwrap_or_default()
            ));
        }
    }
    out.sort();
    out
}

#[test]
fn a_restart_onto_an_unchanged_node_writes_nothing() {
    let state = state(12, 3);
    let mut restarted = proxier(programmed(&state));
    let report = restarted.sync(&state, &ChangeSummary::default()).unwrap();
    assert!(report.full);
    assert!(
        restarted.iptables().restores.is_empty(),
        "{:?}",
        restarted.iptables().restores
    );
    assert_eq!(canonical(restarted.iptables()), fresh(&state));
}

#[test]
fn a_restart_keeps_shared_chains_whose_rules_partial_syncs_reordered() {
    let mut state = state(12, 3);
    let mut p = proxier(FakeIptables::default());
    p.sync(&state, &ChangeSummary::default()).unwrap();
    // Services leave and come back: their KUBE-SERVICES rules are now at the top.
    for name in ["svc-3", "svc-8"] {
        let key = NamespacedName::new("ns", name);
        let (ports, endpoints) = (
            state.services.remove(&key).unwrap(),
            state.endpoints.remove(&key),
        );
        p.sync(&state, &changed(&[&key])).unwrap();
        state.services.insert(key.clone(), ports);
        if let Some(endpoints) = endpoints {
            state.endpoints.insert(key.clone(), endpoints);
        }
        p.sync(&state, &changed(&[&key])).unwrap();
    }
    let mut node = p.iptables().clone();
    node.restores.clear();
    let mut restarted = proxier(node);
    restarted.sync(&state, &ChangeSummary::default()).unwrap();
    assert!(restarted.iptables().restores.is_empty());
    assert_eq!(canonical(restarted.iptables()), fresh(&state));
}

#[test]
fn a_restart_rewrites_exactly_the_chains_that_differ() {
    let before = state(12, 3);
    let mut node = programmed(&before);
    let chain_of = |node: &FakeIptables, prefix: &str, nth: usize| {
        node.table(V4, "nat")
            .chains
            .iter()
            .map(|(name, _)| name.clone())
            .filter(|name| name.starts_with(prefix))
            .nth(nth)
            .unwrap()
    };
    // Another program changes one rule of an endpoint chain, adds one to a service chain,
    // drops a rule from nat KUBE-SERVICES and flushes KUBE-MARK-MASQ.
    let sep = chain_of(&node, "KUBE-SEP-", 4);
    let svc = chain_of(&node, "KUBE-SVC-", 2);
    node.rules_mut(V4, "nat", &sep).unwrap()[1] = "-j ACCEPT".into();
    node.rules_mut(V4, "nat", &svc)
        .unwrap()
        .insert(0, "-j RETURN".into());
    node.rules_mut(V4, "nat", "KUBE-SERVICES")
        .unwrap()
        .remove(3);
    node.rules_mut(V4, "nat", "KUBE-MARK-MASQ").unwrap().clear();
    // And one service changed while the daemon was down.
    let mut after = before.clone();
    let changed_key = NamespacedName::new("ns", "svc-9");
    let ports = after.endpoints.get_mut(&changed_key).unwrap();
    ports.values_mut().next().unwrap().pop();

    // What a full sync must write: the chains someone changed, and those whose rules the
    // changed service changes (or that it no longer has: declared to be deleted).
    let (old, new) = (
        canonical(&programmed(&before)),
        canonical(&programmed(&after)),
    );
    let mut expected: Vec<String> = old
        .keys()
        .chain(new.keys())
        .filter(|chain| old.get(*chain) != new.get(*chain))
        .cloned()
        .chain([sep, svc].iter().map(|c| format!("nat/{c}")))
        .chain([
            "nat/KUBE-SERVICES".to_string(),
            "nat/KUBE-MARK-MASQ".to_string(),
        ])
        .collect();
    expected.sort();
    expected.dedup();

    let mut restarted = proxier(node);
    restarted.sync(&after, &ChangeSummary::default()).unwrap();
    let input = &restarted.iptables().restores[0].1;
    assert_eq!(declared(input), expected, "{input}");
    assert_eq!(canonical(restarted.iptables()), fresh(&after));
}

#[test]
fn without_reading_rules_a_full_sync_rewrites_everything() {
    let state = state(6, 2);
    let mut node = programmed(&state);
    node.cannot_read_rules = true;
    let mut restarted = proxier(node);
    restarted.sync(&state, &ChangeSummary::default()).unwrap();
    let input = &restarted.iptables().restores[0].1;
    for chain in [
        "filter/KUBE-FORWARD",
        "nat/KUBE-SERVICES",
        "mangle/KUBE-PROXY-CANARY",
    ] {
        assert!(declared(input).contains(&chain.to_string()), "{chain}");
    }
    assert_eq!(canonical(restarted.iptables()), fresh(&state));
}

#[test]
fn the_hourly_full_sync_writes_only_what_another_program_changed() {
    let state = state(10, 2);
    let mut p = proxier(FakeIptables::default());
    p.sync(&state, &ChangeSummary::default()).unwrap();
    p.iptables().restores.clear();
    p.force_full_sync();
    assert!(p.sync(&state, &ChangeSummary::default()).unwrap().full);
    assert!(
        p.iptables().restores.is_empty(),
        "{:?}",
        p.iptables().restores
    );

    p.iptables()
        .rules_mut(V4, "filter", "KUBE-FORWARD")
        .unwrap()
        .clear();
    p.force_full_sync();
    p.sync(&state, &ChangeSummary::default()).unwrap();
    let input = &p.iptables().restores[0].1;
    assert_eq!(declared(input), ["filter/KUBE-FORWARD"], "{input}");
    assert_eq!(canonical(p.iptables()), fresh(&state));
}

/// A node programmed from `state` whose back end reads chains one request at a time (nft's
/// cost), with the endpoint chain numbered `nth` and the service chain that jumps to it.
fn read_per_chain(state: &crate::model::ProxyState, nth: usize) -> (FakeIptables, String, String) {
    let mut node = programmed(state);
    node.reads_each_chain = true;
    let chains = &node.table(V4, "nat").chains;
    let sep = chains
        .iter()
        .map(|(name, _)| name.clone())
        .filter(|name| name.starts_with("KUBE-SEP-"))
        .nth(nth)
        .unwrap();
    let svc = chains
        .iter()
        .find(|(name, rules)| {
            name.starts_with("KUBE-SVC-")
                && rules
                    .iter()
                    .any(|rule| rule.ends_with(&format!("-j {sep}")))
        })
        .map(|(name, _)| name.clone())
        .unwrap();
    (node, sep, svc)
}

/// The endpoint chains a proxier has read so far.
fn endpoint_chains_read(ipt: &FakeIptables) -> Vec<String> {
    ipt.reads
        .iter()
        .filter_map(|read| match read {
            crate::sys::xtables::fake::Read::ChainFingerprints { chains, .. } => Some(chains),
            _ => None,
        })
        .flatten()
        .filter(|chain| chain.starts_with("KUBE-SEP-"))
        .cloned()
        .collect()
}

#[test]
fn endpoint_chains_kept_by_name_are_checked_by_the_next_sync() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let state = state(12, 3);
    let (mut node, sep, _) = read_per_chain(&state, 4);
    // Another program changed an endpoint chain of a service whose own chains are right.
    node.rules_mut(V4, "nat", &sep).unwrap()[1] = "-j ACCEPT".into();
    let asked = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = asked.clone();
    let mut restarted = proxier(node).with_wake(std::sync::Arc::new(move || {
        counter.fetch_add(1, Ordering::SeqCst);
    }));

    // The restart reads no endpoint chain, writes nothing, and asks for the sync that checks.
    assert!(
        restarted
            .sync(&state, &ChangeSummary::default())
            .unwrap()
            .full
    );
    assert!(restarted.iptables().restores.is_empty());
    assert_eq!(
        endpoint_chains_read(restarted.iptables()),
        Vec::<String>::new()
    );
    assert_eq!(asked.load(Ordering::SeqCst), 1);

    // That sync reads them all (fewer than a sync's share) and rewrites the changed one only.
    let report = restarted.sync(&state, &ChangeSummary::default()).unwrap();
    assert!(!report.full);
    assert_eq!(report.repaired_chains, 1);
    assert_eq!(endpoint_chains_read(restarted.iptables()).len(), 12 * 3);
    let restores = &restarted.iptables().restores;
    assert_eq!(restores.len(), 1, "{restores:?}");
    assert_eq!(declared(&restores[0].1), vec![format!("nat/{sep}")]);
    assert_eq!(canonical(restarted.iptables()), fresh(&state));

    // Nothing is left to check: no more syncs asked for, nothing written.
    restarted.sync(&state, &ChangeSummary::default()).unwrap();
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    assert_eq!(restarted.iptables().restores.len(), 1);
}

#[test]
fn endpoint_chains_of_a_service_whose_chains_differ_are_read_at_once() {
    let state = state(12, 3);
    let (mut node, sep, svc) = read_per_chain(&state, 4);
    node.rules_mut(V4, "nat", &sep).unwrap()[1] = "-j ACCEPT".into();
    node.rules_mut(V4, "nat", &svc)
        .unwrap()
        .insert(0, "-j RETURN".into());
    let mut restarted = proxier(node);
    assert!(
        restarted
            .sync(&state, &ChangeSummary::default())
            .unwrap()
            .full
    );
    let restores = &restarted.iptables().restores;
    assert_eq!(restores.len(), 1, "{restores:?}");
    assert_eq!(
        declared(&restores[0].1),
        vec![format!("nat/{sep}"), format!("nat/{svc}")]
    );
    assert_eq!(canonical(restarted.iptables()), fresh(&state));
}
