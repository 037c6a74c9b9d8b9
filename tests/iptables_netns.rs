//! iptables mode with real packets, as root, in network namespaces this test creates and removes:
//! the real daemon in a node namespace against the test API server, pods on veth pairs running
//! TCP/UDP echo servers, and an external client routed to the node.

mod support;

use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use support::netns::{EchoServer, Netns, can_use_netns, tcp_request, udp_request, veth};
use support::{WAIT, eventually};
use test_apiserver::{ApiServer, Options, Resource};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_kube-proxy-rs");
const NODE_IP: &str = "192.168.100.2";
const CLIENT_IP: &str = "192.168.100.1";

/// (name, ip, node it is declared on).
const PODS: [(&str, &str, &str); 4] = [
    ("pod-a1", "10.244.1.11", "node-a"),
    ("pod-a2", "10.244.1.12", "node-a"),
    ("pod-b1", "10.244.2.21", "node-b"),
    ("pod-b2", "10.244.2.22", "node-b"),
];

struct Cluster {
    node: Netns,
    client: Netns,
    _pods: Vec<(Netns, EchoServer)>,
    api: ApiServer,
    dir: tempfile::TempDir,
}

fn addr(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

impl Cluster {
    async fn start() -> Cluster {
        let node = Netns::new("node");
        let client = Netns::new("client");
        node.sysctl("net.ipv4.ip_forward", "1");
        veth(&node, "eth0", &client, "eth0");
        node.exec(&["ip", "addr", "add", &format!("{NODE_IP}/24"), "dev", "eth0"]);
        client.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{CLIENT_IP}/24"),
            "dev",
            "eth0",
        ]);
        client.exec(&["ip", "route", "add", "default", "via", NODE_IP]);
        // Locally sent packets need a route before nat OUTPUT sees them, as on a real node; it
        // points at the client namespace, so nothing can leave the test's namespaces.
        node.exec(&["ip", "route", "add", "default", "via", CLIENT_IP]);
        let mut pods = Vec::new();
        for (i, (name, ip, _)) in PODS.iter().enumerate() {
            let pod = Netns::new(name);
            let node_if = format!("veth{i}");
            veth(&node, &node_if, &pod, "eth0");
            node.exec(&["ip", "addr", "add", "10.244.0.1/32", "dev", &node_if]);
            node.exec(&["ip", "route", "add", &format!("{ip}/32"), "dev", &node_if]);
            pod.exec(&["ip", "addr", "add", &format!("{ip}/32"), "dev", "eth0"]);
            pod.exec(&["ip", "route", "add", "10.244.0.1", "dev", "eth0"]);
            pod.exec(&["ip", "route", "add", "default", "via", "10.244.0.1"]);
            let server = EchoServer::start(&pod, name, 8080);
            pods.push((pod, server));
        }
        let listener = node.run(|| std::net::TcpListener::bind("127.0.0.1:0").expect("bind api"));
        let api = ApiServer::start_on(listener, Options::default())
            .await
            .expect("api server");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("kubeconfig"), api.kubeconfig_yaml()).unwrap();
        api.apply(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "node-a", "labels": {"kubernetes.io/hostname": "node-a"}},
            "spec": {"podCIDRs": ["10.244.1.0/24"]},
            "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}]}
        }))
        .unwrap();
        Cluster {
            node,
            client,
            _pods: pods,
            api,
            dir,
        }
    }

    fn config(&self, extra: &str) -> std::path::PathBuf {
        self.config_with_mode("iptables", extra)
    }

    fn config_with_mode(&self, mode: &str, extra: &str) -> std::path::PathBuf {
        let path = self.dir.path().join("config.conf");
        let text = format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: {mode}\n\
             clusterCIDR: 10.244.0.0/16\nclientConnection:\n  kubeconfig: {}\n\
             iptables:\n  syncPeriod: 2s\n  minSyncPeriod: 0s\n{extra}",
            self.dir.path().join("kubeconfig").display()
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    fn daemon(&self, config: &std::path::Path) -> Daemon {
        self.daemon_with(config, &[])
    }

    fn daemon_with(&self, config: &std::path::Path, extra: &[&str]) -> Daemon {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.node.name, BIN])
            .arg(format!("--config={}", config.display()))
            .args(extra)
            .args(["--hostname-override=node-a", "--v=2"])
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn daemon");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let stderr = child.stderr.take().unwrap();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                sink.lock().unwrap().push(line);
            }
        });
        Daemon { child, lines }
    }

    fn ipt(&self, args: &[&str]) -> String {
        let mut full = vec!["iptables-nft", "-w", "5"];
        full.extend_from_slice(args);
        String::from_utf8_lossy(&self.node.exec(&full).stdout).into_owned()
    }
}

