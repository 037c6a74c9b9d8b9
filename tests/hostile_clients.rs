//! Clients that hold the daemon's ports open must neither starve it nor silence its probes.
//! Floods of idle connections and clients that send their request a byte at a time, on the
//! health port (open to the network), the metrics port and a Service's healthCheckNodePort,
//! leave every probe answered at once and correctly, and syncs working; with the open-files
//! limit at 256, a flood leaves the file descriptors that syncs need.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};
use support::cluster::{Cluster, Daemon, NODE_IP, addr, seed, service, slice};
use support::flood::{Flood, raise_open_files};
use support::netns::{Netns, http_get, require_netns};
use support::{WAIT, eventually, metric};

const HEALTH_CHECK_PORT: u16 = 31000;

fn node_address(port: u16) -> SocketAddr {
    format!("{NODE_IP}:{port}").parse().unwrap()
}

/// The LoadBalancer Service whose health check the tests probe, with endpoints on `pods`.
fn local_load_balancer(cluster: &Cluster, pods: &[&str]) {
    support::cluster::local_load_balancer(&cluster.api, 30090, HEALTH_CHECK_PORT, pods);
}

/// A Service `name` on `ip` with an endpoint, whose rules appear in KUBE-SERVICES once synced.
async fn programmed_during(cluster: &Cluster, daemon: &Daemon, name: &str, ip: &str) {
    let ports = json!([{"name": "http", "port": 80, "protocol": "TCP"}]);
    cluster
        .api
        .apply(service(name, ip, ports, json!({})))
        .unwrap();
    let slice_ports = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    cluster
        .api
        .apply(slice(name, slice_ports, &["pod-a1"]))
        .unwrap();
    let comment = format!("default/{name}:http");
    let programmed = eventually(WAIT, || {
        cluster
            .ipt(&["-t", "nat", "-S", "KUBE-SERVICES"])
            .contains(&comment)
    })
    .await;
    assert!(programmed, "{}", daemon.lines.lock().unwrap().join("\n"));
}

/// A probe from outside: 200 and a body that `check` accepts, within http_get's two seconds.
fn probe(client: &Netns, port: u16, path: &str, check: impl Fn(&str) -> bool) -> String {
    match http_get(client, node_address(port), path) {
        Ok((200, body)) if check(&body) => String::new(),
        other => format!("port {port} {path}: {other:?}\n"),
    }
}

