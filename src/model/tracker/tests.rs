use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::model::fixtures::{service_port, slice};
use crate::model::types::{NamespacedName, ServicePortMap};

fn ports(namespace: &str, name: &str, port: u16) -> ServicePortMap {
    let mut sp = service_port(namespace, name, "http");
    sp.port = port;
    crate::model::VecMap::from([(sp.name.clone(), sp)])
}

fn key(name: &str) -> NamespacedName {
    NamespacedName::new("ns", name)
}

#[test]
fn no_op_updates_are_dropped() {
    let mut tracker = ChangeTracker::default();
    assert!(tracker.service_updated(&key("a"), Some(ports("ns", "a", 80))));
    let mut state = ProxyState::default();
    state.apply(tracker.take_changes());
    assert!(
        !tracker.service_updated(&key("a"), Some(ports("ns", "a", 80))),
        "same value again"
    );
    assert!(!tracker.has_pending());
    // A change and its undo cancel out before the sync sees them.
    assert!(tracker.service_updated(&key("a"), Some(ports("ns", "a", 81))));
    assert!(!tracker.service_updated(&key("a"), Some(ports("ns", "a", 80))));
    assert!(!tracker.has_pending());
}

#[test]
fn external_ips_are_dropped_when_they_are_not_allowed() {
    let with_external = || {
        let mut ports = ports("ns", "a", 80);
        for port in ports.values_mut() {
            port.external_ips = vec!["192.0.2.1".parse().unwrap()];
            port.external_policy_local = true;
        }
        ports
    };
    let mut state = ProxyState::default();
    let mut tracker = ChangeTracker::new(false);
    assert!(tracker.service_updated(&key("a"), Some(with_external())));
    state.apply(tracker.take_changes());
    let port = state.services[&key("a")].values().next().unwrap();
    assert!(port.external_ips.is_empty());
    assert!(!port.externally_accessible() && !port.external_policy_local);
    // A relist brings the same Service: nothing changed.
    let listing = BTreeMap::from([(key("a"), with_external())]);
    assert!(!tracker.replace_services(listing, &BTreeSet::new()));

    let mut tracker = ChangeTracker::default();
    tracker.service_updated(&key("a"), Some(with_external()));
    state.apply(tracker.take_changes());
    let port = state.services[&key("a")].values().next().unwrap();
    assert_eq!(port.external_ips.len(), 1, "kept by default");
}

#[test]
fn add_then_delete_before_sync_is_nothing() {
    let mut tracker = ChangeTracker::default();
    tracker.service_updated(&key("a"), Some(ports("ns", "a", 80)));
    assert!(!tracker.service_updated(&key("a"), None));
    assert!(!tracker.has_pending());
}

#[test]
fn delete_then_readd_after_sync_is_one_change_each() {
    let mut tracker = ChangeTracker::default();
    let mut state = ProxyState::default();
    tracker.service_updated(&key("a"), Some(ports("ns", "a", 80)));
    state.apply(tracker.take_changes());
    tracker.service_updated(&key("a"), None);
    let summary = state.apply(tracker.take_changes());
    assert_eq!(
        summary.changed_services.into_iter().collect::<Vec<_>>(),
        vec![key("a")]
    );
    assert!(state.services.is_empty());
    tracker.service_updated(&key("a"), Some(ports("ns", "a", 81)));
    let summary = state.apply(tracker.take_changes());
    assert_eq!(summary.service_changes, 1);
    assert_eq!(state.services[&key("a")], ports("ns", "a", 81));
}

#[test]
fn only_changed_services_are_reported() {
    let mut tracker = ChangeTracker::default();
    let mut state = ProxyState::default();
    for name in ["a", "b", "c"] {
        tracker.service_updated(&key(name), Some(ports("ns", name, 80)));
        tracker.slice_updated(
            &key(&format!("{name}-1")),
            Some(slice(
                "ns",
                &format!("{name}-1"),
                name,
                &[("10.0.0.1", "n")],
            )),
        );
    }
    let summary = state.apply(tracker.take_changes());
    assert_eq!(summary.changed_services.len(), 3);
    tracker.slice_updated(
        &key("b-1"),
        Some(slice(
            "ns",
            "b-1",
            "b",
            &[("10.0.0.1", "n"), ("10.0.0.2", "n")],
        )),
    );
    let summary = state.apply(tracker.take_changes());
    assert_eq!(
        summary.changed_services.into_iter().collect::<Vec<_>>(),
        vec![key("b")]
    );
    assert_eq!(summary.endpoint_changes, 1);
    assert_eq!(summary.service_changes, 0);
    let eps = state.endpoints[&key("b")].values().next().unwrap();
    assert_eq!(eps.len(), 2);
}

