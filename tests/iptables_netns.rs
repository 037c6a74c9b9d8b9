//! iptables mode with real packets, as root, in network namespaces this test creates and removes:
//! the real daemon in a node namespace against the test API server, pods on veth pairs running
//! TCP/UDP echo servers, and an external client routed to the node.

mod support;

use std::collections::BTreeSet;
use std::io::ErrorKind;

use serde_json::json;
use support::cluster::{
    CLIENT_IP, Cluster, NODE_IP, PODS, addr, many, names, seed, slice, web_ports,
};
use support::netns::{http_get, require_netns, tcp_request, udp_request};
use support::{WAIT, eventually};
use test_apiserver::Resource;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_packets_through_the_daemon() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    // Another program's rules in the same tables.
    cluster.ipt(&["-t", "nat", "-N", "OTHER-NAT"]);
    cluster.ipt(&[
        "-t",
        "nat",
        "-A",
        "POSTROUTING",
        "-s",
        "10.99.0.0/16",
        "-j",
        "OTHER-NAT",
    ]);
    cluster.ipt(&[
        "-A", "INPUT", "-p", "tcp", "--dport", "2222", "-j", "ACCEPT",
    ]);

    let daemon = cluster.daemon(&cluster.config(""));
    daemon.wait_for("\"Using iptables Proxier\"").await;
    daemon.wait_for("\"Synced proxy rules\"").await;
    let node = &cluster.node;
    let client = &cluster.client;

    // What KUBE-SERVICES' length costs each new connection, said once, with the chain's
    // length as the kernel holds it.
    let in_kernel = cluster
        .ipt(&["-t", "nat", "-S", "KUBE-SERVICES"])
        .lines()
        .filter(|l| l.starts_with("-A "))
        .count();
    daemon.wait_for("KUBE-SERVICES (IPv4) holds").await;
    let said = format!("KUBE-SERVICES (IPv4) holds {in_kernel} rules");
    assert_eq!(daemon.count(&said), 1, "{:?}", daemon.lines.lock().unwrap());

    // ClusterIP and NodePort reach the pods and spread over them; UDP too.
    let all: BTreeSet<String> = PODS.iter().map(|p| p.0.to_string()).collect();
    let answers = many(40, || tcp_request(node, addr("10.96.0.10:80")));
    assert!(
        names(&answers).len() >= 2 && names(&answers).is_subset(&all),
        "{answers:?}"
    );
    let answers = many(40, || {
        tcp_request(client, addr(&format!("{NODE_IP}:30080")))
    });
    assert!(names(&answers).len() >= 2, "{answers:?}");
    let answers = many(30, || udp_request(node, addr("10.96.0.10:53")));
    assert!(names(&answers).len() >= 2, "UDP spreads: {answers:?}");
    let answers = many(10, || {
        udp_request(client, addr(&format!("{NODE_IP}:30053")))
    });
    assert!(
        answers.iter().all(Result::is_ok),
        "UDP NodePort: {answers:?}"
    );

    // ClientIP affinity sticks to one pod.
    let answers = many(15, || tcp_request(node, addr("10.96.0.11:80")));
    assert_eq!(names(&answers).len(), 1, "{answers:?}");

    // externalTrafficPolicy Local: only this node's pods, and they see the real client address.
    let answers = many(30, || {
        tcp_request(client, addr(&format!("{NODE_IP}:30081")))
    });
    let local: BTreeSet<String> = ["pod-a1", "pod-a2"].iter().map(|s| s.to_string()).collect();
    assert!(
        names(&answers).is_subset(&local) && !names(&answers).is_empty(),
        "{answers:?}"
    );
    assert!(
        answers.iter().all(|a| a
            .as_ref()
            .is_ok_and(|t| t.contains(&format!(" {CLIENT_IP}:")))),
        "{answers:?}"
    );
    // Through the Cluster-policy NodePort the client is masqueraded.
    let masked = tcp_request(client, addr(&format!("{NODE_IP}:30080"))).unwrap();
    assert!(!masked.contains(CLIENT_IP), "{masked}");

    // No endpoints: refused at once.
    assert_eq!(
        tcp_request(node, addr("10.96.0.13:80")),
        Err(ErrorKind::ConnectionRefused)
    );

    // Scale down: traffic follows.
    let (ports, slice_ports) = web_ports();
    cluster
        .api
        .apply(slice("web", slice_ports.clone(), &["pod-b2"]))
        .unwrap();
    assert!(
        eventually(WAIT, || names(&many(8, || tcp_request(
            node,
            addr("10.96.0.10:80")
        ))) == ["pod-b2".to_string()].into())
        .await
    );
    // Scale up again.
    cluster
        .api
        .apply(slice("web", slice_ports, &["pod-a1", "pod-b2"]))
        .unwrap();
    assert!(
        eventually(WAIT, || names(&many(20, || tcp_request(
            node,
            addr("10.96.0.10:80")
        )))
        .len()
            == 2)
        .await
    );
    // Endpoints removed entirely: refused.
    cluster
        .api
        .delete(Resource::EndpointSlices, "default", "web-1")
        .unwrap();
    assert!(
        eventually(WAIT, || tcp_request(node, addr("10.96.0.10:80"))
            == Err(ErrorKind::ConnectionRefused))
        .await
    );
    // Service deleted: no rule answers for it any more (no route to the service range here).
    cluster
        .api
        .delete(Resource::Services, "default", "web")
        .unwrap();
    assert!(
        eventually(WAIT, || cluster
            .ipt(&["-t", "filter", "-S", "KUBE-SERVICES"])
            .lines()
            .all(|l| !l.contains("default/web")))
        .await
    );
    assert!(tcp_request(node, addr("10.96.0.10:80")).is_err());
    let _ = ports;

    // The other program's rules survived every sync.
    assert!(
        cluster
            .ipt(&["-t", "nat", "-S", "POSTROUTING"])
            .contains("OTHER-NAT")
    );
    assert!(cluster.ipt(&["-S", "INPUT"]).contains("--dport 2222"));

    // Someone flushes the tables: repaired from the kernel's change events at once, and in
    // full by the canary check within a syncPeriod (2s).
    for table in ["nat", "filter", "mangle"] {
        cluster.ipt(&["-t", table, "-F"]);
        cluster.ipt(&["-t", table, "-X"]);
    }
    assert!(
        eventually(WAIT, || tcp_request(node, addr("10.96.0.11:80")).is_ok()).await,
        "restored after flush"
    );
    daemon.wait_for("canary chain missing").await;

    // Restart: traffic keeps flowing while the daemon is down, and it converges afterwards.
    daemon.stop().await;
    assert!(
        tcp_request(node, addr("10.96.0.11:80")).is_ok(),
        "rules stay while the daemon is down"
    );
    let tcp = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    cluster
        .api
        .apply(slice("sticky", tcp, &["pod-a2"]))
        .unwrap();
    let daemon = cluster.daemon(&cluster.config(""));
    assert!(
        tcp_request(node, addr("10.96.0.11:80")).is_ok(),
        "still flowing while it starts"
    );
    assert!(
        eventually(WAIT, || names(&many(5, || tcp_request(
            node,
            addr("10.96.0.11:80")
        ))) == ["pod-a2".to_string()].into())
        .await
    );
    daemon.wait_for("\"Synced proxy rules\"").await;
    daemon.stop().await;
}

