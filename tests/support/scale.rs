//! What the benchmarks and the proxier-level kernel tests share: a model state of N services x
//! 10 endpoints (service i is `bench/svc-<i>` on 172.30.x.y:80 with NodePort 30000 + i % 2700 and
//! endpoints 10.x.y.1-10:8080 on another node), the same as API objects, proxiers built as the
//! daemon builds them, the real daemon's run at that size, and the medians the benchmarks report.
#![allow(dead_code)]

use std::process::Command;
use std::time::{Duration, Instant};

use kube_proxy_rs::config::KubeProxyConfiguration;
use kube_proxy_rs::model::{
    Endpoint, NamespacedName, NodeInfo, Protocol, ProxyState, ServicePort, ServicePortName,
};
use kube_proxy_rs::proxier::iptables::IptablesSettings;
use kube_proxy_rs::proxier::ipvs::{IpvsProxier, IpvsSettings};
use kube_proxy_rs::sys::host::net::{FakeSysctl, FixedAddresses};
use kube_proxy_rs::sys::xtables::{Backend, SystemIptables};

use super::netns::Netns;

/// The node address the state and the proxiers use.
pub const NODE_IP: &str = "192.168.0.2";

/// The configuration the benchmarks' proxiers start from: upstream's defaults and a cluster CIDR.
pub fn config(cluster_cidr: &str) -> KubeProxyConfiguration {
    let mut config = KubeProxyConfiguration {
        cluster_cidr: cluster_cidr.into(),
        ..KubeProxyConfiguration::default()
    };
    config.apply_defaults();
    config
}

/// iptables mode's settings for a cluster CIDR, with no canary check in the middle of a test
/// (the first sync is full anyway).
pub fn iptables_settings(cluster_cidr: &str) -> IptablesSettings {
    let mut settings = IptablesSettings::from_config(&config(cluster_cidr));
    settings.canary_interval = Duration::from_secs(3600);
    settings
}

/// An IPVS proxier in this thread's namespace (cluster CIDR 10.0.0.0/8, node address NODE_IP,
/// nft rules, sysctls kept in memory).
pub fn ipvs_proxier() -> IpvsProxier {
    IpvsProxier::new(
        IpvsSettings::from_config(&config("10.0.0.0/8")),
        Box::new(SystemIptables::new(Backend::Nft)),
        Box::new(FakeSysctl::default()),
        Box::new(FixedAddresses(vec![NODE_IP.parse().unwrap()])),
    )
    .expect("IPVS proxier")
}

/// The median of some timings.
pub fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

/// A timing as the benchmarks print it.
pub fn secs(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

/// The state.
pub fn state(count: usize) -> ProxyState {
    let mut state = ProxyState {
        node: NodeInfo {
            name: "node-a".into(),
            addresses: vec![NODE_IP.parse().unwrap()],
            ..NodeInfo::default()
        },
        ..ProxyState::default()
    };
    for i in 0..count {
        let key = NamespacedName::new("bench", format!("svc-{i}"));
        let name = ServicePortName::new("bench", &format!("svc-{i}"), "http", Protocol::Tcp);
        let cluster_ip = format!("172.30.{}.{}", i / 250, i % 250 + 1);
        let port = ServicePort {
            node_port: Some(30000 + (i % 2700) as u16),
            ..ServicePort::new(name.clone(), cluster_ip.parse().unwrap(), 80)
        };
        let endpoints: Vec<Endpoint> = (0..10)
            .map(|e| {
                let ip = format!("10.{}.{}.{}", i / 250, i % 250, e + 1);
                Endpoint::ready(ip.parse().unwrap(), 8080, Some("node-b"))
            })
            .collect();
        state.services.insert(
            key.clone(),
            kube_proxy_rs::model::VecMap::from([(name.clone(), port)]),
        );
        state
            .endpoints
            .insert(key, kube_proxy_rs::model::VecMap::from([(name, endpoints)]));
    }
    state
}

/// Service `bench/svc-<i>` and its EndpointSlice as API objects: what [`state`] holds for it
/// (ClusterIP 172.30.x.y:80, NodePort 30000 + i % 2700, ten endpoints on another node).
pub fn api_objects(i: usize) -> (serde_json::Value, serde_json::Value) {
    let ip = format!("172.30.{}.{}", i / 250, i % 250 + 1);
    let service = serde_json::json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("svc-{i}"), "namespace": "bench"},
        "spec": {"type": "NodePort", "clusterIP": ip, "clusterIPs": [ip],
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30000 + i % 2700}]}});
    let endpoints: Vec<serde_json::Value> = (0..10)
        .map(|e| serde_json::json!({"addresses": [format!("10.{}.{}.{}", i / 250, i % 250, e + 1)], "nodeName": "node-b"}))
        .collect();
    let slice = serde_json::json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": format!("svc-{i}-1"), "namespace": "bench", "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}], "endpoints": endpoints});
    (service, slice)
}

