//! Drift repair against the fake: chains of ours that "another program" changed are rewritten
//! from memory at the next sync, with nothing read back; changes elsewhere write nothing.

use super::incremental::{V4, canonical, fresh, proxier, state};
use crate::model::ChangeSummary;
use crate::proxier::Proxier;
use crate::sys::nf_tables::events::{Drift, FakeEvents};
use crate::sys::xtables::Iptables;
use crate::sys::xtables::fake::{FakeIptables, Read};

/// The first nat chain of ours whose name starts with `prefix`.
fn first_chain(ipt: &FakeIptables, prefix: &str) -> String {
    ipt.table(V4, "nat")
        .chains
        .iter()
        .map(|(name, _)| name.clone())
        .find(|name| name.starts_with(prefix))
        .unwrap()
}

fn changed(events: &FakeEvents, chains: &[(&str, &str)]) {
    let mut pending = events.pending.lock().unwrap();
    for (table, chain) in chains {
        pending
            .chains
            .insert((V4, table.to_string(), chain.to_string()));
    }
}

#[test]
fn chains_others_change_are_rewritten_at_the_next_sync() {
    let state = state(4, 3);
    let events = FakeEvents::default();
    let mut p = proxier(FakeIptables::default()).with_change_events(Box::new(events.clone()));
    p.sync(&state, &ChangeSummary::default()).unwrap();
    let svc = first_chain(p.iptables(), "KUBE-SVC-");
    let jump = p.iptables().table(V4, "nat").chain("PREROUTING").unwrap()[0].clone();
    // Another program: flushes a service chain, puts a DROP first in filter KUBE-SERVICES, and
    // deletes our jump from nat PREROUTING.
    p.iptables()
        .restore(
            V4,
            &format!(
                "*nat\n:{svc} - [0:0]\n-D PREROUTING {jump}\nCOMMIT\n*filter\n-I KUBE-SERVICES 1 -j DROP\nCOMMIT\n"
            ),
        )
        .unwrap();
    assert_ne!(canonical(p.iptables()), fresh(&state));
    changed(
        &events,
        &[
            ("nat", &svc),
            ("nat", "PREROUTING"),
            ("filter", "KUBE-SERVICES"),
        ],
    );
    let reads_before = p.iptables().reads.len();
    let report = p.sync(&state, &ChangeSummary::default()).unwrap();
    assert!(!report.full, "repaired without a full sync");
    assert_eq!(report.repaired_chains, 3);
    assert_eq!(canonical(p.iptables()), fresh(&state));
    let reads: Vec<_> = p.iptables().reads[reads_before..].to_vec();
    let built_in = |chains: &[String]| {
        chains.iter().all(|c| {
            ["PREROUTING", "OUTPUT", "POSTROUTING", "INPUT", "FORWARD"].contains(&c.as_str())
        })
    };
    assert!(
        reads.iter().all(|r| match r {
            Read::ChainRules { chains, .. } | Read::ChainFingerprints { chains, .. } =>
                built_in(chains),
            _ => false,
        }),
        "only the built-in chains were read: {reads:?}"
    );
}

#[test]
fn changes_to_other_programs_chains_write_nothing() {
    let state = state(2, 2);
    let events = FakeEvents::default();
    let mut p = proxier(FakeIptables::default()).with_change_events(Box::new(events.clone()));
    p.sync(&state, &ChangeSummary::default()).unwrap();
    let restores = p.iptables().restores.len();
    changed(
        &events,
        &[
            ("nat", "KUBE-SVC-NOTOURSNOTOURS"),
            ("filter", "KUBE-FIREWALL-X"),
        ],
    );
    let report = p.sync(&state, &ChangeSummary::default()).unwrap();
    assert_eq!(report.repaired_chains, 0);
    assert_eq!(p.iptables().restores.len(), restores);
}

#[test]
fn lost_events_or_a_changed_table_mean_a_full_sync() {
    let state = state(2, 2);
    let events = FakeEvents::default();
    let mut p = proxier(FakeIptables::default()).with_change_events(Box::new(events.clone()));
    p.sync(&state, &ChangeSummary::default()).unwrap();
    *events.pending.lock().unwrap() = Drift {
        lost: true,
        ..Drift::default()
    };
    assert!(p.sync(&state, &ChangeSummary::default()).unwrap().full);
    changed(&events, &[("nat", "")]);
    assert!(p.sync(&state, &ChangeSummary::default()).unwrap().full);
    assert!(!p.sync(&state, &ChangeSummary::default()).unwrap().full);
}

#[test]
fn without_events_each_sync_period_compares_rule_counts_and_repairs() {
    let state = state(4, 3);
    let mut settings = super::incremental::settings();
    settings.canary_interval = std::time::Duration::ZERO;
    let mut p = crate::proxier::iptables::IptablesProxier::new(
        FakeIptables::default(),
        settings,
        Box::new(crate::sys::host::net::FixedAddresses(vec![])),
        Box::new(crate::sys::host::net::FakeSysctl::default()),
    );
    p.sync(&state, &ChangeSummary::default()).unwrap();
    assert_eq!(
        p.sync(&state, &ChangeSummary::default())
            .unwrap()
            .repaired_chains,
        0,
        "nothing to repair"
    );
    let svc = first_chain(p.iptables(), "KUBE-SEP-");
    let jump = p.iptables().table(V4, "filter").chain("FORWARD").unwrap()[0].clone();
    p.iptables()
        .restore(
            V4,
            &format!(
                "*nat\n:{svc} - [0:0]\nCOMMIT\n*filter\n-D FORWARD {jump}\n-I KUBE-SERVICES 1 -j DROP\nCOMMIT\n"
            ),
        )
        .unwrap();
    let report = p.sync(&state, &ChangeSummary::default()).unwrap();
    assert!(!report.full);
    assert_eq!(
        report.repaired_chains, 3,
        "the SEP chain, filter KUBE-SERVICES, the FORWARD jump"
    );
    assert_eq!(canonical(p.iptables()), fresh(&state));
}
