//! nodePortAddresses' keywords as upstream 1.37 reads them (`primary`, `localhost`, `all`, mixed
//! with each other and with CIDRs), with real connections (root; in namespaces): the real
//! daemon in iptables and nftables mode serves the seeded NodePort (web's 30080) on exactly the
//! addresses the list names.

mod support;

use std::io::ErrorKind;

use support::cluster::{Cluster, NODE_IP, addr, seed};
use support::netns::{require_netns, tcp_request};

/// Where the NodePort answers: from the client on the node's primary address, from the node
/// on 127.0.0.1, and from a pod on the node's address on the pods' side (10.244.0.1).
#[derive(Debug, PartialEq, Eq)]
struct Served {
    primary: bool,
    localhost: bool,
    pod_side: bool,
}

fn served(cluster: &Cluster) -> Served {
    let answers = |result: Result<String, ErrorKind>| match result {
        Ok(greeting) => {
            assert!(greeting.starts_with("pod-"), "{greeting}");
            true
        }
        Err(ErrorKind::ConnectionRefused) => false,
        Err(other) => panic!("neither answered nor refused: {other:?}"),
    };
    Served {
        primary: answers(tcp_request(
            &cluster.client,
            addr(&format!("{NODE_IP}:30080")),
        )),
        localhost: answers(tcp_request(&cluster.node, addr("127.0.0.1:30080"))),
        pod_side: answers(tcp_request(cluster.pod("pod-a1"), addr("10.244.0.1:30080"))),
    }
}

/// What nftables mode says when nodePortAddresses names loopback addresses alone.
const SERVES_NO_NODE_PORT: &str =
    "nodePortAddresses names nothing else, so this node serves no NodePort";

/// The daemon in `mode` with `addresses` serves the NodePort where `expected` says, and says
/// `said` times that it serves none.
async fn serves(cluster: &Cluster, mode: &str, addresses: &str, expected: Served, said: usize) {
    let extra = format!(
        "nftables:\n  syncPeriod: 2s\n  minSyncPeriod: 0s\nnodePortAddresses: {addresses}\n"
    );
    let daemon = cluster.daemon(&cluster.config_with_mode(mode, &extra));
    daemon.wait_for("\"Synced proxy rules\"").await;
    assert_eq!(
        served(cluster),
        expected,
        "{mode}, nodePortAddresses {addresses}"
    );
    assert_eq!(
        daemon.count(SERVES_NO_NODE_PORT),
        said,
        "{mode}, {addresses}"
    );
    daemon.stop().await;
}

async fn keywords_select_the_node_port_addresses(mode: &str) {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    // The node's address and the loopback ones: 127.0.0.1 only where the mode serves
    // localhost NodePorts (iptables, IPv4, as upstream; nftables leaves them to the userspace
    // proxy of KubeProxyNFTablesLocalhostNodePorts, which we do not have).
    serves(
        &cluster,
        mode,
        "[primary, localhost]",
        Served {
            primary: true,
            localhost: mode == "iptables",
            pod_side: false,
        },
        0,
    )
    .await;
    // A CIDR beside a keyword.
    serves(
        &cluster,
        mode,
        "[10.244.0.0/16, localhost]",
        Served {
            primary: false,
            localhost: mode == "iptables",
            pod_side: true,
        },
        0,
    )
    .await;
    // Loopback alone: only what iptables mode serves on 127.0.0.1; nftables mode serves no
    // NodePort, and says so.
    serves(
        &cluster,
        mode,
        "[localhost]",
        Served {
            primary: false,
            localhost: mode == "iptables",
            pod_side: false,
        },
        usize::from(mode == "nftables"),
    )
    .await;
    // Every address, whatever else is listed.
    serves(
        &cluster,
        mode,
        "[all, 192.0.2.0/24]",
        Served {
            primary: true,
            localhost: mode == "iptables",
            pod_side: true,
        },
        0,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keywords_select_the_node_port_addresses_in_iptables_mode() {
    keywords_select_the_node_port_addresses("iptables").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keywords_select_the_node_port_addresses_in_nftables_mode() {
    keywords_select_the_node_port_addresses("nftables").await;
}
