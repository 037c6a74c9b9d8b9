//! `kube-proxy-rs explain` against real packets (root; in namespaces): the real daemon programs
//! nftables mode or iptables mode (both back ends), `explain` reads the kernel, and connections
//! from the client land only on the endpoints it names, in shares that match its probabilities
//! (within five standard deviations), or are refused where it says they are rejected. IPVS
//! mode's are in tests/explain_ipvs_vm.rs.

mod support;

use serde_json::{Value, json};
use support::cluster::{BIN, Cluster, NODE_IP, addr, seed, slice, web_ports};
use support::explain::{
    assert_external_ip_spread, assert_gone_endpoint_named, assert_hairpin, assert_ipv6_spread,
    assert_local_node_port, assert_masquerade_follows_the_source, assert_matches,
    assert_source_ranges_decide, assert_terminating_endpoints_serve, candidates, differing,
    dual_stack_load_balancer, explain, pod_at, spread, terminating_only,
};
use support::netns::{require_netns, tcp_request};
use support::{WAIT, eventually};

/// A mode as the tests run it: its config, and on iptables the back end.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Nftables,
    IptablesNft,
    IptablesLegacy,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Nftables => "nftables",
            Mode::IptablesNft | Mode::IptablesLegacy => "iptables",
        }
    }

    /// Starts the daemon in this mode, with `extra` config (nftables' sync periods when empty).
    async fn daemon(self, cluster: &Cluster, extra: &str) -> support::cluster::Daemon {
        if self == Mode::IptablesLegacy {
            // kubelet's hint chain: the daemon (and explain) choose the legacy back end.
            cluster.node.exec(&[
                "iptables-legacy",
                "-t",
                "mangle",
                "-N",
                "KUBE-IPTABLES-HINT",
            ]);
        }
        let extra = match extra {
            "" => "nftables:\n  syncPeriod: 2s\n  minSyncPeriod: 0s\n",
            extra => extra,
        };
        let daemon = cluster.daemon(&cluster.config_with_mode(self.name(), extra));
        daemon.wait_for("\"Synced proxy rules\"").await;
        daemon
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_names_where_packets_go_in_nftables_mode() {
    names_where_packets_go(Mode::Nftables).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_names_where_packets_go_in_iptables_mode() {
    names_where_packets_go(Mode::IptablesNft).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_names_where_packets_go_in_iptables_mode_on_legacy() {
    names_where_packets_go(Mode::IptablesLegacy).await;
}

async fn names_where_packets_go(mode: Mode) {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    terminating_only(&cluster);
    let daemon = mode.daemon(&cluster, "").await;
    assert_terminating_endpoints_serve(&cluster, 200);
    assert_hairpin(&cluster, 200);

    // A ClusterIP with four endpoints: a quarter each, and the connections agree.
    let web = explain(&cluster, "10.96.0.10:80/tcp");
    assert_eq!(web["service"], "default/web:http", "{web:#}");
    assert_eq!(web["daemon"]["comparison"], "agrees", "{web:#}");
    // Every service port of the node agrees with the daemon (web's two, sticky, local, and
    // empty, whose rejection is what the daemon wants too).
    let all = explain(&cluster, "--all");
    assert_eq!(all["checked"], 6, "{all:#}");
    assert_eq!(all["differing"], json!([]), "{all:#}");
    let predicted = candidates(&web);
    assert_eq!(predicted.len(), 4, "{web:#}");
    let n = 400;
    assert_matches(&predicted, &spread(&cluster, "10.96.0.10:80", n), n);
    let text = cluster
        .node
        .output(&[BIN, "explain", "--to", "10.96.0.10:80"]);
    eprintln!("{text}");
    assert_masquerade_follows_the_source(&cluster);
    for line in [
        "service:  default/web:http",
        "verdict:  DNAT to one of 4:",
        " 25.00%",
    ] {
        assert!(text.contains(line), "{line:?} in:\n{text}");
    }

    // A NodePort with externalTrafficPolicy Local: only this node's two pods.
    assert_local_node_port(&cluster, n);

    // ClientIP affinity: a new client goes to any of the four; one client keeps to one.
    let sticky = explain(&cluster, "10.96.0.11:80/tcp");
    let predicted = candidates(&sticky);
    assert_eq!(predicted.len(), 4, "{sticky:#}");
    let affinity = match mode {
        Mode::Nftables => "endpoint chains at random",
        _ => "goes back to its endpoint (recent list KUBE-SEP-",
    };
    assert!(sticky["steps"].to_string().contains(affinity), "{sticky:#}");
    let counts = spread(&cluster, "10.96.0.11:80", 20);
    assert_eq!(counts.len(), 1, "{counts:?}");
    let pods: Vec<&str> = predicted.keys().map(|e| pod_at(e)).collect();
    assert!(
        counts.keys().all(|pod| pods.contains(&pod.as_str())),
        "{counts:?}"
    );

    assert_gone_endpoint_named(&cluster).await;

    // No endpoints: rejected, and refused (from the node, as the modes' tests check it). A
    // port the Service does not have: nftables mode rejects it too; iptables mode leaves it
    // alone, and says so.
    let mut refused = vec![("10.96.0.13:80/tcp", "no endpoints")];
    if mode == Mode::Nftables {
        refused.push(("10.96.0.10:81/tcp", "no port 81/tcp"));
    } else {
        let other_port = explain(&cluster, "10.96.0.10:81/tcp");
        assert_eq!(other_port["verdict"], "untouched", "{other_port:#}");
        let reason = other_port["reason"].as_str().unwrap();
        assert!(
            reason.contains("default/web") && reason.contains("no port"),
            "{reason}"
        );
    }
    for (to, why) in refused {
        let answer = explain(&cluster, to);
        assert_eq!(answer["verdict"], "reject", "{answer:#}");
        assert!(
            answer["reason"].as_str().unwrap().contains(why),
            "{answer:#}"
        );
        let address = to.trim_end_matches("/tcp");
        assert_eq!(
            tcp_request(&cluster.node, addr(address)),
            Err(std::io::ErrorKind::ConnectionRefused),
            "{to}"
        );
    }
    // An address no Service has: left alone.
    assert_eq!(
        explain(&cluster, "10.96.9.9:80/tcp")["verdict"],
        "untouched"
    );
    daemon.stop().await;
}

/// IPv6, and a LoadBalancer IP with source ranges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_reads_ipv6_and_load_balancers_in_nftables_mode() {
    ipv6_and_load_balancers(Mode::Nftables).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_reads_ipv6_and_load_balancers_in_iptables_mode() {
    ipv6_and_load_balancers(Mode::IptablesNft).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_reads_ipv6_and_load_balancers_in_iptables_mode_on_legacy() {
    ipv6_and_load_balancers(Mode::IptablesLegacy).await;
}

async fn ipv6_and_load_balancers(mode: Mode) {
    require_netns();
    let mut cluster = Cluster::start().await;
    cluster.add_ipv6();
    dual_stack_load_balancer(&cluster);
    let daemon = mode.daemon(&cluster, "").await;
    let n = 200;
    assert_ipv6_spread(&cluster, n).await;
    assert_source_ranges_decide(&cluster);
    assert_external_ip_spread(&cluster, n);
    let lb = explain(&cluster, "192.168.200.1:80/tcp");
    assert_eq!(lb["service"], "default/web:http", "{lb:#}");
    let firewall = match mode {
        Mode::Nftables => "@firewall-ips",
        _ => "KUBE-FW-",
    };
    assert!(lb["steps"].to_string().contains(firewall), "{lb:#}");
    let predicted = candidates(&lb);
    assert_matches(&predicted, &spread(&cluster, "192.168.200.1:80", n), n);
    daemon.stop().await;
}

/// nftables mode declares only the endpoint maps its chains draw from, so that a small node's
/// table reads short: a map goes when the last chain leaves it, in the sync that removes that
/// chain, and every map declared is one a rule draws from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nftables_mode_declares_only_the_endpoint_maps_in_use() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    let daemon = Mode::Nftables.daemon(&cluster, "").await;
    let listing = || {
        cluster
            .node
            .output(&["nft", "list", "table", "ip", "kube-proxy"])
    };
    let maps = |table: &str| -> std::collections::BTreeSet<String> {
        table
            .lines()
            .filter_map(|line| line.trim().strip_prefix("map endpoints-"))
            .map(|rest| format!("endpoints-{}", rest.trim_end_matches(" {")))
            .collect()
    };
    let drawn_from = |table: &str| -> std::collections::BTreeSet<String> {
        table
            .split_whitespace()
            .filter_map(|word| word.strip_prefix("@endpoints-"))
            .map(|rest| format!("endpoints-{rest}"))
            .collect()
    };
    let table = listing();
    let before = maps(&table);
    // web's two ports and local's two policy chains draw from maps; sticky's affinity does not.
    assert!(!before.is_empty() && before.len() <= 4, "{table}");
    assert_eq!(before, drawn_from(&table), "{table}");
    eprintln!(
        "{} lines in `nft list table ip kube-proxy`, {} endpoint maps",
        table.lines().count(),
        before.len()
    );
    cluster
        .api
        .delete(test_apiserver::Resource::Services, "default", "web")
        .unwrap();
    assert!(
        eventually(WAIT, || !listing().contains("default/web")).await,
        "web's chains go"
    );
    let table = listing();
    let after = maps(&table);
    assert!(after.len() < before.len(), "{before:?} -> {after:?}");
    assert_eq!(after, drawn_from(&table), "{table}");
    assert_eq!(daemon.count("Failed to sync"), 0);
    let local = explain(&cluster, &format!("{NODE_IP}:30081/tcp"));
    assert_eq!(candidates(&local).len(), 2, "{local:#}");
    daemon.stop().await;
}

/// A rule changed behind the daemon's back (legacy iptables, whose drift check waits for the
/// sync period, an hour here): explain reads the drifted chain, packets follow it, and the
/// comparison with the daemon names it as drift.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_names_a_drifted_rule() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    let ipt = ["iptables-legacy", "-w", "5", "-t", "nat"];
    cluster.node.exec(&[
        "iptables-legacy",
        "-t",
        "mangle",
        "-N",
        "KUBE-IPTABLES-HINT",
    ]);
    let config = cluster.dir.path().join("config-drift.conf");
    std::fs::write(
        &config,
        format!(
            "mode: iptables\nclusterCIDR: 10.244.0.0/16\nclientConnection: {{kubeconfig: {}}}\n\
             iptables: {{syncPeriod: 1h, minSyncPeriod: 0s}}\n",
            cluster.dir.path().join("kubeconfig").display()
        ),
    )
    .unwrap();
    let daemon = support::cluster::Daemon::spawn(&cluster.node, &config, &[]);
    daemon.wait_for("\"Synced proxy rules\"").await;
    let web = explain(&cluster, "10.96.0.10:80/tcp");
    assert_eq!(web["daemon"]["comparison"], "agrees", "{web:#}");

    // Every new connection to one endpoint: the service chain flushed, one jump put back.
    let chain = web["steps"][0].as_str().unwrap();
    let chain = chain
        .split_whitespace()
        .nth(3)
        .expect("KUBE-SERVICES: jumps to CHAIN");
    let rules = cluster.node.output(&[&ipt[..], &["-S", chain]].concat());
    let endpoint_chain = rules
        .lines()
        .last()
        .and_then(|rule| rule.split_whitespace().last())
        .expect("a jump to an endpoint chain");
    cluster.node.exec(&[&ipt[..], &["-F", chain]].concat());
    cluster
        .node
        .exec(&[&ipt[..], &["-A", chain, "-j", endpoint_chain]].concat());

    let drifted = explain(&cluster, "10.96.0.10:80/tcp");
    let predicted = candidates(&drifted);
    assert_eq!(predicted.len(), 1, "{drifted:#}");
    let n = 20;
    assert_matches(&predicted, &spread(&cluster, "10.96.0.10:80", n), n);
    assert_eq!(drifted["daemon"]["comparison"], "differs", "{drifted:#}");
    assert_eq!(
        drifted["daemon"]["missing"].as_array().map(Vec::len),
        Some(3),
        "{drifted:#}"
    );
    let why = drifted["daemon"]["why"].as_str().unwrap();
    assert!(why.contains("drifted"), "{why}");
    let all = explain(&cluster, "--all");
    assert_eq!(differing(&all), ["default/web:http"], "{all:#}");
    daemon.stop().await;
}

/// A change the daemon has not synced yet (minSyncPeriod holds it back): explain says the
/// kernel is behind the daemon, and names the endpoint the daemon wants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_names_what_the_daemon_has_not_synced_yet() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    let config = "nftables:\n  syncPeriod: 1h\n  minSyncPeriod: 1h\n";
    let daemon = cluster.daemon(&cluster.config_with_mode("nftables", config));
    daemon.wait_for("\"Synced proxy rules\"").await;
    cluster
        .api
        .apply(slice("web", web_ports().1, &["pod-a1", "pod-a2", "pod-b1"]))
        .unwrap();
    let behind = |answer: &Value| answer["daemon"]["comparison"] == "differs";
    assert!(
        eventually(WAIT, || behind(&explain(&cluster, "10.96.0.10:80/tcp"))).await,
        "the daemon knows the change: {:#}",
        explain(&cluster, "10.96.0.10:80/tcp")
    );

    let web = explain(&cluster, "10.96.0.10:80/tcp");
    assert_eq!(
        web["daemon"]["extra"],
        json!(["10.244.2.22:8080"]),
        "{web:#}"
    );
    let all = explain(&cluster, "--all");
    assert_eq!(
        differing(&all),
        ["default/web:dns", "default/web:http"],
        "{all:#}"
    );
    assert!(
        web["daemon"]["why"]
            .as_str()
            .unwrap()
            .contains("wait for a sync"),
        "{web:#}"
    );
    // Without a daemon answering, the kernel's answer stands alone.
    daemon.stop().await;
    let alone = explain(&cluster, "10.96.0.10:80/tcp");
    assert_eq!(alone["daemon"]["comparison"], "unknown", "{alone:#}");
    assert_eq!(candidates(&alone).len(), 4, "{alone:#}");
}

#[test]
fn bad_input_gets_a_clear_error() {
    for (args, says) in [
        (vec!["explain"], "--to"),
        (vec!["explain", "--to", "10.96.0.10"], "not ADDRESS:PORT"),
        (
            vec!["explain", "--to", "10.96.0.10:80/icmp"],
            "not tcp, udp or sctp",
        ),
        (
            vec!["explain", "--to", "10.96.0.10:80", "--from", "fd00::1"],
            "IP family",
        ),
        (
            vec!["explain", "--to", "10.96.0.10:80", "-o", "yaml"],
            "possible values: text, json",
        ),
        (
            vec!["explain", "--to", "10.96.0.10:80", "--mode", "ebpf"],
            "possible values: iptables, ipvs, nftables",
        ),
    ] {
        let output = std::process::Command::new(BIN)
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
