//! A sync that keeps failing, through the real daemon in namespaces: the tool's failure is named
//! (the command, the signal that killed it, its stderr), repeats are summarised instead of logged
//! each time, every failure is counted in the metrics, /livez and /healthz turn 503 once the
//! failure outlasts 2 x syncPeriod, and the first success says so and turns them back to 200.

mod support;

use std::os::unix::fs::PermissionsExt;

use support::cluster::{Cluster, Daemon, addr, seed};
use support::netns::{http_get, require_netns};
use support::{WAIT, eventually};

/// The restore failures the metrics report.
fn restore_failures(metrics: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("kubeproxy_sync_proxy_rules_iptables_restore_failures_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_that_keeps_failing_is_visible_without_flooding() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    // iptables-nft-restore crashes (SIGSEGV, as iptables-nft-save does on huge tables) while
    // the marker file exists; otherwise it is the real tool.
    let real = String::from_utf8(
        std::process::Command::new("sh")
            .args(["-c", "command -v iptables-nft-restore"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let bin = cluster.dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let marker = cluster.dir.path().join("crash");
    std::fs::write(&marker, "").unwrap();
    let wrapper = bin.join("iptables-nft-restore");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nif [ -e {} ]; then echo 'simulated trouble' >&2; kill -SEGV $$; fi\nexec {} \"$@\"\n",
            marker.display(),
            real.trim()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
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
    assert!(eventually(WAIT, || restore_failures(&metrics()) >= 8).await);
    let failures = restore_failures(&metrics());
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
