//! IPVS against a real kernel: each test re-runs itself inside the VM (tests/vm/run-in-vm.sh boots
//! Debian's kernel, which has IPVS and dummy links), in a network namespace it creates there, and
//! checks what the kernel holds with ipvsadm and ip.

mod support;

use std::net::IpAddr;
use std::process::Command;

use kube_proxy_rs::model::{IpFamily, Protocol};
use kube_proxy_rs::proxier::ipvs::{IpvsUnsupported, check_support};
use kube_proxy_rs::sys::host::link::Links;
use kube_proxy_rs::sys::ipvs::codec::{CMD_DEL_DEST, CMD_NEW_DEST, CMD_SET_DEST, FLAG_PERSISTENT};
use kube_proxy_rs::sys::ipvs::{IpvsClient, RealServer, VirtualServer};
use support::netns::{Netns, require_netns};

/// On the host: runs test `name` in the VM, asserts it passed there, and returns its output.
fn run_in_vm(name: &str) -> String {
    require_netns();
    let exe = std::env::current_exe().expect("test binary");
    let harness = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vm/run-in-vm.sh");
    let output = Command::new(harness)
        .env("KPRS_IN_VM", "1")
        .arg(exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .output()
        .expect("run the VM harness");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && log.contains("1 passed"),
        "{name} failed in the VM:\n{log}"
    );
    log
}

/// In the VM: true. On the host: runs `name` in the VM, asserts it passed there, and returns false.
fn in_vm(name: &str) -> bool {
    if std::env::var_os("KPRS_IN_VM").is_some() {
        return true;
    }
    run_in_vm(name);
    false
}

fn vs(address: &str, protocol: Protocol, port: u16, scheduler: &str) -> VirtualServer {
    VirtualServer {
        address: address.parse().unwrap(),
        protocol,
        port,
        scheduler: scheduler.into(),
        flags: 0,
        timeout: 0,
    }
}

fn rs(address: &str, port: u16, weight: u32) -> RealServer {
    RealServer::new(address.parse().unwrap(), port, weight)
}

fn text(ns: &Netns, args: &[&str]) -> String {
    ns.output(args)
}

#[test]
fn ipvs_client_against_the_kernel() {
    if !in_vm("ipvs_client_against_the_kernel") {
        return;
    }
    let ns = Netns::new("ipvs");
    let web = vs("10.96.0.10", Protocol::Tcp, 80, "rr");
    let dns = vs("fd00:10:96::10", Protocol::Udp, 53, "wrr");
    let (web2, dns2) = (web.clone(), dns.clone());
    ns.run(move || {
        let mut ipvs = IpvsClient::connect().expect("IPVS resolves in the VM");
        assert!(ipvs.services().unwrap().is_empty());
        ipvs.add_service(&web2).unwrap();
        ipvs.add_service(&dns2).unwrap();
        assert_eq!(
            ipvs.add_service(&web2).unwrap_err().errno(),
            Some(17),
            "EEXIST on a second add"
        );
        let mut listed = ipvs.services().unwrap();
        listed.sort();
        assert_eq!(listed, vec![web2.clone(), dns2.clone()]);
        ipvs.change_destination(CMD_NEW_DEST, &web2, &rs("10.244.1.5", 8080, 1))
            .unwrap();
        ipvs.change_destination(CMD_NEW_DEST, &web2, &rs("10.244.1.6", 8080, 1))
            .unwrap();
        ipvs.change_destination(CMD_NEW_DEST, &dns2, &rs("fd00:10:244::5", 5353, 1))
            .unwrap();
        ipvs.change_destination(CMD_SET_DEST, &web2, &rs("10.244.1.6", 8080, 0))
            .unwrap();
        let mut dests = ipvs.destinations(&web2).unwrap();
        dests.sort();
        assert_eq!(
            dests,
            vec![rs("10.244.1.5", 8080, 1), rs("10.244.1.6", 8080, 0)]
        );
        assert_eq!(
            ipvs.destinations(&dns2).unwrap(),
            vec![rs("fd00:10:244::5", 5353, 1)]
        );
        ipvs.set_timeouts(900, 120, 300).unwrap();
    });
    let listing = text(&ns, &["ipvsadm", "-Ln"]);
    for want in [
        "TCP  10.96.0.10:80 rr",
        "-> 10.244.1.5:8080",
        "Masq    1",
        "-> 10.244.1.6:8080",
        "Masq    0",
        "UDP  [fd00:10:96::10]:53 wrr",
        "-> [fd00:10:244::5]:5353",
    ] {
        assert!(
            listing.contains(want),
            "ipvsadm -Ln lacks {want:?}:\n{listing}"
        );
    }
    assert!(text(&ns, &["ipvsadm", "-L", "--timeout"]).contains("900 120 300"));

    // Persistence (ClientIP affinity) and a scheduler change through SET_SERVICE.
    let mut sticky = web.clone();
    sticky.scheduler = "sh".into();
    sticky.flags = FLAG_PERSISTENT;
    sticky.timeout = 600;
    let sticky2 = sticky.clone();
    ns.run(move || {
        let mut ipvs = IpvsClient::connect().unwrap();
        ipvs.update_service(&sticky2).unwrap();
        assert!(ipvs.services().unwrap().contains(&sticky2));
        ipvs.change_destination(CMD_DEL_DEST, &sticky2, &rs("10.244.1.6", 8080, 0))
            .unwrap();
        assert_eq!(ipvs.destinations(&sticky2).unwrap().len(), 1);
    });
    assert!(
        text(&ns, &["ipvsadm", "-Ln"]).contains("TCP  10.96.0.10:80 sh persistent 600"),
        "{}",
        text(&ns, &["ipvsadm", "-Ln"])
    );

    ns.run(move || {
        let mut ipvs = IpvsClient::connect().unwrap();
        ipvs.delete_service(&sticky).unwrap();
        ipvs.delete_service(&dns).unwrap();
        assert!(ipvs.services().unwrap().is_empty());
    });
    assert!(!text(&ns, &["ipvsadm", "-Ln"]).contains("10.96.0.10"));
}

