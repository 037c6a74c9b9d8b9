//! Localhost NodePorts through the userspace proxy (KEP-6032; root, in namespaces): the real
//! daemon, with KubeProxyNFTablesLocalhostNodePorts on and `localhost` in nodePortAddresses,
//! serves NodePorts on 127.0.0.1 and ::1 from the node in iptables and nftables mode, to the
//! endpoints the kernel path's external traffic uses, with route_localnet left at 0; the node's
//! own address is still served by the kernel; a deleted Service's listener goes.

mod support;

use std::collections::BTreeSet;
use std::io::ErrorKind;

use serde_json::json;
use support::cluster::{
    BIN, Cluster, NODE_IP, addr, apply_dual_stack_slices, dual_stack_web, many, names, service,
    slice,
};
use support::explain::{explain, pod_at};
use support::netns::{http_get, require_netns, tcp_request, udp_request};
use support::{WAIT, eventually, metric};

const CONFIG: &str = "nftables:\n  syncPeriod: 2s\n  minSyncPeriod: 0s\n\
    featureGates:\n  KubeProxyNFTablesLocalhostNodePorts: true\n\
    nodePortAddresses: [primary, localhost]\n";

fn tcp_ports(node_port: u16) -> (serde_json::Value, serde_json::Value) {
    (
        json!([{"name": "http", "port": 80, "protocol": "TCP", "nodePort": node_port}]),
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
    )
}

/// `web` (dual stack, 30090, on pod-a1 and pod-b2), `local` (externalTrafficPolicy Local,
/// 30091, on every pod: node-a's are pod-a1 and pod-a2), `remote` (Local, 30092, on node-b's
/// pods only) and `sticky` (ClientIP affinity, 30093, on every pod).
fn seed(cluster: &Cluster) {
    let (ports, slice_ports) = tcp_ports(30090);
    cluster.api.apply(dual_stack_web(ports)).unwrap();
    apply_dual_stack_slices(cluster, "web", slice_ports, &["pod-a1", "pod-b2"]);
    let all = ["pod-a1", "pod-a2", "pod-b1", "pod-b2"];
    for (name, ip, node_port, extra, pods) in [
        (
            "local",
            "10.96.0.11",
            30091,
            json!({"externalTrafficPolicy": "Local"}),
            &all[..],
        ),
        (
            "remote",
            "10.96.0.12",
            30092,
            json!({"externalTrafficPolicy": "Local"}),
            &all[2..],
        ),
        (
            "sticky",
            "10.96.0.13",
            30093,
            json!({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}}}),
            &all[..],
        ),
    ] {
        let (ports, slice_ports) = tcp_ports(node_port);
        let mut spec = json!({"type": "NodePort"});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        cluster.api.apply(service(name, ip, ports, spec)).unwrap();
        cluster.api.apply(slice(name, slice_ports, pods)).unwrap();
    }
}

fn set(pods: &[&str]) -> BTreeSet<String> {
    pods.iter().map(|p| p.to_string()).collect()
}

