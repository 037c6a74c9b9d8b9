//! What the tests of `kube-proxy-rs explain` share: its JSON answer run in the node's
//! namespace, the candidates it names, and how connections spread over the pods against its
//! probabilities.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::cluster::{
    BIN, CLIENT_IP, Cluster, NODE_IP, PODS, addr, apply_dual_stack_slices, pod_ip6, service, slice,
    web_ports,
};
use super::netns::{Netns, tcp_connect, tcp_request};
use super::{WAIT, eventually};

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

/// A dual-stack LoadBalancer Service `web` (ClusterIPs 10.96.0.10 and fd00:10:96::10, ingress
/// 192.168.200.1, external IP 192.168.201.1) whose source ranges let in the client alone, with
/// pods a1 and b2 in both families.
pub fn dual_stack_load_balancer(cluster: &Cluster) {
    let ports = json!([{"name": "http", "port": 80, "protocol": "TCP"}]);
    let slice_ports = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    let mut web = service(
        "web",
        "10.96.0.10",
        ports,
        json!({"type": "LoadBalancer", "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack",
               "loadBalancerSourceRanges": [format!("{CLIENT_IP}/32")],
               "externalIPs": ["192.168.201.1"]}),
    );
    web["spec"]["clusterIPs"] = json!(["10.96.0.10", "fd00:10:96::10"]);
    web["status"] = json!({"loadBalancer": {"ingress": [{"ip": "192.168.200.1"}]}});
    cluster.api.apply(web).unwrap();
    apply_dual_stack_slices(cluster, "web", slice_ports, &["pod-a1", "pod-b2"]);
}

/// IPv6 to web's ClusterIP (see [`dual_stack_load_balancer`]): explain names the two pods, and
/// `n` connections from the node spread as it says.
pub async fn assert_ipv6_spread(cluster: &Cluster, n: usize) {
    // The pods' IPv6 side answers a moment after the daemon's first sync: each pod directly
    // (its neighbour entry resolved), then the ClusterIP.
    let pods: Vec<String> = ["pod-a1", "pod-b2"]
        .iter()
        .filter_map(|name| PODS.iter().find(|(pod, _, _)| pod == name))
        .map(|(_, ip, _)| format!("[{}]:8080", pod_ip6(ip)))
        .collect();
    let reachable = || {
        pods.iter()
            .all(|pod| tcp_request(&cluster.node, addr(pod)).is_ok())
            && tcp_request(&cluster.node, addr("[fd00:10:96::10]:80")).is_ok()
    };
    assert!(eventually(WAIT, reachable).await, "IPv6 reachable");
    let v6 = explain(cluster, "[fd00:10:96::10]:80/tcp");
    assert_eq!(v6["service"], "default/web:http", "{v6:#}");
    let predicted = candidates(&v6);
    let named: Vec<&str> = predicted.keys().map(|e| pod_at(e)).collect();
    assert_eq!(named, ["pod-a1", "pod-b2"], "{v6:#}");
    assert_matches(
        &predicted,
        &spread_from(&cluster.node, "[fd00:10:96::10]:80", n),
        n,
    );
}

/// With `--from`, web's load-balancer IP lets the client in and drops another source.
pub fn assert_source_ranges_decide(cluster: &Cluster) {
    let lb_from = |source: &str| {
        let output = cluster.node.raw_output(&[
            BIN,
            "explain",
            "--to",
            "192.168.200.1:80",
            "--from",
            source,
            "-o",
            "json",
        ]);
        serde_json::from_slice::<Value>(&output.stdout).expect("explain's JSON")
    };
    let allowed = lb_from(CLIENT_IP);
    assert_eq!(allowed["verdict"], "dnat", "{allowed:#}");
    assert!(
        allowed["steps"].to_string().contains("within"),
        "{allowed:#}"
    );
    let outside = lb_from("10.99.0.1");
    assert_eq!(outside["verdict"], "drop", "{outside:#}");
    assert!(
        outside["reason"]
            .as_str()
            .unwrap()
            .contains("loadBalancerSourceRanges"),
        "{outside:#}"
    );
}

