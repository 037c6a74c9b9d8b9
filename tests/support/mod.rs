//! Helpers shared by the integration tests: API objects as JSON, a test API server with a
//! kubeconfig on disk, and waiting for a condition.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use test_apiserver::ApiServer;

/// A ClusterIP Service `ns/name` on `ip` with TCP ports named `p<port>`.
pub fn service(ns: &str, name: &str, ip: &str, ports: &[u16]) -> Value {
    let ports: Vec<Value> = ports
        .iter()
        .map(|p| json!({"name": format!("p{p}"), "port": p, "protocol": "TCP", "targetPort": 8080}))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip], "ports": ports}
    })
}

/// An IPv4 EndpointSlice `ns/<svc>-<suffix>` for service `svc`, one port `p<port>` -> 8080, ready endpoints.
pub fn slice(ns: &str, svc: &str, suffix: &str, port: u16, ips: &[&str]) -> Value {
    let endpoints: Vec<Value> = ips
        .iter()
        .map(|ip| json!({"addresses": [ip], "conditions": {"ready": true, "serving": true, "terminating": false}, "nodeName": "node-a"}))
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": format!("{svc}-{suffix}"), "namespace": ns, "labels": {"kubernetes.io/service-name": svc}},
        "ports": [{"name": format!("p{port}"), "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints
    })
}

/// A Node with an InternalIP and a zone.
pub fn node(name: &str, ip: &str, zone: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone, "kubernetes.io/hostname": name}},
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}]}
    })
}

/// Seeds node-a and service default/web (10.96.0.10:80) with two ready endpoints.
pub fn seed_web(server: &ApiServer) {
    server
        .apply(node("node-a", "192.168.1.10", "zone-a"))
        .unwrap();
    server
        .apply(service("default", "web", "10.96.0.10", &[80]))
        .unwrap();
    server
        .apply(slice(
            "default",
            "web",
            "1",
            80,
            &["10.244.1.5", "10.244.1.6"],
        ))
        .unwrap();
}

/// A test API server with its kubeconfig written to a temporary directory.
pub struct Cluster {
    pub server: ApiServer,
    pub dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
}

impl Cluster {
    pub async fn start() -> Cluster {
        let server = ApiServer::start().await.expect("start test API server");
        let dir = tempfile::tempdir().expect("temp dir");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, server.kubeconfig_yaml()).expect("write kubeconfig");
        Cluster {
            server,
            dir,
            kubeconfig,
        }
    }

    /// Writes a config file into the temp dir and returns its path.
    pub fn write_file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).expect("write file");
        path
    }
}

/// Polls `check` every 50 ms until it holds or `limit` passes; returns whether it held. The limit
/// only bounds a broken test's run time; nothing asserts how fast things happen.
pub async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The value of the metric line starting with `prefix` (name and labels); -1 without one.
pub fn metric(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1.0)
}

/// The generous bound for waits in these tests.
pub const WAIT: Duration = Duration::from_secs(60);

pub mod chart;
pub mod cluster;
pub mod explain;
pub mod flood;
pub mod netns;
pub mod nft_files;
pub mod rules;
pub mod scale;
pub mod vm;