async fn localhost_node_ports_through_the_proxy(mode: &str) {
    require_netns();
    let mut cluster = Cluster::start().await;
    cluster.add_ipv6();
    seed(&cluster);
    let node = &cluster.node;
    let route_localnet = || node.output(&["sysctl", "-n", "net.ipv4.conf.all.route_localnet"]);
    assert_eq!(route_localnet().trim(), "0");

    let daemon = cluster.daemon(&cluster.config_with_mode(mode, CONFIG));
    daemon.wait_for("\"Synced proxy rules\"").await;
    daemon
        .wait_for("Serving localhost NodePorts through the userspace proxy")
        .await;
    let both = set(&["pod-a1", "pod-b2"]);
    let answers = many(20, || tcp_request(node, addr("127.0.0.1:30090")));
    assert_eq!(names(&answers), both, "{mode}: {answers:?}");
    let answers = many(20, || tcp_request(node, addr("[::1]:30090")));
    assert_eq!(names(&answers), both, "{mode}: {answers:?}");
    // Local policy: this node's endpoints only; none here, no listener.
    let answers = many(20, || tcp_request(node, addr("127.0.0.1:30091")));
    assert_eq!(names(&answers), set(&["pod-a1", "pod-a2"]), "{answers:?}");
    assert_eq!(
        tcp_request(node, addr("127.0.0.1:30092")),
        Err(ErrorKind::ConnectionRefused)
    );
    // Affinity: one pod for every connection.
    let answers = many(10, || tcp_request(node, addr("127.0.0.1:30093")));
    assert_eq!(names(&answers).len(), 1, "{answers:?}");
    // The kernel still serves the node's own address, and needed no route_localnet.
    let answers = many(10, || {
        tcp_request(&cluster.client, addr(&format!("{NODE_IP}:30090")))
    });
    assert_eq!(names(&answers), both, "{answers:?}");
    assert_eq!(
        route_localnet().trim(),
        "0",
        "{mode}: route_localnet left alone"
    );
    explain_names_the_relays(&cluster, mode);
    let (_, metrics) = http_get(node, addr("127.0.0.1:10249"), "/metrics").unwrap();
    for family in ["IPv4", "IPv6"] {
        let line =
            format!("kubeproxy_nftables_localhost_nodeport_listeners{{ip_family=\"{family}\"}}");
        let count = if family == "IPv4" { 3 } else { 1 };
        assert!(
            metrics.contains(&format!("{line} {count}")),
            "{family}: {count} listeners\n{metrics}"
        );
    }

    // A deleted Service's listeners go.
    cluster
        .api
        .delete(test_apiserver::Resource::Services, "default", "web")
        .unwrap();
    let refused = |to: &str| tcp_request(node, addr(to)) == Err(ErrorKind::ConnectionRefused);
    assert!(
        eventually(WAIT, || refused("127.0.0.1:30090")
            && refused("[::1]:30090"))
        .await,
        "{mode}: web's listeners closed"
    );
    assert!(tcp_request(node, addr("127.0.0.1:30091")).is_ok());
    assert_eq!(daemon.count("Failed to create localhost nodeport proxy"), 0);
    daemon.stop().await;
}

