//! nftables mode benchmark (root; runs in network namespaces it creates and removes): for N
//! services x 10 endpoints, our first (full) sync into an empty namespace against a bare
//! `nft -f` of the same transaction into another one, a one-endpoint change against a bare
//! `nft -f` of the same change and against a forced full sync on the same node (what a
//! whole-table rewrite costs, as upstream's hourly sync does), the same forced full sync as the
//! daemon runs it (with the kernel's change events: only differences written), restarts (a
//! new proxier's first sync on the programmed node; the median of five and the slowest), the
//! sync after one (which reads the table back), and a restart after one endpoint came while no
//! proxier ran.
//!
//! Then the real daemon in nftables mode (as the iptables benchmark runs it): RSS, first sync,
//! restart, a new Service after it.
//!
//! `cargo bench --bench nftables` runs 1k and 5k services; `-- --sizes 1000,10000` picks sizes;
//! `--only-daemon` / `--no-daemon` pick a part; `--svg PATH` says where the chart goes
//! (`target/benchmarks/nftables.svg` by default); `--no-one-transaction` skips the
//! one-transaction baselines: our table as one `nft -f`, and the same services in upstream
//! 1.37's shape (an anonymous map per service) as one `nft -f`, as upstream writes its table.
//! Under `cargo test` it runs once at 50 services as a smoke test.

#[path = "../tests/support/chart.rs"]
mod chart;
#[path = "../tests/support/netns.rs"]
mod netns;
#[path = "../tests/support/nft_files.rs"]
mod nft_files;
#[path = "../tests/support/scale.rs"]
mod scale;

use std::time::{Duration, Instant};

use chart::Chart;
use kube_proxy_rs::config::KubeProxyConfiguration;
use kube_proxy_rs::model::{ChangeSummary, Endpoint, NamespacedName, ProxyState};
use kube_proxy_rs::proxier::Proxier;
use kube_proxy_rs::proxier::nftables::names;
use kube_proxy_rs::proxier::nftables::render::TABLE;
use kube_proxy_rs::proxier::nftables::{NftablesProxier, NftablesSettings};
use kube_proxy_rs::sys::host::net::FixedAddresses;
use kube_proxy_rs::sys::nf_tables::SystemNftables;
use kube_proxy_rs::sys::nf_tables::events::{NfEvents, Scope};
use netns::Netns;
use nft_files::{bare_nft, upstream_shaped};
use scale::{NODE_IP, secs};

fn proxier() -> NftablesProxier<SystemNftables> {
    let mut config = KubeProxyConfiguration {
        cluster_cidr: "10.0.0.0/8".into(),
        ..KubeProxyConfiguration::default()
    };
    config.apply_defaults();
    let mut p = NftablesProxier::new(
        SystemNftables::default(),
        NftablesSettings::from_config(&config),
        Box::new(FixedAddresses(vec![NODE_IP.parse().unwrap()])),
    );
    p.record_transactions = true;
    p
}

/// A sync in `ns`, timed, with the transactions it wrote.
fn timed_sync(
    ns: &Netns,
    mut p: NftablesProxier<SystemNftables>,
    state: ProxyState,
    changes: ChangeSummary,
) -> (NftablesProxier<SystemNftables>, Duration, String) {
    ns.run(move || {
        let started = Instant::now();
        p.sync(&state, &changes).expect("sync");
        let elapsed = started.elapsed();
        let text: String = p.last_transactions.iter().map(|t| t.1.clone()).collect();
        (p, elapsed, text)
    })
}

/// One-endpoint changes timed, of which the median is reported.
const CHANGES: usize = 21;

/// Restarts timed, of which the median and the slowest are reported.
const RESTARTS: usize = 5;

