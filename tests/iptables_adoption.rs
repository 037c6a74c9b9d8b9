//! Restart adoption in a real kernel (both back ends, both families): a new proxier on a node an
//! earlier one programmed writes nothing when nothing changed (on nft every rule keeps its
//! kernel handle), and when other programs changed some of our chains and a service changed
//! while it was down, it rewrites those chains only and ends where a full sync on a fresh node
//! ends.

mod support;

use kube_proxy_rs::model::{
    ChangeSummary, Endpoint, IpFamily, NamespacedName, NodeInfo, Protocol, ProxyState, ServicePort,
    ServicePortName, VecMap,
};
use kube_proxy_rs::proxier::Proxier;
use kube_proxy_rs::proxier::iptables::IptablesProxier;
use kube_proxy_rs::sys::host::net::{FakeSysctl, FixedAddresses};
use kube_proxy_rs::sys::xtables::{Backend, SystemIptables};
use support::netns::{Netns, require_netns};
use support::rules::normalized_save;

/// Services of every kind in both families: ClusterIP with affinity, NodePort, LoadBalancer with
/// source ranges and Local policy, one without endpoints, UDP and SCTP.
fn state() -> ProxyState {
    let mut state = ProxyState {
        node: NodeInfo {
            name: "node-a".into(),
            addresses: vec![
                "192.168.100.2".parse().unwrap(),
                "fd00:192:168:100::2".parse().unwrap(),
            ],
            ..NodeInfo::default()
        },
        ..ProxyState::default()
    };
    for i in 0..8u16 {
        let name = format!("svc-{i}");
        let protocol = match i % 4 {
            1 => Protocol::Udp,
            2 => Protocol::Sctp,
            _ => Protocol::Tcp,
        };
        let port_name = ServicePortName::new("default", &name, "p", protocol);
        let v4: std::net::IpAddr = format!("10.96.0.{}", 10 + i).parse().unwrap();
        let v6: std::net::IpAddr = format!("fd00:10:96::{}", 10 + i).parse().unwrap();
        let mut port = ServicePort {
            cluster_ips: vec![v4, v6],
            node_port: (i % 2 == 0).then_some(30000 + i),
            ..ServicePort::new(port_name.clone(), v4, 80)
        };
        if i == 3 {
            port.session_affinity_seconds = Some(10800);
        }
        if i == 4 {
            port.load_balancer_ips = vec!["192.168.50.4".parse().unwrap()];
            port.load_balancer_source_ranges = vec!["203.0.113.0/25".parse().unwrap()];
            port.external_policy_local = true;
            port.health_check_node_port = Some(31000);
        }
        let key = NamespacedName::new("default", &name);
        state
            .services
            .insert(key.clone(), VecMap::from([(port_name.clone(), port)]));
        if i == 6 {
            continue; // no endpoints
        }
        let endpoints: Vec<Endpoint> = (0..3u8)
            .flat_map(|e| {
                let node = if e == 0 { "node-a" } else { "node-b" };
                [
                    Endpoint::ready(
                        format!("10.244.{e}.{}", 10 + i).parse().unwrap(),
                        8080,
                        Some(node),
                    ),
                    Endpoint::ready(
                        format!("fd00:10:244:{e}::{}", 10 + i).parse().unwrap(),
                        8080,
                        Some(node),
                    ),
                ]
            })
            .collect();
        state
            .endpoints
            .insert(key, VecMap::from([(port_name, endpoints)]));
    }
    state
}

fn proxier(backend: Backend) -> IptablesProxier<SystemIptables> {
    let mut p = IptablesProxier::new(
        SystemIptables::new(backend),
        support::scale::iptables_settings("10.244.0.0/16"),
        Box::new(FixedAddresses(vec![])),
        Box::new(FakeSysctl::default()),
    );
    p.record_transactions = true;
    p
}

/// One full sync of `state` by a new proxier, and the sync after it (which checks the endpoint
/// chains the first kept by name, on nft); the restore inputs they wrote.
fn restart(ns: &Netns, backend: Backend, state: &ProxyState) -> Vec<(IpFamily, String)> {
    let state = state.clone();
    ns.run(move || {
        let mut p = proxier(backend);
        assert!(
            p.sync(&state, &ChangeSummary::default())
                .expect("sync")
                .full
        );
        let mut inputs = p.last_transactions.clone();
        assert!(
            !p.sync(&state, &ChangeSummary::default())
                .expect("the sync after")
                .full
        );
        inputs.extend(p.last_transactions.clone());
        inputs
    })
}