#[test]
fn dummy_link_and_support_probe_in_the_kernel() {
    if !in_vm("dummy_link_and_support_probe_in_the_kernel") {
        return;
    }
    let ns = Netns::new("link");
    ns.run(|| {
        let mut links = Links::open().unwrap();
        let index = links.ensure_dummy("kube-ipvs0").unwrap();
        assert_eq!(
            links.ensure_dummy("kube-ipvs0").unwrap(),
            index,
            "idempotent"
        );
        let v4: IpAddr = "10.96.0.10".parse().unwrap();
        let v6: IpAddr = "fd00:10:96::10".parse().unwrap();
        links.add_address(index, v4).unwrap();
        links.add_address(index, v4).unwrap();
        links.add_address(index, v6).unwrap();
        assert_eq!(links.addresses(index).unwrap(), vec![v4, v6]);
    });
    let shown = text(&ns, &["ip", "addr", "show", "kube-ipvs0"]);
    assert!(
        shown.contains("10.96.0.10/32") && shown.contains("fd00:10:96::10/128"),
        "{shown}"
    );
    assert!(text(&ns, &["ip", "-d", "link", "show", "kube-ipvs0"]).contains("dummy"));
    ns.run(|| {
        let mut links = Links::open().unwrap();
        let index = links.index_of("kube-ipvs0").unwrap().unwrap();
        links
            .delete_address(index, "10.96.0.10".parse().unwrap())
            .unwrap();
        links
            .delete_address(index, "10.96.0.10".parse().unwrap())
            .unwrap();
        assert_eq!(
            links.addresses(index).unwrap(),
            vec!["fd00:10:96::10".parse::<IpAddr>().unwrap()]
        );
        assert!(links.delete("kube-ipvs0").unwrap());
        assert!(!links.delete("kube-ipvs0").unwrap());

        check_support("rr").expect("this kernel can run IPVS mode");
        check_support("").expect("empty scheduler means rr");
        match check_support("no-such-scheduler") {
            Err(IpvsUnsupported::Scheduler { scheduler, .. }) => {
                assert_eq!(scheduler, "no-such-scheduler")
            }
            other => panic!("want a scheduler error, got {other:?}"),
        }
        assert!(
            IpvsClient::connect()
                .unwrap()
                .services()
                .unwrap()
                .is_empty(),
            "the probe leaves nothing behind"
        );
        assert!(links.index_of("kprs-probe0").unwrap().is_none());
    });
}

