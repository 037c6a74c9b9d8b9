//! The real daemon in IPVS mode, in the VM (see `support::vm`): traffic to ClusterIPs and
//! NodePorts, affinity and graceful termination, partial syncs against a full one, IPv6, and
//! mode switches and `--cleanup`.

mod support;

use kube_proxy_rs::model::IpFamily;
use support::netns::Netns;
use support::vm::{in_vm, ipvs_state, text};

/// The real daemon in IPVS mode: `ipvsadm -Ln` shows every ClusterIP and NodePort with the pods as
/// Masq real servers, kube-ipvs0 holds exactly the service IPs, connections spread over the pods,
/// changes are followed, and a virtual server added by hand survives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipvs_mode_end_to_end() {
    if !in_vm("ipvs_mode_end_to_end") {
        return;
    }
    use support::cluster::{Cluster, NODE_IP, addr, many, names, seed, slice, web_ports};
    use support::netns::{echo, tcp_connect, tcp_request};
    use support::{WAIT, eventually};

    let cluster = Cluster::start().await;
    seed(&cluster.api);
    cluster
        .node
        .exec(&["ipvsadm", "-A", "-t", "172.31.9.9:9999", "-s", "rr"]);
    let config = cluster.config_with_mode("ipvs", "ipvs:\n  scheduler: rr\n");
    let daemon = cluster.daemon(&config);
    daemon.wait_for("\"Using ipvs Proxier\"").await;
    // Upstream's deprecation of the ipvs proxier: logged as an error, and a Warning Event
    // regarding the Node.
    daemon
        .wait_for("\"The ipvs proxier is now deprecated and may be removed in a future release. Please use 'nftables' instead.\"")
        .await;
    daemon.wait_for("\"Synced proxy rules\"").await;
    let deprecation = |event: &serde_json::Value| {
        event["reason"] == "IPVSDeprecation"
            && event["type"] == "Warning"
            && event["action"] == "StartKubeProxy"
            && event["regarding"]["kind"] == "Node"
            && event["regarding"]["name"] == "node-a"
            && event["note"]
                .as_str()
                .is_some_and(|note| note.starts_with("The ipvs proxier is now deprecated"))
    };
    let events = || cluster.api.list(test_apiserver::Resource::EventsV1);
    assert!(
        eventually(WAIT, || events().iter().any(deprecation)).await,
        "{:?}",
        events()
    );
    let node = &cluster.node;
    let listing = node.output(&["ipvsadm", "-Ln"]);
    for want in [
        "TCP  10.96.0.10:80 rr",
        "UDP  10.96.0.10:53 rr",
        &format!("TCP  {NODE_IP}:30080 rr"),
        "-> 10.244.1.11:8080",
        "Masq    1",
        "TCP  10.96.0.11:80 rr persistent 600",
        "TCP  172.31.9.9:9999 rr",
    ] {
        assert!(
            listing.contains(want),
            "ipvsadm -Ln lacks {want:?}:\n{listing}"
        );
    }
    let bound = node.output(&["ip", "-4", "addr", "show", "kube-ipvs0"]);
    for ip in [
        "10.96.0.10/32",
        "10.96.0.11/32",
        "10.96.0.12/32",
        "10.96.0.13/32",
    ] {
        assert!(bound.contains(ip), "{bound}");
    }
    assert!(
        !bound.contains(NODE_IP),
        "NodePort addresses are never bound"
    );

    let answers = many(30, || tcp_request(node, addr("10.96.0.10:80")));
    assert!(names(&answers).len() >= 2, "{answers:?}");
    let answers = many(20, || {
        tcp_request(&cluster.client, addr(&format!("{NODE_IP}:30080")))
    });
    assert!(names(&answers).len() >= 2, "NodePort: {answers:?}");

    // A restart disturbs nothing: while the daemon is gone and after the new one's first (full)
    // sync, an open connection keeps working, new ones are served, and the kernel state is as it was.
    let before = node.output(&["ipvsadm", "-Sn"]);
    let (mut held, _) = tcp_connect(&cluster.client, addr("10.96.0.10:80"));
    daemon.stop().await;
    assert_eq!(
        echo(&mut held, "while stopped").as_deref(),
        Ok("while stopped")
    );
    assert!(tcp_request(node, addr("10.96.0.10:80")).is_ok());
    let daemon = cluster.daemon(&config);
    daemon.wait_for("\"Synced proxy rules\"").await;
    assert_eq!(
        echo(&mut held, "after restart").as_deref(),
        Ok("after restart")
    );
    assert_eq!(
        node.output(&["ipvsadm", "-Sn"]),
        before,
        "the restart changed nothing"
    );
    drop(held);

    let (_, slice_ports) = web_ports();
    cluster
        .api
        .apply(slice("web", slice_ports, &["pod-b2"]))
        .unwrap();
    assert!(
        eventually(WAIT, || names(&many(6, || tcp_request(
            node,
            addr("10.96.0.10:80")
        ))) == ["pod-b2".to_string()].into())
        .await
    );
    cluster
        .api
        .delete(test_apiserver::Resource::Services, "default", "web")
        .unwrap();
    assert!(
        eventually(WAIT, || !node
            .output(&["ipvsadm", "-Ln"])
            .contains("10.96.0.10:80"))
        .await
    );
    assert!(
        eventually(WAIT, || !node
            .output(&["ip", "addr", "show", "kube-ipvs0"])
            .contains("10.96.0.10/32"))
        .await
    );
    assert!(
        node.output(&["ipvsadm", "-Ln"]).contains("172.31.9.9:9999"),
        "the hand-made virtual server survives"
    );
    daemon.stop().await;
}