/// The service ports `explain --all` says differ.
pub fn differing(all: &Value) -> Vec<&str> {
    all["differing"]
        .as_array()
        .expect("differing")
        .iter()
        .map(|d| d["service_port"].as_str().unwrap())
        .collect()
}

/// web's external IP (see [`dual_stack_load_balancer`]), which source ranges do not restrict:
/// explain names the two pods, and `n` connections from the client spread as it says.
pub fn assert_external_ip_spread(cluster: &Cluster, n: usize) {
    let external = explain(cluster, "192.168.201.1:80/tcp");
    assert_eq!(external["service"], "default/web:http", "{external:#}");
    let predicted = candidates(&external);
    let named: Vec<&str> = predicted.keys().map(|e| pod_at(e)).collect();
    assert_eq!(named, ["pod-a1", "pod-b2"], "{external:#}");
    assert_matches(&predicted, &spread(cluster, "192.168.201.1:80", n), n);
}

/// Service `draining` (10.96.0.14:80) whose every endpoint (pods a1 and b1) is terminating but
/// still serving: upstream sends traffic to them when no endpoint is ready.
pub fn terminating_only(cluster: &Cluster) {
    let ports = json!([{"name": "http", "port": 80, "protocol": "TCP"}]);
    cluster
        .api
        .apply(service("draining", "10.96.0.14", ports, json!({})))
        .unwrap();
    let slice_ports = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    let mut draining = slice("draining", slice_ports, &["pod-a1", "pod-b1"]);
    for endpoint in draining["endpoints"].as_array_mut().expect("endpoints") {
        endpoint["conditions"] = json!({"ready": false, "serving": true, "terminating": true});
    }
    cluster.api.apply(draining).unwrap();
}

/// explain names `draining`'s terminating endpoints (see [`terminating_only`]), and `n`
/// connections from the client land on them as it says.
pub fn assert_terminating_endpoints_serve(cluster: &Cluster, n: usize) {
    let answer = explain(cluster, "10.96.0.14:80/tcp");
    assert_eq!(answer["daemon"]["comparison"], "agrees", "{answer:#}");
    let predicted = candidates(&answer);
    let pods: Vec<&str> = predicted.keys().map(|e| pod_at(e)).collect();
    assert_eq!(pods, ["pod-a1", "pod-b1"], "{answer:#}");
    assert_matches(&predicted, &spread(cluster, "10.96.0.14:80", n), n);
}

/// From pod a1 to web's ClusterIP (four endpoints, a1 among them): explain says a connection
/// drawn back to a1 is masqueraded (hairpin), and `n` connections from a1 land as it says,
/// those to itself included (they work only masqueraded).
pub fn assert_hairpin(cluster: &Cluster, n: usize) {
    let output = cluster.node.raw_output(&[
        BIN,
        "explain",
        "--to",
        "10.96.0.10:80",
        "--from",
        "10.244.1.11",
        "-o",
        "json",
    ]);
    let answer: Value = serde_json::from_slice(&output.stdout).expect("explain's JSON");
    assert!(
        answer["steps"].to_string().contains("(hairpin)"),
        "{answer:#}"
    );
    let predicted = candidates(&answer);
    assert!(
        predicted.keys().any(|e| pod_at(e) == "pod-a1"),
        "{answer:#}"
    );
    assert_matches(
        &predicted,
        &spread_from(cluster.pod("pod-a1"), "10.96.0.10:80", n),
        n,
    );
}

/// The seeded `local` Service's NodePort (externalTrafficPolicy Local): explain names only this
/// node's two pods, agreeing with the daemon, and `n` connections from the client land as it
/// says.
pub fn assert_local_node_port(cluster: &Cluster, n: usize) {
    let to = format!("{NODE_IP}:30081");
    let local = explain(cluster, &format!("{to}/tcp"));
    assert_eq!(local["service"], "default/local:http", "{local:#}");
    assert_eq!(local["daemon"]["comparison"], "agrees", "{local:#}");
    let predicted = candidates(&local);
    let pods: Vec<&str> = predicted.keys().map(|e| pod_at(e)).collect();
    assert_eq!(pods, ["pod-a1", "pod-a2"], "{local:#}");
    assert_matches(&predicted, &spread(cluster, &to, n), n);
}

