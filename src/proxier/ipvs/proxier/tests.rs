//! The IPVS proxier on stateful fakes of IPVS, the node's links and ipset (iptables' fake for
//! its rules): a full sync programs every Service; a run of partial syncs ends where a full sync
//! would; drift is repaired by a periodic sync; a virtual server the kernel refuses is skipped
//! while the rest is programmed; a restart adopts what it finds without a write.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::*;
use crate::config::KubeProxyConfiguration;
use crate::model::{Endpoint, NamespacedName, NodeInfo};
use crate::proxier::Proxier;
use crate::proxier::fixtures::{NODE, NODE_IP, ep, overall_services, svc};
use crate::sys::host::link::fake::FakeLinks;
use crate::sys::host::net::{FakeSysctl, FixedAddresses};
use crate::sys::ipset::fake::FakeIpset;
use crate::sys::ipvs::codec::CMD_DEL_DEST;
use crate::sys::ipvs::fake::FakeIpvs;
use crate::sys::ipvs::{RealServer, VirtualServer};
use crate::sys::xtables::fake::FakeIptables;

type FakeProxier = IpvsProxier<FakeIpvs, FakeLinks, FakeIpset>;

fn settings() -> IpvsSettings {
    let mut config = KubeProxyConfiguration {
        cluster_cidr: "10.0.0.0/8".into(),
        ..KubeProxyConfiguration::default()
    };
    config.apply_defaults();
    IpvsSettings::from_config(&config)
}

/// A proxier on these fakes (a new iptables fake each time: its rules are constant).
fn proxier(ipvs: FakeIpvs, links: FakeLinks, ipset: FakeIpset) -> FakeProxier {
    let kernel = IpvsKernel {
        ipvs,
        links,
        ipset,
        iptables: Box::new(FakeIptables::default()),
        sysctl: Box::new(FakeSysctl::default()),
        addresses: Box::new(FixedAddresses(vec![NODE_IP.parse().unwrap()])),
    };
    IpvsProxier::on(kernel, settings())
}

fn fresh() -> FakeProxier {
    proxier(
        FakeIpvs::default(),
        FakeLinks::default(),
        FakeIpset::default(),
    )
}

/// What the fakes hold: virtual servers with their real servers, kube-ipvs0's addresses, and
/// each of our sets' entries.
type Held = (
    BTreeMap<String, (VirtualServer, Vec<RealServer>)>,
    BTreeSet<IpAddr>,
    BTreeMap<String, BTreeSet<String>>,
);

fn held(p: &FakeProxier) -> Held {
    let sets = p
        .mode
        .ipset
        .sets
        .iter()
        .map(|(name, set)| (name.clone(), set.entries.clone()))
        .collect();
    (p.mode.ipvs.state(), p.mode.links.bound(DUMMY_LINK), sets)
}

fn writes(p: &FakeProxier) -> usize {
    p.mode.ipvs.writes + p.mode.links.writes + p.mode.ipset.writes
}

fn state() -> ProxyState {
    let mut state = ProxyState {
        node: NodeInfo {
            name: NODE.into(),
            addresses: vec![NODE_IP.parse().unwrap()],
            ..NodeInfo::default()
        },
        ..ProxyState::default()
    };
    for s in overall_services() {
        state.services.insert(s.key.clone(), s.ports);
        state.endpoints.insert(s.key.clone(), s.endpoints);
    }
    state
}

fn changed(keys: &[&NamespacedName]) -> ChangeSummary {
    ChangeSummary {
        changed_services: keys.iter().map(|k| (*k).clone()).collect(),
        ..ChangeSummary::default()
    }
}

fn add_endpoint(state: &mut ProxyState, service: &NamespacedName, endpoint: Endpoint) {
    if let Some(endpoints) = state
        .endpoints
        .get_mut(service)
        .and_then(|ports| ports.values_mut().next())
    {
        endpoints.push(endpoint);
    }
}

fn virtual_server(p: &FakeProxier, key: &str) -> (VirtualServer, Vec<RealServer>) {
    p.mode
        .ipvs
        .state()
        .remove(key)
        .unwrap_or_else(|| panic!("no virtual server {key}: {:?}", p.mode.ipvs.state().keys()))
}

#[test]
fn a_full_sync_programs_every_service() {
    let mut p = fresh();
    let report = p.sync(&state(), &ChangeSummary::default()).unwrap();
    assert!(report.full);
    let (vs, reals) = virtual_server(&p, "172.30.0.41:80/TCP");
    assert_eq!(vs.scheduler, "rr");
    assert_eq!(
        reals,
        vec![RealServer::new("10.180.0.1".parse().unwrap(), 80, 1)]
    );
    // Every ClusterIP bound to kube-ipvs0, and a NodePort on the node's address.
    let bound = p.mode.links.bound(DUMMY_LINK);
    for n in 41..=46 {
        let ip: IpAddr = format!("172.30.0.{n}").parse().unwrap();
        assert!(bound.contains(&ip), "{ip} in {bound:?}");
    }
    virtual_server(&p, &format!("{NODE_IP}:3001/TCP"));
    assert!(
        p.mode
            .ipset
            .entries("KUBE-CLUSTER-IP")
            .contains("172.30.0.41,tcp:80")
    );
    assert!(report.skipped_services == 0);
}

