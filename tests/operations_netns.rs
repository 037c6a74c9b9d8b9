//! Operations against the real daemon in network namespaces: the health, metrics and
//! per-service health-check servers over real HTTP.

mod support;

use serde_json::{Value, json};
use support::cluster::{Cluster, NODE_IP, addr, seed, service, slice};
use support::netns::{http_get, require_netns};
use support::{WAIT, eventually};

fn json_body(reply: &(u16, String)) -> Value {
    serde_json::from_str(&reply.1).unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_metrics_and_service_health_servers() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    let tcp = json!([{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30082}]);
    cluster
        .api
        .apply(service(
            "lb",
            "10.96.0.20",
            tcp,
            json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local", "healthCheckNodePort": 32100}),
        ))
        .unwrap();
    let slice_ports = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    cluster
        .api
        .apply(slice(
            "lb",
            slice_ports.clone(),
            &["pod-a1", "pod-a2", "pod-b1"],
        ))
        .unwrap();
    let daemon = cluster.daemon(&cluster.config(""));
    daemon.wait_for("\"Synced proxy rules\"").await;
    let node = &cluster.node;

    // Node setup as upstream: conntrack timeouts (per namespace) and the OOM score.
    let sysctl = |name: &str| node.output(&["sysctl", "-n", name]).trim().to_string();
    assert_eq!(
        sysctl("net.netfilter.nf_conntrack_tcp_timeout_established"),
        "86400"
    );
    assert_eq!(
        sysctl("net.netfilter.nf_conntrack_tcp_timeout_close_wait"),
        "3600"
    );
    // Lowering it needs CAP_SYS_RESOURCE, which this sandbox may lack: then it is a warning.
    daemon.wait_for("oom_score_adj\" value=-999").await;

    // Health: ready and alive, with upstream's JSON.
    let healthz = http_get(node, addr("127.0.0.1:10256"), "/healthz").unwrap();
    assert_eq!(healthz.0, 200, "{healthz:?}");
    let body = json_body(&healthz);
    assert_eq!(body["healthy"], true);
    assert!(
        body["lastUpdated"]
            .as_str()
            .is_some_and(|t| t.contains('T')),
        "{body}"
    );
    assert!(body["currentTime"].as_str().is_some());
    assert_eq!(
        http_get(node, addr(&format!("{NODE_IP}:10256")), "/livez")
            .unwrap()
            .0,
        200
    );

    // Metrics on loopback only, upstream's names, counters that move with syncs.
    let metrics = http_get(node, addr("127.0.0.1:10249"), "/metrics").unwrap();
    assert_eq!(metrics.0, 200);
    for name in [
        "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
        "kubeproxy_sync_proxy_rules_endpoint_changes_total",
        "kubeproxy_sync_proxy_rules_service_changes_total",
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family=\"IPv4\"} 0",
        "kubeproxy_network_programming_duration_seconds",
    ] {
        assert!(metrics.1.contains(name), "{name} missing:\n{}", metrics.1);
    }
    let count = |text: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with("kubeproxy_sync_proxy_rules_duration_seconds_count"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let syncs = count(&metrics.1);
    assert!(syncs >= 1.0, "{}", metrics.1);
    // Every metric the kubernetes-mixin "Kubernetes / Proxy" dashboard queries (its PromQL's
    // metric names, `up` aside, which Prometheus makes), and what upstream adds around them.
    for name in [
        "kubeproxy_sync_proxy_rules_duration_seconds_count",
        "kubeproxy_sync_proxy_rules_duration_seconds_bucket{",
        "kubeproxy_network_programming_duration_seconds_count",
        "kubeproxy_network_programming_duration_seconds_bucket{",
        "rest_client_requests_total{code=\"200\"",
        "rest_client_request_duration_seconds_bucket{",
        "process_resident_memory_bytes ",
        "process_cpu_seconds_total ",
        "go_goroutines ",
        "kubeproxy_proxy_healthz_total{code=\"200\"}",
        "kubeproxy_proxy_livez_total{code=\"200\"}",
        "kubeproxy_sync_proxy_rules_iptables_last{ip_family=\"IPv4\",table=\"nat\"}",
        "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total{ip_family=\"IPv4\"} 0",
        "kubernetes_build_info{",
        "kubernetes_feature_enabled{name=\"NFTablesProxyMode\",stage=\"\"} 1",
    ] {
        assert!(metrics.1.contains(name), "{name} missing:\n{}", metrics.1);
    }
    let verb_get = metrics.1.lines().any(|l| {
        l.starts_with("rest_client_request_duration_seconds_count") && l.contains("verb=\"GET\"")
    });
    assert!(verb_get, "the API client's GETs are timed:\n{}", metrics.1);
    // The rule counts say what the kernel holds in our chains.
    let saved = node.output(&["iptables-nft-save"]);
    for table in ["filter", "nat"] {
        let section = kube_proxy_rs::sys::xtables::table_section(&saved, table);
        let in_kernel = section
            .lines()
            .filter(|l| l.starts_with("-A KUBE-"))
            .count();
        let metric = format!(
            "kubeproxy_sync_proxy_rules_iptables_total{{ip_family=\"IPv4\",table=\"{table}\"}} {in_kernel}"
        );
        assert!(
            metrics.1.lines().any(|l| l == metric),
            "{metric} missing:\n{}",
            metrics.1
        );
    }
    for line in metrics
        .1
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let value = line.rsplit(' ').next().unwrap_or("");
        assert!(
            value.parse::<f64>().is_ok(),
            "not Prometheus text: {line:?}"
        );
    }
    assert!(
        http_get(node, addr(&format!("{NODE_IP}:10249")), "/metrics").is_err(),
        "metrics listen on loopback only"
    );
    assert_eq!(
        http_get(node, addr("127.0.0.1:10249"), "/proxyMode").unwrap(),
        (200, "iptables".to_string())
    );
    // The configuration in force, with its apiVersion and kind, as upstream 1.36 serves it.
    let (status, configz) = http_get(node, addr("127.0.0.1:10249"), "/configz").unwrap();
    assert_eq!(status, 200);
    let configz: serde_json::Value = serde_json::from_str(&configz).expect("JSON");
    let served = &configz["kubeproxy.config.k8s.io"];
    assert_eq!(
        served["apiVersion"], "kubeproxy.config.k8s.io/v1alpha1",
        "{configz}"
    );
    assert_eq!(served["kind"], "KubeProxyConfiguration", "{configz}");
    assert_eq!(served["mode"], "iptables", "{configz}");
    assert_eq!(served["metricsBindAddress"], "127.0.0.1:10249", "{configz}");
    assert_eq!(
        http_get(node, addr("127.0.0.1:10249"), "/healthz")
            .unwrap()
            .0,
        200
    );
    // The periodic sync (syncPeriod 2s) moves the counters.
    assert!(
        eventually(WAIT, || count(
            &http_get(node, addr("127.0.0.1:10249"), "/metrics")
                .unwrap()
                .1
        ) > syncs)
        .await
    );

    // The service's health check: two of its endpoints are on this node.
    let check = || http_get(&cluster.client, addr(&format!("{NODE_IP}:32100")), "/");
    let reply = check().unwrap();
    assert_eq!(reply.0, 200, "{reply:?}");
    let body = json_body(&reply);
    assert_eq!(
        body["service"],
        json!({"namespace": "default", "name": "lb"})
    );
    assert_eq!(body["localEndpoints"], 2);
    // Only a remote endpoint left: 503, none here.
    cluster
        .api
        .apply(slice("lb", slice_ports, &["pod-b1"]))
        .unwrap();
    assert!(eventually(WAIT, || check().is_ok_and(|r| r.0 == 503)).await);
    assert_eq!(json_body(&check().unwrap())["localEndpoints"], 0);
    // The service goes: so does its server.
    cluster
        .api
        .delete(test_apiserver::Resource::Services, "default", "lb")
        .unwrap();
    assert!(
        eventually(WAIT, || check().is_err()).await,
        "health check port closed"
    );
    daemon.stop().await;
}