/// Node `node-a` (NODE_IP) and services `range` with their slices, in the test API server.
pub fn populate(api: &test_apiserver::ApiServer, range: std::ops::Range<usize>) {
    api.apply(
        serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
        "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}]}}),
    )
    .expect("node");
    for i in range {
        let (service, slice) = api_objects(i);
        api.apply(service).expect("service");
        api.apply(slice).expect("slice");
    }
}

/// How many times `explain` of one flow is timed.
const EXPLAINS: usize = 5;

/// `kube-proxy-rs explain` on the node the daemon programmed: one flow to the middle service
/// (the median of [`EXPLAINS`]) against the listing a user would read by hand (nftables: our
/// table; iptables: nat's KUBE-SERVICES alone; IPVS: `ipvsadm -Ln`), and `--all`.
fn explain_timings(node: &Netns, count: usize, mode: &str) {
    let timed = |args: &[&str]| {
        let started = Instant::now();
        let output = node.raw_output(args);
        let took = started.elapsed();
        assert!(output.status.success(), "{args:?}: {output:?}");
        (took, String::from_utf8_lossy(&output.stdout).into_owned())
    };
    let middle = count / 2;
    let to = format!("172.30.{}.{}:80/tcp", middle / 250, middle % 250 + 1);
    let explain = [env!("CARGO_BIN_EXE_kube-proxy-rs"), "explain", "--to", &to];
    let mut explains = Vec::new();
    for _ in 0..EXPLAINS {
        let (took, text) = timed(&explain);
        assert!(text.contains("DNAT to one of 10"), "{text}");
        explains.push(took);
    }
    let explained = median(explains);
    let (by_hand, listed) = match mode {
        "nftables" => (
            "nft list table ip kube-proxy",
            timed(&["nft", "list", "table", "ip", "kube-proxy"]).0,
        ),
        "ipvs" => ("ipvsadm -Ln", timed(&["ipvsadm", "-Ln"]).0),
        "iptables-legacy" => (
            "iptables-legacy -t nat -S KUBE-SERVICES",
            timed(&["iptables-legacy", "-t", "nat", "-S", "KUBE-SERVICES"]).0,
        ),
        _ => (
            "iptables-nft -t nat -S KUBE-SERVICES",
            timed(&["iptables-nft", "-t", "nat", "-S", "KUBE-SERVICES"]).0,
        ),
    };
    println!(
        "{count:>6} services ({mode}): explain of one flow {} (median of {EXPLAINS}) vs {by_hand} {} ({:.3}x)",
        secs(explained),
        secs(listed),
        explained.as_secs_f64() / listed.as_secs_f64(),
    );
    // Every service port checked against the daemon's wants, read from the kernel.
    let (took, output) = timed(&[env!("CARGO_BIN_EXE_kube-proxy-rs"), "explain", "--all"]);
    let summary = output.lines().next().unwrap_or_default().to_string();
    assert!(summary.starts_with("checked "), "{output}");
    println!(
        "{count:>6} services ({mode}): explain --all {} ({summary})",
        secs(took)
    );
}