/// ClientIP affinity sticks to one pod; a removed endpoint drains: its real server goes to weight 0
/// while a connection is open (which keeps working), and is deleted once the connection is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipvs_affinity_and_graceful_termination() {
    if !in_vm("ipvs_affinity_and_graceful_termination") {
        return;
    }
    use support::cluster::{Cluster, addr, many, names, seed, slice};
    use support::netns::{echo, tcp_connect, tcp_request};
    use support::{WAIT, eventually};

    let cluster = Cluster::start().await;
    seed(&cluster.api);
    let tcp = serde_json::json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    cluster
        .api
        .apply(slice("local", tcp.clone(), &["pod-a1"]))
        .unwrap();
    let extra = "ipvs:\n  syncPeriod: 2s\n  minSyncPeriod: 0s\n  tcpFinTimeout: 2s\n";
    let daemon = cluster.daemon(&cluster.config_with_mode("ipvs", extra));
    daemon.wait_for("\"Using ipvs Proxier\"").await;
    daemon.wait_for("\"Synced proxy rules\"").await;
    let node = &cluster.node;

    let answers = many(12, || tcp_request(node, addr("10.96.0.11:80")));
    assert_eq!(
        names(&answers).len(),
        1,
        "persistence keeps one pod: {answers:?}"
    );

    // A connection to the only endpoint of `local`, then that endpoint is replaced.
    let (mut held, greeting) = tcp_connect(node, addr("10.96.0.12:80"));
    assert!(greeting.starts_with("pod-a1 "), "{greeting}");
    cluster.api.apply(slice("local", tcp, &["pod-a2"])).unwrap();
    let draining = |weight: &str| {
        let listing = node.output(&["ipvsadm", "-Ln", "-t", "10.96.0.12:80"]);
        listing
            .lines()
            .any(|l| l.contains("10.244.1.11:8080") && l.split_whitespace().nth(3) == Some(weight))
    };
    assert!(
        eventually(WAIT, || draining("0")).await,
        "{}",
        node.output(&["ipvsadm", "-Ln", "-t", "10.96.0.12:80"])
    );
    assert_eq!(
        echo(&mut held, "still there?"),
        Ok("still there?".to_string()),
        "the open connection keeps working"
    );
    assert!(
        names(&many(6, || tcp_request(node, addr("10.96.0.12:80"))))
            == ["pod-a2".to_string()].into(),
        "new connections go to the new pod"
    );
    drop(held);
    // The closed connection stays in IPVS's TIME_WAIT (an inactive connection) for its fixed two
    // minutes; until then the real server must stay (weight 0), and afterwards it must go.
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    assert!(
        draining("0"),
        "not deleted while a closed connection still counts:\n{}",
        node.output(&["ipvsadm", "-Lnc"])
    );
    let time_wait = std::time::Duration::from_secs(200);
    assert!(
        eventually(time_wait, || !node
            .output(&["ipvsadm", "-Ln", "-t", "10.96.0.12:80"])
            .contains("10.244.1.11"))
        .await,
        "the drained real server is deleted once its connections are gone:\n{}",
        node.output(&["ipvsadm", "-Lnc"])
    );
    daemon.stop().await;
}

