//! The data path against its floors (root; runs in network namespaces it creates and removes).
//!
//! For each mode and number of Services, a node namespace holds the mode's rules for N Services
//! x 10 endpoints (ClusterIPs) and three measured Services, whose one endpoint is a server pod
//! on the node. Beside it, in the same rounds, the same topology with no rules (the bare floor)
//! and with only connection tracking and a masquerade rule, as any CNI's node has (the
//! conntrack+masquerade floor), and with the same translations as the mode's for the measured
//! Service written as one rule each and no other Service (the translation floor: what DNAT and
//! masquerading cost by themselves); in nftables mode also upstream 1.37's shape of the same table,
//! loaded with `nft -f`; in iptables mode the measured Service sorted first, in the middle and
//! last in KUBE-SERVICES. Each way (a pod, the node or a machine outside, to a ClusterIP, a
//! NodePort or the pod directly) is measured as new TCP connections per second with their p50
//! and p99, UDP requests each on a new flow (DNS-shaped), and one TCP stream's throughput.
//! Rounds are interleaved; the tables give medians, the least and most of the rounds, and
//! ratios taken within each round. Then the idle daemon: the real daemon at the largest size,
//! the connection rate second by second while it runs, across a restart and while stopped.
//!
//! `cargo bench --bench datapath` runs 0, 1,000, 10,000 and 30,000 Services in iptables mode
//! (iptables-nft, as Debian's `iptables`) and nftables mode, nftables mode with its flowtable
//! fast path beside it without (`nftables-offload`), and IPVS mode (`ipvs`); the last two are
//! said not measured on a kernel without flowtables or IPVS (this machine's): run them in the
//! VM (tests/vm/run-in-vm.sh); `-- --sizes 0,1000 --modes
//! nftables,iptables-legacy --rounds 7 --connections 500 --stream-mib 64 --svg PATH
//! --idle-services N --idle-modes nftables --no-idle --only-idle` pick; `--absorb FILE` adds
//! to the chart the points an earlier run printed. Under `cargo test` it runs once at 0 and 50 Services with short rounds, as
//! a smoke test.

#[path = "../../tests/support/mod.rs"]
mod support;

mod idle;
mod measure;
mod report;
mod rules;
mod topology;
mod traffic;

use std::time::Duration;

use kube_proxy_rs::sys::xtables::Backend;
use measure::{Amounts, Target, Way};
use report::{BARE, COMPARED, CONNTRACK_MASQUERADE, OURS, Run, TRANSLATION};
use rules::Place;
use support::scale::{flag, require_root, sizes};
use topology::{Origin, Twin};

/// `--offload-packet-threshold` of the nftables-offload twin: KEP-4963's proposed default.
const OFFLOAD_THRESHOLD: u32 = 20;

/// The ways measured on `twin`: direct to the pod from each origin, and for a node with
/// Services, to them.
fn ways(twin: usize, mode: &str) -> Vec<Way> {
    let way = |from, to| Way { twin, from, to };
    let mut ways = vec![
        way(Origin::Pod, Target::Pod),
        way(Origin::Node, Target::Pod),
        way(Origin::Outside, Target::Pod),
    ];
    if twin == OURS || twin == COMPARED || twin == TRANSLATION {
        let middle = Target::ClusterIp(Place::Middle);
        ways.extend([
            way(Origin::Pod, middle),
            way(Origin::Pod, Target::NodePort),
            way(Origin::Node, middle),
            way(Origin::Outside, Target::NodePort),
        ]);
    }
    if twin == OURS && mode.starts_with("iptables") {
        ways.extend([
            way(Origin::Pod, Target::ClusterIp(Place::First)),
            way(Origin::Pod, Target::ClusterIp(Place::Last)),
        ]);
    }
    ways
}

