//! A sync that keeps failing, through the real daemon in namespaces: the tool's failure is named
//! (the command, the signal that killed it, its stderr), repeats are summarised instead of logged
//! each time, every failure is counted in the metrics, /livez and /healthz turn 503 once the
//! failure outlasts 2 x syncPeriod, and the first success says so and turns them back to 200.

mod support;

use serde_json::json;
use support::cluster::{Cluster, Daemon, addr, seed, service, slice, wrapped_tool};
use support::netns::{http_get, require_netns};
use support::{WAIT, eventually};

/// The restore failures the metrics report.
fn sync_failures(metrics: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                "kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family=\"IPv4\"} ",
            )
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// A PATH whose iptables-nft-restore runs `script` (with `REAL` set to the real tool) first.
fn wrapped_restore(cluster: &Cluster, script: &str) -> String {
    wrapped_tool(cluster, "iptables-nft-restore", script)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_that_keeps_failing_is_visible_without_flooding() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    // iptables-nft-restore crashes (SIGSEGV, as iptables-nft-save does on huge tables) while
    // the marker file exists; otherwise it is the real tool.
    let marker = cluster.dir.path().join("crash");
    std::fs::write(&marker, "").unwrap();
    let path = wrapped_restore(
        &cluster,
        &format!(
            "if [ -e {} ]; then echo 'simulated trouble' >&2; kill -SEGV $$; fi\nexec \"$REAL\" \"$@\"\n",
            marker.display()
        ),
    );
    let config = cluster.dir.path().join("config-1s.conf");
    std::fs::write(
        &config,
        format!(
            "mode: iptables\nclusterCIDR: 10.244.0.0/16\nclientConnection: {{kubeconfig: {}}}\n\
             iptables: {{syncPeriod: 1s, minSyncPeriod: 0s}}\n",
            cluster.dir.path().join("kubeconfig").display()
        ),
    )
    .unwrap();
    let daemon = Daemon::spawn_with_env(&cluster.node, &config, &[], &[("PATH", &path)]);
    daemon
        .wait_for("was killed by signal 11 (SIGSEGV): stderr: simulated trouble")
        .await;
    assert!(daemon.count("iptables-nft-restore -w 5 --noflush --counters was killed") > 0);

    // Past 2 x syncPeriod with nothing applied: unhealthy, even for liveness.
    let node = &cluster.node;
    let status = |path: &str| {
        http_get(node, addr("127.0.0.1:10256"), path)
            .map(|r| r.0)
            .ok()
    };
    assert!(
        eventually(WAIT, || status("/livez") == Some(503)).await,
        "/livez stayed healthy while every sync failed"
    );
    assert_eq!(status("/healthz"), Some(503));

    // Many failures, counted; far fewer log lines.
    let metrics = || {
        http_get(node, addr("127.0.0.1:10249"), "/metrics")
            .map(|r| r.1)
            .unwrap_or_default()
    };
    assert!(eventually(WAIT, || sync_failures(&metrics()) >= 8).await);
    let failures = sync_failures(&metrics());
    let logged = daemon.count("Failed to sync proxy rules");
    assert!(
        logged <= 1 + (failures as f64).log2().ceil() as usize,
        "{logged} log lines for {failures} failures"
    );
    assert_eq!(
        daemon.count("\"Failed to sync proxy rules; retrying\""),
        1,
        "the reason in full once"
    );
    assert!(daemon.count("repeats=") > 0, "repeats summarised");

    // The tool works again: one line says so, and the node is healthy.
    std::fs::remove_file(&marker).unwrap();
    daemon
        .wait_for("Synced proxy rules again after failed attempts")
        .await;
    assert!(eventually(WAIT, || status("/healthz") == Some(200)).await);
    assert_eq!(status("/livez"), Some(200));
    daemon.stop().await;
}

/// A kernel that refuses one Service's rules (simulated: the restore tool fails on the line that
/// carries them, as iptables-restore reports it) fails no sync: that Service is skipped with a
/// warning and a metric, every other Service is programmed, and the node keeps following.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_service_the_kernel_refuses_does_not_fail_the_node() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    let ports = json!([{"name": "http", "port": 80, "protocol": "TCP"}]);
    let slice_ports = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    cluster
        .api
        .apply(service("refused", "10.96.0.66", ports.clone(), json!({})))
        .unwrap();
    cluster
        .api
        .apply(slice("refused", slice_ports.clone(), &["pod-a1"]))
        .unwrap();
    let path = wrapped_restore(
        &cluster,
        "input=$(mktemp)\ncat > \"$input\"\n\
         line=$(grep -n 'default/refused:' \"$input\" | head -1 | cut -d: -f1)\n\
         if [ -n \"$line\" ]; then echo \"iptables-nft-restore: line $line failed\" >&2; rm -f \"$input\"; exit 1; fi\n\
         \"$REAL\" \"$@\" < \"$input\"; status=$?; rm -f \"$input\"; exit $status\n",
    );
    let config = cluster.config("");
    let daemon = Daemon::spawn_with_env(&cluster.node, &config, &[], &[("PATH", &path)]);
    daemon.wait_for("\"Synced proxy rules\"").await;
    daemon
        .wait_for("\"Skipping a Service whose rules the kernel refused; the other services are programmed\" service=\"default/refused\"")
        .await;
    let services = cluster.ipt(&["-t", "nat", "-S", "KUBE-SERVICES"]);
    assert!(services.contains("default/web:http"), "{services}");
    assert!(!services.contains("default/refused:"), "{services}");
    let node = &cluster.node;
    let metrics = http_get(node, addr("127.0.0.1:10249"), "/metrics")
        .unwrap()
        .1;
    assert!(
        metrics.contains("kubeproxy_rs_sync_proxy_rules_skipped_services 1"),
        "{metrics}"
    );

    // The node keeps following the cluster.
    cluster
        .api
        .apply(service("later", "10.96.0.67", ports, json!({})))
        .unwrap();
    cluster
        .api
        .apply(slice("later", slice_ports, &["pod-a2"]))
        .unwrap();
    assert!(
        eventually(WAIT, || cluster
            .ipt(&["-t", "nat", "-S", "KUBE-SERVICES"])
            .contains("default/later:http"))
        .await
    );
    assert_eq!(daemon.count("Failed to sync"), 0);
    // Deleted, it leaves quarantine.
    cluster
        .api
        .delete(test_apiserver::Resource::Services, "default", "refused")
        .unwrap();
    assert!(
        eventually(WAIT, || http_get(node, addr("127.0.0.1:10249"), "/metrics")
            .is_ok_and(|m| m
                .1
                .contains("kubeproxy_rs_sync_proxy_rules_skipped_services 0")))
        .await
    );
    daemon.stop().await;
}