fn our_chains(node: &support::netns::Netns) -> Vec<String> {
    let mut chains = Vec::new();
    for tool in [
        "iptables-nft-save",
        "ip6tables-nft-save",
        "iptables-legacy-save",
        "ip6tables-legacy-save",
    ] {
        chains.extend(
            node.output(&[tool])
                .lines()
                .filter(|l| l.starts_with(":KUBE-") || (l.starts_with("-A") && l.contains("KUBE-")))
                // Shared with the kubelet, which older versions of it own: left, as upstream does.
                .filter(|l| !l.contains("KUBE-FIREWALL"))
                .map(|l| format!("{tool}: {l}")),
        );
    }
    chains
}

fn cleanup(node: &support::netns::Netns) -> String {
    let output = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            &node.name,
            support::cluster::BIN,
            "--cleanup",
        ])
        .output()
        .unwrap();
    assert!(output.status.success(), "--cleanup failed: {output:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `--cleanup` removes every chain, jump and set of ours, in both back ends and families, and
/// nothing else; a second run has nothing to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_removes_ours_and_nothing_else_twice() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    let node = &cluster.node;
    // Someone else's rules and set, and IPVS mode's leftovers in the legacy back end.
    node.exec(&["iptables-nft", "-t", "nat", "-N", "FOREIGN"]);
    node.exec(&["iptables-nft", "-t", "nat", "-A", "OUTPUT", "-j", "FOREIGN"]);
    node.exec(&[
        "iptables-nft",
        "-A",
        "INPUT",
        "-p",
        "tcp",
        "--dport",
        "9999",
        "-j",
        "ACCEPT",
    ]);
    node.exec(&["ipset", "create", "foreign", "hash:ip"]);
    node.exec(&["ipset", "create", "KUBE-CLUSTER-IP", "hash:ip,port"]);
    node.exec(&["iptables-legacy", "-N", "KUBE-IPVS-FILTER"]);
    node.exec(&["iptables-legacy", "-A", "INPUT", "-j", "KUBE-IPVS-FILTER"]);
    let daemon = cluster.daemon(&cluster.config(""));
    daemon.wait_for("\"Synced proxy rules\"").await;
    daemon.stop().await;
    assert!(!our_chains(node).is_empty());

    let log = cleanup(node);
    assert!(log.contains("Removed kube-proxy chains"), "{log}");
    assert_eq!(
        our_chains(node),
        Vec::<String>::new(),
        "nothing of ours left"
    );
    let sets = node.output(&["ipset", "list", "-n"]);
    assert!(
        sets.contains("foreign") && !sets.contains("KUBE-"),
        "{sets}"
    );
    let nat = node.output(&["iptables-nft-save", "-t", "nat"]);
    assert!(nat.contains("-A OUTPUT -j FOREIGN"), "{nat}");
    assert!(
        node.output(&["iptables-nft-save", "-t", "filter"])
            .contains("--dport 9999 -j ACCEPT")
    );

    let again = cleanup(node);
    assert!(
        !again.contains("Removed"),
        "a second cleanup has nothing to do: {again}"
    );
    assert!(
        node.output(&["iptables-nft-save", "-t", "nat"])
            .contains("-A OUTPUT -j FOREIGN")
    );
}