/// `mode` at `services` Services beside the floors; None (said) when the kernel refused the
/// mode's rules at this size.
fn measure(
    mode: &'static str,
    services: usize,
    floors: [&Twin; 3],
    amounts: Amounts,
) -> Option<Run> {
    let mut ours = Twin::new(&format!("{mode}-{services}"));
    let state = rules::state(services);
    let mut compared = None;
    match mode {
        "nftables" => {
            let text = rules::nftables(&ours.node, state);
            let twin = Twin::new(&format!("upstream-{services}"));
            rules::upstream_nftables(&twin.node, &text);
            compared = Some(twin);
        }
        // The same table with the fast path, compared with it without.
        "nftables-offload" => {
            if let Err(refused) =
                rules::nftables_offloading(&ours.node, state.clone(), OFFLOAD_THRESHOLD)
            {
                println!("\n{mode}, {services} Services: not measured: {refused}");
                return None;
            }
            let twin = Twin::new(&format!("plain-{services}"));
            rules::nftables(&twin.node, state);
            compared = Some(twin);
        }
        "ipvs" => {
            if let Err(refused) = rules::ipvs(&ours.node, state) {
                println!("\n{mode}, {services} Services: not measured: {refused}");
                return None;
            }
            ours.keep_connections();
        }
        _ => {
            let backend = if mode == "iptables-legacy" {
                Backend::Legacy
            } else {
                Backend::Nft
            };
            match rules::iptables(&ours.node, state, backend) {
                Ok(placed) => println!("\n{mode}, {services} Services: {placed}"),
                Err(refused) => {
                    println!("\n{mode}, {services} Services: not measured: {refused}");
                    return None;
                }
            }
        }
    }
    // What deleting the last size's namespaces left the kernel to free is done before measuring.
    std::thread::sleep(amounts.settle);
    let mut twins = vec![floors[0], floors[1], floors[2], &ours];
    let mut all_ways: Vec<Way> = [BARE, CONNTRACK_MASQUERADE, TRANSLATION, OURS]
        .into_iter()
        .flat_map(|t| ways(t, mode))
        .collect();
    if let Some(twin) = &compared {
        twins.push(twin);
        all_ways.extend(ways(COMPARED, mode));
    }
    let figures = measure::rounds(&twins, &all_ways, amounts);
    Some(Run {
        mode,
        services,
        ways: all_ways,
        figures,
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    require_root("the data path benchmark needs root (network namespaces)");
    let bench = args.iter().any(|a| a == "--bench");
    let (default_sizes, amounts, window, period): (&[usize], _, _, _) = if bench {
        let number = |name: &str, default: usize| {
            flag(&args, name)
                .and_then(|n| n.parse().ok())
                .unwrap_or(default)
        };
        let rounds = number("--rounds", 9);
        // As many UDP requests a way as connections.
        let connections = number("--connections", 2000);
        (
            &[0, 1000, 10_000, 30_000],
            Amounts {
                connections,
                requests: connections,
                stream_bytes: (number("--stream-mib", 256) as u64) << 20,
                rounds,
                settle: Duration::from_secs(10),
            },
            Duration::from_secs(60),
            Duration::from_secs(10),
        )
    } else {
        (
            &[0, 50],
            Amounts {
                connections: 20,
                requests: 20,
                stream_bytes: 1 << 20,
                rounds: 1,
                settle: Duration::ZERO,
            },
            Duration::from_secs(3),
            Duration::from_secs(1),
        )
    };
    let sizes = sizes(&args, default_sizes);
    const MODES: [&str; 5] = [
        "iptables",
        "iptables-legacy",
        "nftables",
        "nftables-offload",
        "ipvs",
    ];
    let mut modes: Vec<&'static str> = Vec::new();
    for asked in flag(&args, "--modes")
        .unwrap_or("iptables,nftables,nftables-offload,ipvs")
        .split(',')
    {
        match MODES.into_iter().find(|known| *known == asked) {
            Some(mode) => modes.push(mode),
            None => {
                eprintln!(
                    "unknown mode {asked:?} in --modes (known: {})",
                    MODES.join(", ")
                );
                std::process::exit(2);
            }
        }
    }
    let bare = Twin::new("bare");
    let conntrack = Twin::new("ctmasq");
    rules::conntrack_and_masquerade(&conntrack.node);
    let translation = Twin::new("translate");
    rules::translation(&translation.node);
    let mut runs = Vec::new();
    let matrix = if args.iter().any(|a| a == "--only-idle") {
        &[][..]
    } else {
        &modes[..]
    };
    for mode in matrix {
        for &services in &sizes {
            if let Some(run) = measure(mode, services, [&bare, &conntrack, &translation], amounts) {
                run.print();
                runs.push(run);
            }
        }
    }
    report::summary(&runs);
    report::offload_summary(&runs);
    let mut points = report::points(&runs);
    if let Some(file) = flag(&args, "--absorb") {
        let earlier = std::fs::read_to_string(file).expect("the run to absorb");
        points.extend(report::absorb(&earlier));
    }
    report::chart(&points, &support::chart::path_from_args(&args, "datapath"));
    if !args.iter().any(|a| a == "--no-idle") {
        let idle_modes: Vec<&str> = match flag(&args, "--idle-modes") {
            Some(list) => list.split(',').collect(),
            None => modes.clone(),
        };
        let services = flag(&args, "--idle-services")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| sizes.iter().copied().max().unwrap_or(0));
        // Not a divisor of the sync period, so that syncs fall in run and frozen slices alike.
        let slice = if bench { 3 } else { 1 };
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        // The daemon runs iptables mode on the back end the node uses: nft here.
        for mode in idle_modes
            .iter()
            .filter(|m| ["iptables", "nftables"].contains(*m))
        {
            runtime.block_on(idle::run(mode, services, window, slice, period));
        }
    }
}
