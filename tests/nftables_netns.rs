//! nftables mode with real packets, as root, in network namespaces this test creates and
//! removes: the real daemon in a node namespace against the test API server, pods on veth pairs
//! running TCP/UDP echo servers, and an external client routed to the node.

mod support;

use std::collections::BTreeSet;
use std::io::ErrorKind;

use kube_proxy_rs::proxier::nftables::names::hash_and_truncate;
use serde_json::json;
use support::cluster::{
    CLIENT_IP, Cluster, NODE_IP, NODE_IP6, PODS, addr, apply_dual_stack_slices, dual_stack_web,
    many, names, seed, service, service_cidr, slice, web_ports,
};
use support::netns::{http_get, require_netns, tcp_request, udp_request};
use support::{WAIT, eventually};
use test_apiserver::Resource;

const NFT_CONFIG: &str = "nftables:\n  syncPeriod: 2s\n  minSyncPeriod: 0s\n";

/// What `nft <args>` prints in the node namespace (nothing when it fails: a missing table).
fn nft(cluster: &Cluster, args: &[&str]) -> String {
    let command = format!("nft {} 2>/dev/null; true", args.join(" "));
    String::from_utf8_lossy(&cluster.node.exec(&["sh", "-c", &command]).stdout).into_owned()
}

fn our_table(cluster: &Cluster) -> String {
    nft(cluster, &["list", "table", "ip", "kube-proxy"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_packets_through_the_nftables_proxier() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    // Another program's table, and chains an earlier iptables-mode run left behind.
    let other = "add table ip other\nadd chain ip other post { type nat hook postrouting priority 50 ; }\n\
                 add rule ip other post ip saddr 10.99.0.0/16 counter\n";
    let added = cluster
        .node
        .exec(&["sh", "-c", &format!("printf '{other}' | nft -f -")]);
    assert!(added.status.success(), "{added:?}");
    cluster.ipt(&["-t", "nat", "-N", "KUBE-SERVICES"]);
    cluster.ipt(&["-t", "nat", "-N", "KUBE-SVC-LEFTOVER0000000"]);
    cluster.ipt(&["-t", "nat", "-A", "PREROUTING", "-j", "KUBE-SERVICES"]);
    service_cidr(&cluster.api, "kubernetes", "10.96.0.0/16");

    let daemon = cluster.daemon(&cluster.config_with_mode("nftables", NFT_CONFIG));
    daemon.wait_for("\"Using nftables Proxier\"").await;
    daemon.wait_for("\"Synced proxy rules\"").await;
    let node = &cluster.node;
    let client = &cluster.client;
    let mode = http_get(node, addr("127.0.0.1:10249"), "/proxyMode").unwrap();
    assert_eq!(mode.1.trim(), "nftables");
    let table = our_table(&cluster);
    assert!(table.contains("chain nat-prerouting"), "{table}");
    assert!(table.contains("service-ips"), "{table}");
    // ServiceCIDRs are not waited for (an RBAC without them must not stop the services).
    assert!(
        eventually(WAIT, || our_table(&cluster).contains(
            "ip daddr 10.96.0.0/16 drop comment \"Drop traffic to unallocated ClusterIPs\""
        ))
        .await,
        "{}",
        our_table(&cluster)
    );

    // ClusterIP and NodePort (nodePortAddresses defaults to the node's primary address) reach
    // the pods and spread over them; UDP too.
    let all: BTreeSet<String> = PODS.iter().map(|p| p.0.to_string()).collect();
    let answers = many(40, || tcp_request(node, addr("10.96.0.10:80")));
    assert!(
        names(&answers).len() >= 2 && names(&answers).is_subset(&all),
        "{answers:?}"
    );
    let answers = many(40, || {
        tcp_request(client, addr(&format!("{NODE_IP}:30080")))
    });
    assert!(names(&answers).len() >= 2, "{answers:?}");
    let answers = many(30, || udp_request(node, addr("10.96.0.10:53")));
    assert!(names(&answers).len() >= 2, "UDP spreads: {answers:?}");
    let answers = many(10, || {
        udp_request(client, addr(&format!("{NODE_IP}:30053")))
    });
    assert!(
        answers.iter().all(Result::is_ok),
        "UDP NodePort: {answers:?}"
    );

    // ClientIP affinity sticks to one pod.
    let answers = many(15, || tcp_request(node, addr("10.96.0.11:80")));
    assert_eq!(names(&answers).len(), 1, "{answers:?}");

    // externalTrafficPolicy Local: only this node's pods, and they see the real client address.
    let answers = many(30, || {
        tcp_request(client, addr(&format!("{NODE_IP}:30081")))
    });
    let local: BTreeSet<String> = ["pod-a1", "pod-a2"].iter().map(|s| s.to_string()).collect();
    assert!(
        names(&answers).is_subset(&local) && !names(&answers).is_empty(),
        "{answers:?}"
    );
    assert!(
        answers.iter().all(|a| a
            .as_ref()
            .is_ok_and(|t| t.contains(&format!(" {CLIENT_IP}:")))),
        "{answers:?}"
    );
    let masked = tcp_request(client, addr(&format!("{NODE_IP}:30080"))).unwrap();
    assert!(!masked.contains(CLIENT_IP), "{masked}");

    // No endpoints, and a port an active ClusterIP does not serve: refused at once.
    assert_eq!(
        tcp_request(node, addr("10.96.0.13:80")),
        Err(ErrorKind::ConnectionRefused)
    );
    assert_eq!(
        tcp_request(node, addr("10.96.0.10:81")),
        Err(ErrorKind::ConnectionRefused)
    );

    // An unallocated address in the ServiceCIDR: dropped (no answer at all).
    assert_eq!(
        tcp_request(node, addr("10.96.0.99:80")),
        Err(ErrorKind::TimedOut)
    );
    // A second ServiceCIDR is followed.
    service_cidr(&cluster.api, "extra", "10.100.0.0/16");
    assert!(
        eventually(WAIT, || our_table(&cluster)
            .contains("{ 10.96.0.0/16, 10.100.0.0/16 } drop"))
        .await,
        "{}",
        our_table(&cluster)
    );

    // The other modes' leftovers went; the other program's table stayed.
    assert!(
        eventually(WAIT, || !cluster
            .ipt(&["-t", "nat", "-S"])
            .contains("KUBE-"))
        .await,
        "{}",
        cluster.ipt(&["-t", "nat", "-S"])
    );
    assert!(nft(&cluster, &["list", "table", "ip", "other"]).contains("10.99.0.0/16"));

    // Scale down, then up: traffic follows, and the service chain's rules stay as they are
    // (same handles): only the elements of its slot in an endpoint map change.
    let web_chain = chain_ending(&cluster, "service-", "default/web/tcp/http");
    let rules_with_handles = || {
        nft(
            &cluster,
            &["-a", "list", "chain", "ip", "kube-proxy", &web_chain],
        )
    };
    let before = rules_with_handles();
    let map = endpoint_map_of(&cluster, &web_chain);
    let shares = || nft(&cluster, &["list", "map", "ip", "kube-proxy", &map]);
    let shares_before = shares();
    let (_, slice_ports) = web_ports();
    cluster
        .api
        .apply(slice("web", slice_ports.clone(), &["pod-b2"]))
        .unwrap();
    assert!(
        eventually(WAIT, || names(&many(8, || tcp_request(
            node,
            addr("10.96.0.10:80")
        ))) == ["pod-b2".to_string()].into())
        .await
    );
    cluster
        .api
        .apply(slice("web", slice_ports, &["pod-a1", "pod-b2"]))
        .unwrap();
    assert!(
        eventually(WAIT, || names(&many(20, || tcp_request(
            node,
            addr("10.96.0.10:80")
        )))
        .len()
            == 2)
        .await
    );
    assert_eq!(rules_with_handles(), before);
    assert!(
        before.contains("numgen random mod 16384 offset"),
        "{before}"
    );
    // Two endpoints of the four: each owns half of the slot's draws.
    let shares_after = shares();
    assert_ne!(shares_after, shares_before);
    assert_eq!(
        shares_after.matches(" : 10.244.").count(),
        2,
        "{shares_after}"
    );
    // A new Service is served.
    let tcp = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    cluster
        .api
        .apply(service(
            "late",
            "10.96.0.30",
            json!([{"name": "http", "port": 80, "protocol": "TCP"}]),
            json!({}),
        ))
        .unwrap();
    cluster
        .api
        .apply(slice("late", tcp.clone(), &["pod-a2"]))
        .unwrap();
    assert!(
        eventually(WAIT, || names(&many(3, || tcp_request(
            node,
            addr("10.96.0.30:80")
        ))) == ["pod-a2".to_string()].into())
        .await
    );

    // Hairpin: a pod of this node reaches itself through its own Service, masqueraded (to the
    // node's address on its link) so that the answer comes back through the node.
    let hairpin = tcp_request(cluster.pod("pod-a2"), addr("10.96.0.30:80"));
    assert!(
        hairpin
            .as_ref()
            .is_ok_and(|a| a.starts_with("pod-a2 10.244.0.1:")),
        "{hairpin:?}"
    );
    // Another pod is not masqueraded.
    let direct = tcp_request(cluster.pod("pod-b1"), addr("10.96.0.30:80"));
    assert!(
        direct
            .as_ref()
            .is_ok_and(|a| a.starts_with("pod-a2 10.244.2.21:")),
        "{direct:?}"
    );

    // The daemon's own transactions are not taken for another program's changes (their
    // kernel events carry the port id of its own socket): nothing was repaired or re-read.
    assert_eq!(daemon.count("Rewrote our nftables objects"), 0);
    assert_eq!(daemon.count("Another program deleted or replaced"), 0);

    // Service deleted: its chains are flushed, then deleted; nothing answers for it.
    cluster
        .api
        .delete(Resource::Services, "default", "web")
        .unwrap();
    assert!(
        eventually(WAIT, || !our_table(&cluster).contains("default/web")).await,
        "{}",
        our_table(&cluster)
    );
    assert!(tcp_request(node, addr("10.96.0.10:80")).is_err());

    // Restart: traffic keeps flowing while the daemon is down and while it starts, and it
    // converges on what changed meanwhile.
    daemon.stop().await;
    assert!(tcp_request(node, addr("10.96.0.11:80")).is_ok());
    cluster
        .api
        .apply(slice("sticky", tcp, &["pod-a2"]))
        .unwrap();
    let daemon = cluster.daemon(&cluster.config_with_mode("nftables", NFT_CONFIG));
    assert!(tcp_request(node, addr("10.96.0.11:80")).is_ok());
    assert!(
        eventually(WAIT, || names(&many(5, || tcp_request(
            node,
            addr("10.96.0.11:80")
        ))) == ["pod-a2".to_string()].into())
        .await
    );
    daemon.wait_for("\"Synced proxy rules\"").await;
    // What the earlier run wrote and nothing changed is kept as it is: the table's digests
    // vouch for most of it, and the sync after reads it back.
    daemon
        .wait_for("Took what our table's digests vouch for as right")
        .await;
    daemon
        .wait_for("Kept chains an earlier run programmed as they are")
        .await;
    assert!(
        our_table(&cluster).contains("chain kube-proxy-rs-digests"),
        "{}",
        our_table(&cluster)
    );
    daemon.stop().await;

    // Another program changes the table while no daemon runs (the digests do not see it): the
    // restart keeps what they vouch for, and the sync after it reads the table back and
    // repairs the change.
    let tampered = cluster.node.exec(&[
        "nft",
        "delete",
        "element",
        "ip",
        "kube-proxy",
        "service-ips",
        "{ 10.96.0.11 . tcp . 80 }",
    ]);
    assert!(tampered.status.success(), "{tampered:?}");
    assert!(tcp_request(node, addr("10.96.0.11:80")).is_err());
    let daemon = cluster.daemon(&cluster.config_with_mode("nftables", NFT_CONFIG));
    daemon
        .wait_for("Took what our table's digests vouch for as right")
        .await;
    assert!(
        eventually(WAIT, || tcp_request(node, addr("10.96.0.11:80")).is_ok()).await,
        "{}",
        our_table(&cluster)
    );
    daemon.stop().await;

    // Switching to iptables mode: served by iptables, and our nftables tables go.
    let daemon = cluster.daemon(&cluster.config(""));
    daemon.wait_for("\"Synced proxy rules\"").await;
    assert!(
        eventually(WAIT, || our_table(&cluster).is_empty()).await,
        "{}",
        our_table(&cluster)
    );
    assert!(tcp_request(node, addr("10.96.0.30:80")).is_ok());
    assert!(nft(&cluster, &["list", "table", "ip", "other"]).contains("10.99.0.0/16"));
    daemon.stop().await;
}

/// A node that cannot run nftables mode exits non-zero, saying what is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nftables_mode_without_nft_exits_naming_it() {
    require_netns();
    let cluster = Cluster::start().await;
    let config = cluster.config_with_mode("nftables", NFT_CONFIG);
    let empty = tempfile::tempdir().unwrap();
    let path = format!("{}:/usr/bin:/bin", empty.path().display());
    let mut daemon = support::cluster::Daemon::spawn_with_env(
        &cluster.node,
        &config,
        &[],
        &[("PATH", path.as_str())],
    );
    let status = tokio::time::timeout(WAIT, daemon.child.wait())
        .await
        .expect("exits")
        .unwrap();
    assert!(!status.success());
    daemon.wait_for("the nft binary is missing").await;
}

/// The name of our chain whose name ends with `suffix` (`default/web/tcp/http`).
fn chain_ending(cluster: &Cluster, prefix: &str, suffix: &str) -> String {
    our_table(cluster)
        .lines()
        .filter_map(|line| line.trim().strip_prefix("chain "))
        .map(|rest| rest.trim_end_matches(" {").to_string())
        .find(|name| name.starts_with(prefix) && name.ends_with(suffix))
        .unwrap_or_else(|| panic!("no chain {prefix}...{suffix} in\n{}", our_table(cluster)))
}

/// The shared endpoint map `chain` DNATs through (`... map @endpoints-tcp-N`).
fn endpoint_map_of(cluster: &Cluster, chain: &str) -> String {
    let listing = nft(cluster, &["list", "chain", "ip", "kube-proxy", chain]);
    listing
        .split_whitespace()
        .find_map(|word| word.strip_prefix("@endpoints-"))
        .map(|rest| format!("endpoints-{rest}"))
        .unwrap_or_else(|| panic!("no endpoint map in\n{listing}"))
}

/// Another program changing our table: each change is seen in the kernel's events and exactly
/// what changed is rewritten, well within a syncPeriod (the config's is 30 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_in_our_table_is_repaired() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    let config = cluster.config_with_mode(
        "nftables",
        "nftables:\n  syncPeriod: 30s\n  minSyncPeriod: 0s\n",
    );
    let daemon = cluster.daemon(&config);
    daemon.wait_for("\"Synced proxy rules\"").await;
    let node = &cluster.node;
    let works = |ip: &str| tcp_request(node, addr(ip)).is_ok();
    assert!(works("10.96.0.10:80") && works("10.96.0.11:80"));
    let run = |commands: &str| {
        let out = node.exec(&["sh", "-c", &format!("printf '{commands}\\n' | nft -f -")]);
        assert!(out.status.success(), "{commands}: {out:?}");
    };

    // A service chain emptied.
    let chain = chain_ending(&cluster, "service-", "default/web/tcp/http");
    run(&format!("flush chain ip kube-proxy {chain}"));
    assert!(
        eventually(WAIT, || works("10.96.0.10:80")).await,
        "flushed chain repaired"
    );
    // A map element deleted.
    run("delete element ip kube-proxy service-ips { 10.96.0.11 . tcp . 80 }");
    assert!(
        eventually(WAIT, || works("10.96.0.11:80")).await,
        "element repaired"
    );
    // The elements of the endpoint map the service chain DNATs through, all gone.
    let map = endpoint_map_of(&cluster, &chain);
    run(&format!("flush map ip kube-proxy {map}"));
    assert!(
        eventually(WAIT, || works("10.96.0.10:80")).await,
        "endpoint map refilled"
    );
    // A rule inserted at the top of a chain of ours.
    run("insert rule ip kube-proxy services ip daddr 10.96.0.10 drop");
    assert!(
        eventually(WAIT, || !our_table(&cluster)
            .contains("ip daddr 10.96.0.10 drop"))
        .await,
        "inserted rule removed"
    );
    assert!(works("10.96.0.10:80"));
    // A base chain deleted.
    run("delete chain ip kube-proxy nat-output");
    assert!(eventually(WAIT, || our_table(&cluster).contains("chain nat-output")).await);
    assert!(eventually(WAIT, || works("10.96.0.10:80")).await);
    // The whole table deleted.
    run("delete table ip kube-proxy");
    assert!(
        eventually(WAIT, || works("10.96.0.10:80") && works("10.96.0.11:80")).await,
        "table recreated"
    );
    daemon
        .wait_for("Rewrote our nftables objects another program changed")
        .await;
    assert!(
        daemon.count("Failed to sync") == 0,
        "{:?}",
        daemon.lines.lock().unwrap()
    );
    daemon.stop().await;
}

