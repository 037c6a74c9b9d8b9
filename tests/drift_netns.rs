//! Drift in our own rules, through the real daemon in namespaces: another program flushes a
//! service chain, puts a DROP first in filter KUBE-SERVICES, and deletes our jump from nat
//! PREROUTING. On nft each is repaired from the kernel's change events, long before the
//! syncPeriod (60 s here); on legacy by the check each syncPeriod (2 s here). Never with a full
//! sync, and traffic flows again.

mod support;

use std::time::{Duration, Instant};

use support::cluster::{Cluster, Daemon, NODE_IP, addr, seed};
use support::netns::{require_netns, tcp_request};
use support::{WAIT, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_in_our_rules_is_repaired_as_it_happens() {
    drift_is_repaired("nft", 60).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_in_our_rules_is_repaired_within_the_sync_period_on_legacy() {
    drift_is_repaired("legacy", 2).await;
}

async fn drift_is_repaired(backend: &str, sync_period: u64) {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    let tool = format!("iptables-{backend}");
    if backend == "legacy" {
        // As the kubelet does: its hint chain tells kube-proxy which back end the node uses.
        cluster
            .node
            .exec(&[&tool, "-t", "mangle", "-N", "KUBE-IPTABLES-HINT"]);
    }
    let ipt = |args: &[&str]| {
        let mut full = vec![tool.as_str(), "-w", "5"];
        full.extend_from_slice(args);
        String::from_utf8_lossy(&cluster.node.exec(&full).stdout).into_owned()
    };
    let config = cluster.dir.path().join("config-drift.conf");
    std::fs::write(
        &config,
        format!(
            "mode: iptables\nclusterCIDR: 10.244.0.0/16\nclientConnection: {{kubeconfig: {}}}\n\
             iptables: {{syncPeriod: {sync_period}s, minSyncPeriod: 0s}}\n",
            cluster.dir.path().join("kubeconfig").display()
        ),
    )
    .unwrap();
    let daemon = Daemon::spawn(&cluster.node, &config, &[]);
    daemon.wait_for("\"Synced proxy rules\"").await;
    daemon
        .wait_for(&format!(
            "\"Using iptables back end\" backend=\"{backend}\""
        ))
        .await;
    let node = &cluster.node;
    let cluster_ip = || tcp_request(node, addr("10.96.0.10:80")).is_ok();
    let node_port = || tcp_request(&cluster.client, addr(&format!("{NODE_IP}:30080"))).is_ok();
    assert!(cluster_ip() && node_port());
    let nat_services = ipt(&["-t", "nat", "-S", "KUBE-SERVICES"]);
    let svc_chain = nat_services
        .lines()
        .find(|l| l.contains("default/web:http cluster IP"))
        .and_then(|l| l.split_whitespace().last())
        .unwrap()
        .to_string();
    let rules_of = |table: &str, chain: &str| ipt(&["-t", table, "-S", chain]);
    let healthy_svc = rules_of("nat", &svc_chain);

    let mut repairs = Vec::new();
    // A flushed service chain.
    let started = Instant::now();
    ipt(&["-t", "nat", "-F", &svc_chain]);
    assert!(eventually(WAIT, || rules_of("nat", &svc_chain) == healthy_svc).await);
    repairs.push(started.elapsed());
    assert!(eventually(WAIT, cluster_ip).await);

    // A DROP put first in filter KUBE-SERVICES.
    let started = Instant::now();
    ipt(&["-I", "KUBE-SERVICES", "1", "-j", "DROP"]);
    assert!(
        eventually(WAIT, || !rules_of("filter", "KUBE-SERVICES")
            .contains("-j DROP"))
        .await,
        "{}",
        rules_of("filter", "KUBE-SERVICES")
    );
    repairs.push(started.elapsed());
    assert!(eventually(WAIT, cluster_ip).await);

    // Our jump from nat PREROUTING deleted: NodePorts from outside stop until it is back.
    let started = Instant::now();
    ipt(&[
        "-t",
        "nat",
        "-D",
        "PREROUTING",
        "-m",
        "comment",
        "--comment",
        "kubernetes service portals",
        "-j",
        "KUBE-SERVICES",
    ]);
    assert!(
        eventually(WAIT, || rules_of("nat", "PREROUTING")
            .contains("-j KUBE-SERVICES"))
        .await
    );
    repairs.push(started.elapsed());
    assert!(eventually(WAIT, node_port).await);

    eprintln!("{backend}: repaired after {repairs:?}");
    if backend == "nft" {
        assert!(
            repairs
                .iter()
                .all(|r| *r < Duration::from_secs(sync_period)),
            "before the syncPeriod: {repairs:?}"
        );
    }
    // The repair is logged after its rules are in: the last one's line may follow the check
    // that saw them.
    assert!(
        eventually(WAIT, || daemon
            .count("Repaired rules another program changed")
            >= 3)
        .await,
        "{}",
        daemon.lines.lock().unwrap().join("\n")
    );
    assert_eq!(
        daemon.count("\"Synced proxy rules\" mode=\"iptables\" full=true"),
        1,
        "only the first sync was full:\n{}",
        daemon.lines.lock().unwrap().join("\n")
    );
    daemon.stop().await;
}

/// A restart keeps the endpoint chains of services whose own chains are right without reading
/// them, and the syncs the daemon runs right after it check them: one that another program
/// changed while the daemon was down is rewritten long before the syncPeriod (60 s here), and
/// its endpoint serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_chains_a_restart_kept_by_name_are_checked_by_the_syncs_after_it() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    let ipt = |args: &[&str]| {
        let mut full = vec!["iptables-nft", "-w", "5"];
        full.extend_from_slice(args);
        String::from_utf8_lossy(&cluster.node.exec(&full).stdout).into_owned()
    };
    let config = cluster.dir.path().join("config-restart.conf");
    std::fs::write(
        &config,
        format!(
            "mode: iptables\nclusterCIDR: 10.244.0.0/16\nclientConnection: {{kubeconfig: {}}}\n\
             iptables: {{syncPeriod: 60s, minSyncPeriod: 1s}}\n",
            cluster.dir.path().join("kubeconfig").display()
        ),
    )
    .unwrap();
    let first = Daemon::spawn(&cluster.node, &config, &[]);
    first.wait_for("\"Synced proxy rules\"").await;
    first.stop().await;

    // While no daemon runs, another program empties one endpoint chain of default/web.
    let svc_chain = ipt(&["-t", "nat", "-S", "KUBE-SERVICES"])
        .lines()
        .find(|l| l.contains("default/web:http cluster IP"))
        .and_then(|l| l.split_whitespace().last())
        .unwrap()
        .to_string();
    let sep = ipt(&["-t", "nat", "-S", &svc_chain])
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .find(|target| target.starts_with("KUBE-SEP-"))
        .unwrap()
        .to_string();
    let rules_of = |chain: &str| ipt(&["-t", "nat", "-S", chain]);
    let healthy = rules_of(&sep);
    ipt(&["-t", "nat", "-F", &sep]);
    assert_ne!(rules_of(&sep), healthy);

    let started = Instant::now();
    let restarted = Daemon::spawn(&cluster.node, &config, &[]);
    restarted.wait_for("\"Synced proxy rules\"").await;
    assert!(
        eventually(WAIT, || rules_of(&sep) == healthy).await,
        "{}",
        rules_of(&sep)
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "before the syncPeriod"
    );
    assert_eq!(
        restarted.count("Endpoint chains a full sync kept by name differ; rewriting them"),
        1,
        "{}",
        restarted.lines.lock().unwrap().join("\n")
    );
    assert!(restarted.count("kept_by_name=") >= 1);
    assert!(
        eventually(WAIT, || tcp_request(&cluster.node, addr("10.96.0.10:80"))
            .is_ok())
        .await
    );
    restarted.stop().await;
}