/// This kernel has no IPVS: mode ipvs falls back to iptables, says why in the logs, and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipvs_mode_falls_back_to_iptables_here() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    // IPVS's own sync periods differ from iptables' (2s, and 0s, which defaults to 1s): the
    // mode that runs uses its own.
    let ipvs_section = "ipvs:\n  scheduler: rr\n  syncPeriod: 70s\n  minSyncPeriod: 7s\n";
    let daemon = cluster.daemon(&cluster.config_with_mode("ipvs", ipvs_section));
    daemon
        .wait_for("\"Can't use the IPVS proxier\" reason=\"the kernel has no IPVS")
        .await;
    daemon
        .wait_for("\"Can't use ipvs proxier, trying iptables proxier\"")
        .await;
    daemon.wait_for("\"Using iptables Proxier\"").await;
    daemon
        .wait_for("mode=\"iptables\" min_sync_period=\"1s\" sync_period=\"2s\"")
        .await;
    daemon.wait_for("\"Synced proxy rules\"").await;
    // Upstream's start event regarding the Node; no IPVS deprecation, as no ipvs proxier runs.
    let started = |event: &serde_json::Value| {
        event["reason"] == "Starting"
            && event["type"] == "Normal"
            && event["action"] == "StartKubeProxy"
            && event["reportingController"] == "kube-proxy"
            && event["regarding"]["kind"] == "Node"
            && event["regarding"]["name"] == "node-a"
    };
    assert!(
        posted_event(&cluster, started).await,
        "{:?}",
        cluster.api.list(Resource::EventsV1)
    );
    let events = cluster.api.list(Resource::EventsV1);
    assert!(
        events.iter().all(|e| e["reason"] != "IPVSDeprecation"),
        "{events:?}"
    );
    let answers = many(10, || tcp_request(&cluster.node, addr("10.96.0.10:80")));
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert!(
        cluster
            .ipt(&["-t", "nat", "-S", "KUBE-SERVICES"])
            .contains("KUBE-SVC-")
    );
    // The mode running, in /proxyMode and in the configuration in force (the rest as read).
    let metrics = addr("127.0.0.1:10249");
    let (_, mode) = http_get(&cluster.node, metrics, "/proxyMode").unwrap();
    assert_eq!(mode, "iptables");
    let (_, configz) = http_get(&cluster.node, metrics, "/configz").unwrap();
    let configz: serde_json::Value = serde_json::from_str(&configz).expect("JSON");
    let in_force = &configz["kubeproxy.config.k8s.io"];
    assert_eq!(in_force["mode"], "iptables", "{configz}");
    assert_eq!(in_force["ipvs"]["scheduler"], "rr", "{configz}");
    daemon.stop().await;

    // With fallback off it exits instead, as upstream does since 1.26.
    let mut strict = cluster.daemon_with(
        &cluster.config_with_mode("ipvs", ""),
        &["--ipvs-fallback=false"],
    );
    let status = tokio::time::timeout(WAIT, strict.child.wait())
        .await
        .expect("exits")
        .expect("wait");
    assert_eq!(status.code(), Some(1));
    let lines = strict.lines.clone();
    assert!(
        eventually(WAIT, || lines.lock().unwrap().iter().any(
            |l| l.contains("can't use the IPVS proxier: the kernel has no IPVS")
        ))
        .await,
        "{}",
        lines.lock().unwrap().join("\n")
    );
}

