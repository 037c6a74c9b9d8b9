//! Drift in our own rules, through the real daemon (nft back end) in namespaces: another program
//! flushes a service chain, puts a DROP first in filter KUBE-SERVICES, and deletes our jump from
//! nat PREROUTING. Each is repaired from the kernel's change events, long before the syncPeriod
//! (60 s here) and without a full sync, and traffic flows again.

mod support;

use std::time::{Duration, Instant};

use support::cluster::{Cluster, Daemon, NODE_IP, addr, seed};
use support::netns::{require_netns, tcp_request};
use support::{WAIT, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_in_our_rules_is_repaired_as_it_happens() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    let config = cluster.dir.path().join("config-60s.conf");
    std::fs::write(
        &config,
        format!(
            "mode: iptables\nclusterCIDR: 10.244.0.0/16\nclientConnection: {{kubeconfig: {}}}\n\
             iptables: {{syncPeriod: 60s, minSyncPeriod: 0s}}\n",
            cluster.dir.path().join("kubeconfig").display()
        ),
    )
    .unwrap();
    let daemon = Daemon::spawn(&cluster.node, &config, &[]);
    daemon.wait_for("\"Synced proxy rules\"").await;
    let node = &cluster.node;
    let cluster_ip = || tcp_request(node, addr("10.96.0.10:80")).is_ok();
    let node_port = || tcp_request(&cluster.client, addr(&format!("{NODE_IP}:30080"))).is_ok();
    assert!(cluster_ip() && node_port());
    let nat_services = cluster.ipt(&["-t", "nat", "-S", "KUBE-SERVICES"]);
    let svc_chain = nat_services
        .lines()
        .find(|l| l.contains("default/web:http cluster IP"))
        .and_then(|l| l.split_whitespace().last())
        .unwrap()
        .to_string();
    let rules_of = |table: &str, chain: &str| cluster.ipt(&["-t", table, "-S", chain]);
    let healthy_svc = rules_of("nat", &svc_chain);

    let mut repairs = Vec::new();
    // A flushed service chain.
    let started = Instant::now();
    cluster.ipt(&["-t", "nat", "-F", &svc_chain]);
    assert!(eventually(WAIT, || rules_of("nat", &svc_chain) == healthy_svc).await);
    repairs.push(started.elapsed());
    assert!(eventually(WAIT, cluster_ip).await);

    // A DROP put first in filter KUBE-SERVICES.
    let started = Instant::now();
    cluster.ipt(&["-I", "KUBE-SERVICES", "1", "-j", "DROP"]);
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
    cluster.ipt(&[
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

    eprintln!("repaired after {repairs:?}");
    assert!(
        repairs.iter().all(|r| *r < Duration::from_secs(60)),
        "before the syncPeriod: {repairs:?}"
    );
    assert!(daemon.count("Repaired rules another program changed") >= 3);
    assert_eq!(
        daemon.count("\"Synced proxy rules\" mode=\"iptables\" full=true"),
        1,
        "only the first sync was full:\n{}",
        daemon.lines.lock().unwrap().join("\n")
    );
    daemon.stop().await;
}
