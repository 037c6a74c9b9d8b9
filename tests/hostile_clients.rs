//! Clients that hold the daemon's ports open must not starve it. With its open-files limit at 256,
//! a flood of idle and half-sent connections to the health port (open to the network) leaves
//! syncs working, is not taken for a change of the config file, and once the flood stops the
//! health port answers again.

mod support;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::json;
use support::cluster::{Cluster, Daemon, NODE_IP, addr, seed, service, slice};
use support::netns::{http_get, require_netns};
use support::{WAIT, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_connections_does_not_starve_the_daemon() {
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

    let health: SocketAddr = format!("{NODE_IP}:10256").parse().unwrap();
    let flood: Vec<TcpStream> = cluster.client.run(move || {
        (0..400)
            .filter_map(|i| {
                let mut stream =
                    TcpStream::connect_timeout(&health, Duration::from_millis(300)).ok()?;
                if i % 4 == 0 {
                    let _ = stream.write_all(b"GET /healthz HTTP/1.1\r\nHost:");
                }
                Some(stream)
            })
            .collect()
    });
    // The daemon takes 32 at a time; the kernel queues some more and refuses the rest.
    assert!(flood.len() > 150, "{} connections made", flood.len());

    // Syncs still work: a new Service is programmed while the flood holds.
    let ports = json!([{"name": "http", "port": 80, "protocol": "TCP"}]);
    cluster
        .api
        .apply(service("during-flood", "10.96.0.77", ports, json!({})))
        .unwrap();
    let slice_ports = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    cluster
        .api
        .apply(slice("during-flood", slice_ports, &["pod-a1"]))
        .unwrap();
    let programmed = eventually(WAIT, || {
        cluster
            .ipt(&["-t", "nat", "-S", "KUBE-SERVICES"])
            .contains("default/during-flood:http")
    })
    .await;
    assert!(programmed, "{}", daemon.lines.lock().unwrap().join("\n"));
    // Long enough for several config-file polls and syncs under the flood.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(daemon.count("Config file changed"), 0);
    assert_eq!(daemon.count("Failed to sync"), 0, "syncs under the flood");

    drop(flood);
    let answered = eventually(WAIT, || {
        http_get(&cluster.node, addr("127.0.0.1:10256"), "/healthz").is_ok_and(|r| r.0 == 200)
    })
    .await;
    assert!(answered, "the health port answers once the flood is gone");
    daemon.stop().await;
}
