//! iptables mode benchmark (root; runs in network namespaces it creates and removes):
//! for N services x 10 endpoints, the render time, a full sync end to end against a bare
//! `iptables-restore` of the same text and against the same rules in one transaction per table
//! (upstream's shape), a one-endpoint-change sync against a bare `iptables-restore --noflush` of
//! the same minimal change, a forced full sync on the running node, a restart (a new proxier's
//! first sync on the programmed node), the reads a full sync makes, and the real daemon: its RSS,
//! its first sync, its first sync after a restart, and a Service created after the restart.
//!
//! `cargo bench --bench iptables` runs 1k and 10k services on nft;
//! `cargo bench --bench iptables -- --sizes 1000 --legacy` picks sizes and the legacy back end;
//! `--only-daemon` measures only the daemon's RSS, `--no-daemon` everything else,
//! `--no-one-transaction` skips the one-transaction restore (minutes at 10k),
//! `--one-transaction-up-to N` runs it only up to N services; `--svg PATH` says where the
//! chart goes (`target/benchmarks/iptables-<back end>.svg` by default).
//! Under `cargo test` it runs once at 50 services as a smoke test.

/// The daemon's allocator, so that what is measured here is what the daemon does.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[path = "../tests/support/chart.rs"]
mod chart;
#[path = "../tests/support/netns.rs"]
mod netns;
#[path = "../tests/support/scale.rs"]
mod scale;

use std::process::Command;
use std::time::{Duration, Instant};

use chart::Chart;
use kube_proxy_rs::model::{ChangeSummary, IpFamily, NamespacedName, ProxyState};
use kube_proxy_rs::proxier::Proxier;
use kube_proxy_rs::proxier::context::FamilyContext;
use kube_proxy_rs::proxier::iptables::IptablesProxier;
use kube_proxy_rs::proxier::iptables::plan::{FullSyncExtras, full_restore};
use kube_proxy_rs::proxier::iptables::render::{
    LocalDetector, NodePortAddresses, RenderContext, render_base, render_service,
};
use kube_proxy_rs::sys::host::net::{FakeSysctl, FixedAddresses};
use kube_proxy_rs::sys::xtables::{Backend, Iptables, SystemIptables, tool};
use netns::Netns;
use scale::{median, secs};

fn bare_restore(ns: &Netns, backend: Backend, text: &str, noflush: bool) -> Duration {
    let mut args = vec!["-w", "5"];
    if noflush {
        args.push("--noflush");
    }
    ns.feed(&tool(IpFamily::V4, backend, "restore"), &args, text)
}

/// One run's figures, each in fresh namespaces.
struct Sample {
    /// Our first (full) sync into an empty namespace.
    full: Duration,
    /// The bare restore of the same input into another empty namespace.
    bare_full: Duration,
    /// The bare restore of the same rules as one transaction per table (upstream's shape).
    one_transaction: Option<Duration>,
    /// A one-endpoint change, and the bare noflush restore of the same lines.
    change: Duration,
    bare_change: Duration,
    /// A full sync forced on the running proxier (the hourly one, or after a failure).
    forced: Duration,
    /// A new proxier's first sync on the programmed node (a daemon restart), and the restore
    /// lines it wrote.
    restart: Duration,
    restart_lines: usize,
    /// The syncs after the restart that check the endpoint chains it kept by name: their
    /// total time and how many.
    checks: Duration,
    check_syncs: usize,
    /// What a full sync reads: nat's chain names and the built-in chains' rules.
    reads: Duration,
    /// One sync repairing a flushed service chain and a DROP in filter KUBE-SERVICES (nft).
    repair: Option<Duration>,
    lines: usize,
    change_lines: usize,
}

/// The syncs after a full sync that check the endpoint chains it kept by name (nft), until
/// none is left: how many, and their total time. Each must write nothing.
fn check_kept_chains(
    p: &mut IptablesProxier<SystemIptables>,
    state: &ProxyState,
) -> (usize, Duration) {
    let (mut syncs, mut total) = (0, Duration::ZERO);
    while p.endpoint_chains_to_check() > 0 {
        let started = Instant::now();
        let report = p
            .sync(state, &ChangeSummary::default())
            .expect("checking sync");
        total += started.elapsed();
        syncs += 1;
        assert_eq!(report.repaired_chains, 0, "nothing differs");
    }
    (syncs, total)
}