fn local_endpoints(body: &str) -> Option<u64> {
    serde_json::from_str::<Value>(body).ok()?["localEndpoints"].as_u64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_are_answered_through_floods_on_every_port() {
    require_netns();
    // 2,000 held connections per port and their replacements, on the client side of this process.
    raise_open_files(16_384);
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    local_load_balancer(&cluster, &["pod-a1", "pod-a2", "pod-b1"]);
    let config = cluster.config("metricsBindAddress: 0.0.0.0:10249\n");
    // 4,096 files: the servers hold 3,072 connections together, fewer than the floods open.
    let daemon = Daemon::spawn_wrapped(
        &cluster.node,
        &["prlimit", "--nofile=4096:4096"],
        &config,
        &[],
        &[],
    );
    daemon.wait_for("\"Synced proxy rules\"").await;
    daemon.wait_for("Opened health check server").await;

    let ports = [10256, 10249, HEALTH_CHECK_PORT];
    let floods: Vec<Flood> = ports
        .iter()
        .map(|port| Flood::start(&cluster.client, node_address(*port), 2000))
        .collect();
    let flooding = eventually(WAIT, || floods.iter().all(|f| f.opened() >= 2000)).await;
    assert!(
        flooding,
        "the floods opened {:?}",
        floods.iter().map(Flood::opened).collect::<Vec<_>>()
    );

    // Probes from outside, answered through the flood, over several header timeouts.
    let mut failures = String::new();
    for _ in 0..8 {
        failures += &probe(&cluster.client, 10256, "/healthz", |b| {
            b.contains("\"healthy\":true")
        });
        failures += &probe(&cluster.client, 10249, "/metrics", |b| {
            b.contains("kubeproxy_rs_http_connections_open")
        });
        failures += &probe(&cluster.client, HEALTH_CHECK_PORT, "/", |b| {
            local_endpoints(b) == Some(2)
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        failures.is_empty(),
        "probes failed during the flood:\n{failures}"
    );

    // Changes are programmed through the flood, and the health check follows its Service.
    programmed_during(&cluster, &daemon, "during-flood", "10.96.0.77").await;
    local_load_balancer(&cluster, &["pod-a1", "pod-b1"]);
    let followed = eventually(WAIT, || {
        probe(&cluster.client, HEALTH_CHECK_PORT, "/", |b| {
            local_endpoints(b) == Some(1)
        })
        .is_empty()
    })
    .await;
    assert!(followed, "the health check did not follow its endpoints");

    let (_, metrics) = http_get(&cluster.client, node_address(10249), "/metrics").unwrap();
    let counts: Vec<_> = floods.into_iter().map(Flood::stop).collect();
    assert_eq!(
        metric(&metrics, "kubeproxy_rs_http_connections_limit "),
        3072.0
    );
    for (port, server) in [
        (10256, "healthz"),
        (10249, "metrics"),
        (HEALTH_CHECK_PORT, "healthcheck"),
    ] {
        let labels = format!("{{port=\"{port}\",server=\"{server}\"}}");
        let shed = metric(
            &metrics,
            &format!("kubeproxy_rs_http_connections_shed_total{labels}"),
        );
        let timed_out = metric(
            &metrics,
            &format!("kubeproxy_rs_http_connections_timed_out_total{labels}"),
        );
        let open = metric(
            &metrics,
            &format!("kubeproxy_rs_http_connections_open{labels}"),
        );
        assert!(
            shed > 0.0 && timed_out >= 0.0,
            "{server}: shed {shed}, timed out {timed_out}"
        );
        assert!((1.0..=3072.0).contains(&open), "{server}: {open} open");
    }
    for (port, counts) in ports.iter().zip(&counts) {
        assert!(
            counts.slow_closed.load(Ordering::SeqCst) > 0,
            "port {port}: the slow client was never closed"
        );
    }
    assert_eq!(daemon.count("Failed to sync"), 0, "syncs under the flood");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_up_to_the_open_files_limit_leaves_syncs_working() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    let config = cluster.config("");
    let daemon = Daemon::spawn_wrapped(
        &cluster.node,
        &["prlimit", "--nofile=256:256"],
        &config,
        &[],
        &[],
    );
    daemon.wait_for("\"Synced proxy rules\"").await;
    daemon.wait_for("connections=128").await;

    // More connections than the daemon has files: it holds 128 and sheds the oldest.
    let flood = Flood::start(&cluster.client, node_address(10256), 400);
    let flooding = eventually(WAIT, || flood.opened() >= 400).await;
    assert!(flooding, "the flood opened {}", flood.opened());

    programmed_during(&cluster, &daemon, "during-flood", "10.96.0.77").await;
    // Long enough for several config-file polls and syncs under the flood; the health port
    // answers throughout.
    let mut failures = String::new();
    for _ in 0..5 {
        failures += &probe(&cluster.client, 10256, "/healthz", |b| {
            b.contains("\"healthy\":true")
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        failures.is_empty(),
        "probes failed during the flood:\n{failures}"
    );
    assert_eq!(daemon.count("Config file changed"), 0);
    assert_eq!(daemon.count("Failed to sync"), 0, "syncs under the flood");
    let (_, metrics) = http_get(&cluster.node, addr("127.0.0.1:10249"), "/metrics").unwrap();
    let shed = metric(
        &metrics,
        "kubeproxy_rs_http_connections_shed_total{port=\"10256\",server=\"healthz\"}",
    );
    assert!(shed >= 272.0, "shed {shed}");
    let open_files = metric(&metrics, "process_open_fds ");
    assert!(open_files < 256.0, "{open_files} files open");
    flood.stop();
    daemon.stop().await;
}
