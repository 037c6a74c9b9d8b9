//! What the benchmarks and the proxier-level kernel tests share: a model state of N services x
//! 10 endpoints (service i is `bench/svc-<i>` on 172.30.x.y:80 with NodePort 30000 + i % 2700 and
//! endpoints 10.x.y.1-10:8080 on another node), proxiers built as the daemon builds them, and
//! the medians the benchmarks report.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use kube_proxy_rs::config::KubeProxyConfiguration;
use kube_proxy_rs::model::{
    Endpoint, NamespacedName, NodeInfo, Protocol, ProxyState, ServicePort, ServicePortName,
};
use kube_proxy_rs::proxier::iptables::IptablesSettings;
use kube_proxy_rs::proxier::ipvs::{IpvsProxier, IpvsSettings};
use kube_proxy_rs::sys::iptables::{Backend, SystemIptables};
use kube_proxy_rs::sys::net::{FakeSysctl, FixedAddresses};

/// The node address the state and the proxiers use.
pub const NODE_IP: &str = "192.168.0.2";

fn config(cluster_cidr: &str) -> KubeProxyConfiguration {
    let mut config = KubeProxyConfiguration {
        cluster_cidr: cluster_cidr.into(),
        ..KubeProxyConfiguration::default()
    };
    config.apply_defaults();
    config
}

/// iptables mode's settings for a cluster CIDR, with no canary check in the middle of a test
/// (the first sync is full anyway).
pub fn iptables_settings(cluster_cidr: &str) -> IptablesSettings {
    let mut settings = IptablesSettings::from_config(&config(cluster_cidr));
    settings.canary_interval = Duration::from_secs(3600);
    settings
}

/// An IPVS proxier in this thread's namespace (cluster CIDR 10.0.0.0/8, node address NODE_IP,
/// nft rules, sysctls kept in memory).
pub fn ipvs_proxier() -> IpvsProxier {
    IpvsProxier::new(
        IpvsSettings::from_config(&config("10.0.0.0/8")),
        Box::new(SystemIptables::new(Backend::Nft)),
        Box::new(FakeSysctl::default()),
        Box::new(FixedAddresses(vec![NODE_IP.parse().unwrap()])),
    )
    .expect("IPVS proxier")
}

/// The median of some timings.
pub fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

/// A timing as the benchmarks print it.
pub fn secs(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

/// The state.
pub fn state(count: usize) -> ProxyState {
    let mut state = ProxyState {
        node: NodeInfo {
            name: "node-a".into(),
            addresses: vec![NODE_IP.parse().unwrap()],
            ..NodeInfo::default()
        },
        ..ProxyState::default()
    };
    for i in 0..count {
        let key = NamespacedName::new("bench", format!("svc-{i}"));
        let name = ServicePortName::new("bench", &format!("svc-{i}"), "http", Protocol::Tcp);
        let cluster_ip = format!("172.30.{}.{}", i / 250, i % 250 + 1);
        let port = ServicePort {
            node_port: Some(30000 + (i % 2700) as u16),
            ..ServicePort::new(name.clone(), cluster_ip.parse().unwrap(), 80)
        };
        let endpoints: Vec<Endpoint> = (0..10)
            .map(|e| {
                let ip = format!("10.{}.{}.{}", i / 250, i % 250, e + 1);
                Endpoint::ready(ip.parse().unwrap(), 8080, Some("node-b"))
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

/// Service `bench/svc-<i>` and its EndpointSlice as API objects: what [`state`] holds for it
/// (ClusterIP 172.30.x.y:80, NodePort 30000 + i % 2700, ten endpoints on another node).
pub fn api_objects(i: usize) -> (serde_json::Value, serde_json::Value) {
    let ip = format!("172.30.{}.{}", i / 250, i % 250 + 1);
    let service = serde_json::json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("svc-{i}"), "namespace": "bench"},
        "spec": {"type": "NodePort", "clusterIP": ip, "clusterIPs": [ip],
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30000 + i % 2700}]}});
    let endpoints: Vec<serde_json::Value> = (0..10)
        .map(|e| serde_json::json!({"addresses": [format!("10.{}.{}.{}", i / 250, i % 250, e + 1)], "nodeName": "node-b"}))
        .collect();
    let slice = serde_json::json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": format!("svc-{i}-1"), "namespace": "bench", "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}], "endpoints": endpoints});
    (service, slice)
}

/// Node `node-a` (NODE_IP) and services `range` with their slices, in the test API server.
pub fn populate(api: &test_apiserver::ApiServer, range: std::ops::Range<usize>) {
    api.apply(
        serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
        "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}]}}),
    )
    .expect("node");
    for i in range {
        let (service, slice) = api_objects(i);
        api.apply(service).expect("service");
        api.apply(slice).expect("slice");
    }
}