/// Dual stack: `table ip6 kube-proxy` next to `table ip kube-proxy`, real IPv6 packets through
/// a ClusterIP and a NodePort, and a refused IPv6 service without endpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_through_the_nftables_proxier() {
    require_netns();
    let mut cluster = Cluster::start().await;
    cluster.add_ipv6();
    let ports = json!([{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30090}]);
    let slice_ports = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    cluster.api.apply(dual_stack_web(ports)).unwrap();
    let pods = ["pod-a1", "pod-b2"];
    apply_dual_stack_slices(&cluster, "web", slice_ports, &pods);
    let mut empty = service(
        "empty6",
        "fd00:10:96::13",
        json!([{"name": "http", "port": 80, "protocol": "TCP"}]),
        json!({"ipFamilies": ["IPv6"]}),
    );
    empty["spec"]["clusterIPs"] = json!(["fd00:10:96::13"]);
    cluster.api.apply(empty).unwrap();

    let daemon = cluster.daemon(&cluster.config_with_mode("nftables", NFT_CONFIG));
    daemon.wait_for("\"Synced proxy rules\"").await;
    let node = &cluster.node;
    let client = &cluster.client;
    let table6 = nft(&cluster, &["list", "table", "ip6", "kube-proxy"]);
    assert!(table6.contains("fd00:10:96::10"), "{table6}");
    let want: BTreeSet<String> = pods.iter().map(|p| p.to_string()).collect();
    let answers = many(30, || tcp_request(node, addr("[fd00:10:96::10]:80")));
    assert_eq!(names(&answers), want, "{answers:?}");
    let answers = many(30, || {
        tcp_request(client, addr(&format!("[{NODE_IP6}]:30090")))
    });
    assert_eq!(names(&answers), want, "{answers:?}");
    let answers = many(10, || {
        tcp_request(client, addr(&format!("{NODE_IP}:30090")))
    });
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert_eq!(
        tcp_request(node, addr("[fd00:10:96::13]:80")),
        Err(ErrorKind::ConnectionRefused)
    );
    daemon.stop().await;
}

