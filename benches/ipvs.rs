//! IPVS mode benchmark, run inside the VM (tests/vm/run-in-vm.sh; this kernel has no IPVS):
//! for N services x 10 endpoints (ClusterIP + NodePort on one node address), a full sync of our
//! proxier against the kernel floor of the same state loaded by `ipvsadm -R`, `ipset restore` and
//! `ip -batch` (the kube-ipvs0 addresses), and a one-endpoint-change sync against one `ipvsadm`
//! deleting that real server. Both sides run in fresh namespaces of the same VM.
//!
//! `cargo bench --bench ipvs` runs 1k and 10k, then the real daemon in IPVS mode at each size (its
//! RSS, first sync, restart; `--only-daemon` / `--no-daemon` pick one); `-- --sizes 1000` picks
//! sizes; `--svg PATH` says where the chart goes (`target/benchmarks/ipvs.svg` by default).
//! Under `cargo test`
//! it runs once at 50 services as a smoke test. The VM is emulated (TCG), so absolute times are
//! several times a real machine's: the ratios are the result.

#[path = "../tests/support/chart.rs"]
mod chart;
#[path = "../tests/support/netns.rs"]
mod netns;
#[path = "../tests/support/scale.rs"]
mod scale;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use chart::Chart;
use kube_proxy_rs::model::{ChangeSummary, IpFamily, NamespacedName, ProxyState};
use kube_proxy_rs::proxier::Proxier;
use kube_proxy_rs::proxier::context::FamilyContext;
use kube_proxy_rs::proxier::ipvs::aggregate::render;
use kube_proxy_rs::proxier::ipvs::render::IpvsContext;
use kube_proxy_rs::proxier::local::LocalDetector;
use netns::Netns;
use scale::{NODE_IP, median, secs};

struct Sample {
    full: Duration,
    floor_full: Duration,
    change: Duration,
    floor_change: Duration,
    restart: Duration,
    virtual_servers: usize,
}

fn measure(state: &ProxyState) -> Sample {
    let ours = Netns::new("bench-ipvs");
    let floor = Netns::new("bench-floor");
    let mut state = state.clone();
    let key = NamespacedName::new("bench", "svc-7");
    let removed = state.endpoints[&key]
        .values()
        .next()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    let (full, change, restart) = ours.run(move || {
        let mut p = scale::ipvs_proxier();
        let started = Instant::now();
        assert!(
            p.sync(&state, &ChangeSummary::default())
                .expect("full sync")
                .full
        );
        let full = started.elapsed();
        state
            .endpoints
            .get_mut(&key)
            .unwrap()
            .values_mut()
            .next()
            .unwrap()
            .pop();
        let changes = ChangeSummary {
            changed_services: [key].into(),
            ..ChangeSummary::default()
        };
        let started = Instant::now();
        assert!(!p.sync(&state, &changes).expect("change sync").full);
        let change = started.elapsed();
        // A restart: a new proxier's first sync on the programmed node.
        let started = Instant::now();
        scale::ipvs_proxier()
            .sync(&state, &ChangeSummary::default())
            .expect("restart sync");
        (full, change, started.elapsed())
    });
    // The floor loads the same state, as our full sync left it, with the kernel's own tools.
    let ipvs = ours.output(&["ipvsadm", "-Sn"]);
    let sets = ours.output(&["ipset", "save"]);
    let addresses: String = ours
        .output(&["ip", "-o", "addr", "show", "dev", "kube-ipvs0"])
        .lines()
        .filter_map(|line| line.split_whitespace().nth(3))
        .map(|cidr| format!("addr add {cidr} dev kube-ipvs0\n"))
        .collect();
    floor.output(&["ip", "link", "add", "kube-ipvs0", "type", "dummy"]);
    let floor_full = floor.feed("ipvsadm", &["-R"], &ipvs)
        + floor.feed("ipset", &["restore"], &sets)
        + floor.feed("ip", &["-batch", "-"], &addresses);
    let cluster_ip = "172.30.0.8:80";
    let real = format!("{}:{}", removed.ip, removed.port);
    let started = Instant::now();
    floor.output(&["ipvsadm", "-d", "-t", cluster_ip, "-r", &real]);
    let floor_change = started.elapsed();
    assert!(!floor.output(&["ipvsadm", "-Ln"]).contains(&real));
    Sample {
        full,
        floor_full,
        change,
        floor_change,
        restart,
        virtual_servers: ipvs.lines().filter(|l| l.starts_with("-A")).count(),
    }
}