/// The IPVS-mode iptables rules and ipsets for a scenario using every rule are accepted by the kernel.
#[test]
fn ipvs_mode_rules_and_sets_are_accepted_by_the_kernel() {
    if !in_vm("ipvs_mode_rules_and_sets_are_accepted_by_the_kernel") {
        return;
    }

    use kube_proxy_rs::model::{
        Endpoint, NamespacedName, NodeInfo, ProxyState, ServicePort, ServicePortName,
    };
    use kube_proxy_rs::proxier::context::FamilyContext;
    use kube_proxy_rs::proxier::ipvs::aggregate::render;
    use kube_proxy_rs::proxier::ipvs::render::IpvsContext;
    use kube_proxy_rs::proxier::local::LocalDetector;
    use kube_proxy_rs::sys::ipset::{SystemIpset, parse_save, sync_input};
    use kube_proxy_rs::sys::xtables::{Backend, Iptables, SystemIptables};

    let name = ServicePortName::new("ns", "lb", "http", Protocol::Tcp);
    let port = ServicePort {
        node_port: Some(30020),
        external_ips: vec![
            "192.168.50.1".parse().unwrap(),
            "192.168.50.2".parse().unwrap(),
        ],
        load_balancer_ips: vec!["5.6.7.8".parse().unwrap()],
        load_balancer_source_ranges: vec!["203.0.113.0/24".parse().unwrap()],
        ..ServicePort::new(name.clone(), "10.96.0.20".parse().unwrap(), 80)
    };
    // 0.0.0.0/0 is what many users write; ipset cannot store a /0.
    let open_name = ServicePortName::new("ns", "open", "http", Protocol::Tcp);
    let open_port = ServicePort {
        load_balancer_ips: vec!["5.6.7.9".parse().unwrap()],
        load_balancer_source_ranges: vec!["0.0.0.0/0".parse().unwrap()],
        ..ServicePort::new(open_name.clone(), "10.96.0.21".parse().unwrap(), 80)
    };
    let endpoint = Endpoint::ready("10.244.1.7".parse().unwrap(), 8080, Some("node-a"));
    let key = NamespacedName::new("ns", "lb");
    let mut state = ProxyState {
        node: NodeInfo {
            name: "node-a".into(),
            ..NodeInfo::default()
        },
        ..ProxyState::default()
    };
    state.services.insert(
        key.clone(),
        kube_proxy_rs::model::VecMap::from([(name.clone(), port)]),
    );
    state.endpoints.insert(
        key,
        kube_proxy_rs::model::VecMap::from([(name, vec![endpoint.clone()])]),
    );
    let open = NamespacedName::new("ns", "open");
    state.services.insert(
        open.clone(),
        kube_proxy_rs::model::VecMap::from([(open_name.clone(), open_port)]),
    );
    state.endpoints.insert(
        open,
        kube_proxy_rs::model::VecMap::from([(open_name, vec![endpoint])]),
    );
    let ctx = IpvsContext {
        common: FamilyContext {
            family: kube_proxy_rs::model::IpFamily::V4,
            node_name: "node-a".into(),
            zone: None,
            node_ip: Some("192.168.0.2".parse().unwrap()),
            masquerade_mark: 0x4000,
            masquerade_all: false,
            local_detector: LocalDetector::Cidrs(vec!["10.244.0.0/16".parse().unwrap()]),
        },
        node_port_ips: vec!["192.168.0.2".parse().unwrap()],
        local_addresses: vec!["192.168.0.2".parse().unwrap()],
        scheduler: "rr".into(),
    };
    let desired = render(&state, &ctx);
    assert!(
        desired.iptables.contains("-m ipvs --vaddr 5.6.7.8")
            && desired.iptables.contains("-m physdev")
    );
    let ns = Netns::new("rules");
    ns.run(move || {
        let ipset = SystemIpset;
        let input = sync_input(&desired.sets, &parse_save(&ipset.save_sets(&[]).unwrap())).unwrap();
        ipset.restore(&input).unwrap();
        let mut iptables = SystemIptables::new(Backend::Nft);
        iptables
            .restore(kube_proxy_rs::model::IpFamily::V4, &desired.iptables)
            .expect("the kernel accepts IPVS mode's rules");
        let nat = String::from_utf8(
            std::process::Command::new("iptables-nft-save")
                .args(["-t", "nat"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        assert!(
            nat.contains("KUBE-LOAD-BALANCER") && nat.contains("match-set KUBE-CLUSTER-IP"),
            "{nat}"
        );
    });
}

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
    daemon.wait_for("\"Synced proxy rules\"").await;
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

/// What a namespace's IPVS mode state is, sorted: virtual/real servers (`ipvsadm -Sn`), kube-ipvs0's
/// addresses and the sets' entries.
fn ipvs_state(ns: &Netns) -> Vec<String> {
    let mut lines: Vec<String> = text(ns, &["ipvsadm", "-Sn"])
        .lines()
        .chain(text(ns, &["ip", "-o", "addr", "show", "dev", "kube-ipvs0"]).lines())
        .map(|line| {
            // `ip -o addr` lines start with the link index, which differs between namespaces.
            line.split_once(": ")
                .map_or(line, |(_, rest)| rest)
                .to_string()
        })
        // Hash sets get a random initval each.
        .chain(
            text(ns, &["ipset", "save"])
                .lines()
                .map(|line| line.split(" initval ").next().unwrap_or(line).to_string()),
        )
        .filter(|line| !line.contains("valid_lft"))
        .collect();
    lines.sort();
    lines
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

/// A set entry the kernel refuses (here: a set of the same name another program created with
/// room for one element) is skipped with a warning and counted; the sync succeeds and every
/// virtual server is programmed.
#[test]
fn ipvs_a_refused_set_entry_does_not_fail_the_sync() {
    if !in_vm("ipvs_a_refused_set_entry_does_not_fail_the_sync") {
        return;
    }
    use kube_proxy_rs::model::ChangeSummary;
    use kube_proxy_rs::proxier::Proxier;

    let ns = Netns::new("ipvs-refused");
    ns.output(&[
        "ipset",
        "create",
        "KUBE-CLUSTER-IP",
        "hash:ip,port",
        "family",
        "inet",
        "maxelem",
        "1",
    ]);
    let state = support::scale::state(5);
    let report = ns.run(move || {
        support::scale::ipvs_proxier()
            .sync(&state, &ChangeSummary::default())
            .expect("the sync succeeds")
    });
    assert!(report.skipped_services >= 1, "{report:?}");
    let services = text(&ns, &["ipvsadm", "-Ln"]);
    for i in 0..5 {
        assert!(
            services.contains(&format!("172.30.0.{}:80", i + 1)),
            "svc-{i} programmed:\n{services}"
        );
    }
    let sets = text(&ns, &["ipset", "list", "KUBE-NODE-PORT-TCP"]);
    assert!(
        sets.contains("30004"),
        "the other sets were restored:\n{sets}"
    );
}

const CAPTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/testdata/ipvs/kernel-capture.txt"
);

/// Netlink traffic as the kernel sees it, through an nlmon tap in this thread's namespace.
struct NetlinkTap(std::os::fd::OwnedFd);

impl NetlinkTap {
    fn open() -> NetlinkTap {
        use nix::libc;
        use std::os::fd::FromRawFd;
        let status = Command::new("ip")
            .args(["link", "add", "nlmon0", "type", "nlmon"])
            .status()
            .unwrap();
        assert!(status.success(), "nlmon link");
        Command::new("ip")
            .args(["link", "set", "nlmon0", "up"])
            .status()
            .unwrap();
        let all = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket calls with a zeroed sockaddr_ll of the right size.
        unsafe {
            let fd = libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK,
                all as i32,
            );
            assert!(fd >= 0, "AF_PACKET socket");
            let mut address: libc::sockaddr_ll = std::mem::zeroed();
            address.sll_family = libc::AF_PACKET as u16;
            address.sll_protocol = all;
            address.sll_ifindex = libc::if_nametoindex(c"nlmon0".as_ptr()) as i32;
            let bound = libc::bind(
                fd,
                (&address as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            );
            assert_eq!(bound, 0, "bind to nlmon0");
            NetlinkTap(std::os::fd::OwnedFd::from_raw_fd(fd))
        }
    }

    /// The IPVS family's messages seen since the last call, as `direction cmd hex` lines (the hex
    /// is everything after the netlink header: the generic netlink header and the attributes).
    fn take(&self, family_id: u16, label: &str) -> Vec<String> {
        use std::os::fd::AsRawFd;
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut lines = Vec::new();
        let mut buffer = vec![0u8; 65536];
        loop {
            // SAFETY: reads into a buffer we own, of the length we pass.
            let n = unsafe {
                nix::libc::recv(
                    self.0.as_raw_fd(),
                    buffer.as_mut_ptr().cast(),
                    buffer.len(),
                    0,
                )
            };
            if n <= 0 {
                break;
            }
            let mut packet = &buffer[..n as usize];
            while packet.len() >= 16 {
                let length = u32::from_ne_bytes(packet[..4].try_into().unwrap()) as usize;
                let kind = u16::from_ne_bytes(packet[4..6].try_into().unwrap());
                let flags = u16::from_ne_bytes(packet[6..8].try_into().unwrap());
                if length < 16 || length > packet.len() {
                    break;
                }
                if kind == family_id {
                    let direction = if flags & 1 != 0 { "request" } else { "reply" };
                    let hex: String = packet[16..length]
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect();
                    lines.push(format!("{label} {direction} {hex}"));
                }
                packet = &packet[(length + 3) & !3..];
            }
        }
        lines
    }
}

/// Captures, in the kernel, the IPVS messages our client sends and the kernel's answers (and
/// ipvsadm's requests, for a cross-check), and holds them to tests/testdata/ipvs/kernel-capture.txt,
/// which the codec's unit tests check byte for byte. UPDATE_GOLDEN=1 rewrites the file.
#[test]
fn ipvs_messages_match_the_kernel_capture() {
    if std::env::var_os("KPRS_IN_VM").is_none() {
        let log = run_in_vm("ipvs_messages_match_the_kernel_capture");
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            let capture = log
                .split("CAPTURE-BEGIN\n")
                .nth(1)
                .and_then(|rest| rest.split("CAPTURE-END").next())
                .expect("capture in the VM's output");
            std::fs::write(CAPTURE, capture).unwrap();
        }
        return;
    }
    let ns = Netns::new("capture");
    let captured = ns.run(|| {
        let tap = NetlinkTap::open();
        let mut ipvs = IpvsClient::connect().unwrap();
        let family_id = ipvs.family_id();
        let mut web = vs("10.96.0.10", Protocol::Tcp, 80, "rr");
        web.flags = FLAG_PERSISTENT;
        web.timeout = 10800;
        let dns = vs("fd00:10:96::10", Protocol::Udp, 53, "wrr");
        let mut lines = vec![];
        let mut step = |label: &str, f: &mut dyn FnMut(&mut IpvsClient)| {
            f(&mut ipvs);
            lines.extend(tap.take(family_id, label));
        };
        step("add-web", &mut |c| c.add_service(&web).unwrap());
        step("add-dns", &mut |c| c.add_service(&dns).unwrap());
        step("add-web-real", &mut |c| {
            c.change_destination(CMD_NEW_DEST, &web, &rs("10.244.1.5", 8080, 1))
                .unwrap()
        });
        step("add-dns-real", &mut |c| {
            c.change_destination(CMD_NEW_DEST, &dns, &rs("fd00:10:244::5", 5353, 1))
                .unwrap()
        });
        step("drain-web-real", &mut |c| {
            c.change_destination(CMD_SET_DEST, &web, &rs("10.244.1.5", 8080, 0))
                .unwrap()
        });
        step("list-services", &mut |c| {
            assert_eq!(c.services().unwrap().len(), 2)
        });
        step("list-web-reals", &mut |c| {
            assert_eq!(c.destinations(&web).unwrap().len(), 1)
        });
        step("list-dns-reals", &mut |c| {
            assert_eq!(c.destinations(&dns).unwrap().len(), 1)
        });
        step("timeouts", &mut |c| c.set_timeouts(900, 120, 300).unwrap());
        step("ipvsadm-add", &mut |_| {
            let ok = Command::new("ipvsadm")
                .args(["-A", "-t", "10.96.0.11:80", "-s", "sh"])
                .status()
                .unwrap();
            assert!(ok.success());
        });
        step("ipvsadm-add-real", &mut |_| {
            let ok = Command::new("ipvsadm")
                .args([
                    "-a",
                    "-t",
                    "10.96.0.11:80",
                    "-r",
                    "10.244.1.7:8080",
                    "-m",
                    "-w",
                    "3",
                ])
                .status()
                .unwrap();
            assert!(ok.success());
        });
        step("delete-web-real", &mut |c| {
            c.change_destination(CMD_DEL_DEST, &web, &rs("10.244.1.5", 8080, 0))
                .unwrap()
        });
        step("delete-dns", &mut |c| c.delete_service(&dns).unwrap());
        lines.join("\n") + "\n"
    });
    println!("CAPTURE-BEGIN\n{captured}CAPTURE-END");
    if std::env::var_os("UPDATE_GOLDEN").is_none() {
        // A dump lists services in hash order: compare the messages, not their order.
        let sorted = |text: &str| {
            let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
            lines.sort();
            lines
        };
        let want = std::fs::read_to_string(CAPTURE).unwrap_or_default();
        assert_eq!(
            sorted(&captured),
            sorted(&want),
            "the kernel's messages differ from {CAPTURE} (UPDATE_GOLDEN=1 rewrites it)"
        );
    }
}

/// IPv6 in IPVS mode: a dual-stack node serves an IPv6 ClusterIP and NodePort through IPVS
/// (KUBE-6- sets, ip6tables rules) with real connections spread over the pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipvs_mode_ipv6_traffic() {
    if !in_vm("ipvs_mode_ipv6_traffic") {
        return;
    }
    use serde_json::json;
    use support::cluster::{Cluster, NODE_IP6, addr, many, names, service, slice6};
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
    let config = cluster.config_with_mode("ipvs", "");
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