/// An API server that answers Events with 503 for a while: the Starting event is posted once
/// it recovers, as the daemon tries again (as client-go's event broadcaster does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_refused_for_a_moment_is_posted_again() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    cluster.api.refuse(Resource::EventsV1, Some(503));
    let daemon = cluster.daemon(&cluster.config_with_mode("iptables", ""));
    let posted = |api: &test_apiserver::ApiServer| {
        api.requests()
            .iter()
            .filter(|line| line.starts_with("POST /apis/events.k8s.io/v1/"))
            .count()
    };
    assert!(
        eventually(WAIT, || posted(&cluster.api) >= 1).await,
        "tried"
    );
    cluster.api.refuse(Resource::EventsV1, None);
    let started = |event: &serde_json::Value| event["reason"] == "Starting";
    assert!(
        posted_event(&cluster, started).await,
        "posted once the server took it: {:?}",
        cluster.api.requests()
    );
    assert_eq!(daemon.count("Cannot post an event"), 0);
    daemon.stop().await;
}

/// Whether the API server holds, or comes to hold within the wait, an Event `wanted` picks.
async fn posted_event(cluster: &Cluster, wanted: impl Fn(&serde_json::Value) -> bool) -> bool {
    eventually(WAIT, || {
        cluster.api.list(Resource::EventsV1).iter().any(&wanted)
    })
    .await
}