/// LoadBalancer IPs with loadBalancerSourceRanges (`firewall-ips`): a source in range gets in, one
/// out of range is dropped, and a LoadBalancer without ranges is open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_balancer_source_ranges_in_nftables_mode() {
    require_netns();
    let cluster = Cluster::start().await;
    let http = json!([{"name": "http", "port": 80, "protocol": "TCP"}]);
    let backend = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    for (name, cluster_ip, lb, ranges) in [
        (
            "allowed",
            "10.96.0.71",
            "192.168.200.1",
            json!([format!("{CLIENT_IP}/32")]),
        ),
        (
            "elsewhere",
            "10.96.0.72",
            "192.168.200.2",
            json!(["10.99.0.0/16"]),
        ),
        ("open", "10.96.0.73", "192.168.200.3", json!([])),
    ] {
        let mut lb_service = service(
            name,
            cluster_ip,
            http.clone(),
            json!({"type": "LoadBalancer", "loadBalancerSourceRanges": ranges}),
        );
        lb_service["status"] = json!({"loadBalancer": {"ingress": [{"ip": lb}]}});
        cluster.api.apply(lb_service).unwrap();
        cluster
            .api
            .apply(slice(name, backend.clone(), &["pod-a1"]))
            .unwrap();
    }
    let daemon = cluster.daemon(&cluster.config_with_mode("nftables", NFT_CONFIG));
    daemon.wait_for("\"Synced proxy rules\"").await;
    let client = &cluster.client;
    assert!(
        eventually(WAIT, || tcp_request(client, addr("192.168.200.1:80"))
            .is_ok())
        .await,
        "in range"
    );
    assert_eq!(
        tcp_request(client, addr("192.168.200.2:80")),
        Err(ErrorKind::TimedOut),
        "out of range: dropped"
    );
    assert!(
        tcp_request(client, addr("192.168.200.3:80")).is_ok(),
        "no ranges: open"
    );
    assert!(our_table(&cluster).contains("firewall-ips"));
    daemon.stop().await;
}