fn measure(state: &ProxyState, backend: Backend, one_transaction: Option<&str>) -> Sample {
    let ours = Netns::new("bench-ours");
    let bare = Netns::new("bench-bare");
    let mut state = state.clone();
    let proxier = move || {
        let mut p = IptablesProxier::new(
            SystemIptables::new(backend),
            scale::iptables_settings("10.0.0.0/8"),
            Box::new(FixedAddresses(vec![])),
            Box::new(FakeSysctl::default()),
        );
        p.record_transactions = true;
        p
    };
    let timed = |f: &mut dyn FnMut()| {
        let started = Instant::now();
        f();
        started.elapsed()
    };
    let (sample, full_text, change_text) = ours.run(move || {
        let mut p = proxier();
        let full = timed(&mut || {
            p.sync(&state, &ChangeSummary::default())
                .expect("full sync");
        });
        let full_text = p.last_transactions[0].1.clone();
        let key = NamespacedName::new("bench", "svc-7");
        let ports = state.endpoints.get_mut(&key).unwrap();
        ports.values_mut().next().unwrap().pop();
        let changes = ChangeSummary {
            changed_services: [key].into(),
            ..ChangeSummary::default()
        };
        let change = timed(&mut || {
            assert!(!p.sync(&state, &changes).expect("partial sync").full);
        });
        let change_text = p.last_transactions[0].1.clone();
        p.force_full_sync();
        let forced = timed(&mut || {
            assert!(
                p.sync(&state, &ChangeSummary::default())
                    .expect("forced full sync")
                    .full
            );
        });
        check_kept_chains(&mut p, &state);
        let mut restart_lines = 0;
        let mut restarted = proxier();
        let restart = timed(&mut || {
            restarted
                .sync(&state, &ChangeSummary::default())
                .expect("first sync after a restart");
            restart_lines = restarted
                .last_transactions
                .iter()
                .map(|(_, t)| t.lines().count())
                .sum();
        });
        let (check_syncs, checks) = check_kept_chains(&mut restarted, &state);
        let mut iptables = SystemIptables::new(backend);
        let reads = timed(&mut || {
            iptables
                .chain_names(IpFamily::V4, "nat")
                .expect("chain names");
            iptables
                .chain_rules(
                    IpFamily::V4,
                    "nat",
                    &["PREROUTING", "OUTPUT", "POSTROUTING"],
                )
                .expect("nat built-in chains");
            iptables
                .chain_rules(IpFamily::V4, "filter", &["INPUT", "FORWARD", "OUTPUT"])
                .expect("filter built-in chains");
        });
        // Drift (nft: the kernel's change events): another program flushes a service chain and
        // puts a DROP first in filter KUBE-SERVICES; one sync repairs both.
        let repair = (backend == Backend::Nft).then(|| {
            let events = kube_proxy_rs::sys::nf_tables::events::NfEvents::start(
                kube_proxy_rs::sys::nf_tables::events::Scope::IptablesTables,
                Box::new(|| {}),
            )
            .expect("nf_tables events");
            let mut p = p.with_change_events(Box::new(events));
            let chain = kube_proxy_rs::proxier::iptables::names::cluster_policy_chain(
                &kube_proxy_rs::model::ServicePortName::new(
                    "bench",
                    "svc-7",
                    "http",
                    kube_proxy_rs::model::Protocol::Tcp,
                ),
            );
            let tool = |args: &[&str]| {
                assert!(
                    Command::new("iptables-nft")
                        .args(args)
                        .status()
                        .unwrap()
                        .success()
                );
            };
            tool(&["-t", "nat", "-F", &chain]);
            tool(&["-I", "KUBE-SERVICES", "1", "-j", "DROP"]);
            std::thread::sleep(Duration::from_millis(200));
            let mut repaired = 0;
            let time = timed(&mut || {
                repaired = p
                    .sync(&state, &ChangeSummary::default())
                    .expect("repair")
                    .repaired_chains;
            });
            assert_eq!(repaired, 2, "both repaired");
            time
        });
        let sample = Sample {
            repair,
            full,
            bare_full: Duration::ZERO,
            one_transaction: None,
            change,
            bare_change: Duration::ZERO,
            forced,
            restart,
            restart_lines,
            checks,
            check_syncs,
            reads,
            lines: full_text.lines().count(),
            change_lines: change_text.lines().count(),
        };
        (sample, full_text, change_text)
    });
    if let Ok(path) = std::env::var("KPRS_BENCH_DUMP") {
        std::fs::write(path, &full_text).expect("dump restore text");
    }
    let bare_full = bare_restore(&bare, backend, &full_text, true);
    let bare_change = bare_restore(&bare, backend, &change_text, true);
    let one_transaction = one_transaction.map(|text| {
        let fresh = Netns::new("bench-one");
        bare_restore(&fresh, backend, text, true)
    });
    Sample {
        bare_full,
        bare_change,
        one_transaction,
        ..sample
    }
}

/// The same rules as one transaction per table (as upstream writes them), for a fresh node.
fn one_transaction_text(state: &ProxyState, ctx: &RenderContext) -> String {
    let base = render_base(ctx);
    let services = state
        .services
        .iter()
        .map(|(k, p)| (k.clone(), render_service(p, state.endpoints.get(k), ctx)))
        .filter(|(_, rules)| !rules.is_empty())
        .collect();
    let extras = FullSyncExtras {
        missing_jumps: &base.jumps(),
        ..FullSyncExtras::default()
    };
    full_restore(&base, &services, &extras).0
}