/// Syncs of a few changed services diff against memory, not the kernel: after a series of them
/// the kernel holds exactly what a fresh full sync programs; state removed by hand is noticed by
/// the periodic (nothing changed) sync and restored.
#[test]
fn ipvs_partial_syncs_match_a_full_sync() {
    if !in_vm("ipvs_partial_syncs_match_a_full_sync") {
        return;
    }
    use kube_proxy_rs::model::{ChangeSummary, NamespacedName};
    use kube_proxy_rs::proxier::Proxier;

    let ours = Netns::new("ipvs-partial");
    let fresh = Netns::new("ipvs-fresh");
    let state = support::scale::state(30);
    let final_state = ours.run(move || {
        let mut proxier = support::scale::ipvs_proxier();
        let mut state = state;
        assert!(
            proxier
                .sync(&state, &ChangeSummary::default())
                .unwrap()
                .full,
            "the first sync reads everything"
        );
        let key = |i: usize| NamespacedName::new("bench", format!("svc-{i}"));
        let changed = |keys: &[NamespacedName]| ChangeSummary {
            changed_services: keys.iter().cloned().collect(),
            ..ChangeSummary::default()
        };
        // One endpoint fewer, a service gone, a new one, a port changed, every endpoint gone.
        type Step<'a> =
            Box<dyn Fn(&mut kube_proxy_rs::model::ProxyState) -> Vec<NamespacedName> + 'a>;
        let step: [Step<'_>; 5] = [
            Box::new(|s| {
                s.endpoints
                    .get_mut(&key(3))
                    .unwrap()
                    .values_mut()
                    .next()
                    .unwrap()
                    .pop();
                vec![key(3)]
            }),
            Box::new(|s| {
                s.services.remove(&key(5));
                s.endpoints.remove(&key(5));
                vec![key(5)]
            }),
            Box::new(|s| {
                let extra = support::scale::state(31);
                s.services.insert(key(30), extra.services[&key(30)].clone());
                s.endpoints
                    .insert(key(30), extra.endpoints[&key(30)].clone());
                vec![key(30)]
            }),
            Box::new(|s| {
                let port = s
                    .services
                    .get_mut(&key(7))
                    .unwrap()
                    .values_mut()
                    .next()
                    .unwrap();
                port.port = 8443;
                port.node_port = None;
                vec![key(7)]
            }),
            Box::new(|s| {
                s.endpoints.remove(&key(9));
                vec![key(9)]
            }),
        ];
        let mut rule_counts = Vec::new();
        for change in &step {
            let keys = change(&mut state);
            let report = proxier.sync(&state, &changed(&keys)).unwrap();
            assert!(!report.full, "a change sync reads no more than it must");
            rule_counts = report.rules;
        }
        (state, proxier, rule_counts)
    });
    let (final_state, mut proxier, rule_counts) = final_state;
    // The rule-count metric says what the kernel holds in our chains.
    let saved = text(&ours, &["iptables-nft-save"]);
    let in_kernel: Vec<(IpFamily, &str, usize)> = ["filter", "nat"]
        .into_iter()
        .map(|table| {
            let section = kube_proxy_rs::sys::xtables::table_section(&saved, table);
            (
                IpFamily::V4,
                table,
                section
                    .lines()
                    .filter(|l| l.starts_with("-A KUBE-"))
                    .count(),
            )
        })
        .collect();
    assert_eq!(rule_counts, in_kernel, "{saved}");
    let partial = ipvs_state(&ours);
    assert!(
        partial.iter().any(|l| l.contains("172.30.0.8:8443")),
        "{partial:#?}"
    );
    assert!(
        !partial.iter().any(|l| l.contains("172.30.0.6:80")),
        "svc-5 gone"
    );
    let for_fresh = final_state.clone();
    fresh.run(move || {
        support::scale::ipvs_proxier()
            .sync(&for_fresh, &ChangeSummary::default())
            .unwrap();
    });
    assert_eq!(
        partial,
        ipvs_state(&fresh),
        "partial syncs == one full sync"
    );

    // Drift: everything removed by hand comes back at the next periodic sync.
    ours.output(&["ipvsadm", "-C"]);
    ours.output(&["ip", "addr", "flush", "dev", "kube-ipvs0"]);
    assert!(text(&ours, &["ipvsadm", "-Sn"]).is_empty());
    let (repair, after, mut proxier, final_state) = ours.run(move || {
        let empty = ChangeSummary::default();
        let repair = proxier.sync(&final_state, &empty).unwrap();
        let after = proxier.sync(&final_state, &empty).unwrap();
        (repair, after, proxier, final_state)
    });
    assert!(
        repair.full,
        "the periodic check notices the missing virtual servers"
    );
    assert!(!after.full, "and then finds the kernel as it left it");
    assert_eq!(partial, ipvs_state(&ours));

    // Smaller drift, repaired by the next periodic sync without a full one: a real server, a
    // set entry and a jump from a built-in chain removed by hand.
    let real = text(&ours, &["ipvsadm", "-Sn"])
        .lines()
        .find(|l| l.starts_with("-a "))
        .unwrap()
        .to_string();
    let removal: Vec<&str> = real
        .split_whitespace()
        .take(5)
        .map(|w| if w == "-a" { "-d" } else { w })
        .collect();
    let mut command = vec!["ipvsadm"];
    command.extend(&removal);
    ours.output(&command);
    let entry = text(&ours, &["ipset", "list", "KUBE-CLUSTER-IP"])
        .lines()
        .find(|l| l.contains(",tcp:"))
        .unwrap()
        .trim()
        .to_string();
    ours.output(&["ipset", "del", "KUBE-CLUSTER-IP", &entry]);
    ours.output(&[
        "iptables-nft",
        "-t",
        "nat",
        "-D",
        "PREROUTING",
        "-m",
        "comment",
        "--comment",
        "kubernetes service portals",
        "-j",
        "KUBE-SERVICES",
    ]);
    assert_ne!(partial, ipvs_state(&ours));
    let small = ours.run(move || {
        proxier
            .sync(&final_state, &ChangeSummary::default())
            .unwrap()
    });
    assert!(!small.full, "repaired by the periodic check");
    assert_eq!(partial, ipvs_state(&ours));
    assert!(text(&ours, &["ipset", "list", "KUBE-CLUSTER-IP"]).contains(&entry));
    assert!(
        text(&ours, &["iptables-nft", "-t", "nat", "-S", "PREROUTING"]).contains("KUBE-SERVICES")
    );
}

