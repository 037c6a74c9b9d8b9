//! The localhost NodePort proxy against the kernel path (root; runs in network namespaces it
//! creates and removes). The daemon runs in nftables mode with `--services N` NodePort Services
//! programmed (10,000 by default: their NodePorts repeat every 2,700, as the NodePort range
//! holds 2,768, so 2,700 listeners) and one more, `web` (32710), whose one endpoint is a real
//! echo server in a pod (a thread per connection, accepting at once). From the node itself, the same pod is reached two ways: through the
//! kernel (DNAT of the node's address, NODE_IP:32710) and through the proxy (127.0.0.1:32710).
//! Measured, each way in the same run, in interleaved rounds:
//! - connections per second: connect, read the pod's greeting, close, one after another;
//! - round-trip latency: 64-byte echoes on one open connection, p50 and p99;
//! - throughput: 64 MiB sent and echoed back on one connection.
//!
//! The ratios are the proxy's figure over the kernel's. Also the daemon's RSS and open files
//! with the feature gate off and on (its listeners), and how long after the start every
//! listener was open, against how long the first sync took with the gate off.
//!
//! `cargo bench --bench localhost_proxy` runs at 10,000 services; `-- --services N` picks the
//! size. Under `cargo test` it runs once with 50 services and short rounds, as a smoke test.

#[path = "../tests/support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::json;
use support::cluster::{Cluster, Daemon, NODE_IP, service, slice};
use support::netns::Netns;
use support::scale::api_objects;

const WEB_PORT: u16 = 32710;

struct Sizes {
    services: usize,
    connections: usize,
    round_trips: usize,
    bytes: usize,
    rounds: usize,
}

fn addr(text: &str) -> SocketAddr {
    text.parse().expect("address")
}

/// `count` connections to `to`, one after another, each read to its greeting and closed: the
/// time they took.
fn connections(to: SocketAddr, count: usize) -> Duration {
    let started = Instant::now();
    for _ in 0..count {
        let stream = TcpStream::connect_timeout(&to, Duration::from_secs(2)).expect("connect");
        let mut greeting = String::new();
        BufReader::new(&stream)
            .read_line(&mut greeting)
            .expect("greeting");
        assert!(greeting.starts_with("pod-a1"), "{greeting}");
    }
    started.elapsed()
}

/// `count` echoes of 64 bytes on one connection to `to`: each round trip's time.
fn round_trips(to: SocketAddr, count: usize) -> Vec<Duration> {
    let stream = TcpStream::connect_timeout(&to, Duration::from_secs(2)).expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut line = String::new();
    reader.read_line(&mut line).expect("greeting");
    let mut writer = stream;
    let message = format!("{}\n", "x".repeat(63));
    let mut times = Vec::with_capacity(count);
    for _ in 0..count {
        let started = Instant::now();
        writer.write_all(message.as_bytes()).expect("send");
        let mut echoed = 0;
        let mut buf = [0u8; 128];
        while echoed < message.len() {
            let n = reader.read(&mut buf).expect("echo");
            assert!(n > 0, "closed");
            echoed += n;
        }
        times.push(started.elapsed());
    }
    times
}

/// `bytes` sent on one connection to `to` and read back: the time it took.
fn throughput(to: SocketAddr, bytes: usize) -> Duration {
    let stream = TcpStream::connect_timeout(&to, Duration::from_secs(2)).expect("connect");
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut line = String::new();
    reader.read_line(&mut line).expect("greeting");
    let mut writer = stream;
    let started = Instant::now();
    let sender = std::thread::spawn(move || {
        let chunk = vec![b'y'; 64 * 1024];
        let mut sent = 0;
        while sent < bytes {
            let n = chunk.len().min(bytes - sent);
            writer.write_all(&chunk[..n]).expect("send");
            sent += n;
        }
        writer
    });
    let mut received = 0;
    let mut buf = vec![0u8; 64 * 1024];
    while received < bytes {
        let n = reader.read(&mut buf).expect("receive");
        assert!(n > 0, "closed");
        received += n;
    }
    let elapsed = started.elapsed();
    drop(sender.join());
    elapsed
}