fn run(count: usize, runs: usize) {
    let state = scale::state(count);
    let ctx = IpvsContext {
        common: FamilyContext {
            family: IpFamily::V4,
            node_name: "node-a".into(),
            zone: None,
            node_ip: Some(NODE_IP.parse().unwrap()),
            masquerade_mark: 0x4000,
            masquerade_all: false,
            local_detector: LocalDetector::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]),
        },
        node_port_ips: vec![NODE_IP.parse().unwrap()],
        local_addresses: vec![NODE_IP.parse().unwrap()],
        scheduler: "rr".into(),
    };
    let started = Instant::now();
    let rendered = render(&state, &ctx).services.len();
    let render_time = started.elapsed();
    let samples: Vec<Sample> = (0..runs).map(|_| measure(&state)).collect();
    assert_eq!(samples[0].virtual_servers, rendered);
    let pick = |f: fn(&Sample) -> Duration| median(samples.iter().map(f).collect());
    let (full, floor_full) = (pick(|s| s.full), pick(|s| s.floor_full));
    let (change, floor_change) = (pick(|s| s.change), pick(|s| s.floor_change));
    let restart = pick(|s| s.restart);
    // Printed as chart points: the host draws the chart (the VM's root is read-only).
    let mut chart = Chart::new("");
    chart.add("full sync", chart::FIRST_SYNC, count, full);
    chart.add(
        "kernel tools, same state",
        chart::BARE_LOAD,
        count,
        floor_full,
    );
    chart.add("restart", chart::RESTART, count, restart);
    chart.add("one-endpoint change", chart::CHANGE, count, change);
    chart.add("one ipvsadm -d", chart::BARE_CHANGE, count, floor_change);
    println!(
        "{count:>6} services x 10 endpoints ({rendered} virtual servers, median of {runs}, in the VM): render {}, \
         full sync {} vs ipvsadm -R + ipset restore + ip -batch {} (ratio {:.2}), \
         one-endpoint change {} vs one ipvsadm -d {} (ratio {:.2}), \
         restart (a new proxier's first sync on the programmed node) {} (ratio to the full sync {:.2})",
        secs(render_time),
        secs(full),
        secs(floor_full),
        full.as_secs_f64() / floor_full.as_secs_f64(),
        secs(change),
        secs(floor_change),
        change.as_secs_f64() / floor_change.as_secs_f64(),
        secs(restart),
        restart.as_secs_f64() / full.as_secs_f64(),
    );
}

/// On the host: re-runs this benchmark in the VM with the same arguments, passing its output
/// on, and draws the chart of the points it printed.
fn run_in_vm(args: &[String]) {
    let harness = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vm/run-in-vm.sh");
    let mut child = Command::new(harness)
        .env("KPRS_IN_VM", "1")
        .env("VM_MEM", "2048")
        .env("VM_TIMEOUT", "3000")
        .arg(std::env::current_exe().expect("bench binary"))
        .args(&args[1..])
        .stdout(Stdio::piped())
        .spawn()
        .expect("run the VM harness");
    let mut output = String::new();
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line.expect("the VM's output");
        println!("{line}");
        output.push_str(&line);
        output.push('\n');
    }
    let status = child.wait().expect("the VM harness");
    let mut chart = Chart::new("IPVS mode (in the VM): full sync, restart, one change");
    chart.absorb(&output);
    chart.write(&chart::path_from_args(args, "ipvs"));
    std::process::exit(status.code().unwrap_or(1));
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    scale::require_root(
        "the IPVS benchmark needs root (it boots a VM and uses network namespaces)",
    );
    if std::env::var_os("KPRS_IN_VM").is_none() {
        return run_in_vm(&args);
    }
    if !args.iter().any(|a| a == "--bench") {
        run(50, 1);
        return;
    }
    let sizes: Vec<usize> = scale::sizes(&args, &[1000, 10000]);
    for count in sizes {
        if !args.iter().any(|a| a == "--only-daemon") {
            run(count, if count > 2000 { 1 } else { 3 });
        }
        if !args.iter().any(|a| a == "--no-daemon") {
            scale::daemon_run(count, "ipvs");
        }
    }
}