/// IPv6 in IPVS mode: a dual-stack node serves an IPv6 ClusterIP and NodePort through IPVS
/// (KUBE-6- sets, ip6tables rules) with real connections spread over the pods, and the
/// NodePort on ::1 through the localhost NodePort proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipvs_mode_ipv6_traffic() {
    if !in_vm("ipvs_mode_ipv6_traffic") {
        return;
    }
    use serde_json::json;
    use support::cluster::{Cluster, NODE_IP6, addr, many, names, service, slice, slice6};
    use support::netns::tcp_request;

    let mut cluster = Cluster::start().await;
    cluster.add_ipv6();
    let ports = json!([{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30086}]);
    let slice_ports = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    let mut web6 = service(
        "web6",
        "fd00:10:96::10",
        ports,
        json!({"type": "NodePort", "ipFamilies": ["IPv6"]}),
    );
    web6["spec"]["clusterIPs"] = json!(["fd00:10:96::10"]);
    cluster.api.apply(web6).unwrap();
    cluster
        .api
        .apply(slice6(
            "web6",
            slice_ports,
            &["pod-a1", "pod-a2", "pod-b1", "pod-b2"],
        ))
        .unwrap();
    let ports4 = json!([{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30088}]);
    let web4 = service("web4", "10.96.0.20", ports4, json!({"type": "NodePort"}));
    cluster.api.apply(web4).unwrap();
    let slice4_ports = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    cluster
        .api
        .apply(slice("web4", slice4_ports, &["pod-a1", "pod-b2"]))
        .unwrap();
    // Localhost NodePorts through the userspace proxy, beside IPVS (KEP-6032).
    let config = cluster.config_with_mode(
        "ipvs",
        "featureGates:\n  KubeProxyNFTablesLocalhostNodePorts: true\n\
         nodePortAddresses: [primary, localhost]\n",
    );
    let daemon = cluster.daemon(&config);
    daemon.wait_for("\"Using ipvs Proxier\"").await;
    daemon.wait_for("\"Synced proxy rules\"").await;
    let node = &cluster.node;
    let listing = node.output(&["ipvsadm", "-Ln"]);
    for want in [
        "TCP  [fd00:10:96::10]:80 rr",
        &format!("TCP  [{NODE_IP6}]:30086 rr"),
        "-> [fd00:10:244::11]:8080",
    ] {
        assert!(
            listing.contains(want),
            "ipvsadm -Ln lacks {want:?}:\n{listing}"
        );
    }
    assert!(
        node.output(&["ip", "-6", "addr", "show", "kube-ipvs0"])
            .contains("fd00:10:96::10/128")
    );
    assert!(
        node.output(&["ipset", "list", "-n"])
            .contains("KUBE-6-CLUSTER-IP")
    );
    let answers = many(20, || tcp_request(node, addr("[fd00:10:96::10]:80")));
    assert!(
        names(&answers).len() >= 2,
        "ClusterIP over IPv6: {answers:?}"
    );
    let answers = many(20, || {
        tcp_request(&cluster.client, addr(&format!("[{NODE_IP6}]:30086")))
    });
    assert!(
        names(&answers).len() >= 2,
        "NodePort over IPv6: {answers:?}"
    );
    let answers = many(20, || tcp_request(node, addr("[::1]:30086")));
    assert!(
        names(&answers).len() >= 2,
        "NodePort on ::1, through the proxy: {answers:?}"
    );
    let answers = many(20, || tcp_request(node, addr("127.0.0.1:30088")));
    assert!(
        names(&answers).len() >= 2,
        "NodePort on 127.0.0.1, through the proxy: {answers:?}"
    );
    assert!(
        !listing.contains("[::1]:30086") && !listing.contains("127.0.0.1:30088"),
        "no virtual server on a loopback address:\n{listing}"
    );
    daemon.stop().await;
}

