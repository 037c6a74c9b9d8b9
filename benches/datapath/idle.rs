//! What an idle daemon costs the data path: the real daemon holding N Services, the connection
//! rate from a pod to a ClusterIP second by second, across its periodic syncs and across a
//! restart (whose first sync is a full one that reads the table back), the daemon frozen every
//! other few seconds so that the seconds without it are measured in the same minute.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

use crate::measure::{Kind, Target, spread};
use crate::rules::{PORTS, Place};
use crate::support::cluster::Daemon;
use crate::support::scale::populate;
use crate::topology::{SERVER_POD_IP, Twin};
use crate::traffic;

const SYNCED: &str = "\"Synced proxy rules\"";

/// Connections per second, second by second; whether the daemon ran in that second, and
/// whether a sync ended in it.
struct Seconds {
    rates: Vec<f64>,
    running: Vec<bool>,
    synced: Vec<bool>,
}

impl Seconds {
    fn of(&self, running: bool) -> Vec<f64> {
        self.pick(|i| self.running[i] == running)
    }

    fn pick(&self, wanted: impl Fn(usize) -> bool) -> Vec<f64> {
        (0..self.rates.len())
            .filter(|i| wanted(*i))
            .map(|i| self.rates[i])
            .collect()
    }
}

/// The daemon's CPU time so far, its own and its finished children's (the iptables tools it
/// runs), user and system, from /proc.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's closing parenthesis: utime, stime, cutime and cstime are
    // the 12th to the 15th.
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let ticks: u64 = [11, 12, 13, 14]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 10)
}

/// Freezes or thaws the daemon's process group (the daemon and the tools it runs).
fn signal(group: u32, running: bool) {
    let which = if running {
        Signal::SIGCONT
    } else {
        Signal::SIGSTOP
    };
    let _ = kill(Pid::from_raw(-(group as i32)), which);
}

/// Thaws the daemon's group when dropped, so that no panic leaves it frozen.
struct Thaw(u32);

impl Drop for Thaw {
    fn drop(&mut self) {
        signal(self.0, true);
    }
}

/// Connections from `twin`'s client pod to the ClusterIP for `window`, counted per second,
/// the daemon's process group `group` running for `slice`, then frozen (SIGSTOP) for `slice`,
/// and so on, so that each second with it is compared with seconds without it measured moments
/// apart; `lines` is its log.
fn seconds(
    twin: &Twin,
    window: Duration,
    slice: u64,
    group: u32,
    lines: Arc<Mutex<Vec<String>>>,
) -> Seconds {
    let to = Target::ClusterIp(Place::Middle).address(Kind::Connections);
    let synced_so_far = move || {
        lines
            .lock()
            .map(|l| l.iter().filter(|l| l.contains(SYNCED)).count())
            .unwrap_or(0)
    };
    twin.client.run(move || {
        let _thaw = Thaw(group);
        let signal = |running| signal(group, running);
        let started = Instant::now();
        let bins = window.as_secs().max(1) as usize;
        let running_in = |bin: usize| (bin as u64 / slice.max(1)).is_multiple_of(2);
        let mut counts = vec![0usize; bins];
        let mut synced = vec![false; bins];
        let mut seen = synced_so_far();
        let mut bin = 0;
        signal(true);
        while bin < bins {
            traffic::connections(to, 1).expect("connection to the ClusterIP");
            let now = started.elapsed().as_secs() as usize;
            if now > bin {
                let count = synced_so_far();
                synced[bin] = count > seen;
                seen = count;
                bin = now;
                if bin < bins {
                    signal(running_in(bin));
                }
            }
            if bin < bins {
                counts[bin] += 1;
            }
        }
        Seconds {
            rates: counts.into_iter().map(|c| c as f64).collect(),
            running: (0..bins).map(running_in).collect(),
            synced,
        }
    })
}

fn print(phase: &str, seconds: &Seconds, cpu: Duration) {
    let (running, _, _) = spread(&seconds.of(true));
    let (stopped, _, _) = spread(&seconds.of(false));
    let quiet = seconds.pick(|i| seconds.running[i] && !seconds.synced[i]);
    let during = seconds.pick(|i| seconds.synced[i]);
    let ratio = |values: &[f64]| {
        if values.is_empty() {
            "-".to_string()
        } else {
            let (m, l, _) = spread(values);
            format!("{:.2}x (least {:.2}x)", m / stopped, l / stopped)
        }
    };
    println!(
        "| {phase} | {running:.0} | {stopped:.0} | {} | {} in {} seconds | {} ms |",
        ratio(&quiet),
        ratio(&during),
        during.len(),
        cpu.as_millis()
    );
    println!(
        "idle-seconds\t{phase}\t{}",
        (0..seconds.rates.len())
            .map(|i| format!(
                "{}{:.0}{}",
                if seconds.running[i] { "" } else { "~" },
                seconds.rates[i],
                if seconds.synced[i] { "*" } else { "" }
            ))
            .collect::<Vec<_>>()
            .join(" ")
    );
}