fn run(count: usize, backend: Backend, runs: usize, with_one_transaction: bool, chart: &mut Chart) {
    let state = scale::state(count);
    let ctx = RenderContext {
        common: FamilyContext {
            family: IpFamily::V4,
            node_name: "node-a".into(),
            zone: None,
            node_ip: Some("192.168.0.2".parse().unwrap()),
            masquerade_mark: 0x4000,
            masquerade_all: false,
            local_detector: LocalDetector::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]),
        },
        localhost_node_ports: true,
        localhost_proxy: false,
        node_port_addresses: NodePortAddresses::All,
        tcp_be_liberal: false,
        nfacct: Default::default(),
    };
    let started = Instant::now();
    let rendered: usize = state
        .services
        .iter()
        .map(|(k, p)| render_service(p, state.endpoints.get(k), &ctx).chains.len())
        .sum();
    let render = started.elapsed();
    // On legacy both are one transaction per table: nothing to compare.
    let one_text = (with_one_transaction && backend == Backend::Nft)
        .then(|| one_transaction_text(&state, &ctx));
    let samples: Vec<Sample> = (0..runs)
        .map(|_| measure(&state, backend, one_text.as_deref()))
        .collect();
    let (lines, change_lines) = (samples[0].lines, samples[0].change_lines);
    let med = |f: fn(&Sample) -> Duration| median(samples.iter().map(f).collect());
    let (full, bare_full) = (med(|s| s.full), med(|s| s.bare_full));
    let (change, bare_change) = (med(|s| s.change), med(|s| s.bare_change));
    let (forced, restart, reads) = (med(|s| s.forced), med(|s| s.restart), med(|s| s.reads));
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
    chart.add("cold start", chart::FIRST_SYNC, count, full);
    chart.add(
        "bare restore, same text",
        chart::BARE_LOAD,
        count,
        bare_full,
    );
    chart.add("restart", chart::RESTART, count, restart);
    chart.add("one-endpoint change", chart::CHANGE, count, change);
    chart.add(
        "bare noflush restore of it",
        chart::BARE_CHANGE,
        count,
        bare_change,
    );
    let checks = med(|s| s.checks);
    println!(
        "{count:>6} services: restart (first sync on the programmed node) {} (ratio to cold start {:.2}, \
         {} restore lines written; then {} syncs checking the endpoint chains kept by name, {} in all), \
         forced full sync {} (ratio {:.2}), reads of a full sync {}",
        secs(restart),
        restart.as_secs_f64() / full.as_secs_f64(),
        samples[0].restart_lines,
        samples[0].check_syncs,
        secs(checks),
        secs(forced),
        forced.as_secs_f64() / full.as_secs_f64(),
        secs(reads),
    );
    if let Some(repair) = samples.iter().filter_map(|s| s.repair).min() {
        println!(
            "{count:>6} services: drift repair (a flushed service chain, a DROP in filter KUBE-SERVICES) {}",
            secs(repair)
        );
    }
    if let Some(one) = samples.iter().filter_map(|s| s.one_transaction).min() {
        chart.add("upstream's shape", chart::UPSTREAM_SHAPE, count, one);
        println!(
            "{count:>6} services: the same rules in one transaction per table (upstream's shape): bare restore {} \
             (ours is {:.1}x faster)",
            secs(one),
            one.as_secs_f64() / full.as_secs_f64(),
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    scale::require_root("the iptables benchmark needs root (network namespaces)");
    let backend = if args.iter().any(|a| a == "--legacy") {
        Backend::Legacy
    } else {
        Backend::Nft
    };
    let with_one_transaction = !args.iter().any(|a| a == "--no-one-transaction");
    // The one-transaction restore grows with the square of its size: this caps where it runs.
    let one_transaction_up_to = scale::flag(&args, "--one-transaction-up-to")
        .and_then(|n| n.parse().ok())
        .unwrap_or(usize::MAX);
    let mut chart = Chart::new(&format!(
        "iptables mode ({}): cold start, restart, one change",
        backend.as_str()
    ));
    let svg = chart::path_from_args(&args, &format!("iptables-{}", backend.as_str()));
    if !args.iter().any(|a| a == "--bench") {
        run(50, backend, 1, true, &mut chart);
        chart.write(&svg);
        scale::daemon_run(50, "iptables");
        return;
    }
    let sizes: Vec<usize> = scale::sizes(&args, &[1000, 10000]);
    if args.iter().any(|a| a == "--dry-run") {
        // The watch side and the model alone, with nothing programmed.
        for count in sizes {
            scale::daemon_run(count, "dry-run");
        }
        return;
    }
    for count in sizes {
        if !args.iter().any(|a| a == "--only-daemon") {
            // A full nft restore of 10k services takes minutes here: one run is all there is time for.
            let runs = if backend == Backend::Nft && count > 2000 {
                1
            } else {
                3
            };
            let one_transaction = with_one_transaction && count <= one_transaction_up_to;
            run(count, backend, runs, one_transaction, &mut chart);
            chart.write(&svg);
        }
        if !args.iter().any(|a| a == "--no-daemon") {
            let mode = match backend {
                Backend::Legacy => "iptables-legacy",
                Backend::Nft => "iptables",
            };
            scale::daemon_run(count, mode);
        }
    }
}
