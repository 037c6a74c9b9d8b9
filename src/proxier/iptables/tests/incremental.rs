//! Incremental syncs through the proxier against the stateful fake: after any change, the fake's
//! tables equal what a full sync of the same state gives, and the restore input only touches
//! the changed service.

use std::collections::BTreeMap;

use super::*;
use crate::config::KubeProxyConfiguration;
use crate::model::{ChangeSummary, NodeInfo, ProxyState};
use crate::proxier::Proxier;
use crate::proxier::iptables::{IptablesProxier, IptablesSettings};
use crate::sys::host::net::{FakeSysctl, FixedAddresses};
use crate::sys::xtables::fake::FakeIptables;

pub(super) const V4: IpFamily = IpFamily::V4;

pub(super) fn settings() -> IptablesSettings {
    let mut config = KubeProxyConfiguration {
        cluster_cidr: "10.0.0.0/8".into(),
        ..KubeProxyConfiguration::default()
    };
    config.apply_defaults();
    let mut settings = IptablesSettings::from_config(&config);
    // No canary checks in the middle of a test: the first sync is full anyway.
    settings.canary_interval = std::time::Duration::from_secs(3600);
    settings
}

pub(super) fn proxier(ipt: FakeIptables) -> IptablesProxier<FakeIptables> {
    let mut p = IptablesProxier::new(
        ipt,
        settings(),
        Box::new(FixedAddresses(vec![])),
        Box::new(FakeSysctl::default()),
    );
    p.record_transactions = true;
    p
}

pub(super) fn node() -> NodeInfo {
    NodeInfo {
        name: NODE.into(),
        addresses: vec![NODE_IP.parse().unwrap()],
        ..NodeInfo::default()
    }
}

/// `count` services `ns/svc-i`, each with `endpoints` endpoints.
pub(super) fn state(count: usize, endpoints: usize) -> ProxyState {
    let mut state = ProxyState {
        node: node(),
        ..ProxyState::default()
    };
    for i in 0..count {
        let eps = (0..endpoints)
            .map(|e| {
                ep(
                    &format!("10.{}.{}.{}", 100 + i / 250, i % 250, e + 1),
                    8080,
                    "",
                )
            })
            .collect();
        let s = svc(
            "ns",
            &format!("svc-{i}"),
            &format!("172.30.{}.{}", i / 250, i % 250 + 1),
            |s| {
                s.node_port = Some(30000 + i as u16);
            },
        )
        .with_endpoints(eps);
        state.services.insert(s.key.clone(), s.ports);
        state.endpoints.insert(s.key.clone(), s.endpoints);
    }
    state
}

pub(super) fn changed(keys: &[&NamespacedName]) -> ChangeSummary {
    ChangeSummary {
        changed_services: keys.iter().map(|k| (*k).clone()).collect(),
        ..ChangeSummary::default()
    }
}

/// The tables in a form where only meaningful order counts: shared chains' rules as sets (each
/// service's rules are independent), except that the KUBE-NODEPORTS jump must be last.
pub(super) fn canonical(ipt: &FakeIptables) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for table in ["filter", "nat", "mangle"] {
        for (chain, rules) in ipt.table(V4, table).chains {
            let mut rules = rules.clone();
            if table == "nat" && chain == "KUBE-SERVICES" {
                let last = rules.pop();
                rules.sort();
                rules.extend(last);
            } else if chain.starts_with("KUBE-") && !super::super::names::is_service_chain(&chain) {
                rules.sort();
            }
            out.insert(format!("{table}/{chain}"), rules);
        }
    }
    out
}

/// Rules in our (KUBE-*) chains per table, as the kernel holds them: what the rule-count metric
/// must say.
pub(super) fn kube_rules(ipt: &FakeIptables) -> Vec<(IpFamily, &'static str, usize)> {
    ["filter", "nat"]
        .into_iter()
        .map(|table| {
            let count = ipt
                .table(V4, table)
                .chains
                .iter()
                .filter(|(chain, _)| chain.starts_with("KUBE-"))
                .map(|(_, rules)| rules.len())
                .sum();
            (V4, table, count)
        })
        .collect()
}

/// What a fresh node gets from one full sync of `state`.
pub(super) fn fresh(state: &ProxyState) -> BTreeMap<String, Vec<String>> {
    let mut p = proxier(FakeIptables::default());
    p.sync(state, &ChangeSummary::default()).unwrap();
    canonical(p.iptables())
}

