//! Services' externalIPs and the AllowServiceExternalIPs feature gate (root; in namespaces):
//! the real daemon in iptables and nftables mode serves a Service's external IP from the client
//! by default, and with the gate off serves its ClusterIP alone (upstream 1.36, KEP-5707).

mod support;

use serde_json::json;
use support::cluster::{Cluster, addr, service, slice};
use support::netns::{require_netns, tcp_request};

/// `web` on 10.96.0.10:80 with external IP 192.168.201.1 (routed by the client to the node),
/// on pods a1 and b2.
fn seed(cluster: &Cluster) {
    let ports = json!([{"name": "http", "port": 80, "protocol": "TCP"}]);
    let spec = json!({"externalIPs": ["192.168.201.1"]});
    cluster
        .api
        .apply(service("web", "10.96.0.10", ports, spec))
        .unwrap();
    let slice_ports = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    cluster
        .api
        .apply(slice("web", slice_ports, &["pod-a1", "pod-b2"]))
        .unwrap();
}

async fn external_ips_follow_the_gate(mode: &str) {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster);
    let external = || tcp_request(&cluster.client, addr("192.168.201.1:80"));
    let cluster_ip = || tcp_request(&cluster.node, addr("10.96.0.10:80"));
    let sync = "nftables:\n  syncPeriod: 2s\n  minSyncPeriod: 0s\n";

    let daemon = cluster.daemon(&cluster.config_with_mode(mode, sync));
    daemon.wait_for("\"Synced proxy rules\"").await;
    assert!(external().is_ok(), "{mode}: external IP served by default");
    daemon.stop().await;

    let off = format!("{sync}featureGates:\n  AllowServiceExternalIPs: false\n");
    let daemon = cluster.daemon(&cluster.config_with_mode(mode, &off));
    daemon.wait_for("\"Synced proxy rules\"").await;
    daemon
        .wait_for("Services' externalIPs are not programmed")
        .await;
    assert!(cluster_ip().is_ok(), "{mode}: the ClusterIP still served");
    let answer = external();
    assert!(
        answer.is_err(),
        "{mode}: external IP served with the gate off: {answer:?}"
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_ips_follow_the_gate_in_iptables_mode() {
    external_ips_follow_the_gate("iptables").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_ips_follow_the_gate_in_nftables_mode() {
    external_ips_follow_the_gate("nftables").await;
}
