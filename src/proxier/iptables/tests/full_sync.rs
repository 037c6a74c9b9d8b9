//! Full syncs against the stateful fake: what they read (never a whole table), how a large one is
//! split into transactions, and restarts onto a node an earlier run programmed.

use super::super::names;
use super::incremental::{V4, canonical, changed, fresh, proxier, state};
use super::*;
use crate::model::ChangeSummary;
use crate::proxier::Proxier;
use crate::sys::xtables::builtin_chains;
use crate::sys::xtables::fake::{FakeIptables, Read};

/// The reads a proxier made since the last call, cleared.
fn take_reads(ipt: &mut FakeIptables) -> Vec<Read> {
    std::mem::take(&mut ipt.reads)
}

/// Chain names, the rules of built-in chains (for our jumps) and of our own chains (to keep
/// those already right): never a whole table, never another program's chain.
fn assert_only_names_and_built_in_chains(reads: &[Read]) {
    for read in reads {
        match read {
            Read::ChainNames { .. } => {}
            Read::ChainRules { table, chains, .. } => assert!(
                chains
                    .iter()
                    .all(|chain| builtin_chains(table).contains(&chain.as_str())),
                "a full sync read one of our chains' rules: {read:?}"
            ),
            Read::ChainFingerprints { table, chains, .. } => assert!(
                chains.iter().all(|chain| chain.starts_with("KUBE-")
                    || builtin_chains(table).contains(&chain.as_str())),
                "a full sync read another program's chain: {read:?}"
            ),
            Read::ChainExists { .. } => {}
            Read::Snapshot { .. } => panic!("a full sync read a whole table: {read:?}"),
        }
    }
}

#[test]
fn full_syncs_read_only_chain_names_and_built_in_chains() {
    let mut state = state(30, 3);
    let mut p = proxier(FakeIptables::default());
    p.sync(&state, &ChangeSummary::default()).unwrap();
    let first = take_reads(p.iptables());
    assert_only_names_and_built_in_chains(&first);
    assert!(
        first.iter().any(|r| matches!(r, Read::ChainNames { .. })),
        "the first full sync looks for an earlier run's chains"
    );

    // The hourly full sync knows nat's chains from what it wrote: their names are not read.
    p.force_full_sync();
    assert!(p.sync(&state, &ChangeSummary::default()).unwrap().full);
    let hourly = take_reads(p.iptables());
    assert_only_names_and_built_in_chains(&hourly);
    assert!(
        !hourly
            .iter()
            .any(|r| matches!(r, Read::ChainNames { table, .. } if table == "nat"))
    );

    // After a failed restore it cannot know what went in: it reads the names again.
    let key = NamespacedName::new("ns", "svc-3");
    state.endpoints.remove(&key);
    p.iptables().fail_next_restore = Some("injected".into());
    assert!(p.sync(&state, &changed(&[&key])).is_err());
    assert!(p.sync(&state, &ChangeSummary::default()).unwrap().full);
    let retry = take_reads(p.iptables());
    assert_only_names_and_built_in_chains(&retry);
    assert!(retry.iter().any(|r| matches!(r, Read::ChainNames { .. })));
    assert_eq!(canonical(p.iptables()), fresh(&state));
}

#[test]
fn large_restores_go_in_transactions_that_each_hold_whole_services() {
    let state = state(12, 4);
    let mut ipt = FakeIptables::default();
    ipt.chains_per_transaction = Some(7);
    ipt.add_foreign_rule(V4, "nat", "KUBE-SVC-OLDOLDOLDOLDOLD", "-j RETURN");
    let mut p = proxier(ipt);
    p.sync(&state, &ChangeSummary::default()).unwrap();
    assert_eq!(
        canonical(p.iptables()),
        fresh(&state),
        "same rules as one transaction"
    );
    assert!(
        p.iptables()
            .table(V4, "nat")
            .chain("KUBE-SVC-OLDOLDOLDOLDOLD")
            .is_none()
    );

    let text = &p.last_transactions[0].1;
    let sections: Vec<&str> = text.split("COMMIT\n").filter(|s| !s.is_empty()).collect();
    let nat: Vec<&str> = sections
        .iter()
        .copied()
        .filter(|s| s.starts_with("*nat"))
        .collect();
    assert!(nat.len() > 3, "{} nat transactions", nat.len());
    // The service chains' targets first, the entry points (and the deletions) last.
    assert!(nat[0].contains(":KUBE-MARK-MASQ") && !nat[0].contains(":KUBE-SERVICES"));
    let last = nat[nat.len() - 1];
    assert!(last.contains(":KUBE-SERVICES") && last.contains("-X KUBE-SVC-OLDOLDOLDOLDOLD"));
    // Each service's chains are declared and filled in one transaction.
    for ports in state.services.values() {
        for port in ports.values() {
            let svc = names::cluster_policy_chain(&port.name);
            let holding: Vec<&&str> = nat
                .iter()
                .filter(|s| s.contains(&format!(":{svc} ")))
                .collect();
            assert_eq!(holding.len(), 1, "{svc}");
            for endpoint in &state.endpoints[&port.name.service][&port.name] {
                let sep = names::endpoint_chain(&port.name, &endpoint.address());
                assert!(holding[0].contains(&format!(":{sep} ")), "{sep} with {svc}");
            }
        }
    }
}

#[test]
fn a_restart_converges_on_what_an_earlier_run_programmed() {
    let before = state(8, 3);
    let mut after = state(10, 2);
    for gone in ["svc-1", "svc-6"] {
        let key = NamespacedName::new("ns", gone);
        after.services.remove(&key);
        after.endpoints.remove(&key);
    }
    let mut earlier = proxier(FakeIptables::default());
    earlier.sync(&before, &ChangeSummary::default()).unwrap();
    let node = earlier.iptables().clone();

    let mut restarted = proxier(node);
    assert!(
        restarted
            .sync(&after, &ChangeSummary::default())
            .unwrap()
            .full
    );
    assert_eq!(canonical(restarted.iptables()), fresh(&after));
    let reads = take_reads(restarted.iptables());
    assert_only_names_and_built_in_chains(&reads);
}