/// Runs the real daemon in a namespace against the test API server holding `count` services x 10
/// endpoints: its resident memory and time to the first completed sync; then, stopped and started
/// again on the programmed node, the time to its first sync and until a Service created after the
/// restart is programmed. Mode `dry-run`: `--dry-run` (the watch side and the model alone), no
/// restart.
pub fn daemon_run(count: usize, mode: &str) {
    let dry_run = mode == "dry-run";
    let legacy = mode == "iptables-legacy";
    let mode = if dry_run || legacy { "iptables" } else { mode };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let node = Netns::new("bench-daemon");
        let listener = node.run(|| std::net::TcpListener::bind("127.0.0.1:0").expect("bind"));
        let api = test_apiserver::ApiServer::start_on(listener, test_apiserver::Options::default())
            .await
            .expect("api");
        populate(&api, 0..count);
        if legacy {
            // kubelet's hint chain: the daemon (and explain) choose the legacy back end.
            node.exec(&["iptables-legacy", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT"]);
        }
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, api.kubeconfig_yaml()).unwrap();
        let config = dir.path().join("config.conf");
        std::fs::write(
            &config,
            format!("mode: {mode}\nclusterCIDR: 10.0.0.0/8\nclientConnection: {{kubeconfig: {}}}\n", kubeconfig.display()),
        )
        .unwrap();
        let start = |log: &std::path::Path| {
            Command::new("ip")
                .args(["netns", "exec", &node.name, env!("CARGO_BIN_EXE_kube-proxy-rs")])
                .arg(format!("--config={}", config.display()))
                .args(["--hostname-override=node-a", "--v=2"])
                .args(dry_run.then_some("--dry-run"))
                .env_remove("RUST_LOG")
                .stderr(std::fs::File::create(log).unwrap())
                .spawn()
                .expect("daemon")
        };
        let until = |what: &str, check: &dyn Fn() -> bool| {
            let started = Instant::now();
            while !check() {
                assert!(started.elapsed() < Duration::from_secs(1800), "{what}");
                std::thread::sleep(Duration::from_millis(100));
            }
            started.elapsed()
        };
        let synced = |log: &std::path::Path| {
            std::fs::read_to_string(log).unwrap_or_default().contains("Synced proxy rules")
        };
        let first_log = dir.path().join("first.log");
        let mut daemon = start(&first_log);
        let first = until("the daemon did not sync", &|| synced(&first_log));
        let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.id())).unwrap_or_default();
        let field = |name: &str| status.lines().find(|l| l.starts_with(name)).map(|l| l.split_whitespace().nth(1).unwrap_or("?").to_string()).unwrap_or_default();
        let (rss, peak) = (field("VmRSS:"), field("VmHWM:"));
        let _ = Command::new("kill").args(["-TERM", &daemon.id().to_string()]).status();
        let _ = daemon.wait();
        if dry_run {
            println!(
                "{count:>6} services x 10 endpoints, the daemon with --dry-run: RSS after first sync {rss} kB (peak {peak} kB), first sync {}",
                secs(first)
            );
            return;
        }

        let second_log = dir.path().join("second.log");
        let mut daemon = start(&second_log);
        let restart = until("the restarted daemon did not sync", &|| synced(&second_log));
        if std::env::var_os("KPRS_BENCH_LOG").is_some() {
            eprintln!("{}", std::fs::read_to_string(&second_log).unwrap_or_default());
        }
        let (service, slice) = api_objects(count);
        api.apply(service).unwrap();
        api.apply(slice).unwrap();
        let followed = until("the new Service was not programmed", &|| {
            let ip = format!("172.30.{}.{}", count / 250, count % 250 + 1);
            if mode == "nftables" {
                let element = format!("{ip} . tcp . 80");
                node.output(&["nft", "list", "map", "ip", "kube-proxy", "service-ips"]).contains(&element)
            } else if mode == "ipvs" {
                node.output(&["ipvsadm", "-Ln", "-t", &format!("{ip}:80")]).contains("->")
            } else {
                let wanted = format!("bench/svc-{count}:http cluster IP");
                let tool = if legacy { "iptables-legacy" } else { "iptables-nft" };
                node.output(&[tool, "-t", "nat", "-S", "KUBE-SERVICES"]).contains(&wanted)
            }
        });
        println!(
            "{count:>6} services x 10 endpoints, the daemon in {mode} mode: RSS after first sync {rss} kB (peak {peak} kB), \
             first sync {}; restarted: first sync {}, a new Service programmed {} later",
            secs(first),
            secs(restart),
            secs(followed),
        );
        explain_timings(&node, count, if legacy { "iptables-legacy" } else { mode });
        let _ = daemon.kill();
        let _ = daemon.wait();
    });
}

/// Exits 1, saying why, unless run as root: the benchmarks work in network namespaces.
pub fn require_root(why: &str) {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("{why}");
        std::process::exit(1);
    }
}

/// The text after `flag` in a benchmark's arguments.
pub fn flag<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let at = args.iter().position(|a| a == flag)?;
    args.get(at + 1).map(String::as_str)
}

/// `--sizes 1000,5000` as numbers, or `default`.
pub fn sizes(args: &[String], default: &[usize]) -> Vec<usize> {
    flag(args, "--sizes")
        .map(|s| s.split(',').filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}