/// Node addresses as upstream reads them (kubernetes#114815, #138927): by link, so that a
/// load-balancer IP equal to the node's address leaves that address a node address (a NodePort
/// virtual server on it, unbound from kube-ipvs0 where it was bound), and an IPv4 link-local
/// address (node-local DNS's 169.254.20.10) serves NodePorts too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_addresses_are_read_by_link() {
    if !in_vm("node_addresses_are_read_by_link") {
        return;
    }
    use serde_json::json;
    use support::cluster::{Cluster, NODE_IP, addr, service, slice};
    use support::netns::tcp_request;

    let cluster = Cluster::start().await;
    let node = &cluster.node;
    node.exec(&["ip", "link", "add", "nodelocaldns", "type", "dummy"]);
    node.exec(&[
        "ip",
        "addr",
        "add",
        "169.254.20.10/32",
        "dev",
        "nodelocaldns",
    ]);
    node.exec(&["ip", "link", "set", "nodelocaldns", "up"]);
    // As an earlier daemon that read node addresses by value left it: the node's address bound.
    node.exec(&["ip", "link", "add", "kube-ipvs0", "type", "dummy"]);
    node.exec(&[
        "ip",
        "addr",
        "add",
        &format!("{NODE_IP}/32"),
        "dev",
        "kube-ipvs0",
    ]);
    let ports = json!([{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30087}]);
    let mut lb = service("lb", "10.96.0.20", ports, json!({"type": "LoadBalancer"}));
    lb["status"] = json!({"loadBalancer": {"ingress": [{"ip": NODE_IP}]}});
    cluster.api.apply(lb).unwrap();
    let slice_ports = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    cluster
        .api
        .apply(slice("lb", slice_ports, &["pod-a1", "pod-b2"]))
        .unwrap();
    let daemon = cluster.daemon(&cluster.config_with_mode("ipvs", ""));
    daemon.wait_for("\"Synced proxy rules\"").await;
    let listing = node.output(&["ipvsadm", "-Ln"]);
    for want in [
        format!("TCP  {NODE_IP}:30087 rr"),
        format!("TCP  {NODE_IP}:80 rr"),
        "TCP  169.254.20.10:30087 rr".to_string(),
    ] {
        assert!(listing.contains(&want), "no {want:?}:\n{listing}");
    }
    let bound = node.output(&["ip", "-4", "addr", "show", "kube-ipvs0"]);
    assert!(bound.contains("10.96.0.20/32"), "{bound}");
    assert!(
        !bound.contains(NODE_IP),
        "the node's address is not bound: {bound}"
    );
    assert!(tcp_request(&cluster.client, addr(&format!("{NODE_IP}:30087"))).is_ok());
    assert!(tcp_request(&cluster.client, addr(&format!("{NODE_IP}:80"))).is_ok());
    daemon.stop().await;
}