#[test]
fn partial_syncs_end_as_a_full_sync_would() {
    let mut state = state();
    let mut p = fresh();
    p.sync(&state, &ChangeSummary::default()).unwrap();
    let svc1 = NamespacedName::new("ns1", "svc1");
    let svc3 = NamespacedName::new("ns3", "svc3");
    let svc4 = NamespacedName::new("ns4", "svc4");

    // One more endpoint: one real server and its hairpin entry, nothing else.
    add_endpoint(&mut state, &svc4, ep("10.180.0.9", 80, NODE));
    let before = writes(&p);
    let report = p.sync(&state, &changed(&[&svc4])).unwrap();
    assert!(!report.full);
    let (_, reals) = virtual_server(&p, "172.30.0.44:80/TCP");
    assert!(
        reals.iter().any(|r| r.address.to_string() == "10.180.0.9"),
        "{reals:?}"
    );
    // A real server per virtual server of svc4 (ClusterIP, external IP) and the hairpin entry.
    assert!(writes(&p) - before <= 4, "{} writes", writes(&p) - before);

    assert_eq!(held(&p), full_sync_of(&state), "after one more endpoint");

    // A Service gone, a new one, a port changed.
    state.services.remove(&svc1);
    state.endpoints.remove(&svc1);
    let new = svc("ns9", "svc9", "172.30.0.49", |s| s.node_port = Some(3009))
        .with_endpoints(vec![ep("10.180.0.9", 8080, NODE)]);
    state.services.insert(new.key.clone(), new.ports);
    state.endpoints.insert(new.key.clone(), new.endpoints);
    if let Some(port) = state
        .services
        .get_mut(&svc3)
        .and_then(|p| p.values_mut().next())
    {
        port.port = 81;
    }
    let report = p.sync(&state, &changed(&[&svc1, &new.key, &svc3])).unwrap();
    assert!(!report.full);
    assert_eq!(held(&p), full_sync_of(&state), "after three changes");

    // Every endpoint of one gone; another's NodePort removed.
    let svc2 = NamespacedName::new("ns2", "svc2");
    state.endpoints.remove(&svc4);
    if let Some(port) = state
        .services
        .get_mut(&svc2)
        .and_then(|p| p.values_mut().next())
    {
        port.node_port = None;
    }
    let report = p.sync(&state, &changed(&[&svc4, &svc2])).unwrap();
    assert!(!report.full);
    assert_eq!(
        held(&p),
        full_sync_of(&state),
        "after endpoints and a NodePort gone"
    );
}

#[test]
fn everything_removed_by_hand_is_read_again_and_restored() {
    let state = state();
    let mut p = fresh();
    p.sync(&state, &ChangeSummary::default()).unwrap();
    let want = held(&p);
    // `ipvsadm -C` and `ip addr flush dev kube-ipvs0`.
    p.mode.ipvs.services.clear();
    if let Some((_, bound)) = p.mode.links.links.get_mut(DUMMY_LINK) {
        bound.clear();
    }
    let repair = p.sync(&state, &ChangeSummary::default()).unwrap();
    assert!(
        repair.full,
        "the periodic check notices and reads everything"
    );
    assert_eq!(held(&p), want);
    let after = p.sync(&state, &ChangeSummary::default()).unwrap();
    assert!(!after.full, "and then finds the kernel as it left it");
}

/// What a full sync of `state` on fresh fakes leaves.
fn full_sync_of(state: &ProxyState) -> Held {
    let mut full = fresh();
    full.sync(state, &ChangeSummary::default()).unwrap();
    held(&full)
}

/// Drift another program could make: each is repaired by the next periodic sync.
#[test]
fn drift_is_repaired_by_a_periodic_sync() {
    type Drift = fn(&mut FakeProxier);
    let drifts: [(&str, Drift); 4] = [
        ("a real server removed", |p| {
            let (vs, reals) = virtual_server(p, "172.30.0.41:80/TCP");
            p.mode
                .ipvs
                .change_destination(CMD_DEL_DEST, &vs, &reals[0])
                .unwrap();
        }),
        ("a virtual server removed", |p| {
            let (vs, _) = virtual_server(p, "172.30.0.44:80/TCP");
            p.mode.ipvs.delete_service(&vs).unwrap();
        }),
        ("a ClusterIP unbound", |p| {
            let index = p.mode.links.ensure_dummy(DUMMY_LINK).unwrap();
            p.mode
                .links
                .delete_address(index, "172.30.0.42".parse().unwrap())
                .unwrap();
        }),
        ("a set entry deleted", |p| {
            p.mode
                .ipset
                .restore("del KUBE-CLUSTER-IP 172.30.0.43,tcp:80\n")
                .unwrap();
        }),
    ];
    let state = state();
    for (name, drift) in drifts {
        let mut p = fresh();
        p.sync(&state, &ChangeSummary::default()).unwrap();
        let want = held(&p);
        drift(&mut p);
        assert_ne!(held(&p), want, "{name}: no drift");
        p.sync(&state, &ChangeSummary::default()).unwrap();
        assert_eq!(held(&p), want, "{name}: not repaired");
    }
}