struct Daemon {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Daemon {
    async fn wait_for(&self, needle: &str) {
        let found = eventually(WAIT, || {
            self.lines
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.contains(needle))
        })
        .await;
        assert!(
            found,
            "no log line with {needle:?}:\n{}",
            self.lines.lock().unwrap().join("\n")
        );
    }

    async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("stops")
            .expect("wait");
        assert!(status.success(), "{status:?}");
    }
}

fn service(name: &str, ip: &str, ports: Value, extra: Value) -> Value {
    let mut spec =
        json!({"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip], "ports": ports});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            spec.insert(k.clone(), v.clone());
        }
    }
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"}, "spec": spec})
}

fn slice(service: &str, ports: Value, pods: &[&str]) -> Value {
    let endpoints: Vec<Value> = PODS
        .iter()
        .filter(|(name, _, _)| pods.contains(name))
        .map(|(name, ip, node)| json!({"addresses": [ip], "conditions": {"ready": true}, "nodeName": node, "targetRef": {"kind": "Pod", "name": name}}))
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": format!("{service}-1"), "namespace": "default", "labels": {"kubernetes.io/service-name": service}},
        "ports": ports, "endpoints": endpoints
    })
}

fn web_ports() -> (Value, Value) {
    (
        json!([{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080}, {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053}]),
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "dns", "port": 8080, "protocol": "UDP"}]),
    )
}

fn names(answers: &[Result<String, ErrorKind>]) -> BTreeSet<String> {
    answers
        .iter()
        .filter_map(|a| a.as_ref().ok())
        .map(|a| a.split(' ').next().unwrap_or("").to_string())
        .collect()
}

fn many(n: usize, f: impl Fn() -> Result<String, ErrorKind>) -> Vec<Result<String, ErrorKind>> {
    (0..n).map(|_| f()).collect()
}

fn seed(api: &ApiServer) {
    let (ports, slice_ports) = web_ports();
    api.apply(service(
        "web",
        "10.96.0.10",
        ports,
        json!({"type": "NodePort"}),
    ))
    .unwrap();
    api.apply(slice(
        "web",
        slice_ports,
        &["pod-a1", "pod-a2", "pod-b1", "pod-b2"],
    ))
    .unwrap();
    let tcp = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    api.apply(service("sticky", "10.96.0.11", json!([{"name": "http", "port": 80, "protocol": "TCP"}]),
        json!({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}}}))).unwrap();
    api.apply(slice(
        "sticky",
        tcp.clone(),
        &["pod-a1", "pod-a2", "pod-b1", "pod-b2"],
    ))
    .unwrap();
    api.apply(service(
        "local",
        "10.96.0.12",
        json!([{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30081}]),
        json!({"type": "NodePort", "externalTrafficPolicy": "Local"}),
    ))
    .unwrap();
    api.apply(slice(
        "local",
        tcp,
        &["pod-a1", "pod-a2", "pod-b1", "pod-b2"],
    ))
    .unwrap();
    api.apply(service(
        "empty",
        "10.96.0.13",
        json!([{"name": "http", "port": 80, "protocol": "TCP"}]),
        json!({}),
    ))
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_packets_through_the_daemon() {
    assert!(
        can_use_netns(),
        "this test needs root and iproute2 (run it through .ci/run as root)"
    );
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

    // Someone flushes the tables: restored within a syncPeriod (2s) by the canary check.
    for table in ["nat", "filter", "mangle"] {
        cluster.ipt(&["-t", table, "-F"]);
        cluster.ipt(&["-t", table, "-X"]);
    }
    assert!(
        tcp_request(node, addr("10.96.0.11:80")).is_err(),
        "flushed: service gone"
    );
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
    assert!(
        can_use_netns(),
        "this test needs root and iproute2 (run it through .ci/run as root)"
    );
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    let daemon = cluster.daemon(&cluster.config_with_mode("ipvs", "ipvs:\n  scheduler: rr\n"));
    daemon
        .wait_for("\"Can't use the IPVS proxier\" reason=\"the kernel has no IPVS")
        .await;
    daemon
        .wait_for("\"Can't use ipvs proxier, trying iptables proxier\"")
        .await;
    daemon.wait_for("\"Using iptables Proxier\"").await;
    daemon.wait_for("\"Synced proxy rules\"").await;
    let answers = many(10, || tcp_request(&cluster.node, addr("10.96.0.10:80")));
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert!(
        cluster
            .ipt(&["-t", "nat", "-S", "KUBE-SERVICES"])
            .contains("KUBE-SVC-")
    );
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
