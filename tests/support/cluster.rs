//! A small cluster in network namespaces: a node running the real daemon against the test API
//! server (listening inside the node namespace), pods on veth pairs with echo servers, and an
//! external client routed to the node. Shared by the iptables tests and the IPVS tests in the VM.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use test_apiserver::{ApiServer, Options};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::netns::{EchoServer, Netns, attach_pod, uplink};
use super::{WAIT, eventually};

pub const BIN: &str = env!("CARGO_BIN_EXE_kube-proxy-rs");
pub const NODE_IP: &str = "192.168.100.2";
pub const CLIENT_IP: &str = "192.168.100.1";

/// (name, ip, node it is declared on).
pub const PODS: [(&str, &str, &str); 4] = [
    ("pod-a1", "10.244.1.11", "node-a"),
    ("pod-a2", "10.244.1.12", "node-a"),
    ("pod-b1", "10.244.2.21", "node-b"),
    ("pod-b2", "10.244.2.22", "node-b"),
];

/// The IPv6 side of a dual-stack cluster (`Cluster::add_ipv6`).
pub const NODE_IP6: &str = "fd00:100::2";
pub const CLIENT_IP6: &str = "fd00:100::1";

/// A pod's IPv6 address: fd00:10:244::<last octet of its IPv4 address>.
pub fn pod_ip6(ip: &str) -> String {
    format!("fd00:10:244::{}", ip.rsplit('.').next().unwrap_or("1"))
}

pub struct Cluster {
    pub node: Netns,
    pub client: Netns,
    pods: Vec<(Netns, EchoServer)>,
    v6_servers: Vec<EchoServer>,
    pub api: ApiServer,
    pub dir: tempfile::TempDir,
}

pub fn addr(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

impl Cluster {
    pub async fn start() -> Cluster {
        let node = Netns::new("node");
        let client = Netns::new("client");
        uplink(&node, NODE_IP, &client, CLIENT_IP);
        let mut pods = Vec::new();
        for (i, (name, ip, _)) in PODS.iter().enumerate() {
            let pod = Netns::new(name);
            let node_if = format!("veth{i}");
            attach_pod(&node, &node_if, &pod, ip, "10.244.0.1");
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
            pods,
            v6_servers: Vec::new(),
            api,
            dir,
        }
    }

    /// A pod's namespace, by name (PODS).
    pub fn pod(&self, name: &str) -> &Netns {
        let index = PODS
            .iter()
            .position(|(pod, _, _)| *pod == name)
            .expect("a pod of PODS");
        &self.pods[index].0
    }

    /// Makes the cluster dual-stack: IPv6 on the node, the client and every pod (with a v6 echo
    /// server), and an IPv6 InternalIP on the Node. Call before starting a daemon.
    pub fn add_ipv6(&mut self) {
        let nodad = |ns: &Netns, cidr: &str, dev: &str| {
            ns.exec(&["ip", "-6", "addr", "add", cidr, "dev", dev, "nodad"]);
        };
        self.node.sysctl("net.ipv6.conf.all.forwarding", "1");
        nodad(&self.node, &format!("{NODE_IP6}/64"), "eth0");
        nodad(&self.client, &format!("{CLIENT_IP6}/64"), "eth0");
        self.client
            .exec(&["ip", "-6", "route", "add", "default", "via", NODE_IP6]);
        self.node
            .exec(&["ip", "-6", "route", "add", "default", "via", CLIENT_IP6]);
        for (i, (name, ip, _)) in PODS.iter().enumerate() {
            let pod = &self.pods[i].0;
            let ip6 = pod_ip6(ip);
            let node_if = format!("veth{i}");
            nodad(&self.node, "fd00:10:244::1/128", &node_if);
            self.node.exec(&[
                "ip",
                "-6",
                "route",
                "add",
                &format!("{ip6}/128"),
                "dev",
                &node_if,
            ]);
            nodad(pod, &format!("{ip6}/128"), "eth0");
            pod.exec(&["ip", "-6", "route", "add", "fd00:10:244::1", "dev", "eth0"]);
            pod.exec(&[
                "ip",
                "-6",
                "route",
                "add",
                "default",
                "via",
                "fd00:10:244::1",
            ]);
            pod.sysctl("net.ipv6.bindv6only", "1");
            let server = EchoServer::start_on(pod, name, "::", 8080);
            self.v6_servers.push(server);
        }
        self.api
            .apply(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "node-a", "labels": {"kubernetes.io/hostname": "node-a"}},
                "spec": {"podCIDRs": ["10.244.1.0/24", "fd00:10:244:1::/64"]},
                "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP},
                                          {"type": "InternalIP", "address": NODE_IP6}]}
            }))
            .unwrap();
    }

    pub fn config(&self, extra: &str) -> std::path::PathBuf {
        self.config_with_mode("iptables", extra)
    }

    pub fn config_with_mode(&self, mode: &str, extra: &str) -> std::path::PathBuf {
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

    pub fn daemon(&self, config: &std::path::Path) -> Daemon {
        self.daemon_with(config, &[])
    }

    pub fn daemon_with(&self, config: &std::path::Path, extra: &[&str]) -> Daemon {
        Daemon::spawn(&self.node, config, extra)
    }

    pub fn ipt(&self, args: &[&str]) -> String {
        let mut full = vec!["iptables-nft", "-w", "5"];
        full.extend_from_slice(args);
        String::from_utf8_lossy(&self.node.exec(&full).stdout).into_owned()
    }
}

pub struct Daemon {
    pub child: Child,
    pub lines: Arc<Mutex<Vec<String>>>,
}

impl Daemon {
    /// The real daemon in `node` as node-a (`--v=2`), its stderr collected line by line.
    pub fn spawn(node: &Netns, config: &std::path::Path, extra: &[&str]) -> Daemon {
        Daemon::spawn_with_env(node, config, extra, &[])
    }

