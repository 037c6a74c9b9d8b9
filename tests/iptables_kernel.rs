//! Incremental syncs in a real kernel, both back ends and both families (a dual-stack node): after a series of partial syncs in one
//! namespace, iptables-save shows exactly what one full sync of the same state shows in another.

mod support;

use kube_proxy_rs::model::{
    ChangeSummary, Endpoint, NamespacedName, NodeInfo, Protocol, ProxyState, ServicePort,
    ServicePortName,
};
use kube_proxy_rs::proxier::Proxier;
use kube_proxy_rs::proxier::iptables::IptablesProxier;
use kube_proxy_rs::sys::host::net::{FakeSysctl, FixedAddresses};
use kube_proxy_rs::sys::xtables::{Backend, SystemIptables};
use support::netns::{Netns, require_netns};
use support::rules::normalized_save;

fn endpoint(ip: &str, node: &str) -> Endpoint {
    Endpoint::ready(ip.parse().unwrap(), 8080, Some(node))
}

fn put(
    state: &mut ProxyState,
    name: &str,
    ip: &str,
    node_port: Option<u16>,
    etp_local: bool,
    endpoints: Vec<Endpoint>,
) -> NamespacedName {
    let key = NamespacedName::new("default", name);
    let port_name = ServicePortName::new("default", name, "http", Protocol::Tcp);
    let port = ServicePort {
        cluster_ips: vec![ip.parse().unwrap(), v6_of(ip).parse().unwrap()],
        node_port,
        external_ips: vec!["192.168.50.1".parse().unwrap()],
        external_policy_local: etp_local,
        ..ServicePort::new(port_name.clone(), ip.parse().unwrap(), 80)
    };
    state.services.insert(
        key.clone(),
        kube_proxy_rs::model::VecMap::from([(port_name.clone(), port)]),
    );
    if endpoints.is_empty() {
        state.endpoints.remove(&key);
    } else {
        let mut both = endpoints.clone();
        both.extend(endpoints.iter().map(|ep| Endpoint {
            ip: v6_of(&ep.ip.to_string()).parse().unwrap(),
            ..ep.clone()
        }));
        state.endpoints.insert(
            key.clone(),
            kube_proxy_rs::model::VecMap::from([(port_name, both)]),
        );
    }
    key
}

/// The IPv6 twin of an IPv4 test address: 10.96.0.12 -> fd00:10:96:0::12.
fn v6_of(ip: &str) -> String {
    let parts: Vec<&str> = ip.split('.').collect();
    format!("fd00:{}:{}:{}::{}", parts[0], parts[1], parts[2], parts[3])
}

fn node() -> NodeInfo {
    NodeInfo {
        name: "node-a".into(),
        addresses: vec![
            "192.168.100.2".parse().unwrap(),
            "fd00:192:168:100::2".parse().unwrap(),
        ],
        ..NodeInfo::default()
    }
}

#[test]
fn partial_syncs_equal_a_full_sync_in_the_kernel() {
    require_netns();
    for backend in [Backend::Nft, Backend::Legacy] {
        let incremental = Netns::new("incr");
        let full = Netns::new("full");

        let mut state = ProxyState {
            node: node(),
            ..ProxyState::default()
        };
        for i in 0..5 {
            let eps = vec![
                endpoint(&format!("10.244.1.{}", 10 + i), "node-a"),
                endpoint(&format!("10.244.2.{}", 10 + i), "node-b"),
            ];
            put(
                &mut state,
                &format!("svc-{i}"),
                &format!("10.96.0.{}", 10 + i),
                Some(30000 + i),
                false,
                eps,
            );
        }
        // The changes a cluster goes through, one sync each.
        let mut steps: Vec<(ProxyState, ChangeSummary)> = Vec::new();
        let mut step = |state: &ProxyState, keys: Vec<NamespacedName>| {
            steps.push((
                state.clone(),
                ChangeSummary {
                    changed_services: keys.into_iter().collect(),
                    ..ChangeSummary::default()
                },
            ));
        };
        step(&state, vec![]);
        let k = put(
            &mut state,
            "svc-1",
            "10.96.0.11",
            Some(30001),
            false,
            vec![endpoint("10.244.1.11", "node-a")],
        );
        step(&state, vec![k]);
        let k = put(
            &mut state,
            "svc-2",
            "10.96.0.12",
            Some(30002),
            false,
            vec![],
        );
        step(&state, vec![k]);
        let k = put(
            &mut state,
            "svc-3",
            "10.96.0.13",
            Some(30003),
            true,
            vec![
                endpoint("10.244.1.13", "node-a"),
                endpoint("10.244.2.13", "node-b"),
            ],
        );
        step(&state, vec![k]);
        let k = NamespacedName::new("default", "svc-4");
        state.services.remove(&k);
        state.endpoints.remove(&k);
        step(&state, vec![k]);
        let k = put(
            &mut state,
            "svc-new",
            "10.96.0.99",
            None,
            false,
            vec![endpoint("10.244.1.99", "node-a")],
        );
        step(&state, vec![k]);
        let k = put(
            &mut state,
            "svc-2",
            "10.96.0.12",
            Some(30002),
            false,
            vec![endpoint("10.244.1.12", "node-a")],
        );
        step(&state, vec![k]);

        let fulls: Vec<bool> = incremental.run(move || {
            let mut p = IptablesProxier::new(
                SystemIptables::new(backend),
                support::scale::iptables_settings("10.244.0.0/16"),
                Box::new(FixedAddresses(vec![])),
                Box::new(FakeSysctl::default()),
            );
            steps
                .iter()
                .map(|(state, changes)| p.sync(state, changes).expect("sync").full)
                .collect()
        });
        assert_eq!(
            fulls,
            vec![true, false, false, false, false, false, false],
            "{backend:?}"
        );
        let final_state = state.clone();
        full.run(move || {
            let mut p = IptablesProxier::new(
                SystemIptables::new(backend),
                support::scale::iptables_settings("10.244.0.0/16"),
                Box::new(FixedAddresses(vec![])),
                Box::new(FakeSysctl::default()),
            );
            p.sync(&final_state, &ChangeSummary::default())
                .expect("full sync");
        });
        for family in ["iptables", "ip6tables"] {
            let a = normalized_save(&incremental, backend, family);
            let b = normalized_save(&full, backend, family);
            assert!(
                a.contains("KUBE-SVC-") && a.contains("default/svc-new"),
                "{backend:?} {family}: {a}"
            );
            let v6_rule = a.contains("fd00:10:96::99");
            assert_eq!(
                v6_rule,
                family == "ip6tables",
                "{family} holds its own family's rules only"
            );
            assert_eq!(
                a, b,
                "{backend:?} {family}: incremental and full syncs differ"
            );
        }
    }
}