#[test]
fn changes_touch_only_the_changed_service_and_match_a_full_sync() {
    let mut state = state(20, 3);
    let mut p = proxier(FakeIptables::default());
    let report = p.sync(&state, &ChangeSummary::default()).unwrap();
    assert!(report.full);
    assert_eq!(canonical(p.iptables()), fresh(&state));
    assert_eq!(report.rules, kube_rules(p.iptables()));

    // One more endpoint for svc-7.
    let key = NamespacedName::new("ns", "svc-7");
    let port = state.services[&key].keys().next().unwrap().clone();
    state
        .endpoints
        .get_mut(&key)
        .unwrap()
        .get_mut(&port)
        .unwrap()
        .push(ep("10.200.0.9", 8080, ""));
    let report = p.sync(&state, &changed(&[&key])).unwrap();
    assert!(!report.full);
    assert_eq!(report.rules, kube_rules(p.iptables()));
    let (_, input) = p.last_transactions.last().unwrap().clone();
    assert!(!input.contains("*filter"), "filter untouched:\n{input}");
    for line in input
        .lines()
        .filter(|l| l.starts_with('-') || l.starts_with(':'))
    {
        assert!(
            line.contains("svc-7") || line.contains("KUBE-SVC-") || line.contains("KUBE-SEP-"),
            "{line}"
        );
    }
    assert_eq!(
        input.lines().filter(|l| l.starts_with(':')).count(),
        2,
        "the SVC chain and the new SEP chain:\n{input}"
    );
    assert!(
        !input.contains(":KUBE-SERVICES"),
        "shared chains are never flushed in a partial sync"
    );
    assert_eq!(canonical(p.iptables()), fresh(&state));

    // Endpoints gone: REJECT, chains deleted.
    state.endpoints.remove(&key);
    p.sync(&state, &changed(&[&key])).unwrap();
    let (_, input) = p.last_transactions.last().unwrap().clone();
    assert!(
        input.contains("-j REJECT") && input.contains("-X KUBE-SVC-"),
        "{input}"
    );
    assert_eq!(canonical(p.iptables()), fresh(&state));

    // Service deleted, another added.
    state.services.remove(&key);
    let added = svc("other", "new", "172.31.0.1", |s| {
        s.external_ips = vec!["192.168.99.1".parse().unwrap()]
    })
    .with_endpoints(vec![ep("10.201.0.1", 80, "")]);
    state.services.insert(added.key.clone(), added.ports);
    state.endpoints.insert(added.key.clone(), added.endpoints);
    let report = p.sync(&state, &changed(&[&key, &added.key])).unwrap();
    assert_eq!(report.rules, kube_rules(p.iptables()));
    let (_, input) = p.last_transactions.last().unwrap().clone();
    assert!(input.contains("-I KUBE-SERVICES 1 "), "{input}");
    assert_eq!(canonical(p.iptables()), fresh(&state));
    let nat = p.iptables().table(V4, "nat");
    let services = nat.chain("KUBE-SERVICES").unwrap();
    assert!(
        services.last().unwrap().contains("-j KUBE-NODEPORTS"),
        "the NodePort jump stays last"
    );

    // Nothing changed: nothing written.
    p.sync(&state, &ChangeSummary::default()).unwrap();
    assert!(p.last_transactions.is_empty());
}

#[test]
fn one_endpoint_change_costs_the_same_at_any_size() {
    let mut sizes = Vec::new();
    for count in [10, 1000] {
        let mut state = state(count, 10);
        let mut p = proxier(FakeIptables::default());
        p.sync(&state, &ChangeSummary::default()).unwrap();
        let key = NamespacedName::new("ns", "svc-3");
        let port = state.services[&key].keys().next().unwrap().clone();
        state
            .endpoints
            .get_mut(&key)
            .unwrap()
            .get_mut(&port)
            .unwrap()
            .pop();
        p.sync(&state, &changed(&[&key])).unwrap();
        let (_, input) = p.last_transactions.last().unwrap().clone();
        sizes.push(input.lines().count());
    }
    assert_eq!(
        sizes[0], sizes[1],
        "restore lines for one change at 10 and 1000 services"
    );
}