/// With `--from`, explain says whether a connection is masqueraded, and real connections are
/// as it says (conntrack's reply tuple goes back to the node, not the client, when they are):
/// a pod's to a ClusterIP is not, the client's is; the client's to the Cluster-policy NodePort
/// (web's 30080) is, to the Local-policy one (local's 30081) is not.
pub fn assert_masquerade_follows_the_source(cluster: &Cluster) {
    let said = |to: &str, from: &str| {
        let text = cluster
            .node
            .output(&[BIN, "explain", "--to", to, "--from", from]);
        // One step that marks it is enough (another may not hold for this packet); hairpin
        // marks only a connection drawn back to its source (assert_hairpin).
        let marked = text.lines().any(|line| {
            line.contains("marked for masquerade")
                && !line.contains("not marked")
                && !line.contains("(hairpin)")
        });
        (marked, text)
    };
    let (marked, text) = said("10.96.0.10:80", "10.244.1.11");
    assert!(
        !marked && text.contains("not marked for masquerade"),
        "{text}"
    );
    let (marked, text) = said("10.96.0.10:80", CLIENT_IP);
    assert!(marked, "{text}");
    for (port, masqueraded) in [(30080, true), (30081, false)] {
        let to = format!("{NODE_IP}:{port}");
        let (marked, text) = said(&to, CLIENT_IP);
        assert_eq!(marked, masqueraded, "{text}");
        tcp_request(&cluster.client, addr(&to)).expect("a connection to the NodePort");
        let tracked = cluster.node.output(&[
            "conntrack",
            "-L",
            "-p",
            "tcp",
            "-s",
            CLIENT_IP,
            "--dport",
            &port.to_string(),
        ]);
        let replies_to: Vec<&str> = tracked
            .lines()
            .filter_map(|line| line.split("dst=").nth(2)?.split(' ').next())
            .collect();
        assert!(!replies_to.is_empty(), "no connection tracked:\n{tracked}");
        assert!(
            replies_to
                .iter()
                .all(|to| (*to != CLIENT_IP) == masqueraded),
            "{port}: masqueraded {masqueraded}, but conntrack says:\n{tracked}"
        );
    }
}

/// A connection held open to one of web's endpoints, which then goes from its EndpointSlice:
/// conntrack keeps the connection, and explain names it as going to a gone endpoint.
pub async fn assert_gone_endpoint_named(cluster: &Cluster) {
    let (held, greeting) = tcp_connect(&cluster.client, addr("10.96.0.10:80"));
    let pod = greeting.split(' ').next().unwrap_or_default().to_string();
    let remaining: Vec<&str> = PODS
        .iter()
        .map(|(name, _, _)| *name)
        .filter(|name| *name != pod)
        .collect();
    cluster
        .api
        .apply(slice("web", web_ports().1, &remaining))
        .unwrap();
    assert!(
        eventually(WAIT, || candidates(&explain(cluster, "10.96.0.10:80/tcp"))
            .len()
            == 3)
        .await,
        "the endpoint went"
    );
    let web = explain(cluster, "10.96.0.10:80/tcp");
    let tracked = web["conntrack"].as_array().expect("conntrack entries");
    assert!(
        tracked.iter().any(
            |entry| pod_at(entry["endpoint"].as_str().unwrap()) == pod && entry["gone"] == true
        ),
        "{pod}'s connection: {web:#}"
    );
    let text = cluster
        .node
        .output(&[BIN, "explain", "--to", "10.96.0.10:80"]);
    assert!(text.contains("a gone endpoint"), "{text}");
    drop(held);
}
