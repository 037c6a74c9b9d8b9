//! nftables mode's flowtable fast path (`--offload-packet-threshold`, KEP-4963) in the VM,
//! whose Debian kernel has flowtables (nf_flow_table_inet; this machine's has none): the real
//! daemon, pods on veth pairs, and connections from one pod to a Service whose endpoint is
//! another. A connection past the threshold is offloaded (conntrack says OFFLOAD, and a
//! counting forward chain of another table stops seeing its packets); new connections after an
//! endpoint change or the Service's deletion go where the rules say; an offloaded TCP connection
//! keeps its endpoint until it ends, and an offloaded UDP flow whose endpoint went away is
//! cleared with its conntrack entry, so its next packet takes the rules again.

mod support;

use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use serde_json::json;
use support::cluster::{BIN, Cluster, addr, apply_dual_stack_slices, seed, service};
use support::netns::{Netns, echo, http_get, tcp_connect};
use support::vm::in_vm;
use support::{WAIT, eventually};

const CONFIG: &str = "nftables:\n  syncPeriod: 30s\n  minSyncPeriod: 0s\n";
const ONE: &str = "10.96.0.20";
const ONE6: &str = "fd00:10:96::20";
/// The node's forward hook as another program sees it: packets from pod-a1 to pod-b1 and
/// pod-b2, counted after our filter-forward (priority 0).
const WATCH: &str = "add table ip watch\n\
    add chain ip watch forward { type filter hook forward priority 10 ; }\n\
    add rule ip watch forward ip saddr 10.244.1.11 ip daddr { 10.244.2.21, 10.244.2.22 } counter\n";

fn nft(node: &Netns, args: &[&str]) -> String {
    node.output(&[&["nft"], args].concat())
}

/// The packets the watching chain has counted.
fn watched(node: &Netns) -> u64 {
    let listing = nft(node, &["list", "chain", "ip", "watch", "forward"]);
    listing
        .split_whitespace()
        .skip_while(|word| *word != "packets")
        .nth(1)
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no counter in\n{listing}"))
}

/// The node's conntrack entries for connections to `port` of the Service's IPv4 ClusterIP.
fn tracked(node: &Netns, protocol: &str, port: &str) -> Vec<String> {
    tracked_to(node, ONE, protocol, port)
}

fn tracked_to(node: &Netns, ip: &str, protocol: &str, port: &str) -> Vec<String> {
    let family = if ip.contains(':') { "ipv6" } else { "ipv4" };
    node.output(&[
        "conntrack",
        "-L",
        "-f",
        family,
        "-p",
        protocol,
        "-d",
        ip,
        "--dport",
        port,
    ])
    .lines()
    .map(str::to_string)
    .collect()
}