#[test]
fn failures_force_a_full_sync_and_are_counted() {
    let mut state = state(5, 2);
    let mut p = proxier(FakeIptables::default());
    p.sync(&state, &ChangeSummary::default()).unwrap();
    let key = NamespacedName::new("ns", "svc-1");
    state.endpoints.remove(&key);
    p.iptables().fail_next_restore = Some("injected".into());
    assert!(p.sync(&state, &changed(&[&key])).is_err());
    assert_eq!(p.sync_failures, 1);
    // The retry carries no change set (it was consumed) but must converge: it is a full sync.
    let report = p.sync(&state, &ChangeSummary::default()).unwrap();
    assert!(report.full);
    assert_eq!(canonical(p.iptables()), fresh(&state));
    assert_eq!(report.rules, kube_rules(p.iptables()));
}

#[test]
fn flushed_tables_are_restored_by_the_canary_check() {
    let state = state(3, 2);
    let mut s = settings();
    s.canary_interval = std::time::Duration::ZERO;
    let mut p = IptablesProxier::new(
        FakeIptables::default(),
        s,
        Box::new(FixedAddresses(vec![])),
        Box::new(FakeSysctl::default()),
    );
    p.sync(&state, &ChangeSummary::default()).unwrap();
    p.iptables().flush_all(V4);
    let report = p.sync(&state, &ChangeSummary::default()).unwrap();
    assert!(report.full, "canary gone: full sync");
    assert_eq!(canonical(p.iptables()), fresh(&state));
}

#[test]
fn foreign_rules_survive_and_stale_chains_go() {
    let state = state(3, 2);
    let mut ipt = FakeIptables::default();
    ipt.add_foreign_rule(
        V4,
        "nat",
        "PREROUTING",
        "-p tcp --dport 2222 -j DNAT --to-destination 10.9.9.9:22",
    );
    ipt.add_foreign_rule(V4, "filter", "INPUT", "-p tcp --dport 22 -j ACCEPT");
    ipt.add_foreign_rule(V4, "nat", "CNI-CHAIN", "-j RETURN");
    // Left over by an earlier run for a service that no longer exists.
    ipt.add_foreign_rule(V4, "nat", "KUBE-SVC-OLDOLDOLDOLDOLD", "-j RETURN");
    let mut p = proxier(ipt);
    p.sync(&state, &ChangeSummary::default()).unwrap();
    p.force_full_sync();
    p.sync(&state, &ChangeSummary::default()).unwrap();
    let nat = p.iptables().table(V4, "nat");
    assert!(
        nat.chain("KUBE-SVC-OLDOLDOLDOLDOLD").is_none(),
        "stale chain removed"
    );
    assert!(nat.chain("CNI-CHAIN").is_some());
    let prerouting = nat.chain("PREROUTING").unwrap();
    assert_eq!(
        prerouting.len(),
        2,
        "our jump added once, theirs kept: {prerouting:?}"
    );
    assert!(prerouting.iter().any(|r| r.contains("--dport 2222")));
    let input = p
        .iptables()
        .table(V4, "filter")
        .chain("INPUT")
        .unwrap()
        .clone();
    assert!(input.iter().any(|r| r.contains("--dport 22 -j ACCEPT")));
    assert_eq!(
        input.iter().filter(|r| r.contains("KUBE-")).count(),
        4,
        "{input:?}"
    );
}

#[test]
fn dual_stack_nodes_program_both_families() {
    let mut state = ProxyState {
        node: NodeInfo {
            name: NODE.into(),
            addresses: vec![NODE_IP.parse().unwrap(), "fd00::2".parse().unwrap()],
            ..NodeInfo::default()
        },
        ..ProxyState::default()
    };
    let s = svc("ns", "dual", "172.30.0.1,fd00:30::1", |_| {})
        .with_endpoints(vec![ep("10.1.0.1", 80, ""), ep("fd00:1::1", 80, "")]);
    state.services.insert(s.key.clone(), s.ports);
    state.endpoints.insert(s.key.clone(), s.endpoints);
    let mut p = proxier(FakeIptables::default());
    p.sync(&state, &ChangeSummary::default()).unwrap();
    let v4 = p.iptables().dump(IpFamily::V4, "nat");
    let v6 = p.iptables().dump(IpFamily::V6, "nat");
    assert!(
        v4.contains("-d 172.30.0.1 ") && v4.contains("10.1.0.1:80") && !v4.contains("fd00"),
        "{v4}"
    );
    assert!(
        v6.contains("-d fd00:30::1 ") && v6.contains("[fd00:1::1]:80") && !v6.contains("10.1.0.1"),
        "{v6}"
    );
    assert!(
        p.iptables()
            .restores
            .iter()
            .any(|(f, _)| *f == IpFamily::V6)
    );
}
