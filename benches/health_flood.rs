//! Health ports under a flood (root; runs in network namespaces it creates and removes): how
//! long a load balancer's probe waits for its answer from the health port (10256) and from a
//! Service's healthCheckNodePort, first on a quiet node, then while each of the daemon's three
//! ports (10256, 10249 and the healthCheckNodePort) holds a flood of idle connections (2,000
//! held, one replaced every millisecond) and a client sending its request a byte at a time. The
//! ratio is the flood's figure over the quiet one, both measured in the same run against the
//! same daemon. Probes come 20 ms apart, so a phase of 400 spans eight seconds on each port,
//! through several header timeouts. Also the daemon's RSS, quiet and flooded, and the
//! connections it held, shed and timed out.
//!
//! It runs twice: at an open-files limit of 16,384, where the servers hold 8,192 connections
//! together as on any node whose limit is 10,923 or more (1,048,576 is common; this machine
//! cannot raise a hard limit past 20,000), more than the floods keep open at once; and at 4,096
//! (3,072 connections, fewer than the floods open: the oldest are shed).
//!
//! `cargo bench --bench health_flood` runs with 10,000 services programmed (nftables mode) and
//! 400 probes per phase; `-- --services N` picks the size. Under `cargo test` it runs once with
//! 50 services, 20 probes and floods of 200, as a smoke test.

#[path = "../tests/support/mod.rs"]
mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use support::cluster::{Cluster, Daemon, NODE_IP, local_load_balancer};
use support::flood::{Flood, raise_open_files};
use support::netns::Netns;
use support::scale::api_objects;

/// Outside the bench services' NodePorts (30000-32699).
const HEALTH_CHECK_PORT: u16 = 32700;

struct Sizes {
    services: usize,
    probes: usize,
    held: usize,
}

/// Probe latencies of one phase on one port, and how many failed.
struct Latencies {
    sorted: Vec<Duration>,
    failed: usize,
}