fn run(count: usize, one_transaction: bool, chart: &mut Chart) {
    let mut state = scale::state(count);
    let node = Netns::new("nftbench");
    let (p, full, full_text) =
        timed_sync(&node, proxier(), state.clone(), ChangeSummary::default());
    // Our own transactions, each a bare `nft -f`, into another namespace.
    let ours_ns = Netns::new("nftours");
    let bare_ours: Duration = p
        .last_transactions
        .iter()
        .map(|(_, text)| bare_nft(&ours_ns, text))
        .sum();
    // The same table as one transaction, as upstream writes it; and the same services in
    // upstream 1.37's shape, as one transaction.
    let (bare_full, bare_upstream) = if one_transaction {
        (
            bare_nft(&Netns::new("nftbare"), &full_text),
            bare_nft(&Netns::new("nftupstream"), &upstream_shaped(&full_text)),
        )
    } else {
        (Duration::ZERO, Duration::ZERO)
    };

    // One more endpoint for one service, then one fewer, and so on: the median of 21 such
    // changes (the last one adds it), each a sync of its own.
    let key = NamespacedName::new("bench", format!("svc-{}", count / 2));
    let port = state.endpoints[&key].keys().next().unwrap().clone();
    let changes = ChangeSummary {
        changed_services: [key.clone()].into(),
        ..ChangeSummary::default()
    };
    let mut p = p;
    let mut timings = Vec::new();
    let mut change_text = String::new();
    for round in 0..CHANGES {
        let endpoints = state
            .endpoints
            .get_mut(&key)
            .unwrap()
            .get_mut(&port)
            .unwrap();
        if round % 2 == 0 {
            endpoints.push(Endpoint::ready(
                "10.250.0.1".parse().unwrap(),
                8080,
                Some("node-b"),
            ));
        } else {
            endpoints.pop();
        }
        let (next, took, text) = timed_sync(&node, p, state.clone(), changes.clone());
        p = next;
        timings.push(took);
        if round == 0 {
            change_text = text;
        }
    }
    let change = scale::median(timings);
    let bare_change = bare_nft(&ours_ns, &change_text);
    p.force_full_sync();
    let (p, forced, _) = timed_sync(&node, p, state.clone(), ChangeSummary::default());
    // As the daemon runs it: the kernel's change events known, a full sync writes only what
    // differs from memory (nothing here).
    let events = node.run(|| {
        NfEvents::start(Scope::NftTable(TABLE), Box::new(|| {})).expect("nf_tables events")
    });
    let mut p = p.with_change_events(Box::new(events));
    p.force_full_sync();
    let (_, diffed, diffed_text) = timed_sync(&node, p, state.clone(), ChangeSummary::default());
    assert!(diffed_text.is_empty(), "{diffed_text}");
    // Restarts, each a new proxier's first sync on the programmed node (none writes anything,
    // so each finds the same table): the median is reported, and the slowest.
    let mut restarts = Vec::new();
    let mut restart_text = String::new();
    let mut restarted = None;
    for _ in 0..RESTARTS {
        let (p, took, text) = timed_sync(&node, proxier(), state.clone(), ChangeSummary::default());
        restarts.push(took);
        restart_text.push_str(&text);
        restarted.get_or_insert(p);
    }
    let restarted = restarted.expect("a restart");
    let slowest_restart = restarts.iter().copied().max().unwrap_or_default();
    let restart = scale::median(restarts);
    // Nothing changed: no service's chain, no element is written.
    let service_lines = |text: &str| {
        text.lines()
            .filter(|line| {
                let words: Vec<&str> = line.split(' ').collect();
                let declares = matches!(words[..2], ["add", "table" | "chain" | "map" | "set"]);
                !declares && (words[1] == "element" || names::is_service_chain(words[4]))
            })
            .inspect(|line| eprintln!("restart wrote: {line}"))
            .count()
    };
    // The sync after a restart, once due, reads the whole table back (see `digests`).
    std::thread::sleep(restarted.verify_delay);
    let (_, verify, verify_text) =
        timed_sync(&node, restarted, state.clone(), ChangeSummary::default());
    // A restart after one endpoint came while no daemon ran: the sets whose digests differ are
    // read back.
    let mut moved = state.clone();
    moved
        .endpoints
        .get_mut(&key)
        .unwrap()
        .get_mut(&port)
        .unwrap()
        .push(Endpoint::ready(
            "10.250.0.2".parse().unwrap(),
            8080,
            Some("node-b"),
        ));
    let (_, moved_restart, moved_text) =
        timed_sync(&node, proxier(), moved, ChangeSummary::default());

    chart.add("first sync", chart::FIRST_SYNC, count, full);
    chart.add("bare nft -f, same text", chart::BARE_LOAD, count, bare_ours);
    chart.add("restart", chart::RESTART, count, restart);
    chart.add("one-endpoint change", chart::CHANGE, count, change);
    chart.add("bare nft -f of it", chart::BARE_CHANGE, count, bare_change);
    if bare_upstream > Duration::ZERO {
        chart.add(
            "upstream's shape",
            chart::UPSTREAM_SHAPE,
            count,
            bare_upstream,
        );
    }
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
    println!(
        "nftables {count} services x 10 endpoints: first sync {} vs bare nft -f of our transactions {} ({:.2}x)",
        secs(full),
        secs(bare_ours),
        ratio(full, bare_ours),
    );
    if bare_full > Duration::ZERO {
        println!(
            "nftables {count} services x 10 endpoints: first sync {} vs bare nft -f of one transaction {} ({:.2}x) vs bare nft -f of upstream 1.37's shape of the same services, one transaction, {} ({:.2}x)",
            secs(full),
            secs(bare_full),
            ratio(full, bare_full),
            secs(bare_upstream),
            ratio(full, bare_upstream),
        );
    }
    println!(
        "nftables {count} services x 10 endpoints: \
         one-endpoint change {} (median of {CHANGES}; {} lines) vs bare nft -f {} ({:.2}x) vs forced full sync {} ({:.3}x of it); \
         forced full sync with change events {} ({:.3}x the rewrite); \
         restart {} (median of {RESTARTS}: {:.3}x the first sync, the slowest {} {:.3}x; {} lines, {} of them a service's), the read-back sync after it {} ({:.2}x; {} lines, {} of them a service's); \
         restart after one endpoint came {} ({:.2}x; {} lines); {} lines in the first sync",
        secs(change),
        change_text.lines().count(),
        secs(bare_change),
        ratio(change, bare_change),
        secs(forced),
        ratio(change, forced),
        secs(diffed),
        ratio(diffed, forced),
        secs(restart),
        ratio(restart, full),
        secs(slowest_restart),
        ratio(slowest_restart, full),
        restart_text.lines().count(),
        service_lines(&restart_text),
        secs(verify),
        ratio(verify, full),
        verify_text.lines().count(),
        service_lines(&verify_text),
        secs(moved_restart),
        ratio(moved_restart, full),
        moved_text.lines().count(),
        full_text.lines().count(),
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    scale::require_root("the nftables benchmark needs root (network namespaces)");
    let mut chart = Chart::new("nftables mode: first sync, restart, one change");
    let svg = chart::path_from_args(&args, "nftables");
    if !args.iter().any(|a| a == "--bench") {
        run(50, true, &mut chart);
        chart.write(&svg);
        scale::daemon_run(50, "nftables");
        return;
    }
    let sizes: Vec<usize> = scale::sizes(&args, &[1000, 5000]);
    for count in sizes {
        if !args.iter().any(|a| a == "--only-daemon") {
            let one_transaction = !args.iter().any(|a| a == "--no-one-transaction");
            run(count, one_transaction, &mut chart);
            chart.write(&svg);
        }
        if !args.iter().any(|a| a == "--no-daemon") {
            scale::daemon_run(count, "nftables");
        }
    }
}