/// Switching modes as seed 002 does (edit the ConfigMap, restart), iptables -> ipvs -> iptables:
/// traffic keeps flowing through every switch, each start leaves exactly its own mode's state,
/// and a virtual server and rule of someone else survive. Then `--cleanup`, twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_switches_leave_one_mode_and_cleanup_leaves_nothing() {
    if !in_vm("mode_switches_leave_one_mode_and_cleanup_leaves_nothing") {
        return;
    }
    use support::cluster::{BIN, Cluster, addr, seed};
    use support::netns::tcp_request;

    let cluster = Cluster::start().await;
    seed(&cluster.api);
    let node = &cluster.node;
    node.exec(&["ipvsadm", "-A", "-t", "172.31.9.9:9999", "-s", "rr"]);
    node.exec(&["iptables-nft", "-t", "nat", "-N", "FOREIGN"]);
    let serving = || tcp_request(node, addr("10.96.0.10:80")).is_ok();
    let per_service_chains = || {
        node.output(&["iptables-nft-save", "-t", "nat"])
            .lines()
            .filter(|l| l.starts_with(":KUBE-SVC-") || l.starts_with(":KUBE-SEP-"))
            .count()
    };
    let ipvs_state = || {
        (
            node.output(&["ipvsadm", "-Ln"]).contains("10.96.0.10:80"),
            node.output(&["ip", "link", "show", "kube-ipvs0"])
                .contains("kube-ipvs0"),
            node.output(&["ipset", "list", "-n"])
                .contains("KUBE-CLUSTER-IP"),
        )
    };

    for (round, mode) in ["iptables", "ipvs", "iptables"].into_iter().enumerate() {
        let daemon = cluster.daemon(&cluster.config_with_mode(mode, ""));
        daemon.wait_for(&format!("\"Using {mode} Proxier\"")).await;
        if round > 0 {
            daemon
                .wait_for("\"Removing the other proxy mode's leftovers\"")
                .await;
        }
        daemon.wait_for("\"Synced proxy rules\"").await;
        // Give the removal after the first sync a moment, then look.
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        assert!(serving(), "{mode}: traffic flows");
        if mode == "ipvs" {
            assert_eq!(per_service_chains(), 0, "iptables mode's chains are gone");
            assert_eq!(ipvs_state(), (true, true, true));
        } else {
            assert!(per_service_chains() > 0);
            assert_eq!(ipvs_state(), (false, false, false), "IPVS state is gone");
        }
        assert!(node.output(&["ipvsadm", "-Ln"]).contains("172.31.9.9:9999"));
        assert!(
            node.output(&["iptables-nft-save", "-t", "nat"])
                .contains(":FOREIGN")
        );
        daemon.stop().await;
        assert!(serving(), "{mode}: traffic flows with the daemon stopped");
    }

    // Leave IPVS state behind, then clean everything up, twice.
    let daemon = cluster.daemon(&cluster.config_with_mode("ipvs", ""));
    daemon.wait_for("\"Synced proxy rules\"").await;
    daemon.stop().await;
    for _ in 0..2 {
        let output = std::process::Command::new("ip")
            .args(["netns", "exec", &node.name, BIN, "--cleanup"])
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let saved = node.output(&["iptables-nft-save"]);
        assert!(
            !saved
                .lines()
                .any(|l| l.contains("KUBE-") && !l.contains("KUBE-FIREWALL")),
            "{saved}"
        );
        assert_eq!(ipvs_state(), (false, false, false));
        assert!(node.output(&["ipvsadm", "-Ln"]).contains("172.31.9.9:9999"));
        assert!(saved.contains(":FOREIGN"));
    }
}