/// Every rule of ours with its kernel handle: a rule rewritten gets a new one.
fn handles(ns: &Netns) -> String {
    let mut out = String::new();
    for family in ["ip", "ip6"] {
        for table in ["filter", "nat", "mangle"] {
            out.push_str(&ns.output(&["nft", "-a", "list", "table", family, table]));
        }
    }
    out
}

/// The chains a restore input declares (and so flushes), as `table/chain`.
fn declared(inputs: &[(IpFamily, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (family, input) in inputs {
        let mut table = "";
        for line in input.lines() {
            if let Some(name) = line.strip_prefix('*') {
                table = name;
            } else if let Some(decl) = line.strip_prefix(':') {
                let chain = decl.split(' ').next().unwrap_or_default();
                out.push(format!("{}/{table}/{chain}", family.name()));
            }
        }
    }
    out
}

fn first_chain(ns: &Netns, tool: &str, prefix: &str) -> String {
    ns.output(&[tool, "-t", "nat", "-S"])
        .lines()
        .filter_map(|l| l.strip_prefix("-N "))
        .find(|chain| chain.starts_with(prefix))
        .unwrap()
        .to_string()
}

#[test]
fn a_restart_rewrites_nothing_that_is_right_and_repairs_what_is_wrong() {
    require_netns();
    for backend in [Backend::Nft, Backend::Legacy] {
        restart_on(backend);
    }
}

fn restart_on(backend: Backend) {
    let tool = |family: &str| format!("{family}-{}", backend.as_str());
    let (v4, v6) = (tool("iptables"), tool("ip6tables"));
    let node = Netns::new("adopt");
    let state = state();
    let first = restart(&node, backend, &state);
    assert!(!first.is_empty());
    let programmed = (
        handles(&node),
        normalized_save(&node, backend, "iptables"),
        normalized_save(&node, backend, "ip6tables"),
    );
    assert!(programmed.1.contains("KUBE-SEP-") && programmed.2.contains("KUBE-SEP-"));

    // Nothing changed: nothing is written (on nft, every rule keeps its handle).
    let inputs = restart(&node, backend, &state);
    assert!(inputs.is_empty(), "{backend:?}: {inputs:?}");
    assert_eq!(
        (
            handles(&node),
            normalized_save(&node, backend, "iptables"),
            normalized_save(&node, backend, "ip6tables"),
        ),
        programmed
    );

    // Other programs change some of our chains, and a service loses an endpoint while the
    // daemon is down.
    let sep = first_chain(&node, &v4, "KUBE-SEP-");
    let svc = first_chain(&node, &v6, "KUBE-SVC-");
    node.exec(&[&v4, "-t", "nat", "-D", &sep, "1"]);
    node.exec(&[&v6, "-t", "nat", "-I", &svc, "1", "-j", "RETURN"]);
    node.exec(&[&v4, "-t", "filter", "-F", "KUBE-FORWARD"]);
    let mut changed = state.clone();
    let key = NamespacedName::new("default", "svc-5");
    changed
        .endpoints
        .get_mut(&key)
        .unwrap()
        .values_mut()
        .next()
        .unwrap()
        .truncate(4);
    let inputs = restart(&node, backend, &changed);
    let rewritten = declared(&inputs);
    for expected in [
        format!("IPv4/nat/{sep}"),
        format!("IPv6/nat/{svc}"),
        "IPv4/filter/KUBE-FORWARD".to_string(),
    ] {
        assert!(
            rewritten.contains(&expected),
            "{backend:?}: {expected} not in {rewritten:?}"
        );
    }
    // Besides those: svc-5's policy chain in each family and the endpoint chain it lost.
    assert!(rewritten.len() <= 3 + 4, "{backend:?}: {rewritten:?}");

    let fresh = Netns::new("adopt-fresh");
    restart(&fresh, backend, &changed);
    for family in ["iptables", "ip6tables"] {
        assert_eq!(
            normalized_save(&node, backend, family),
            normalized_save(&fresh, backend, family),
            "{backend:?} {family}"
        );
    }
}