/// The measured Service as API objects, its one endpoint the server pod.
fn measured_service(api: &test_apiserver::ApiServer) {
    let ports: Vec<serde_json::Value> = PORTS
        .iter()
        .map(|(name, protocol, port, _, node_port)| {
            json!({"name": name, "port": port, "protocol": protocol.to_string(), "nodePort": node_port})
        })
        .collect();
    let ip = Place::Middle.cluster_ip().to_string();
    api.apply(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "measured"},
        "spec": {"type": "NodePort", "clusterIP": ip, "clusterIPs": [ip], "ports": ports}}))
        .expect("service");
    let slice_ports: Vec<serde_json::Value> = PORTS
        .iter()
        .map(|(name, protocol, _, target, _)| json!({"name": name, "port": target, "protocol": protocol.to_string()}))
        .collect();
    api.apply(json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": "web-1", "namespace": "measured", "labels": {"kubernetes.io/service-name": "web"}},
        "ports": slice_ports,
        "endpoints": [{"addresses": [SERVER_POD_IP], "nodeName": "node-a", "conditions": {"ready": true}}]}))
        .expect("slice");
}

/// The idle daemon's cost in `mode` at `services` Services: windows of `window` in slices of
/// `slice` seconds, the daemon syncing every `sync_period`.
pub async fn run(mode: &str, services: usize, window: Duration, slice: u64, sync_period: Duration) {
    let twin = Twin::new("idle");
    let listener = twin
        .node
        .run(|| std::net::TcpListener::bind("127.0.0.1:0").expect("bind"));
    let api = test_apiserver::ApiServer::start_on(listener, test_apiserver::Options::default())
        .await
        .expect("api server");
    populate(&api, 0..services);
    measured_service(&api);
    let dir = tempfile::tempdir().expect("dir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig_yaml()).expect("kubeconfig");
    let config = dir.path().join("config.conf");
    let section = if mode == "nftables" {
        "nftables"
    } else {
        "iptables"
    };
    std::fs::write(
        &config,
        format!(
            "mode: {mode}\nclusterCIDR: 10.0.0.0/8\nclientConnection: {{kubeconfig: {}}}\n\
             {section}: {{syncPeriod: {}s, minSyncPeriod: 1s}}\n",
            kubeconfig.display(),
            sync_period.as_secs()
        ),
    )
    .expect("config");
    // In a session of its own (setsid execs it, keeping its pid): its group holds the tools it
    // runs, frozen with it.
    let spawn = || Daemon::spawn_wrapped(&twin.node, &["setsid"], &config, &[], &[]);
    let pid_of = |daemon: &Daemon| daemon.child.id().expect("the daemon's pid");
    let daemon = spawn();
    daemon
        .wait_for_within(SYNCED, Duration::from_secs(1800))
        .await;
    let pid = pid_of(&daemon);
    let before = cpu_time(pid);
    let idle = seconds(&twin, window, slice, pid, daemon.lines.clone());
    let idle_cpu = cpu_time(pid).saturating_sub(before);
    daemon.stop().await;
    let restarted = spawn();
    let pid = pid_of(&restarted);
    let restart = seconds(&twin, window, slice, pid, restarted.lines.clone());
    let restart_cpu = cpu_time(pid);
    restarted.stop().await;

    println!(
        "\nIdle daemon, {mode} mode, {services} Services x 10 endpoints, syncPeriod {}s: connections per second from a pod to a ClusterIP, second by second over {}s, the daemon running {slice}s then frozen (SIGSTOP) {slice}s in turn",
        sync_period.as_secs(),
        window.as_secs()
    );
    println!(
        "| phase | conn/s, median of the seconds it ran | conn/s, median of the seconds it was frozen | seconds it ran without a sync ending, x frozen | seconds a sync ended in, x frozen | the daemon's CPU time in the window |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    print("running after its first sync", &idle, idle_cpu);
    print("restarted (its first sync is full)", &restart, restart_cpu);
}
