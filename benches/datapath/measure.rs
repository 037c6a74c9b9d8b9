//! The ways a connection can go, and their figures over interleaved rounds.

use std::net::SocketAddr;
use std::time::Duration;

use crate::rules::{PORTS, Place};
use crate::support::scale::NODE_IP;
use crate::topology::{Origin, Twin, server_pod};
use crate::traffic::{self, DIRECT_OFFSET};

/// What is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// New TCP connections, one after another.
    Connections,
    /// New UDP flows, a request and its answer each.
    Requests,
    /// One TCP stream.
    Stream,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Connections, Kind::Requests, Kind::Stream];
}

/// Where a connection is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The server pod itself (on ports of its own: see `DIRECT_OFFSET`).
    Pod,
    /// A measured Service's ClusterIP.
    ClusterIp(Place),
    /// The middle Service's NodePort on the node's address.
    NodePort,
}

impl Target {
    /// The address for `kind`.
    pub fn address(self, kind: Kind) -> SocketAddr {
        let index = match kind {
            Kind::Connections => 0,
            Kind::Requests => 1,
            Kind::Stream => 2,
        };
        let (_, _, port, target, node_port) = PORTS[index];
        match self {
            Target::Pod => server_pod(target + DIRECT_OFFSET),
            Target::ClusterIp(place) => SocketAddr::new(place.cluster_ip(), port),
            Target::NodePort => SocketAddr::new(NODE_IP.parse().expect("address"), node_port),
        }
    }
}

/// A path through one twin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Way {
    pub twin: usize,
    pub from: Origin,
    pub to: Target,
}

impl Way {
    pub fn label(self) -> String {
        let from = match self.from {
            Origin::Pod => "pod",
            Origin::Node => "node",
            Origin::Outside => "outside",
        };
        let to = match self.to {
            Target::Pod => "pod direct".to_string(),
            Target::ClusterIp(Place::Middle) => "ClusterIP".to_string(),
            Target::ClusterIp(place) => format!("ClusterIP ({} rule)", place.word()),
            Target::NodePort => "NodePort".to_string(),
        };
        format!("{from} -> {to}")
    }
}

/// How much each round sends.
#[derive(Clone, Copy, Debug)]
pub struct Amounts {
    pub connections: usize,
    pub requests: usize,
    pub stream_bytes: u64,
    pub rounds: usize,
    /// How long to wait after programming a node before measuring.
    pub settle: Duration,
}

/// One way's figures for one kind: per round, the rate (per second, or MiB/s for a stream);
/// and every operation's time.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    pub rates: Vec<f64>,
    pub times: Vec<Duration>,
}

/// Measures every way, `amounts.rounds` times, interleaved: in each round every way once,
/// starting one further along the list each round, the nodes' tracked connections forgotten
/// between rounds.
pub fn rounds(twins: &[&Twin], ways: &[Way], amounts: Amounts) -> Vec<[Samples; 3]> {
    let mut figures: Vec<[Samples; 3]> = vec![Default::default(); ways.len()];
    for round in 0..amounts.rounds {
        for twin in twins {
            twin.forget_connections();
        }
        for step in 0..ways.len() {
            let index = (step + round) % ways.len();
            let way = ways[index];
            let ns = twins[way.twin].origin(way.from);
            for (k, kind) in Kind::ALL.into_iter().enumerate() {
                let to = way.to.address(kind);
                let (rate, mut times) = ns
                    .run(move || once(kind, to, amounts))
                    .unwrap_or_else(|e| panic!("{} twin {}: {e}", way.label(), way.twin));
                figures[index][k].rates.push(rate);
                figures[index][k].times.append(&mut times);
            }
        }
    }
    figures
}

/// One kind's figure to `to`: its rate and the operations' times.
fn once(kind: Kind, to: SocketAddr, amounts: Amounts) -> Result<(f64, Vec<Duration>), String> {
    match kind {
        Kind::Connections => {
            let times = traffic::connections(to, amounts.connections)?;
            Ok((per_second(&times), times))
        }
        Kind::Requests => {
            let times = traffic::requests(to, amounts.requests)?;
            Ok((per_second(&times), times))
        }
        Kind::Stream => {
            let took = traffic::stream(to, amounts.stream_bytes)?;
            let mib = amounts.stream_bytes as f64 / f64::from(1 << 20);
            Ok((mib / took.as_secs_f64(), vec![took]))
        }
    }
}

fn per_second(times: &[Duration]) -> f64 {
    times.len() as f64 / times.iter().sum::<Duration>().as_secs_f64()
}

/// The median of some values, and their least and greatest.
pub fn spread(values: &[f64]) -> (f64, f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN);
    let low = sorted.first().copied().unwrap_or(f64::NAN);
    let high = sorted.last().copied().unwrap_or(f64::NAN);
    (median, low, high)
}

/// A quantile of some operations' times.
pub fn quantile(times: &[Duration], q: f64) -> Duration {
    let mut sorted = times.to_vec();
    sorted.sort();
    let index = ((sorted.len().saturating_sub(1)) as f64 * q).round() as usize;
    sorted.get(index).copied().unwrap_or_default()
}

/// Round by round, `a`'s rate over `b`'s (both measured in the same round).
pub fn ratios(a: &Samples, b: &Samples) -> Vec<f64> {
    a.rates.iter().zip(&b.rates).map(|(x, y)| x / y).collect()
}
