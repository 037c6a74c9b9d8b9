//! Operations against the real daemon in network namespaces: the health, metrics and
//! per-service health-check servers over real HTTP.

mod support;

use serde_json::{Value, json};
use support::cluster::{Cluster, NODE_IP, addr, seed, service, slice};
use support::netns::{can_use_netns, http_get};
use support::{WAIT, eventually};

fn json_body(reply: &(u16, String)) -> Value {
    serde_json::from_str(&reply.1).unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_metrics_and_service_health_servers() {
    if !can_use_netns() {
        eprintln!("skipped: needs root for network namespaces");
        return;
    }
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    let tcp = json!([{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30082}]);
    cluster
        .api
        .apply(service(
            "lb",
            "10.96.0.20",
            tcp,
            json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local", "healthCheckNodePort": 32100}),
        ))
        .unwrap();
    let slice_ports = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    cluster
        .api
        .apply(slice(
            "lb",
            slice_ports.clone(),
            &["pod-a1", "pod-a2", "pod-b1"],
        ))
        .unwrap();
    let daemon = cluster.daemon(&cluster.config(""));
    daemon.wait_for("\"Synced proxy rules\"").await;
    let node = &cluster.node;

    // Health: ready and alive, with upstream's JSON.
    let healthz = http_get(node, addr("127.0.0.1:10256"), "/healthz").unwrap();
    assert_eq!(healthz.0, 200, "{healthz:?}");
    let body = json_body(&healthz);
    assert_eq!(body["healthy"], true);
    assert!(
        body["lastUpdated"]
            .as_str()
            .is_some_and(|t| t.contains('T')),
        "{body}"
    );
    assert!(body["currentTime"].as_str().is_some());
    assert_eq!(
        http_get(node, addr(&format!("{NODE_IP}:10256")), "/livez")
            .unwrap()
            .0,
        200
    );

    // Metrics on loopback only, upstream's names, counters that move with syncs.
    let metrics = http_get(node, addr("127.0.0.1:10249"), "/metrics").unwrap();
    assert_eq!(metrics.0, 200);
    for name in [
        "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
        "kubeproxy_sync_proxy_rules_endpoint_changes_total",
        "kubeproxy_sync_proxy_rules_service_changes_total",
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total 0",
        "kubeproxy_network_programming_duration_seconds",
    ] {
        assert!(metrics.1.contains(name), "{name} missing:\n{}", metrics.1);
    }
    let count = |text: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with("kubeproxy_sync_proxy_rules_duration_seconds_count"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let syncs = count(&metrics.1);
    assert!(syncs >= 1.0, "{}", metrics.1);
    for line in metrics
        .1
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let value = line.rsplit(' ').next().unwrap_or("");
        assert!(
            value.parse::<f64>().is_ok(),
            "not Prometheus text: {line:?}"
        );
    }
    assert!(
        http_get(node, addr(&format!("{NODE_IP}:10249")), "/metrics").is_err(),
        "metrics listen on loopback only"
    );
    assert_eq!(
        http_get(node, addr("127.0.0.1:10249"), "/proxyMode").unwrap(),
        (200, "iptables".to_string())
    );
    assert_eq!(
        http_get(node, addr("127.0.0.1:10249"), "/healthz")
            .unwrap()
            .0,
        200
    );
    // The periodic sync (syncPeriod 2s) moves the counters.
    assert!(
        eventually(WAIT, || count(
            &http_get(node, addr("127.0.0.1:10249"), "/metrics")
                .unwrap()
                .1
        ) > syncs)
        .await
    );

    // The service's health check: two of its endpoints are on this node.
    let check = || http_get(&cluster.client, addr(&format!("{NODE_IP}:32100")), "/");
    let reply = check().unwrap();
    assert_eq!(reply.0, 200, "{reply:?}");
    let body = json_body(&reply);
    assert_eq!(
        body["service"],
        json!({"namespace": "default", "name": "lb"})
    );
    assert_eq!(body["localEndpoints"], 2);
    // Only a remote endpoint left: 503, none here.
    cluster
        .api
        .apply(slice("lb", slice_ports, &["pod-b1"]))
        .unwrap();
    assert!(eventually(WAIT, || check().is_ok_and(|r| r.0 == 503)).await);
    assert_eq!(json_body(&check().unwrap())["localEndpoints"], 0);
    // The service goes: so does its server.
    cluster
        .api
        .delete(test_apiserver::Resource::Services, "default", "lb")
        .unwrap();
    assert!(
        eventually(WAIT, || check().is_err()).await,
        "health check port closed"
    );
    daemon.stop().await;
}