/// A PATH whose `nft` refuses any transaction that mentions `default/refused` (naming its line,
/// as nft does when the kernel refuses a command) and runs the real nft otherwise.
/// A transaction the kernel refuses for one Service's objects fails no sync: that Service is
/// skipped with a warning, every other one is programmed, and the node keeps following. The
/// refusal is the kernel's own: another program left a set of another type in our table under
/// the name of the Service's affinity set, so the rules that look the set up are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_service_the_kernel_refuses_does_not_fail_the_node() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    let ports = json!([{"name": "http", "port": 80, "protocol": "TCP"}]);
    let backend = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    let affinity = json!({"sessionAffinity": "ClientIP"});
    cluster
        .api
        .apply(service("refused", "10.96.0.66", ports.clone(), affinity))
        .unwrap();
    cluster
        .api
        .apply(slice("refused", backend.clone(), &["pod-a1"]))
        .unwrap();
    let set = format!(
        "affinity-{}",
        hash_and_truncate("default/refused/tcp/http__10.244.1.11/8080")
    );
    let foreign =
        format!("add table ip kube-proxy\nadd set ip kube-proxy {set} {{ type ipv6_addr ; }}\n");
    let path = cluster.dir.path().join("foreign.nft");
    std::fs::write(&path, foreign).unwrap();
    cluster.node.exec(&["nft", "-f", path.to_str().unwrap()]);
    let config = cluster.config_with_mode("nftables", NFT_CONFIG);
    let daemon = support::cluster::Daemon::spawn(&cluster.node, &config, &[]);
    daemon.wait_for("\"Synced proxy rules\"").await;
    daemon.wait_for("service=\"default/refused\"").await;
    let node = &cluster.node;
    assert!(tcp_request(node, addr("10.96.0.10:80")).is_ok());
    let table = our_table(&cluster);
    assert!(
        !table
            .lines()
            .any(|l| l.trim_start().starts_with("chain ") && l.contains("default/refused")),
        "no chain of the refused Service: {table}"
    );
    assert!(tcp_request(node, addr("10.96.0.66:80")).is_err());
    cluster
        .api
        .apply(service("later", "10.96.0.67", ports, json!({})))
        .unwrap();
    cluster
        .api
        .apply(slice("later", backend, &["pod-a2"]))
        .unwrap();
    assert!(
        eventually(WAIT, || tcp_request(node, addr("10.96.0.67:80")).is_ok()).await,
        "a later Service is programmed"
    );
    assert_eq!(daemon.count("Failed to sync"), 0);
    daemon.stop().await;
}

