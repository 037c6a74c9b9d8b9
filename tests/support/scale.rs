//! A model state of N services x 10 endpoints, as the benchmarks and the VM's partial-sync
//! tests use it: service i is `bench/svc-<i>` on 172.30.x.y:80 with NodePort 30000 + i % 2700 and
//! endpoints 10.x.y.1-10:8080 on another node.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};

use kube_proxy_rs::model::{
    Endpoint, NamespacedName, NodeInfo, Protocol, ProxyState, ServicePort, ServicePortName,
};

/// The state.
pub fn state(count: usize) -> ProxyState {
    let mut state = ProxyState {
        node: NodeInfo {
            name: "node-a".into(),
            addresses: vec!["192.168.0.2".parse().unwrap()],
            ..NodeInfo::default()
        },
        ..ProxyState::default()
    };
    for i in 0..count {
        let key = NamespacedName::new("bench", format!("svc-{i}"));
        let name = ServicePortName::new("bench", &format!("svc-{i}"), "http", Protocol::Tcp);
        let port = ServicePort {
            name: name.clone(),
            cluster_ips: vec![
                format!("172.30.{}.{}", i / 250, i % 250 + 1)
                    .parse()
                    .unwrap(),
            ],
            port: 80,
            node_port: Some(30000 + (i % 2700) as u16),
            external_ips: vec![],
            load_balancer_ips: vec![],
            load_balancer_source_ranges: vec![],
            session_affinity_seconds: None,
            external_policy_local: false,
            internal_policy_local: false,
            health_check_node_port: None,
        };
        let endpoints: Vec<Endpoint> = (0..10)
            .map(|e| Endpoint {
                ip: format!("10.{}.{}.{}", i / 250, i % 250, e + 1)
                    .parse()
                    .unwrap(),
                port: 8080,
                ready: true,
                serving: true,
                terminating: false,
                node_name: Some("node-b".into()),
                zone: None,
                zone_hints: BTreeSet::new(),
            })
            .collect();
        state
            .services
            .insert(key.clone(), BTreeMap::from([(name.clone(), port)]));
        state
            .endpoints
            .insert(key, BTreeMap::from([(name, endpoints)]));
    }
    state
}
