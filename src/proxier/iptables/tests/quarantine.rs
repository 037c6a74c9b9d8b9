//! One service whose rules the kernel refuses never fails the node: it is skipped (its last
//! accepted rules stay), the rest is programmed in the same sync, and it is tried again when it
//! changes.

use super::incremental::{V4, changed, proxier, state};
use super::*;
use crate::model::ChangeSummary;
use crate::proxier::Proxier;
use crate::sys::xtables::fake::FakeIptables;

/// Whether the fake's nat KUBE-SERVICES sends `service`'s cluster IP somewhere.
fn programmed(ipt: &FakeIptables, service: &str) -> bool {
    ipt.table(V4, "nat")
        .chain("KUBE-SERVICES")
        .is_some_and(|rules| {
            rules
                .iter()
                .any(|r| r.contains(&format!("ns/{service}:p80 cluster IP")))
        })
}

/// svc-i's endpoints are 10.100.i.1-3:8080 (see `state`).
const SVC_2_ENDPOINT: &str = "10.100.2.1:8080";

#[test]
fn a_refused_service_is_skipped_and_the_rest_programmed_in_the_same_sync() {
    let mut state = state(5, 3);
    let mut ipt = FakeIptables::default();
    ipt.refuse_containing = Some(SVC_2_ENDPOINT.into());
    let mut p = proxier(ipt);
    let report = p
        .sync(&state, &ChangeSummary::default())
        .expect("the sync succeeds");
    assert_eq!(report.skipped_services, 1);
    for good in ["svc-0", "svc-1", "svc-3", "svc-4"] {
        assert!(programmed(p.iptables(), good), "{good}");
    }
    assert!(!programmed(p.iptables(), "svc-2"));

    // Once it changes into something the kernel takes, it is programmed.
    let key = NamespacedName::new("ns", "svc-2");
    let port = state.endpoints[&key].keys().next().unwrap().clone();
    state
        .endpoints
        .get_mut(&key)
        .unwrap()
        .get_mut(&port)
        .unwrap()
        .remove(0);
    let report = p.sync(&state, &changed(&[&key])).unwrap();
    assert_eq!(report.skipped_services, 0);
    assert!(programmed(p.iptables(), "svc-2"));
}

#[test]
fn a_service_turning_bad_keeps_its_last_accepted_rules() {
    let mut state = state(4, 3);
    let mut p = proxier(FakeIptables::default());
    p.sync(&state, &ChangeSummary::default()).unwrap();
    let before = p.iptables().dump(V4, "nat");
    // svc-3 gains an endpoint the kernel refuses; svc-1 changes in the same sync.
    p.iptables().refuse_containing = Some("10.100.3.9:8080".into());
    let svc3 = NamespacedName::new("ns", "svc-3");
    let port = state.endpoints[&svc3].keys().next().unwrap().clone();
    let mut added = state.endpoints[&svc3][&port][0].clone();
    added.ip = "10.100.3.9".parse().unwrap();
    state
        .endpoints
        .get_mut(&svc3)
        .unwrap()
        .get_mut(&port)
        .unwrap()
        .push(added);
    let svc1 = NamespacedName::new("ns", "svc-1");
    let svc1_port = port_of(&state, &svc1);
    state
        .endpoints
        .get_mut(&svc1)
        .unwrap()
        .get_mut(&svc1_port)
        .unwrap()
        .pop();
    let report = p
        .sync(&state, &changed(&[&svc1, &svc3]))
        .expect("the sync succeeds");
    assert_eq!(report.skipped_services, 1);
    let after = p.iptables().dump(V4, "nat");
    let svc3_chains = |dump: &str| -> Vec<String> {
        dump.lines()
            .filter(|l| l.contains("ns/svc-3"))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(svc3_chains(&after), svc3_chains(&before), "svc-3 as it was");
    assert!(!after.contains("10.100.3.9"));
    assert_ne!(after, before, "svc-1's change went in");
}

#[test]
fn a_refused_filter_rule_is_traced_to_its_service_by_its_comment() {
    let mut state = state(3, 2);
    let key = NamespacedName::new("ns", "svc-1");
    state.endpoints.remove(&key);
    let mut ipt = FakeIptables::default();
    ipt.refuse_containing = Some("ns/svc-1:p80 has no endpoints".into());
    let mut p = proxier(ipt);
    let report = p
        .sync(&state, &ChangeSummary::default())
        .expect("the sync succeeds");
    assert_eq!(report.skipped_services, 1);
    assert!(programmed(p.iptables(), "svc-0") && programmed(p.iptables(), "svc-2"));
}

#[test]
fn input_no_service_owns_still_fails_the_sync() {
    let state = state(2, 2);
    let mut ipt = FakeIptables::default();
    ipt.refuse_containing = Some("KUBE-MARK-MASQ -j MARK".into());
    let mut p = proxier(ipt);
    assert!(p.sync(&state, &ChangeSummary::default()).is_err());
}

fn port_of(
    state: &crate::model::ProxyState,
    key: &NamespacedName,
) -> crate::model::ServicePortName {
    state.endpoints[key].keys().next().unwrap().clone()
}
