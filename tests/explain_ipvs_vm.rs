//! `kube-proxy-rs explain` in IPVS mode, in the VM (a kernel with IPVS: see `support::vm`): the
//! real daemon programs virtual servers, `explain` reads the one a flow meets, and connections
//! land only on the real servers it names, in shares that match its probabilities; the daemon
//! names the Service port (IPVS keeps no names).

mod support;

use support::cluster::{Cluster, addr, many, names, seed};
use support::explain::{
    assert_gone_endpoint_named, assert_hairpin, assert_local_node_port,
    assert_masquerade_follows_the_source, assert_matches, assert_terminating_endpoints_serve,
    candidates, explain, spread, terminating_only,
};
use support::netns::tcp_request;
use support::vm::in_vm;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_names_where_packets_go_in_ipvs_mode() {
    if !in_vm("explain_names_where_packets_go_in_ipvs_mode") {
        return;
    }
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    terminating_only(&cluster);
    let extra = "ipvs:\n  scheduler: rr\n  syncPeriod: 2s\n  minSyncPeriod: 0s\n";
    let daemon = cluster.daemon(&cluster.config_with_mode("ipvs", extra));
    daemon.wait_for("\"Using ipvs Proxier\"").await;
    daemon.wait_for("\"Synced proxy rules\"").await;
    assert_terminating_endpoints_serve(&cluster, 100);
    assert_hairpin(&cluster, 100);
    assert_masquerade_follows_the_source(&cluster);

    // A ClusterIP with four real servers: a quarter each, named by the daemon, agreeing.
    let web = explain(&cluster, "10.96.0.10:80/tcp");
    assert_eq!(web["mode"], "ipvs", "{web:#}");
    assert_eq!(web["service"], "default/web:http", "{web:#}");
    assert_eq!(web["daemon"]["comparison"], "agrees", "{web:#}");
    let predicted = candidates(&web);
    assert_eq!(predicted.len(), 4, "{web:#}");
    let n = 200;
    assert_matches(&predicted, &spread(&cluster, "10.96.0.10:80", n), n);

    // A NodePort with externalTrafficPolicy Local: only this node's two pods.
    assert_local_node_port(&cluster, n);

    // ClientIP affinity: persistence, and one client keeps to one of the four.
    let sticky = explain(&cluster, "10.96.0.11:80/tcp");
    assert!(
        sticky["steps"].to_string().contains("persistent 600 s"),
        "{sticky:#}"
    );
    let predicted = candidates(&sticky);
    assert_eq!(predicted.len(), 4, "{sticky:#}");
    let answers = many(12, || tcp_request(&cluster.client, addr("10.96.0.11:80")));
    assert_eq!(names(&answers).len(), 1, "{answers:?}");

    // No endpoints: rejected (IPVS answers port unreachable), and refused.
    let empty = explain(&cluster, "10.96.0.13:80/tcp");
    assert_eq!(empty["verdict"], "reject", "{empty:#}");
    assert_eq!(empty["daemon"]["comparison"], "agrees", "{empty:#}");
    assert_eq!(
        tcp_request(&cluster.node, addr("10.96.0.13:80")),
        Err(std::io::ErrorKind::ConnectionRefused)
    );
    // A port the Service does not have: no virtual server, and the access filter rejects a
    // connection that arrives; refused for real.
    let other_port = explain(&cluster, "10.96.0.10:81/tcp");
    assert_eq!(other_port["verdict"], "reject", "{other_port:#}");
    assert!(
        other_port["reason"]
            .as_str()
            .unwrap()
            .contains("KUBE-IPVS-FILTER"),
        "{other_port:#}"
    );
    assert_eq!(
        tcp_request(&cluster.client, addr("10.96.0.10:81")),
        Err(std::io::ErrorKind::ConnectionRefused)
    );

    assert_gone_endpoint_named(&cluster).await;

    // Every service port of the node agrees with the daemon.
    let all = explain(&cluster, "--all");
    assert_eq!(all["checked"], 6, "{all:#}");
    assert_eq!(all["differing"], serde_json::json!([]), "{all:#}");
    daemon.stop().await;
}

/// IPv6, and a load-balancer IP with source ranges: with `--from`, the client is let in and
/// another source dropped, as the ipsets decide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_reads_ipv6_and_load_balancers_in_ipvs_mode() {
    if !in_vm("explain_reads_ipv6_and_load_balancers_in_ipvs_mode") {
        return;
    }
    use support::explain::{
        assert_external_ip_spread, assert_ipv6_spread, assert_source_ranges_decide,
        dual_stack_load_balancer,
    };

    let mut cluster = Cluster::start().await;
    cluster.add_ipv6();
    dual_stack_load_balancer(&cluster);
    let extra = "ipvs:\n  scheduler: rr\n  syncPeriod: 2s\n  minSyncPeriod: 0s\n";
    let daemon = cluster.daemon(&cluster.config_with_mode("ipvs", extra));
    daemon.wait_for("\"Synced proxy rules\"").await;
    let n = 100;
    assert_ipv6_spread(&cluster, n).await;
    assert_source_ranges_decide(&cluster);
    assert_external_ip_spread(&cluster, n);
    let lb = explain(&cluster, "192.168.200.1:80/tcp");
    assert!(lb["steps"].to_string().contains("give --from"), "{lb:#}");
    let predicted = candidates(&lb);
    assert_matches(&predicted, &spread(&cluster, "192.168.200.1:80", n), n);
    daemon.stop().await;
}