#[test]
fn a_refused_virtual_server_is_skipped_while_the_rest_is_programmed() {
    let state = state();
    let ipvs = FakeIpvs {
        refuse_addresses: vec!["172.30.0.42".parse().unwrap()],
        ..FakeIpvs::default()
    };
    let mut p = proxier(ipvs, FakeLinks::default(), FakeIpset::default());
    let report = p.sync(&state, &ChangeSummary::default()).unwrap();
    assert!(report.skipped_services >= 1, "{report:?}");
    assert!(!p.mode.ipvs.state().contains_key("172.30.0.42:80/TCP"));
    for other in [
        "172.30.0.41:80/TCP",
        "172.30.0.43:80/TCP",
        "172.30.0.44:80/TCP",
    ] {
        virtual_server(&p, other);
    }
    // Once the kernel takes it, the next sync programs it.
    p.mode.ipvs.refuse_addresses.clear();
    let report = p.sync(&state, &ChangeSummary::default()).unwrap();
    assert_eq!(report.skipped_services, 0, "{report:?}");
    let mut full = fresh();
    full.sync(&state, &ChangeSummary::default()).unwrap();
    assert_eq!(held(&p), held(&full));
}

#[test]
fn a_refused_set_entry_is_skipped_while_the_rest_is_programmed() {
    let state = state();
    let ipset = FakeIpset {
        refuse_containing: vec!["172.30.0.43,".into()],
        ..FakeIpset::default()
    };
    let mut p = proxier(FakeIpvs::default(), FakeLinks::default(), ipset);
    let report = p.sync(&state, &ChangeSummary::default()).unwrap();
    assert!(report.skipped_services >= 1, "{report:?}");
    let cluster_ips = p.mode.ipset.entries("KUBE-CLUSTER-IP");
    assert!(
        !cluster_ips.contains("172.30.0.43,tcp:80"),
        "{cluster_ips:?}"
    );
    assert!(
        cluster_ips.contains("172.30.0.41,tcp:80"),
        "{cluster_ips:?}"
    );
    // Lines after the refused one are restored too.
    assert!(
        cluster_ips.contains("172.30.0.46,tcp:80"),
        "{cluster_ips:?}"
    );
    virtual_server(&p, "172.30.0.43:80/TCP");
}

#[test]
fn a_restart_adopts_what_it_finds_without_a_write() {
    let mut state = state();
    // Source ranges of one address and of every address, which ipset stores otherwise than
    // they are written.
    let lb = svc("ns7", "lb", "172.30.0.47", |s| {
        s.load_balancer_ips = vec!["5.6.7.47".parse().unwrap()];
        s.load_balancer_source_ranges = vec![
            "203.0.113.7/32".parse().unwrap(),
            "0.0.0.0/0".parse().unwrap(),
        ];
    })
    .with_endpoints(vec![ep("10.180.0.7", 80, NODE)]);
    state.services.insert(lb.key.clone(), lb.ports);
    state.endpoints.insert(lb.key.clone(), lb.endpoints);
    let mut first = fresh();
    first.sync(&state, &ChangeSummary::default()).unwrap();
    let want = held(&first);
    let (mut ipvs, mut links, mut ipset) = (
        first.mode.ipvs.clone(),
        first.mode.links.clone(),
        first.mode.ipset.clone(),
    );
    (ipvs.writes, links.writes, ipset.writes) = (0, 0, 0);
    let mut restarted = proxier(ipvs, links, ipset);
    let report = restarted.sync(&state, &ChangeSummary::default()).unwrap();
    assert!(report.full);
    assert_eq!(writes(&restarted), 0);
    assert!(
        restarted
            .mode
            .ipset
            .entries("KUBE-LOAD-BALANCER-SOURCE-CIDR")
            .contains("5.6.7.47,tcp:80,203.0.113.7"),
        "{:?}",
        restarted
            .mode
            .ipset
            .entries("KUBE-LOAD-BALANCER-SOURCE-CIDR")
    );
    assert_eq!(held(&restarted), want);
}

#[test]
fn a_node_without_a_dummy_driver_fails_the_sync_and_says_why() {
    let links = FakeLinks {
        no_dummy_driver: true,
        ..FakeLinks::default()
    };
    let mut p = proxier(FakeIpvs::default(), links, FakeIpset::default());
    let err = p.sync(&state(), &ChangeSummary::default()).unwrap_err();
    assert!(err.to_string().contains("kube-ipvs0"), "{err}");
    assert!(p.mode.ipvs.state().is_empty());
}