/// Starting in iptables mode removes what IPVS mode left (its chains, the jumps to them, its
/// sets) once the new rules are in, and traffic flows throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iptables_mode_removes_ipvs_leftovers_after_its_first_sync() {
    require_netns();
    use support::netns::tcp_request;
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    let node = &cluster.node;
    for (table, chain, from) in [
        ("filter", "KUBE-IPVS-FILTER", "INPUT"),
        ("filter", "KUBE-IPVS-OUT-FILTER", "OUTPUT"),
        ("nat", "KUBE-LOAD-BALANCER", "PREROUTING"),
    ] {
        node.exec(&["iptables-nft", "-t", table, "-N", chain]);
        node.exec(&["iptables-nft", "-t", table, "-A", from, "-j", chain]);
    }
    node.exec(&["ipset", "create", "KUBE-LOOP-BACK", "hash:ip,port,ip"]);
    node.exec(&[
        "ipset",
        "create",
        "KUBE-6-CLUSTER-IP",
        "hash:ip,port",
        "family",
        "inet6",
    ]);
    let daemon = cluster.daemon(&cluster.config(""));
    daemon
        .wait_for("\"Removing the other proxy mode's leftovers\"")
        .await;
    daemon.wait_for("\"Removed the IPVS ipsets\"").await;
    let saved = node.output(&["iptables-nft-save"]);
    for gone in [
        "KUBE-IPVS-FILTER",
        "KUBE-IPVS-OUT-FILTER",
        "KUBE-LOAD-BALANCER",
    ] {
        assert!(!saved.contains(gone), "{gone} left:\n{saved}");
    }
    assert!(saved.contains(":KUBE-SERVICES"), "our own chains stay");
    assert!(!node.output(&["ipset", "list", "-n"]).contains("KUBE-"));
    assert!(
        tcp_request(node, addr("10.96.0.10:80")).is_ok(),
        "traffic flows"
    );
    daemon.stop().await;
}

/// A metric's value in a scrape, if it is there.
fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// A TCP segment with SYN and FIN both set (and no checksum): conntrack calls it INVALID.
fn send_invalid_tcp(from: &support::netns::Netns, to: std::net::Ipv4Addr) {
    from.run(move || {
        use nix::sys::socket::{
            AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrIn, sendto, socket,
        };
        use std::os::fd::AsRawFd;
        let raw = socket(
            AddressFamily::Inet,
            SockType::Raw,
            SockFlag::empty(),
            SockProtocol::Tcp,
        )
        .expect("raw socket");
        let mut segment = [0u8; 20];
        segment[0..2].copy_from_slice(&40000u16.to_be_bytes());
        segment[2..4].copy_from_slice(&8080u16.to_be_bytes());
        segment[12] = 5 << 4; // data offset: 5 words
        segment[13] = 0x03; // FIN | SYN
        segment[14..16].copy_from_slice(&1024u16.to_be_bytes());
        let target = SockaddrIn::from(std::net::SocketAddrV4::new(to, 0));
        for _ in 0..3 {
            sendto(raw.as_raw_fd(), &segment, &target, MsgFlags::empty()).expect("send");
        }
    });
}

