//! iptables mode benchmark (root; runs in network namespaces it creates and removes):
//! for N services x 10 endpoints, the render time, a full sync end to end against a bare
//! `iptables-restore` of the same text, a one-endpoint-change sync against a bare
//! `iptables-restore --noflush` of the same minimal change, and the daemon's RSS.
//!
//! `cargo bench --bench iptables` runs 1k and 10k services on nft;
//! `cargo bench --bench iptables -- --sizes 1000 --legacy` picks sizes and the legacy back end;
//! `--only-daemon` measures only the daemon's RSS, `--no-daemon` everything else.
//! Under `cargo test` it runs once at 50 services as a smoke test.

#[path = "../tests/support/netns.rs"]
mod netns;
#[path = "../tests/support/scale.rs"]
mod scale;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kube_proxy_rs::model::{ChangeSummary, IpFamily, NamespacedName, ProxyState};
use kube_proxy_rs::proxier::Proxier;
use kube_proxy_rs::proxier::iptables::IptablesProxier;
use kube_proxy_rs::proxier::iptables::render::{
    LocalDetector, NodePortAddresses, RenderContext, render_service,
};
use kube_proxy_rs::sys::iptables::{Backend, SystemIptables, tool};
use kube_proxy_rs::sys::net::{FakeSysctl, FixedAddresses};
use netns::Netns;
use scale::{median, secs};

fn bare_restore(ns: &Netns, backend: Backend, text: &str, noflush: bool) -> Duration {
    let started = Instant::now();
    let mut args = vec![
        "netns".to_string(),
        "exec".into(),
        ns.name.clone(),
        tool(IpFamily::V4, backend, "restore"),
        "-w".into(),
        "5".into(),
    ];
    if noflush {
        args.push("--noflush".into());
    }
    let mut child = Command::new("ip")
        .args(&args)
        .stdin(Stdio::piped())
        .spawn()
        .expect("restore");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "bare restore failed");
    started.elapsed()
}

/// One measurement in fresh namespaces: (full sync, bare full restore, change sync, bare change
/// restore, restore lines, change lines).
fn measure(
    state: &ProxyState,
    backend: Backend,
) -> (Duration, Duration, Duration, Duration, usize, usize) {
    let ours = Netns::new("bench-ours");
    let bare = Netns::new("bench-bare");
    let mut state = state.clone();
    let (full, full_text, change, change_text) = ours.run(move || {
        let mut p = IptablesProxier::new(
            SystemIptables::new(backend),
            scale::iptables_settings("10.0.0.0/8"),
            Box::new(FixedAddresses(vec![])),
            Box::new(FakeSysctl::default()),
        );
        p.record_restores = true;
        let started = Instant::now();
        p.sync(&state, &ChangeSummary::default())
            .expect("full sync");
        let full = started.elapsed();
        let full_text = p.last_restore[0].1.clone();
        let key = NamespacedName::new("bench", "svc-7");
        let ports = state.endpoints.get_mut(&key).unwrap();
        ports.values_mut().next().unwrap().pop();
        let changes = ChangeSummary {
            changed_services: [key].into(),
            ..ChangeSummary::default()
        };
        let started = Instant::now();
        let report = p.sync(&state, &changes).expect("partial sync");
        let change = started.elapsed();
        assert!(!report.full);
        (full, full_text, change, p.last_restore[0].1.clone())
    });
    if let Ok(path) = std::env::var("KPRS_BENCH_DUMP") {
        std::fs::write(path, &full_text).expect("dump restore text");
    }
    let bare_full = bare_restore(&bare, backend, &full_text, true);
    let bare_change = bare_restore(&bare, backend, &change_text, true);
    (
        full,
        bare_full,
        change,
        bare_change,
        full_text.lines().count(),
        change_text.lines().count(),
    )
}

