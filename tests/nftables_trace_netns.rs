//! The nf_tables tracer on a live kernel's table: the real daemon programs nftables mode in a
//! node namespace (as root, in namespaces this test creates and removes), the table is read
//! back whole over netlink, and each flow the tracer follows through it is sent for real. The
//! pods that answer are among the endpoints the trace reaches, and only those; a masqueraded
//! trace hides the client's address from the pod; a rejected one is refused, a dropped one
//! times out.

mod support;

use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr};

use kube_proxy_rs::model::{IpFamily, Protocol};
use kube_proxy_rs::sys::nf_tables::trace::{Fate, Packet, Path, Ruleset, trace};
use support::cluster::{CLIENT_IP, Cluster, NODE_IP, PODS, addr, many, names, seed, service_cidr};
use support::netns::{require_netns, tcp_request, udp_request};
use support::{WAIT, eventually};

const NFT_CONFIG: &str = "nftables:\n  syncPeriod: 2s\n  minSyncPeriod: 0s\n";

/// The pod listening at `endpoint` (every pod serves 8080).
fn pod_at(endpoint: &SocketAddr) -> String {
    PODS.iter()
        .find(|(_, ip, _)| ip.parse::<IpAddr>().ok() == Some(endpoint.ip()))
        .map(|(name, _, _)| name.to_string())
        .unwrap_or_else(|| endpoint.to_string())
}

fn traced(
    ruleset: &Ruleset,
    src: &str,
    to: &str,
    protocol: Protocol,
    from_node: bool,
) -> Vec<Path> {
    let to = addr(to);
    let packet = Packet {
        src: src.parse().unwrap(),
        dst: to.ip(),
        sport: 40000,
        dport: to.port(),
        protocol,
        from_node,
    };
    let local: Vec<IpAddr> = vec![NODE_IP.parse().unwrap(), "10.244.0.1".parse().unwrap()];
    let paths = trace(ruleset, &local, &packet).expect("traced");
    let total: f64 = paths.iter().map(|p| p.weight).sum();
    assert!((total - 1.0).abs() < 1e-9, "{paths:#?}");
    paths
}

/// The pods the accepted paths reach, each with its probability.
fn reached(paths: &[Path]) -> Vec<(String, f64)> {
    let mut pods: Vec<(String, f64)> = Vec::new();
    for path in paths.iter().filter(|p| p.fate == Fate::Accepted) {
        let Some(endpoint) = path.dnat else { continue };
        let pod = pod_at(&endpoint);
        match pods.iter_mut().find(|(name, _)| *name == pod) {
            Some((_, weight)) => *weight += path.weight,
            None => pods.push((pod, path.weight)),
        }
    }
    pods.sort_by(|a, b| a.0.cmp(&b.0));
    pods
}

fn pod_names(pods: &[(String, f64)]) -> BTreeSet<String> {
    pods.iter().map(|(name, _)| name.clone()).collect()
}