/// Upstream's nfacct counters (kubeproxy_iptables_*_packets_total): the daemon creates the
/// kernel's accounting objects in the node's namespace, its rules name them, and each scrape
/// reads them; real packets move them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nfacct_counters_count_real_packets() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    let daemon = cluster.daemon(&cluster.config(""));
    daemon.wait_for("\"Synced proxy rules\"").await;
    let node = &cluster.node;
    let saved = node.output(&["iptables-nft-save"]);
    let counted = |name: &str| {
        saved
            .lines()
            .filter(|l| l.contains("-m nfacct") && l.contains(name))
            .count()
    };
    assert_eq!(counted("ct_state_invalid_dropped_pkts"), 1, "{saved}");
    // One per NodePort of the seed's services with endpoints (web tcp+udp, local).
    assert_eq!(counted("localhost_nps_accepted_pkts"), 3, "{saved}");
    let scrape = || {
        http_get(node, addr("127.0.0.1:10249"), "/metrics")
            .unwrap()
            .1
    };
    const LOCALHOST: &str = "kubeproxy_iptables_localhost_nodeports_accepted_packets_total";
    const INVALID: &str = "kubeproxy_iptables_ct_state_invalid_dropped_packets_total";
    let before = scrape();
    assert_eq!(metric_value(&before, LOCALHOST), Some(0.0), "{before}");
    assert_eq!(metric_value(&before, INVALID), Some(0.0), "{before}");

    // A connection to web's NodePort on 127.0.0.1, from the node itself.
    let answer = support::netns::tcp_request(node, addr("127.0.0.1:30080"));
    assert!(answer.is_ok(), "{answer:?}");
    // Conntrack-invalid segments forwarded by the node towards a pod are dropped and counted.
    let pod: std::net::Ipv4Addr = support::cluster::PODS[0].1.parse().unwrap();
    send_invalid_tcp(&cluster.client, pod);
    let moved = eventually(WAIT, || {
        let text = scrape();
        metric_value(&text, LOCALHOST).unwrap_or(0.0) >= 1.0
            && metric_value(&text, INVALID).unwrap_or(0.0) >= 3.0
    })
    .await;
    assert!(moved, "{}", scrape());
    // A connection to the node's own address is not a localhost NodePort packet.
    let before = metric_value(&scrape(), LOCALHOST).unwrap_or(0.0);
    let answer = support::netns::tcp_request(node, addr(&format!("{NODE_IP}:30080")));
    assert!(answer.is_ok(), "{answer:?}");
    assert_eq!(metric_value(&scrape(), LOCALHOST), Some(before));
    daemon.stop().await;
}

/// A health port still held when the daemon starts (the kube-proxy it replaces not yet gone):
/// logged, posted as upstream's Warning Event, tried again every five seconds, and served once
/// the port is free; the metrics port serves meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_health_port_is_served_once_it_is_free() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    let held = cluster
        .node
        .run(|| std::net::TcpListener::bind("0.0.0.0:10256").expect("hold 10256"));
    let daemon = cluster.daemon(&cluster.config(""));
    daemon.wait_for("Failed to start health server").await;
    daemon.wait_for("\"Synced proxy rules\"").await;
    let failed = |event: &Value| {
        event["reason"] == "FailedToStartProxierHealthcheck"
            && event["type"] == "Warning"
            && event["action"] == "StartKubeProxy"
            && event["regarding"]["name"] == "node-a"
            && event["note"].as_str().is_some_and(|n| n.contains("10256"))
    };
    let events = || cluster.api.list(test_apiserver::Resource::EventsV1);
    assert!(
        eventually(WAIT, || events().iter().any(failed)).await,
        "{:?}",
        events()
    );
    let metrics = http_get(&cluster.node, addr("127.0.0.1:10249"), "/healthz");
    assert!(matches!(metrics, Ok((200, _))), "{metrics:?}");

    drop(held);
    let healthy = || {
        matches!(
            http_get(
                &cluster.client,
                addr(&format!("{NODE_IP}:10256")),
                "/healthz"
            ),
            Ok((200, _))
        )
    };
    assert!(eventually(WAIT, healthy).await, "the health port is served");
    daemon.stop().await;
}