/// `--offload-packet-threshold` where the kernel may have no flowtables (this machine's has
/// none; tests/nftables_offload_vm.rs runs a kernel that has them): the daemon says which, the
/// rest of the table is written and serves, and its probe leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offload_is_said_to_be_on_or_impossible_and_the_rest_is_written() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    // What the kernel can do, asked with nft itself in a namespace of its own.
    let scratch = support::netns::Netns::new("ft-probe");
    let kernel_has_flowtables = scratch
        .raw_output(&[
            "sh",
            "-c",
            "printf 'add table ip t\\nadd flowtable ip t f { hook ingress priority filter ; }\\n' | nft -f -",
        ])
        .status
        .success();
    let config = cluster.config_with_mode("nftables", NFT_CONFIG);
    let daemon = cluster.daemon_with(&config, &["--offload-packet-threshold=20"]);
    daemon.wait_for("\"Synced proxy rules\"").await;
    let table = our_table(&cluster);
    if kernel_has_flowtables {
        daemon
            .wait_for("Offloading connections to ClusterIPs to the flowtable fast path")
            .await;
        assert!(table.contains("flowtable kube-proxy-flowtable"), "{table}");
        assert!(table.contains("flow add @kube-proxy-flowtable"), "{table}");
    } else {
        daemon
            .wait_for("the kernel refused a flowtable (a kernel without flowtables, NF_FLOW_TABLE and module nf_flow_table_inet, refuses it)")
            .await;
        assert!(!table.contains("flowtable"), "{table}");
        assert!(!table.contains("flow add"), "{table}");
        assert!(!table.contains("flow-offload-requests"), "{table}");
    }
    let answers = many(20, || tcp_request(&cluster.node, addr("10.96.0.10:80")));
    assert!(names(&answers).len() >= 2, "{answers:?}");
    let tables = nft(&cluster, &["list", "tables"]);
    assert!(!tables.contains("probe"), "{tables}");
    daemon.stop().await;
}