/// `explain` on loopback NodePorts: the proxy's listener takes the connection and relays it to
/// the endpoints the daemon wants, under the port's external policy; a port with no listener
/// is refused.
fn explain_names_the_relays(cluster: &Cluster, mode: &str) {
    let endpoints = |answer: &serde_json::Value| -> BTreeSet<String> {
        assert_eq!(answer["verdict"], "relayed", "{mode}: {answer:#}");
        assert_eq!(
            answer["daemon"]["comparison"], "agrees",
            "{mode}: {answer:#}"
        );
        answer["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| pod_at(c["endpoint"].as_str().unwrap()).to_string())
            .collect()
    };
    let web = explain(cluster, "127.0.0.1:30090");
    assert_eq!(endpoints(&web), set(&["pod-a1", "pod-b2"]));
    assert_eq!(web["service"], "default/web:http", "{web:#}");
    assert_eq!(web["policy"], "Cluster", "{web:#}");
    assert_eq!(web["listener"], "127.0.0.1:30090", "{web:#}");
    let text = cluster
        .node
        .raw_output(&[BIN, "explain", "--to", "127.0.0.1:30090"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("verdict:  relayed by the listener on 127.0.0.1:30090 to one of 2:")
            && text.contains("daemon:   agrees"),
        "{text}"
    );
    let web6 = explain(cluster, "[::1]:30090");
    assert_eq!(endpoints(&web6), set(&["pod-a1", "pod-b2"]));
    let local = explain(cluster, "127.0.0.1:30091");
    assert_eq!(endpoints(&local), set(&["pod-a1", "pod-a2"]));
    assert_eq!(local["policy"], "Local", "{local:#}");
    let remote = explain(cluster, "127.0.0.1:30092");
    assert_eq!(remote["verdict"], "untouched", "{mode}: {remote:#}");
    let reason = remote["reason"].as_str().unwrap();
    assert!(reason.contains("nothing listens"), "{mode}: {reason}");
    // No local endpoint: the daemon wants no listener there either.
    assert_eq!(
        remote["daemon"]["comparison"], "agrees",
        "{mode}: {remote:#}"
    );
}

/// Another program holds a localhost NodePort's address before the daemon starts: the proxy
/// cannot listen there, and explain says whose listener takes the connection and that the
/// daemon wanted it relayed to its endpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_names_a_localhost_node_port_another_program_holds() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster);
    let squatter = cluster
        .node
        .run(|| std::net::TcpListener::bind("127.0.0.1:30093").expect("bind"));
    let daemon = cluster.daemon(&cluster.config_with_mode("nftables", CONFIG));
    daemon.wait_for("\"Synced proxy rules\"").await;
    daemon
        .wait_for("Failed to create localhost nodeport proxy")
        .await;
    let answer = explain(&cluster, "127.0.0.1:30093");
    assert_eq!(answer["verdict"], "untouched", "{answer:#}");
    let reason = answer["reason"].as_str().unwrap();
    assert!(
        reason.contains("not the localhost NodePort proxy"),
        "{reason}"
    );
    assert_eq!(answer["service"], "default/sticky:http", "{answer:#}");
    assert_eq!(answer["daemon"]["comparison"], "differs", "{answer:#}");
    let missing: BTreeSet<String> = answer["daemon"]["missing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| pod_at(e.as_str().unwrap()).to_string())
        .collect();
    assert_eq!(missing, set(&["pod-a1", "pod-a2", "pod-b1", "pod-b2"]));
    drop(squatter);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn localhost_node_ports_through_the_proxy_in_iptables_mode() {
    localhost_node_ports_through_the_proxy("iptables").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn localhost_node_ports_through_the_proxy_in_nftables_mode() {
    localhost_node_ports_through_the_proxy("nftables").await;
}

/// nftables mode with the gate on: what the userspace proxy does not serve on the loopback
/// addresses is rejected by the rules and counted (upstream 1.37's named counters, exported as
/// `kubeproxy_nftables_localhost_nodeport_rejected_packets_total`): UDP always, TCP too while
/// nodePortAddresses names no loopback address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn localhost_node_ports_not_served_are_rejected_and_counted_in_nftables_mode() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster);
    cluster
        .api
        .apply(service(
            "dns",
            "10.96.0.14",
            json!([{"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053}]),
            json!({"type": "NodePort"}),
        ))
        .unwrap();
    cluster
        .api
        .apply(slice(
            "dns",
            json!([{"name": "dns", "port": 5353, "protocol": "UDP"}]),
            &["pod-a1"],
        ))
        .unwrap();
    let node = &cluster.node;
    let counted = |protocol: &str| {
        let (_, metrics) = http_get(node, addr("127.0.0.1:10249"), "/metrics").unwrap();
        metric(
            &metrics,
            &format!(
                "kubeproxy_nftables_localhost_nodeport_rejected_packets_total{{ip_family=\"IPv4\",protocol=\"{protocol}\"}}"
            ),
        )
    };
    let rejected_and_counted = |protocol: &str| {
        let before = counted(protocol);
        let answer = match protocol {
            "TCP" => tcp_request(node, addr("127.0.0.1:30090")),
            _ => udp_request(node, addr("127.0.0.1:30053")),
        };
        assert!(answer.is_err(), "{protocol}: {answer:?}");
        counted(protocol) > before && before >= 0.0
    };

    // No loopback address in nodePortAddresses: TCP and UDP rejected and counted.
    let without = "nftables:\n  syncPeriod: 2s\n  minSyncPeriod: 0s\n\
        featureGates:\n  KubeProxyNFTablesLocalhostNodePorts: true\n\
        nodePortAddresses: [primary]\n";
    let daemon = cluster.daemon(&cluster.config_with_mode("nftables", without));
    daemon.wait_for("\"Synced proxy rules\"").await;
    assert!(rejected_and_counted("TCP"));
    assert!(rejected_and_counted("UDP"));
    // explain names the reject and its counter, as the daemon wants it.
    for (to, counter) in [
        ("127.0.0.1:30090", "localhost-nodeport-rejected-tcp"),
        ("127.0.0.1:30053/udp", "localhost-nodeport-rejected-udp"),
    ] {
        let answer = explain(&cluster, to);
        assert_eq!(answer["verdict"], "reject", "{answer:#}");
        assert!(
            answer["reason"].as_str().unwrap().contains(counter),
            "{answer:#}"
        );
        assert_eq!(answer["daemon"]["comparison"], "agrees", "{answer:#}");
    }
    // The node's own address is served as ever.
    let web = tcp_request(&cluster.client, addr(&format!("{NODE_IP}:30090")));
    assert!(web.is_ok(), "{web:?}");
    daemon.stop().await;

    // With the proxy: TCP served (and no longer counted), UDP still rejected and counted.
    let daemon = cluster.daemon(&cluster.config_with_mode("nftables", CONFIG));
    daemon.wait_for("\"Synced proxy rules\"").await;
    daemon
        .wait_for("Serving localhost NodePorts through the userspace proxy")
        .await;
    let served = eventually(WAIT, || tcp_request(node, addr("127.0.0.1:30090")).is_ok()).await;
    assert!(served, "TCP through the proxy");
    assert_eq!(
        counted("TCP"),
        -1.0,
        "no TCP counter while the proxy serves it"
    );
    assert!(rejected_and_counted("UDP"));
    let tcp = explain(&cluster, "127.0.0.1:30090");
    assert_eq!(tcp["verdict"], "relayed", "{tcp:#}");
    let udp = explain(&cluster, "127.0.0.1:30053/udp");
    assert_eq!(udp["verdict"], "reject", "{udp:#}");
    assert_eq!(udp["daemon"]["comparison"], "agrees", "{udp:#}");
    daemon.stop().await;
}

/// A flood of idle connections on a localhost NodePort, beyond what the daemon's open-files
/// limit (256) holds: of the 128 files left for connections, the proxy takes half (32 relays,
/// two files each) and the HTTP servers the other half; it sheds the oldest, a new connection
/// is still relayed, the health port answers and the daemon stays under its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_on_a_localhost_node_port_sheds_the_oldest() {
    require_netns();
    let cluster = Cluster::start().await;
    support::cluster::seed(&cluster.api);
    let config = cluster.config_with_mode("iptables", CONFIG);
    let daemon = support::cluster::Daemon::spawn_wrapped(
        &cluster.node,
        &["prlimit", "--nofile=256:256"],
        &config,
        &[],
        &[],
    );
    daemon.wait_for("\"Synced proxy rules\"").await;
    daemon
        .wait_for("Serving localhost NodePorts through the userspace proxy")
        .await;
    let node = &cluster.node;
    assert!(tcp_request(node, addr("127.0.0.1:30080")).is_ok());

    let flood = support::flood::Flood::start(node, addr("127.0.0.1:30080"), 400);
    let flooding = eventually(WAIT, || flood.opened() >= 400).await;
    assert!(flooding, "the flood opened {}", flood.opened());
    let relayed = eventually(WAIT, || tcp_request(node, addr("127.0.0.1:30080")).is_ok()).await;
    assert!(relayed, "a new connection is relayed during the flood");
    let health = http_get(
        &cluster.client,
        addr(&format!("{NODE_IP}:10256")),
        "/healthz",
    );
    assert!(matches!(health, Ok((200, _))), "{health:?}");
    let (_, metrics) = http_get(node, addr("127.0.0.1:10249"), "/metrics").unwrap();
    let limit = metric(
        &metrics,
        "kubeproxy_rs_localhost_nodeport_connections_limit ",
    );
    assert_eq!(limit, 32.0, "{metrics}");
    let http = metric(&metrics, "kubeproxy_rs_http_connections_limit ");
    assert_eq!(http, 64.0, "{metrics}");
    let shed = metric(
        &metrics,
        "kubeproxy_rs_localhost_nodeport_connections_shed_total{port=\"30080\",server=\"localhost-nodeport\"}",
    );
    assert!(shed >= 300.0, "shed {shed}");
    let open_files = metric(&metrics, "process_open_fds ");
    assert!(open_files < 256.0, "{open_files} files open");
    flood.stop();
    assert_eq!(daemon.count("Failed to sync"), 0, "syncs under the flood");
    daemon.stop().await;
}