impl Latencies {
    fn at(&self, quantile: f64) -> Duration {
        if self.sorted.is_empty() {
            return Duration::ZERO;
        }
        let index = ((self.sorted.len() - 1) as f64 * quantile).round() as usize;
        self.sorted[index]
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

/// One GET as a load balancer sends it; Ok when the answer is a 200.
fn get(to: SocketAddr, path: &str) -> Result<(), String> {
    let mut stream =
        TcpStream::connect_timeout(&to, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {to}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| e.to_string())?;
    if answer.starts_with("HTTP/1.1 200") {
        Ok(())
    } else {
        Err(answer.lines().next().unwrap_or("").to_string())
    }
}

/// Between two probes of one phase: 400 probes span eight seconds, longer than the header
/// timeout, so that the flood's idle and slow connections time out and are replaced meanwhile.
const PROBE_EVERY: Duration = Duration::from_millis(20);

/// `count` probes of `path` on `port`, [`PROBE_EVERY`] apart, from `client`.
fn probe(client: &Netns, port: u16, path: &'static str, count: usize) -> Latencies {
    let to: SocketAddr = format!("{NODE_IP}:{port}").parse().unwrap();
    client.run(move || {
        let mut sorted = Vec::with_capacity(count);
        let mut failed = 0;
        for _ in 0..count {
            let started = Instant::now();
            match get(to, path) {
                Ok(()) => sorted.push(started.elapsed()),
                Err(_) => failed += 1,
            }
            std::thread::sleep(PROBE_EVERY);
        }
        sorted.sort();
        Latencies { sorted, failed }
    })
}

fn rss_kb(daemon: &Daemon) -> String {
    let pid = daemon.child.id().unwrap_or(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("?")
        .to_string()
}

/// The sum of a metric's values over its label sets, read from the metrics port.
fn metric_sum(node: &Netns, name: &str) -> f64 {
    let metrics = node.output(&["curl", "-s", "http://127.0.0.1:10249/metrics"]);
    metrics
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn cluster(services: usize) -> Cluster {
    let cluster = Cluster::start().await;
    for i in 0..services {
        let (service, slice) = api_objects(i);
        cluster.api.apply(service).expect("service");
        cluster.api.apply(slice).expect("slice");
    }
    local_load_balancer(
        &cluster.api,
        32701,
        HEALTH_CHECK_PORT,
        &["pod-a1", "pod-b1"],
    );
    cluster
}

async fn run_at(cluster: &Cluster, open_files: u64, sizes: &Sizes) {
    let config = cluster.config_with_mode("nftables", "metricsBindAddress: 0.0.0.0:10249\n");
    let limit = format!("--nofile={open_files}:{open_files}");
    let daemon = Daemon::spawn_wrapped(&cluster.node, &["prlimit", &limit], &config, &[], &[]);
    daemon
        .wait_for_within("\"Synced proxy rules\"", Duration::from_secs(60))
        .await;
    daemon.wait_for("Opened health check server").await;
    let targets = [(10256, "/healthz"), (HEALTH_CHECK_PORT, "/")];

    let quiet: Vec<Latencies> = targets
        .iter()
        .map(|(port, path)| probe(&cluster.client, *port, path, sizes.probes))
        .collect();
    let quiet_rss = rss_kb(&daemon);

    let floods: Vec<Flood> = [10256, 10249, HEALTH_CHECK_PORT]
        .iter()
        .map(|port| {
            let to = format!("{NODE_IP}:{port}").parse().unwrap();
            Flood::start(&cluster.client, to, sizes.held)
        })
        .collect();
    let started = Instant::now();
    while floods.iter().any(|f| f.opened() < sizes.held) {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the floods did not fill"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let flooded: Vec<Latencies> = targets
        .iter()
        .map(|(port, path)| probe(&cluster.client, *port, path, sizes.probes))
        .collect();
    let flood_rss = rss_kb(&daemon);
    let open = metric_sum(&cluster.node, "kubeproxy_rs_http_connections_open");
    let shed = metric_sum(&cluster.node, "kubeproxy_rs_http_connections_shed_total");
    let timed_out = metric_sum(
        &cluster.node,
        "kubeproxy_rs_http_connections_timed_out_total",
    );
    let capacity = metric_sum(&cluster.node, "kubeproxy_rs_http_connections_limit");
    for flood in floods {
        flood.stop();
    }
    for ((port, path), (quiet, flooded)) in targets.iter().zip(quiet.iter().zip(&flooded)) {
        let ratio =
            |q: f64| flooded.at(q).as_secs_f64() / quiet.at(q).as_secs_f64().max(f64::MIN_POSITIVE);
        println!(
            "| {open_files} ({capacity}) | {port}{path} | {} / {} / {} | {} / {} / {} | {:.2}x / {:.2}x | {} / {} |",
            ms(quiet.at(0.5)),
            ms(quiet.at(0.99)),
            ms(quiet.at(1.0)),
            ms(flooded.at(0.5)),
            ms(flooded.at(0.99)),
            ms(flooded.at(1.0)),
            ratio(0.5),
            ratio(0.99),
            quiet.failed,
            flooded.failed,
        );
    }
    println!(
        "  daemon RSS {quiet_rss} kB quiet, {flood_rss} kB flooded; {open} connections open at the end of the flood, {shed} shed, {timed_out} timed out"
    );
    daemon.stop().await;
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    support::scale::require_root("the health flood benchmark needs root (network namespaces)");
    let sizes = if args.iter().any(|a| a == "--bench") {
        let services = support::scale::flag(&args, "--services")
            .and_then(|n| n.parse().ok())
            .unwrap_or(10_000);
        Sizes {
            services,
            probes: 400,
            held: 2000,
        }
    } else {
        Sizes {
            services: 50,
            probes: 20,
            held: 200,
        }
    };
    // The floods' client side holds a file per connection, in this process.
    raise_open_files(16_384);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let cluster = cluster(sizes.services).await;
        println!(
            "{} services; {} probes per phase; floods of {} held connections on each of three ports",
            sizes.services, sizes.probes, sizes.held
        );
        println!(
            "| open files (connections) | probe | quiet p50 / p99 / max ms | flooded p50 / p99 / max ms | flooded/quiet p50 / p99 | failed quiet / flooded |"
        );
        println!("| --- | --- | --- | --- | --- | --- |");
        for open_files in [16_384, 4096] {
            run_at(&cluster, open_files, &sizes).await;
        }
    });
}