fn one_service(cluster: &Cluster, pods: &[&str]) {
    let ports = json!([
        {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
        {"name": "dns", "port": 53, "targetPort": 8080, "protocol": "UDP"}
    ]);
    let slice_ports = json!([
        {"name": "http", "port": 8080, "protocol": "TCP"},
        {"name": "dns", "port": 8080, "protocol": "UDP"}
    ]);
    let mut one = service(
        "one",
        ONE,
        ports,
        json!({"ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack"}),
    );
    one["spec"]["clusterIPs"] = json!([ONE, ONE6]);
    cluster.api.apply(one).unwrap();
    apply_dual_stack_slices(cluster, "one", slice_ports, pods);
}

/// A UDP socket in `ns` that keeps its port, and one request through it.
fn udp_socket(ns: &Netns) -> UdpSocket {
    ns.run(|| {
        let socket = UdpSocket::bind("0.0.0.0:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        socket
    })
}

fn udp_ask(socket: &UdpSocket, to: SocketAddr) -> Option<String> {
    socket.send_to(b"hello", to).ok()?;
    let mut buf = [0u8; 256];
    let (n, _) = socket.recv_from(&mut buf).ok()?;
    let answer = String::from_utf8_lossy(&buf[..n]).to_string();
    answer.split_whitespace().next().map(str::to_string)
}

/// Our flowtable as nft lists it in `family` (`ip` or `ip6`).
fn flowtable(node: &Netns, family: &str) -> String {
    nft(
        node,
        &[
            "list",
            "flowtable",
            family,
            "kube-proxy",
            "kube-proxy-flowtable",
        ],
    )
}

/// A connection from `client` to `to` (the Service's port 80), answered by pod-b1 and taken
/// past the threshold with 30 echoes; conntrack must mark it offloaded.
fn offloaded_connection(client: &Netns, node: &Netns, ip: &str, to: SocketAddr) -> TcpStream {
    let (mut stream, greeting) = tcp_connect(client, to);
    assert!(greeting.starts_with("pod-b1"), "{greeting}");
    for i in 0..30 {
        assert_eq!(
            echo(&mut stream, &format!("line {i}")).unwrap(),
            format!("line {i}")
        );
    }
    let entries = tracked_to(node, ip, "tcp", "80");
    assert!(
        entries.iter().any(|e| e.contains("[OFFLOAD]")),
        "not offloaded: {entries:?}"
    );
    stream
}

/// The daemon's offload requests of `family` (`IPv4`, `IPv6`), as its metrics say.
fn offload_requests(node: &Netns, family: &str) -> u64 {
    let metrics = http_get(node, addr("127.0.0.1:10249"), "/metrics")
        .unwrap()
        .1;
    let series =
        format!("kubeproxy_nftables_flow_offload_requests_total{{ip_family=\"{family}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {family} offload metric in\n{metrics}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offloaded_service_flows_in_a_kernel_with_flowtables() {
    if !in_vm("offloaded_service_flows_in_a_kernel_with_flowtables") {
        return;
    }
    let mut cluster = Cluster::start().await;
    cluster.add_ipv6();
    seed(&cluster.api);
    one_service(&cluster, &["pod-b1"]);
    let node = &cluster.node;
    let config = cluster.config_with_mode("nftables", CONFIG);
    let daemon = cluster.daemon_with(&config, &["--offload-packet-threshold=20"]);
    daemon
        .wait_for("Offloading connections to ClusterIPs to the flowtable fast path")
        .await;
    daemon.wait_for("\"Synced proxy rules\"").await;

    // The flowtable, over every link but the loopback, and filter-forward's rule.
    let has_devices = || {
        let listing = flowtable(node, "ip");
        ["veth0", "veth1", "veth2", "veth3"]
            .iter()
            .all(|link| listing.contains(link))
            && !listing.contains("\"lo\"")
            && !listing.contains(" lo,")
    };
    assert!(
        eventually(WAIT, has_devices).await,
        "{}\n{}",
        nft(node, &["list", "table", "ip", "kube-proxy"]),
        daemon.lines.lock().unwrap().join("\n")
    );
    let forward = nft(
        node,
        &["list", "chain", "ip", "kube-proxy", "filter-forward"],
    );
    assert!(
        forward.contains("ct original ip daddr @cluster-ips ct packets > 20 counter name \"flow-offload-requests\" flow add @kube-proxy-flowtable"),
        "{forward}"
    );
    // A link that appears is added without waiting for a sync period (30 s here).
    node.exec(&[
        "ip", "link", "add", "late0", "type", "veth", "peer", "name", "late1",
    ]);
    assert!(
        eventually(Duration::from_secs(10), || flowtable(node, "ip")
            .contains("late0"))
        .await,
        "a new link is not in the flowtable"
    );
    let watch = node.exec(&["sh", "-c", &format!("printf '{WATCH}' | nft -f -")]);
    assert!(watch.status.success(), "{watch:?}");

    // A TCP connection from pod-a1 past the threshold is offloaded: its later packets no longer
    // reach the forward hook.
    let client = cluster.pod("pod-a1");
    let mut stream = offloaded_connection(client, node, ONE, addr(&format!("{ONE}:80")));
    // `ct packets` counts: the kernel turned conntrack's accounting on in the node's namespace.
    let accounting = node.output(&["sysctl", "-n", "net.netfilter.nf_conntrack_acct"]);
    assert_eq!(accounting.trim(), "1");
    let before = watched(node);
    for i in 0..100 {
        assert_eq!(
            echo(&mut stream, &format!("more {i}")).unwrap(),
            format!("more {i}")
        );
    }
    let after = watched(node);
    assert!(
        after - before < 10,
        "200 packets of an offloaded connection, {} of them through the forward hook",
        after - before
    );
    let requests = offload_requests(node, "IPv4");
    assert!(requests >= 1, "{requests}");

    // The same over IPv6, through the ip6 table's flowtable.
    let listing6 = flowtable(node, "ip6");
    assert!(
        listing6.contains("veth0") && listing6.contains("veth2"),
        "{listing6}"
    );
    drop(offloaded_connection(
        client,
        node,
        ONE6,
        addr(&format!("[{ONE6}]:80")),
    ));
    let requests6 = offload_requests(node, "IPv6");
    assert!(requests6 >= 1, "{requests6}");

    // A short connection stays on the normal path: under the threshold, nothing to offload.
    let (mut short, _) = tcp_connect(client, addr(&format!("{ONE}:80")));
    assert_eq!(echo(&mut short, "one").unwrap(), "one");
    let entries = tracked(node, "tcp", "80");
    assert_eq!(
        entries.iter().filter(|e| e.contains("[OFFLOAD]")).count(),
        1,
        "{entries:?}"
    );
    drop(short);

    // A UDP flow past the threshold is offloaded too.
    let dns = addr(&format!("{ONE}:53"));
    let socket = udp_socket(client);
    for _ in 0..25 {
        assert_eq!(udp_ask(&socket, dns).as_deref(), Some("pod-b1"));
    }
    let entries = tracked(node, "udp", "53");
    assert!(
        entries.iter().any(|e| e.contains("[OFFLOAD]")),
        "UDP not offloaded: {entries:?}"
    );

    // The endpoint moves to pod-b2. New connections go there; the offloaded TCP connection
    // keeps pod-b1 until it ends (as it would on the normal path: TCP entries are not
    // deleted); the offloaded UDP flow's entry is deleted with its endpoint, and its next
    // request reaches pod-b2.
    one_service(&cluster, &["pod-b2"]);
    let moved = || {
        tcp_connect(client, addr(&format!("{ONE}:80")))
            .1
            .starts_with("pod-b2")
    };
    assert!(
        eventually(WAIT, moved).await,
        "new connections still go to pod-b1"
    );
    assert_eq!(echo(&mut stream, "still").unwrap(), "still");
    assert!(
        eventually(WAIT, || udp_ask(&socket, dns).as_deref() == Some("pod-b2")).await,
        "the offloaded UDP flow kept its old endpoint"
    );

    // The Service goes away: new connections are no longer translated; the offloaded TCP
    // connection still runs to its endpoint until it ends.
    cluster
        .api
        .delete(test_apiserver::Resource::Services, "default", "one")
        .unwrap();
    let gone = || {
        client
            .run(|| {
                std::net::TcpStream::connect_timeout(
                    &addr(&format!("{ONE}:80")),
                    Duration::from_millis(500),
                )
            })
            .is_err()
    };
    assert!(
        eventually(WAIT, gone).await,
        "the deleted Service still answers"
    );
    assert_eq!(echo(&mut stream, "after").unwrap(), "after");
    drop(stream);
    daemon.stop().await;

    // --cleanup leaves no table, and so no flowtable.
    let output = std::process::Command::new("ip")
        .args(["netns", "exec", &node.name, BIN, "--cleanup"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let left = nft(node, &["list", "tables"]);
    assert!(!left.contains("kube-proxy"), "{left}");
    let ruleset = nft(node, &["list", "ruleset"]);
    assert!(!ruleset.contains("flowtable"), "{ruleset}");
}