/// One way's figures over every round.
#[derive(Default)]
struct Way {
    connections: Duration,
    count: usize,
    round_trips: Vec<Duration>,
    bulk: Duration,
    bulk_bytes: usize,
}

impl Way {
    fn measure(&mut self, node: &Netns, to: SocketAddr, sizes: &Sizes) {
        let (count, trips, bytes) = (sizes.connections, sizes.round_trips, sizes.bytes);
        let (spent, mut times, bulk) = node.run(move || {
            (
                connections(to, count),
                round_trips(to, trips),
                throughput(to, bytes),
            )
        });
        self.connections += spent;
        self.count += count;
        self.round_trips.append(&mut times);
        self.bulk += bulk;
        self.bulk_bytes += bytes;
    }

    fn per_second(&self) -> f64 {
        self.count as f64 / self.connections.as_secs_f64()
    }

    fn latency(&mut self, quantile: f64) -> Duration {
        self.round_trips.sort();
        let index = ((self.round_trips.len() - 1) as f64 * quantile).round() as usize;
        self.round_trips[index]
    }

    fn mib_per_second(&self) -> f64 {
        self.bulk_bytes as f64 / (1 << 20) as f64 / self.bulk.as_secs_f64()
    }
}

fn us(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1e6)
}

fn rss_kb(daemon: &Daemon) -> u64 {
    let pid = daemon.child.id().unwrap_or(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

fn open_files(daemon: &Daemon) -> usize {
    let pid = daemon.child.id().unwrap_or(0);
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// The listeners the daemon reports, from its metrics port.
fn listeners(node: &Netns) -> usize {
    let metrics = node.output(&["curl", "-s", "http://127.0.0.1:10249/metrics"]);
    metrics
        .lines()
        .find(|l| {
            l.starts_with("kubeproxy_nftables_localhost_nodeport_listeners{ip_family=\"IPv4\"}")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// The pod's server for this bench, on 8081: it accepts as soon as a connection comes (the
/// tests' echo server polls), greets with the pod's name, and echoes with a 64 kB buffer.
fn start_backend(pod: &Netns) {
    let listener = pod.run(|| std::net::TcpListener::bind("0.0.0.0:8081").expect("bind"));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut stream = stream;
                let _ = stream.set_nodelay(true);
                if stream.write_all(b"pod-a1\n").is_err() {
                    return;
                }
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 || stream.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
}

async fn cluster(services: usize) -> Cluster {
    let cluster = Cluster::start().await;
    for i in 0..services {
        let (service, slice) = api_objects(i);
        cluster.api.apply(service).expect("service");
        cluster.api.apply(slice).expect("slice");
    }
    let ports = json!([{"name": "http", "port": 80, "protocol": "TCP", "nodePort": WEB_PORT}]);
    let web = service("web", "10.96.0.10", ports, json!({"type": "NodePort"}));
    cluster.api.apply(web).expect("web");
    start_backend(cluster.pod("pod-a1"));
    let slice_ports = json!([{"name": "http", "port": 8081, "protocol": "TCP"}]);
    cluster
        .api
        .apply(slice("web", slice_ports, &["pod-a1"]))
        .expect("web's slice");
    cluster
}

const CONFIG: &str = "nftables:\n  syncPeriod: 1h\n  minSyncPeriod: 1s\n\
    nodePortAddresses: [primary, localhost]\n";
const GATE: &str = "featureGates:\n  KubeProxyNFTablesLocalhostNodePorts: true\n";

async fn run(sizes: &Sizes) {
    let cluster = cluster(sizes.services).await;
    let node = &cluster.node;
    let wanted = sizes.services.min(2700) + 1;

    let off = cluster.config_with_mode("nftables", CONFIG);
    let started = Instant::now();
    let daemon = Daemon::spawn(node, &off, &[]);
    daemon
        .wait_for_within("\"Synced proxy rules\"", Duration::from_secs(300))
        .await;
    let first_sync = started.elapsed();
    let (rss_off, files_off) = (rss_kb(&daemon), open_files(&daemon));
    daemon.stop().await;
    // Not the restart's sync that follows: a fresh table, as the first run had.
    node.exec(&["nft", "delete", "table", "ip", "kube-proxy"]);

    let on = cluster.config_with_mode("nftables", &format!("{CONFIG}{GATE}"));
    let started = Instant::now();
    let daemon = Daemon::spawn(node, &on, &[]);
    daemon
        .wait_for_within("\"Synced proxy rules\"", Duration::from_secs(300))
        .await;
    while listeners(node) < wanted {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "{} of {wanted} listeners",
            listeners(node)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let all_listening = started.elapsed();
    let (rss_on, files_on) = (rss_kb(&daemon), open_files(&daemon));

    let kernel_to = addr(&format!("{NODE_IP}:{WEB_PORT}"));
    let proxy_to = addr(&format!("127.0.0.1:{WEB_PORT}"));
    let (mut kernel, mut proxy) = (Way::default(), Way::default());
    for _ in 0..sizes.rounds {
        kernel.measure(node, kernel_to, sizes);
        proxy.measure(node, proxy_to, sizes);
    }
    daemon.stop().await;

    println!(
        "{} services, {wanted} listeners; {} connections, {} round trips and {} MiB each way, in {} interleaved rounds",
        sizes.services,
        kernel.count,
        kernel.round_trips.len(),
        kernel.bulk_bytes >> 20,
        sizes.rounds
    );
    println!("| measure | kernel (NODE_IP) | proxy (127.0.0.1) | proxy / kernel |");
    println!("| --- | --- | --- | --- |");
    println!(
        "| connections per second | {:.0} | {:.0} | {:.2}x |",
        kernel.per_second(),
        proxy.per_second(),
        proxy.per_second() / kernel.per_second()
    );
    for (name, q) in [("p50", 0.5), ("p99", 0.99)] {
        let (k, p) = (kernel.latency(q), proxy.latency(q));
        println!(
            "| round trip {name} (µs) | {} | {} | {:.2}x |",
            us(k),
            us(p),
            p.as_secs_f64() / k.as_secs_f64()
        );
    }
    println!(
        "| throughput (MiB/s) | {:.0} | {:.0} | {:.2}x |",
        kernel.mib_per_second(),
        proxy.mib_per_second(),
        proxy.mib_per_second() / kernel.mib_per_second()
    );
    println!();
    println!("| daemon | gate off | gate on | on / off |");
    println!("| --- | --- | --- | --- |");
    println!(
        "| RSS (kB) | {rss_off} | {rss_on} | {:.2}x |",
        rss_on as f64 / rss_off as f64
    );
    println!(
        "| open files | {files_off} | {files_on} | {:.2}x |",
        files_on as f64 / files_off as f64
    );
    println!(
        "| start to first sync / to every listener (s) | {:.2} | {:.2} | {:.2}x |",
        first_sync.as_secs_f64(),
        all_listening.as_secs_f64(),
        all_listening.as_secs_f64() / first_sync.as_secs_f64()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    support::scale::require_root("the localhost proxy benchmark needs root (network namespaces)");
    let sizes = if args.iter().any(|a| a == "--bench") {
        Sizes {
            services: support::scale::flag(&args, "--services")
                .and_then(|n| n.parse().ok())
                .unwrap_or(10_000),
            connections: 1000,
            round_trips: 2000,
            bytes: 64 << 20,
            rounds: 5,
        }
    } else {
        Sizes {
            services: 50,
            connections: 50,
            round_trips: 50,
            bytes: 1 << 20,
            rounds: 1,
        }
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(run(&sizes));
}
