//! UDP conntrack cleanup in a real kernel: a client that keeps sending from one port to a UDP
//! service whose pod is replaced. Without the cleanup its flow stays DNATed to the old pod (shown
//! with the proxier alone, the cleaner held back); with it the next packet reaches the new pod
//! (shown both step by step and through the daemon, for a ClusterIP and a NodePort).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use kube_proxy_rs::model::{
    ChangeSummary, Endpoint, NamespacedName, NodeInfo, Protocol, ProxyState, ServicePort,
    ServicePortName,
};
use kube_proxy_rs::proxier::Proxier;
use kube_proxy_rs::proxier::conntrack::UdpConntrackCleaner;
use kube_proxy_rs::proxier::iptables::IptablesProxier;
use kube_proxy_rs::sys::conntrack::NetlinkConntrack;
use kube_proxy_rs::sys::host::net::{FakeSysctl, FixedAddresses};
use kube_proxy_rs::sys::xtables::{Backend, SystemIptables};
use serde_json::json;
use support::cluster::{
    CLIENT_IP, CLIENT_IP6, Cluster, NODE_IP, NODE_IP6, PODS, addr, service, slice, slice6,
};
use support::netns::{Netns, require_netns};
use support::{WAIT, eventually};

const CLUSTER_IP: &str = "10.96.0.53";
const NODE_PORT: u16 = 30054;

/// A UDP client bound to one port in `ns` and connected to one address: every datagram belongs
/// to the same conntrack flow.
struct UdpClient {
    socket: UdpSocket,
}

impl UdpClient {
    fn new(ns: &Netns, source_port: u16, to: SocketAddr) -> UdpClient {
        let from = if to.is_ipv4() { CLIENT_IP } else { CLIENT_IP6 };
        let socket = ns.run(move || {
            let socket = UdpSocket::bind((from, source_port)).expect("bind client");
            socket.connect(to).expect("connect");
            socket
        });
        socket
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        UdpClient { socket }
    }

    /// The name of the pod that answered the next datagram, or None.
    fn ask(&self) -> Option<String> {
        self.socket.send(b"ping").ok()?;
        let mut buf = [0u8; 256];
        let n = self.socket.recv(&mut buf).ok()?;
        let text = String::from_utf8_lossy(&buf[..n]).to_string();
        text.split(' ').next().map(str::to_string)
    }

    /// Asks until `pod` answers (or WAIT passes); whether it did.
    async fn reaches(&self, pod: &str) -> bool {
        eventually(WAIT, || self.ask().as_deref() == Some(pod)).await
    }
}

fn pod_ip(pod: &str) -> std::net::IpAddr {
    let (_, ip, _) = PODS.iter().find(|(name, _, _)| *name == pod).unwrap();
    ip.parse().unwrap()
}

/// One UDP service on CLUSTER_IP:53 and NODE_PORT, served by `pods` on port 8080.
fn state_served_by(pods: &[&str]) -> ProxyState {
    let key = NamespacedName::new("default", "dns");
    let name = ServicePortName::new("default", "dns", "dns", Protocol::Udp);
    let port = ServicePort {
        node_port: Some(NODE_PORT),
        ..ServicePort::new(name.clone(), CLUSTER_IP.parse().unwrap(), 53)
    };
    let endpoints = pods
        .iter()
        .map(|pod| Endpoint::ready(pod_ip(pod), 8080, Some("node-a")))
        .collect();
    ProxyState {
        services: BTreeMap::from([(
            key.clone(),
            kube_proxy_rs::model::VecMap::from([(name.clone(), port)]),
        )]),
        endpoints: BTreeMap::from([(key, kube_proxy_rs::model::VecMap::from([(name, endpoints)]))]),
        node: NodeInfo {
            name: "node-a".into(),
            addresses: vec![NODE_IP.parse().unwrap()],
            ..NodeInfo::default()
        },
        ..ProxyState::default()
    }
}