    /// As [`Daemon::spawn`], with extra environment variables.
    pub fn spawn_with_env(
        node: &Netns,
        config: &std::path::Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Daemon {
        Daemon::spawn_wrapped(node, &[], config, extra, env)
    }

    /// As [`Daemon::spawn_with_env`], run through `wrapper` (`prlimit --nofile=256:256`, say).
    pub fn spawn_wrapped(
        node: &Netns,
        wrapper: &[&str],
        config: &std::path::Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Daemon {
        let child = Command::new("ip")
            .args(["netns", "exec", &node.name])
            .args(wrapper)
            .arg(BIN)
            .arg(format!("--config={}", config.display()))
            .args(extra)
            .args(["--hostname-override=node-a", "--v=2"])
            .env_remove("RUST_LOG")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn daemon");
        Daemon::collecting(child)
    }

    /// The real daemon in `node` with exactly `args` (a distribution's command line).
    pub fn spawn_args(node: &Netns, args: &[String], env: &[(&str, &str)]) -> Daemon {
        let child = Command::new("ip")
            .args(["netns", "exec", &node.name])
            .arg(BIN)
            .args(args)
            .env_remove("RUST_LOG")
            .env_remove("NODE_NAME")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn daemon");
        Daemon::collecting(child)
    }

    /// `child` with its stderr collected line by line.
    pub fn collecting(mut child: Child) -> Daemon {
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

    /// How many log lines contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    pub async fn wait_for(&self, needle: &str) {
        self.wait_for_within(needle, WAIT).await;
    }

    /// Waits up to `limit` for a log line containing `needle`.
    pub async fn wait_for_within(&self, needle: &str, limit: std::time::Duration) {
        let found = eventually(limit, || {
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

    pub async fn stop(mut self) {
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

pub fn service(name: &str, ip: &str, ports: Value, extra: Value) -> Value {
    let mut spec =
        json!({"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip], "ports": ports});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            spec.insert(k.clone(), v.clone());
        }
    }
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"}, "spec": spec})
}

/// Service `web` of type NodePort on 10.96.0.10 and fd00:10:96::10 (RequireDualStack).
pub fn dual_stack_web(ports: Value) -> Value {
    let mut web = service(
        "web",
        "10.96.0.10",
        ports,
        json!({"type": "NodePort", "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack"}),
    );
    web["spec"]["clusterIPs"] = json!(["10.96.0.10", "fd00:10:96::10"]);
    web
}

/// The IPv6 slice `<service>-6` of the pods' v6 addresses.
/// A service's IPv4 and IPv6 EndpointSlices, with `pods` in both.
pub fn apply_dual_stack_slices(cluster: &Cluster, service: &str, ports: Value, pods: &[&str]) {
    cluster
        .api
        .apply(slice(service, ports.clone(), pods))
        .unwrap();
    cluster.api.apply(slice6(service, ports, pods)).unwrap();
}

pub fn slice6(service: &str, ports: Value, pods: &[&str]) -> Value {
    let endpoints: Vec<Value> = PODS
        .iter()
        .filter(|(name, _, _)| pods.contains(name))
        .map(|(name, ip, node)| json!({"addresses": [pod_ip6(ip)], "conditions": {"ready": true}, "nodeName": node, "targetRef": {"kind": "Pod", "name": name}}))
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv6",
        "metadata": {"name": format!("{service}-6"), "namespace": "default", "labels": {"kubernetes.io/service-name": service}},
        "ports": ports, "endpoints": endpoints
    })
}

/// Service `default/lb` (10.96.0.90:80): a LoadBalancer with externalTrafficPolicy Local on
/// `node_port`, its health check on `health_check_port`, with endpoints on `pods`.
pub fn local_load_balancer(api: &ApiServer, node_port: u16, health_check_port: u16, pods: &[&str]) {
    let ports = json!([{"name": "http", "port": 80, "protocol": "TCP", "nodePort": node_port}]);
    let spec = json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                      "healthCheckNodePort": health_check_port});
    api.apply(service("lb", "10.96.0.90", ports, spec)).unwrap();
    let slice_ports = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    api.apply(slice("lb", slice_ports, pods)).unwrap();
}

pub fn slice(service: &str, ports: Value, pods: &[&str]) -> Value {
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

pub fn web_ports() -> (Value, Value) {
    (
        json!([{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080}, {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053}]),
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "dns", "port": 8080, "protocol": "UDP"}]),
    )
}

pub fn names(answers: &[Result<String, ErrorKind>]) -> BTreeSet<String> {
    answers
        .iter()
        .filter_map(|a| a.as_ref().ok())
        .map(|a| a.split(' ').next().unwrap_or("").to_string())
        .collect()
}

pub fn many(n: usize, f: impl Fn() -> Result<String, ErrorKind>) -> Vec<Result<String, ErrorKind>> {
    (0..n).map(|_| f()).collect()
}

/// A ServiceCIDR `name` holding `cidr`.
pub fn service_cidr(api: &ApiServer, name: &str, cidr: &str) {
    api.apply(
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
        "metadata": {"name": name}, "spec": {"cidrs": [cidr]}}),
    )
    .unwrap();
}

pub fn seed(api: &ApiServer) {
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

/// A PATH (to give the daemon) whose `tool` runs `script` first, with `REAL` set to the real
/// tool's path; the wrapper lives in the cluster's directory.
pub fn wrapped_tool(cluster: &Cluster, tool: &str, script: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let real = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .unwrap()
        .stdout;
    let bin = cluster.dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let wrapper = bin.join(tool);
    let real = String::from_utf8_lossy(&real);
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nREAL={}\n{script}", real.trim()),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}