fn fates(paths: &[Path]) -> BTreeSet<Fate> {
    paths.iter().map(|p| p.fate).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tracer_on_the_kernels_table_agrees_with_real_packets() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    service_cidr(&cluster.api, "kubernetes", "10.96.0.0/16");
    let daemon = cluster.daemon(&cluster.config_with_mode("nftables", NFT_CONFIG));
    daemon.wait_for("\"Synced proxy rules\"").await;
    let read = || {
        cluster
            .node
            .run(|| Ruleset::read(IpFamily::V4, "kube-proxy").expect("read the table"))
    };
    let unallocated = |ruleset: &Ruleset| {
        fates(&traced(
            ruleset,
            NODE_IP,
            "10.96.0.99:80",
            Protocol::Tcp,
            true,
        )) == BTreeSet::from([Fate::Dropped])
    };
    assert!(
        eventually(WAIT, || unallocated(&read())).await,
        "the ServiceCIDR's drop is programmed"
    );
    let ruleset = read();
    let node = &cluster.node;
    let client = &cluster.client;
    let all: BTreeSet<String> = PODS.iter().map(|p| p.0.to_string()).collect();

    // A ClusterIP from the node: every pod, a quarter each, masqueraded (the node is no pod).
    let paths = traced(&ruleset, NODE_IP, "10.96.0.10:80", Protocol::Tcp, true);
    let pods = reached(&paths);
    assert_eq!(pod_names(&pods), all, "{paths:#?}");
    assert!(
        pods.iter().all(|(_, w)| (w - 0.25).abs() < 0.01),
        "{pods:?}"
    );
    assert!(paths.iter().all(|p| p.masquerade), "{paths:#?}");
    let answers = many(40, || tcp_request(node, addr("10.96.0.10:80")));
    assert!(
        names(&answers).is_subset(&all) && names(&answers).len() >= 2,
        "{answers:?}"
    );

    // UDP to the same Service.
    let paths = traced(&ruleset, NODE_IP, "10.96.0.10:53", Protocol::Udp, true);
    assert_eq!(pod_names(&reached(&paths)), all, "{paths:#?}");
    let answers = many(20, || udp_request(node, addr("10.96.0.10:53")));
    assert!(
        names(&answers).is_subset(&all) && !names(&answers).is_empty(),
        "{answers:?}"
    );

    // A NodePort from outside: every pod, masqueraded; the pod never sees the client.
    let paths = traced(
        &ruleset,
        CLIENT_IP,
        &format!("{NODE_IP}:30080"),
        Protocol::Tcp,
        false,
    );
    assert_eq!(pod_names(&reached(&paths)), all, "{paths:#?}");
    assert!(paths.iter().all(|p| p.masquerade), "{paths:#?}");
    let answers = many(20, || {
        tcp_request(client, addr(&format!("{NODE_IP}:30080")))
    });
    assert!(names(&answers).is_subset(&all), "{answers:?}");
    assert!(
        answers
            .iter()
            .all(|a| a.as_ref().is_ok_and(|t| !t.contains(CLIENT_IP))),
        "{answers:?}"
    );

    // externalTrafficPolicy Local from outside: this node's pods only, the client's address kept.
    let paths = traced(
        &ruleset,
        CLIENT_IP,
        &format!("{NODE_IP}:30081"),
        Protocol::Tcp,
        false,
    );
    let local = BTreeSet::from(["pod-a1".to_string(), "pod-a2".to_string()]);
    assert_eq!(pod_names(&reached(&paths)), local, "{paths:#?}");
    assert!(paths.iter().all(|p| !p.masquerade), "{paths:#?}");
    let answers = many(20, || {
        tcp_request(client, addr(&format!("{NODE_IP}:30081")))
    });
    assert!(
        names(&answers).is_subset(&local) && !names(&answers).is_empty(),
        "{answers:?}"
    );
    assert!(
        answers
            .iter()
            .all(|a| a.as_ref().is_ok_and(|t| t.contains(CLIENT_IP))),
        "{answers:?}"
    );

    // Session affinity: a new client may go to any pod.
    let paths = traced(&ruleset, NODE_IP, "10.96.0.11:80", Protocol::Tcp, true);
    assert_eq!(pod_names(&reached(&paths)), all, "{paths:#?}");

    // No endpoints, another port of a ClusterIP: rejected, and refused for real.
    for to in ["10.96.0.13:80", "10.96.0.10:81"] {
        let paths = traced(&ruleset, NODE_IP, to, Protocol::Tcp, true);
        assert_eq!(
            fates(&paths),
            BTreeSet::from([Fate::Rejected]),
            "{to}: {paths:#?}"
        );
        assert_eq!(
            tcp_request(node, addr(to)),
            Err(ErrorKind::ConnectionRefused),
            "{to}"
        );
    }
    // An unallocated ClusterIP: dropped, and no answer comes.
    assert_eq!(
        tcp_request(node, addr("10.96.0.99:80")),
        Err(ErrorKind::TimedOut)
    );
    daemon.stop().await;
}