fn dns_changed() -> ChangeSummary {
    ChangeSummary {
        changed_services: BTreeSet::from([NamespacedName::new("default", "dns")]),
        ..ChangeSummary::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_flow_sticks_to_the_old_pod_until_the_cleanup_deletes_it() {
    require_netns();
    let cluster = Cluster::start().await;
    let before = state_served_by(&["pod-a1"]);
    let after = state_served_by(&["pod-a2"]);
    let proxier = cluster.node.run(move || {
        let mut proxier = IptablesProxier::new(
            SystemIptables::new(Backend::Nft),
            support::scale::iptables_settings("10.244.0.0/16"),
            Box::new(FixedAddresses(vec![NODE_IP.parse().unwrap()])),
            Box::new(FakeSysctl::default()),
        );
        proxier
            .sync(&before, &ChangeSummary::default())
            .expect("sync");
        proxier
    });
    let client = UdpClient::new(&cluster.client, 40053, addr(&format!("{CLUSTER_IP}:53")));
    assert!(client.reaches("pod-a1").await, "the first pod serves");

    // The pod is replaced: the rules follow, the client's tracked flow does not.
    let state = after.clone();
    cluster.node.run(move || {
        let mut proxier = proxier;
        proxier.sync(&state, &dns_changed()).expect("sync");
    });
    let fresh = UdpClient::new(&cluster.client, 40054, addr(&format!("{CLUSTER_IP}:53")));
    assert_eq!(
        fresh.ask().as_deref(),
        Some("pod-a2"),
        "new flows meet the new rules"
    );
    for _ in 0..5 {
        assert_eq!(
            client.ask().as_deref(),
            Some("pod-a1"),
            "without the cleanup the old flow keeps its DNAT to the replaced pod"
        );
    }

    // The cleanup deletes that flow (and only stale ones); the client's next packet moves.
    let report = cluster.node.run(move || {
        let conntrack = NetlinkConntrack::open().expect("ctnetlink");
        UdpConntrackCleaner::new(Box::new(conntrack))
            .after_sync(&after, &dns_changed(), false, || {
                vec![NODE_IP.parse().unwrap()]
            })
            .expect("cleanup")
    });
    let deleted: usize = report.iter().map(|f| f.deleted).sum();
    assert_eq!(deleted, 1, "exactly the stale flow: {report:?}");
    assert_eq!(client.ask().as_deref(), Some("pod-a2"));
    assert_eq!(
        fresh.ask().as_deref(),
        Some("pod-a2"),
        "the serving flow stays"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_moves_udp_clients_to_the_replacement_pod() {
    require_netns();
    let cluster = Cluster::start().await;
    let ports = json!([{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 8080, "nodePort": NODE_PORT}]);
    let slice_ports = json!([{"name": "dns", "port": 8080, "protocol": "UDP"}]);
    cluster
        .api
        .apply(service(
            "dns",
            CLUSTER_IP,
            ports,
            json!({"type": "NodePort"}),
        ))
        .unwrap();
    cluster
        .api
        .apply(slice("dns", slice_ports.clone(), &["pod-a1"]))
        .unwrap();
    let daemon = cluster.daemon(&cluster.config(""));
    daemon.wait_for("\"Synced proxy rules\"").await;

    let via_cluster_ip = UdpClient::new(&cluster.client, 41053, addr(&format!("{CLUSTER_IP}:53")));
    let via_node_port = UdpClient::new(
        &cluster.client,
        41054,
        addr(&format!("{NODE_IP}:{NODE_PORT}")),
    );
    assert!(via_cluster_ip.reaches("pod-a1").await);
    assert!(via_node_port.reaches("pod-a1").await);

    // Replace the pod; the old one keeps running (as a terminating pod does), so a flow left
    // alone would keep getting answers from it rather than simply failing.
    cluster
        .api
        .apply(slice("dns", slice_ports, &["pod-a2"]))
        .unwrap();
    assert!(
        via_cluster_ip.reaches("pod-a2").await,
        "the ClusterIP client moved to the new pod"
    );
    assert!(
        via_node_port.reaches("pod-a2").await,
        "the NodePort client moved to the new pod"
    );
    daemon
        .wait_for("\"Deleted stale UDP conntrack entries\"")
        .await;
    let metrics = support::netns::http_get(&cluster.node, addr("127.0.0.1:10249"), "/metrics")
        .expect("metrics");
    assert!(
        metrics.1.lines().any(|l| l.starts_with(
            "kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv4\"}"
        ) && !l.ends_with(" 0")),
        "{}",
        metrics.1
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_moves_ipv6_udp_clients_too() {
    require_netns();
    let mut cluster = Cluster::start().await;
    cluster.add_ipv6();
    let cluster_ip6 = "fd00:10:96::53";
    let ports = json!([{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 8080, "nodePort": NODE_PORT}]);
    let slice_ports = json!([{"name": "dns", "port": 8080, "protocol": "UDP"}]);
    let mut dns6 = service(
        "dns6",
        cluster_ip6,
        ports,
        json!({"type": "NodePort", "ipFamilies": ["IPv6"]}),
    );
    dns6["spec"]["clusterIPs"] = json!([cluster_ip6]);
    cluster.api.apply(dns6).unwrap();
    cluster
        .api
        .apply(slice6("dns6", slice_ports.clone(), &["pod-a1"]))
        .unwrap();
    let daemon = cluster.daemon(&cluster.config(""));
    daemon.wait_for("\"Synced proxy rules\"").await;

    let via_cluster_ip =
        UdpClient::new(&cluster.client, 42053, addr(&format!("[{cluster_ip6}]:53")));
    let via_node_port = UdpClient::new(
        &cluster.client,
        42054,
        addr(&format!("[{NODE_IP6}]:{NODE_PORT}")),
    );
    assert!(via_cluster_ip.reaches("pod-a1").await);
    assert!(via_node_port.reaches("pod-a1").await);
    cluster
        .api
        .apply(slice6("dns6", slice_ports, &["pod-a2"]))
        .unwrap();
    assert!(
        via_cluster_ip.reaches("pod-a2").await,
        "IPv6 ClusterIP client moved"
    );
    assert!(
        via_node_port.reaches("pod-a2").await,
        "IPv6 NodePort client moved"
    );
    daemon
        .wait_for("\"Deleted stale UDP conntrack entries\" ip_family=\"IPv6\"")
        .await;
    daemon.stop().await;
}