fn run(count: usize, backend: Backend, runs: usize) {
    let state = scale::state(count);
    let ctx = RenderContext {
        family: IpFamily::V4,
        node_name: "node-a".into(),
        zone: None,
        node_ip: Some("192.168.0.2".parse().unwrap()),
        masquerade_mark: 0x4000,
        masquerade_all: false,
        local_detector: LocalDetector::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]),
        localhost_node_ports: true,
        node_port_addresses: NodePortAddresses::All,
        tcp_be_liberal: false,
    };
    let started = Instant::now();
    let rendered: usize = state
        .services
        .iter()
        .map(|(k, p)| render_service(p, state.endpoints.get(k), &ctx).chains.len())
        .sum();
    let render = started.elapsed();
    let samples: Vec<_> = (0..runs).map(|_| measure(&state, backend)).collect();
    let (lines, change_lines) = (samples[0].4, samples[0].5);
    let full = median(samples.iter().map(|s| s.0).collect());
    let bare_full = median(samples.iter().map(|s| s.1).collect());
    let change = median(samples.iter().map(|s| s.2).collect());
    let bare_change = median(samples.iter().map(|s| s.3).collect());
    println!(
        "{count:>6} services x 10 endpoints ({}, {lines} restore lines, {rendered} chains, median of {runs}): render {}, \
         full sync {} vs bare restore {} (ratio {:.2}), one-endpoint change {} vs bare noflush {} (ratio {:.2}, {change_lines} lines)",
        backend.as_str(),
        secs(render),
        secs(full),
        secs(bare_full),
        full.as_secs_f64() / bare_full.as_secs_f64(),
        secs(change),
        secs(bare_change),
        change.as_secs_f64() / bare_change.as_secs_f64(),
    );
}

/// Runs the real daemon in a namespace against the test API server holding `count` services x 10
/// endpoints, and reads its resident memory after the first full sync.
fn daemon_rss(count: usize) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let node = Netns::new("bench-daemon");
        let listener = node.run(|| std::net::TcpListener::bind("127.0.0.1:0").expect("bind"));
        let api = test_apiserver::ApiServer::start_on(listener, test_apiserver::Options::default()).await.expect("api");
        api.apply(serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.2"}]}})).unwrap();
        for i in 0..count {
            let ip = format!("172.30.{}.{}", i / 250, i % 250 + 1);
            api.apply(serde_json::json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": format!("svc-{i}"), "namespace": "bench"},
                "spec": {"clusterIP": ip, "clusterIPs": [ip], "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}})).unwrap();
            let endpoints: Vec<serde_json::Value> = (0..10)
                .map(|e| serde_json::json!({"addresses": [format!("10.{}.{}.{}", i / 250, i % 250, e + 1)], "nodeName": "node-b"}))
                .collect();
            api.apply(serde_json::json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
                "metadata": {"name": format!("svc-{i}-1"), "namespace": "bench", "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}], "endpoints": endpoints})).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, api.kubeconfig_yaml()).unwrap();
        let config = dir.path().join("config.conf");
        std::fs::write(&config, format!("clusterCIDR: 10.0.0.0/8\nclientConnection: {{kubeconfig: {}}}\n", kubeconfig.display())).unwrap();
        let log = dir.path().join("daemon.log");
        let mut child = Command::new("ip")
            .args(["netns", "exec", &node.name, env!("CARGO_BIN_EXE_kube-proxy-rs")])
            .arg(format!("--config={}", config.display()))
            .args(["--hostname-override=node-a", "--v=2"])
            .env_remove("RUST_LOG")
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("daemon");
        let started = Instant::now();
        while !std::fs::read_to_string(&log).unwrap_or_default().contains("Synced proxy rules") {
            assert!(started.elapsed() < Duration::from_secs(600), "daemon did not sync");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap_or_default();
        let field = |name: &str| status.lines().find(|l| l.starts_with(name)).map(|l| l.split_whitespace().nth(1).unwrap_or("?").to_string()).unwrap_or_default();
        println!("{count:>6} services x 10 endpoints: daemon RSS after first sync {} kB (peak {} kB), first sync {}", field("VmRSS:"), field("VmHWM:"), secs(started.elapsed()));
        let _ = child.kill();
        let _ = child.wait();
    });
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("the iptables benchmark needs root (network namespaces)");
        std::process::exit(1);
    }
    let backend = if args.iter().any(|a| a == "--legacy") {
        Backend::Legacy
    } else {
        Backend::Nft
    };
    if !args.iter().any(|a| a == "--bench") {
        run(50, backend, 1);
        daemon_rss(50);
        return;
    }
    let sizes: Vec<usize> = args
        .iter()
        .position(|a| a == "--sizes")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.split(',').filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_else(|| vec![1000, 10000]);
    for count in sizes {
        if !args.iter().any(|a| a == "--only-daemon") {
            // A full nft restore of 10k services takes minutes here: one run is all there is time for.
            let runs = if backend == Backend::Nft && count > 2000 {
                1
            } else {
                3
            };
            run(count, backend, runs);
        }
        if !args.iter().any(|a| a == "--no-daemon") {
            daemon_rss(count);
        }
    }
}
