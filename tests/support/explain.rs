//! What the tests of `kube-proxy-rs explain` share: its JSON answer run in the node's
//! namespace, the candidates it names, and how connections spread over the pods against its
//! probabilities.

use std::collections::BTreeMap;

use serde_json::Value;

use super::cluster::{BIN, Cluster, PODS, addr, pod_ip6};
use super::netns::{Netns, tcp_request};

/// `explain`'s JSON answer for `to` (`--all` for every service port), run in the node's
/// namespace.
pub fn explain(cluster: &Cluster, to: &str) -> Value {
    let args = match to {
        "--all" => vec![BIN, "explain", "--all", "-o", "json"],
        _ => vec![BIN, "explain", "--to", to, "-o", "json"],
    };
    let output = cluster.node.raw_output(&args);
    assert!(
        output.status.success(),
        "explain {to}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("explain's JSON")
}

/// Endpoint -> probability, from an answer that DNATs.
pub fn candidates(answer: &Value) -> BTreeMap<String, f64> {
    assert_eq!(answer["verdict"], "dnat", "{answer:#}");
    answer["candidates"]
        .as_array()
        .expect("candidates")
        .iter()
        .map(|c| {
            (
                c["endpoint"].as_str().unwrap().to_string(),
                c["probability"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// The pod answering at `endpoint` (`IP:8080` or `[IPv6]:8080`).
pub fn pod_at(endpoint: &str) -> &'static str {
    PODS.iter()
        .find(|(_, ip, _)| {
            endpoint == format!("{ip}:8080") || endpoint == format!("[{}]:8080", pod_ip6(ip))
        })
        .map(|(name, _, _)| *name)
        .unwrap_or_else(|| panic!("{endpoint} is no pod's"))
}

/// `n` requests from the client to `to`: how many each pod answered.
pub fn spread(cluster: &Cluster, to: &str, n: usize) -> BTreeMap<String, usize> {
    spread_from(&cluster.client, to, n)
}

pub fn spread_from(from: &Netns, to: &str, n: usize) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for _ in 0..n {
        let answer = tcp_request(from, addr(to))
            .unwrap_or_else(|err| panic!("{to}: {err:?} after {counts:?}"));
        let pod = answer.split(' ').next().unwrap_or_default().to_string();
        *counts.entry(pod).or_default() += 1;
    }
    counts
}

/// Each named pod's share of `n` within five standard deviations of its probability, and no
/// other pod answering.
pub fn assert_matches(
    predicted: &BTreeMap<String, f64>,
    counts: &BTreeMap<String, usize>,
    n: usize,
) {
    let named: BTreeMap<&str, f64> = predicted.iter().map(|(e, p)| (pod_at(e), *p)).collect();
    for (pod, count) in counts {
        assert!(
            named.contains_key(pod.as_str()),
            "{pod} answered but explain did not name it: {predicted:?}"
        );
        let p = named[pod.as_str()];
        let (mean, sd) = (n as f64 * p, (n as f64 * p * (1.0 - p)).sqrt());
        assert!(
            (*count as f64 - mean).abs() <= 5.0 * sd + 1.0,
            "{pod}: {count} of {n} answers, {mean:.0} expected: {counts:?} against {predicted:?}"
        );
    }
    let total: f64 = predicted.values().sum();
    assert!((total - 1.0).abs() < 1e-9, "probabilities sum to {total}");
}