#[test]
fn slices_merge_and_move_between_services() {
    let mut tracker = ChangeTracker::default();
    let mut state = ProxyState::default();
    tracker.slice_updated(
        &key("s1"),
        Some(slice("ns", "s1", "a", &[("10.0.0.1", "n")])),
    );
    tracker.slice_updated(
        &key("s2"),
        Some(slice(
            "ns",
            "s2",
            "a",
            &[("10.0.0.2", "n"), ("10.0.0.1", "n")],
        )),
    );
    state.apply(tracker.take_changes());
    assert_eq!(state.endpoints[&key("a")].values().next().unwrap().len(), 2);
    // The slice's label now names service b: a loses its endpoints, b gains them.
    tracker.slice_updated(
        &key("s2"),
        Some(slice("ns", "s2", "b", &[("10.0.0.2", "n")])),
    );
    let summary = state.apply(tracker.take_changes());
    assert_eq!(summary.changed_services.len(), 2);
    assert_eq!(state.endpoints[&key("a")].values().next().unwrap().len(), 1);
    assert_eq!(state.endpoints[&key("b")].values().next().unwrap().len(), 1);
    tracker.slice_updated(&key("s1"), None);
    state.apply(tracker.take_changes());
    assert!(
        !state.endpoints.contains_key(&key("a")),
        "no slices left: no entry"
    );
}

#[test]
fn relist_replaces_only_what_differs() {
    let mut tracker = ChangeTracker::default();
    let mut state = ProxyState::default();
    tracker.service_updated(&key("a"), Some(ports("ns", "a", 80)));
    tracker.service_updated(&key("b"), Some(ports("ns", "b", 80)));
    tracker.slice_updated(
        &key("a-1"),
        Some(slice("ns", "a-1", "a", &[("10.0.0.1", "n")])),
    );
    state.apply(tracker.take_changes());

    let listing = BTreeMap::from([
        (key("a"), ports("ns", "a", 80)),
        (key("c"), ports("ns", "c", 80)),
    ]);
    assert!(tracker.replace_services(listing, &BTreeSet::new()));
    assert!(!tracker.replace_slices(
        BTreeMap::from([(key("a-1"), slice("ns", "a-1", "a", &[("10.0.0.1", "n")]))]),
        &BTreeSet::new()
    ));
    let summary = state.apply(tracker.take_changes());
    assert_eq!(
        summary.changed_services.into_iter().collect::<Vec<_>>(),
        vec![key("b"), key("c")]
    );
    assert_eq!(
        state.services.keys().cloned().collect::<Vec<_>>(),
        vec![key("a"), key("c")]
    );
    assert_eq!(tracker.counts(), (2, 1));
}

#[test]
fn node_changes_are_tracked() {
    let mut tracker = ChangeTracker::default();
    let mut state = ProxyState::default();
    let node = NodeInfo {
        name: "n".into(),
        ..NodeInfo::default()
    };
    assert!(tracker.node_updated(Some(node.clone())));
    let summary = state.apply(tracker.take_changes());
    assert!(summary.node_changed);
    assert_eq!(state.node, node);
    assert!(!tracker.node_updated(Some(node)));
    assert!(!tracker.has_pending());
}

#[test]
fn relist_keeps_malformed_objects_as_they_were() {
    let mut tracker = ChangeTracker::default();
    tracker.service_updated(&key("a"), Some(ports("ns", "a", 80)));
    tracker.slice_updated(
        &key("a-1"),
        Some(slice("ns", "a-1", "a", &[("10.0.0.1", "n")])),
    );
    tracker.take_changes();
    let keep = BTreeSet::from([key("a"), key("a-1")]);
    assert!(!tracker.replace_services(BTreeMap::new(), &keep));
    assert!(!tracker.replace_slices(BTreeMap::new(), &keep));
    assert_eq!(tracker.counts(), (1, 1));
}

#[test]
fn service_cidrs_merge_and_only_changes_are_pending() {
    let mut tracker = ChangeTracker::default();
    let a = NamespacedName::new("", "kubernetes");
    let b = NamespacedName::new("", "extra");
    let net = |s: &str| -> ipnet::IpNet { s.parse().unwrap() };
    assert!(tracker.service_cidr_updated(&a, Some(vec![net("10.96.0.0/16")])));
    assert!(tracker.service_cidr_updated(&b, Some(vec![net("fd00::/108"), net("10.96.0.0/16")])));
    let mut state = ProxyState::default();
    state.apply(tracker.take_changes());
    assert_eq!(
        state.service_cidrs,
        vec![net("10.96.0.0/16"), net("fd00::/108")]
    );
    assert!(!tracker.service_cidr_updated(&a, Some(vec![net("10.96.0.0/16")])));
    assert!(!tracker.has_pending());
    assert!(tracker.service_cidr_updated(&b, None));
    state.apply(tracker.take_changes());
    assert_eq!(state.service_cidrs, vec![net("10.96.0.0/16")]);
}

#[test]
fn a_services_pending_changes_are_told_by_name() {
    let mut tracker = ChangeTracker::default();
    let slice_key = NamespacedName::new("ns", "web-1");
    let three = [("10.0.0.1", "a"), ("10.0.0.2", "a"), ("10.0.0.3", "b")];
    tracker.slice_updated(&slice_key, Some(slice("ns", "web-1", "web", &three)));
    let _ = tracker.take_changes();
    assert_eq!(tracker.pending_for(&key("web")), (None, None));
    tracker.slice_updated(&slice_key, Some(slice("ns", "web-1", "web", &three[..2])));
    let (ports, endpoints) = tracker.pending_for(&key("web"));
    assert!(ports.is_none());
    let current = endpoints
        .and_then(|change| change.current.as_ref())
        .expect("pending");
    assert_eq!(current.values().next().map(Vec::len), Some(2));
    assert_eq!(tracker.pending_for(&key("other")), (None, None));
}
