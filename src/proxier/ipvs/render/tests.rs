use std::collections::BTreeSet;
use std::net::SocketAddr;

use super::*;
use crate::model::{NodeInfo, ProxyState};
use crate::proxier::fixtures::{NODE, Svc, ep, family_context, svc};
use crate::proxier::ipvs::aggregate::render;
use crate::sys::ipvs::codec::FLAG_PERSISTENT;

pub(in crate::proxier::ipvs) fn context(family: IpFamily) -> IpvsContext {
    let (node_ip, cidr) = match family {
        IpFamily::V4 => ("192.168.0.2", "10.244.0.0/16"),
        IpFamily::V6 => ("fd00::2", "fd00:10:244::/48"),
    };
    let address: IpAddr = node_ip.parse().unwrap();
    IpvsContext {
        common: family_context(family, node_ip, cidr),
        node_port_ips: vec![address],
        local_addresses: vec![address],
        scheduler: String::new(),
    }
}

pub(in crate::proxier::ipvs) fn state(services: Vec<Svc>) -> ProxyState {
    let mut state = ProxyState {
        node: NodeInfo {
            name: NODE.into(),
            ..NodeInfo::default()
        },
        ..ProxyState::default()
    };
    for s in services {
        state.services.insert(s.key.clone(), s.ports);
        state.endpoints.insert(s.key, s.endpoints);
    }
    state
}

fn entries(desired: &DesiredIpvs, name: &str) -> Vec<String> {
    desired
        .sets
        .iter()
        .find(|(spec, _)| spec.name == name)
        .map(|(_, e)| e.iter().cloned().collect())
        .unwrap_or_default()
}

fn reals(desired: &DesiredIpvs, key: &str) -> Vec<String> {
    desired.services[key]
        .1
        .iter()
        .map(SocketAddr::to_string)
        .collect()
}

/// The scenario of the IPVS fact sheet: a ClusterIP with a remote endpoint, a NodePort with a
/// local one; the rules are upstream's, in its order.
#[test]
fn cluster_ip_and_node_port() {
    let desired =
        render(
            &state(vec![
                svc("default", "kubernetes", "10.96.0.1", |s| s.port = 443)
                    .with_endpoints(vec![ep("10.244.2.5", 6443, "node-b")]),
                svc("default", "web", "10.96.100.5", |s| {
                    s.node_port = Some(30080)
                })
                .with_endpoints(vec![ep("10.244.1.5", 8080, NODE)]),
            ]),
            &context(IpFamily::V4),
        );
    let want = "*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-LOAD-BALANCER - [0:0]
:KUBE-MARK-MASQ - [0:0]
-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN
-A KUBE-POSTROUTING -m comment --comment \"Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose\" -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE
-A KUBE-NODE-PORT -p tcp -m comment --comment \"Kubernetes nodeport TCP port for masquerade purpose\" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT
-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
-A KUBE-POSTROUTING -m mark ! --mark 0x00004000/0x00004000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x00004000
-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully
-A KUBE-MARK-MASQ -j MARK --or-mark 0x00004000
COMMIT
*filter
:KUBE-FORWARD - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SOURCE-RANGES-FIREWALL - [0:0]
:KUBE-IPVS-FILTER - [0:0]
:KUBE-IPVS-OUT-FILTER - [0:0]
-A KUBE-SOURCE-RANGES-FIREWALL -j DROP
-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x00004000/0x00004000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-NODE-PORT -m comment --comment \"Kubernetes health check node port\" -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j ACCEPT
-A KUBE-IPVS-FILTER -m set --match-set KUBE-LOAD-BALANCER dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j RETURN
-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT
COMMIT
";
    assert_eq!(desired.iptables, want);
    assert_eq!(
        entries(&desired, "KUBE-CLUSTER-IP"),
        vec!["10.96.0.1,tcp:443", "10.96.100.5,tcp:80"]
    );
    assert_eq!(
        entries(&desired, "KUBE-LOOP-BACK"),
        vec!["10.244.1.5,tcp:8080,10.244.1.5"]
    );
    assert_eq!(entries(&desired, "KUBE-NODE-PORT-TCP"), vec!["30080"]);
    assert_eq!(
        entries(&desired, "KUBE-IPVS-IPS"),
        vec!["10.96.0.1", "10.96.100.5"]
    );
    assert_eq!(desired.sets.len(), 17, "every set exists, empty or not");
    let keys: Vec<&String> = desired.services.keys().collect();
    assert_eq!(
        keys,
        vec![
            "10.96.0.1:443/TCP",
            "10.96.100.5:80/TCP",
            "192.168.0.2:30080/TCP"
        ]
    );
    assert_eq!(
        reals(&desired, "192.168.0.2:30080/TCP"),
        vec!["10.244.1.5:8080"]
    );
    assert_eq!(desired.services["10.96.0.1:443/TCP"].0.scheduler, "rr");
    assert_eq!(
        desired.bound,
        BTreeSet::from(["10.96.0.1".parse().unwrap(), "10.96.100.5".parse().unwrap()]),
        "NodePort addresses are never bound"
    );
}

#[test]
fn local_policies_affinity_and_source_ranges() {
    let desired = render(
        &state(vec![
            svc("ns", "lb", "10.96.0.20", |s| {
                s.node_port = Some(30020);
                s.load_balancer_ips = vec!["5.6.7.8".parse().unwrap()];
                s.load_balancer_source_ranges = vec!["203.0.113.0/24".parse().unwrap()];
                s.external_ips = vec!["192.168.0.2".parse().unwrap()];
                s.external_policy_local = true;
                s.health_check_node_port = Some(31000);
                s.session_affinity_seconds = Some(600);
            })
            .with_endpoints(vec![
                ep("10.244.1.7", 80, NODE),
                ep("10.244.2.7", 80, "node-b"),
            ]),
            svc("ns", "itp", "10.96.0.21", |s| {
                s.internal_policy_local = true
            })
            .with_endpoints(vec![ep("10.244.2.8", 80, "node-b")]),
        ]),
        &context(IpFamily::V4),
    );
    let cluster = &desired.services["10.96.0.20:80/TCP"];
    assert_eq!(cluster.1.len(), 2, "ClusterIP: every endpoint");
    assert_eq!((cluster.0.flags, cluster.0.timeout), (FLAG_PERSISTENT, 600));
    assert_eq!(
        reals(&desired, "5.6.7.8:80/TCP"),
        vec!["10.244.1.7:80"],
        "ETP Local: local endpoints only"
    );
    assert_eq!(
        reals(&desired, "192.168.0.2:30020/TCP"),
        vec!["10.244.1.7:80"]
    );
    assert!(desired.bound.contains(&"5.6.7.8".parse().unwrap()));
    assert!(
        !desired.bound.contains(&"192.168.0.2".parse().unwrap()),
        "an external IP that is a node address is not bound"
    );
    assert_eq!(
        entries(&desired, "KUBE-EXTERNAL-IP-LOCAL"),
        vec!["192.168.0.2,tcp:80"]
    );
    assert_eq!(
        entries(&desired, "KUBE-LOAD-BALANCER-LOCAL"),
        vec!["5.6.7.8,tcp:80"]
    );
    assert_eq!(
        entries(&desired, "KUBE-LOAD-BALANCER-SOURCE-CIDR"),
        vec!["5.6.7.8,tcp:80,203.0.113.0/24"]
    );
    assert_eq!(entries(&desired, "KUBE-NODE-PORT-LOCAL-TCP"), vec!["30020"]);
    assert_eq!(
        entries(&desired, "KUBE-HEALTH-CHECK-NODE-PORT"),
        vec!["31000"]
    );
    assert!(desired.iptables.contains(
        "-A KUBE-IPVS-OUT-FILTER -s 5.6.7.8 -m ipvs --vaddr 5.6.7.8 --vproto tcp --vport 80 -j DROP"
    ));
    assert!(desired.iptables.contains("-A KUBE-LOAD-BALANCER -m comment --comment \"Kubernetes service load balancer ip + port with externalTrafficPolicy=local\" -m set --match-set KUBE-LOAD-BALANCER-LOCAL dst,dst -j RETURN"));
    assert!(
        reals(&desired, "10.96.0.21:80/TCP").is_empty(),
        "ITP Local without local endpoints: no real servers"
    );
}

#[test]
fn ipv6_names_and_rules() {
    let desired = render(
        &state(vec![
            svc("ns", "v6", "10.96.0.30,fd00:10:96::30", |s| {
                s.node_port = Some(30030)
            })
            .with_endpoints(vec![
                ep("10.244.1.9", 80, NODE),
                ep("fd00:10:244:1::9", 80, NODE),
            ]),
        ]),
        &context(IpFamily::V6),
    );
    let names: Vec<&str> = desired.sets.keys().map(|s| s.name.as_str()).collect();
    assert!(
        names.contains(&"KUBE-6-LOAD-BALANCER-SOURCE-CID")
            && names.contains(&"KUBE-6-NODE-PORT-LOCAL-SCTP-HAS"),
        "{names:?}"
    );
    assert!(names.iter().all(|n| n.len() <= 31));
    assert_eq!(
        entries(&desired, "KUBE-6-CLUSTER-IP"),
        vec!["fd00:10:96::30,tcp:80"]
    );
    assert!(
        desired
            .iptables
            .contains("-A KUBE-SERVICES -s ::1/128 -j RETURN")
    );
    assert!(
        desired.iptables.contains(
            "--match-set KUBE-6-CLUSTER-IP dst,dst ! -s fd00:10:244::/48 -j KUBE-MARK-MASQ"
        )
    );
    assert_eq!(
        reals(&desired, "[fd00::2]:30030/TCP"),
        vec!["[fd00:10:244:1::9]:80"]
    );
    assert!(
        !desired.services.keys().any(|k| k.contains("10.96.0.30")),
        "IPv4 stays in the IPv4 render"
    );
}

#[test]
fn unreadable_source_ranges_let_no_source_in() {
    let desired = render(
        &state(vec![
            svc("ns", "lb", "10.96.0.30", |s| {
                s.load_balancer_ips = vec!["5.6.7.30".parse().unwrap()];
                s.source_ranges_closed = true;
            })
            .with_endpoints(vec![ep("10.244.1.7", 80, NODE)]),
        ]),
        &context(IpFamily::V4),
    );
    assert_eq!(
        entries(&desired, "KUBE-LOAD-BALANCER-FW"),
        vec!["5.6.7.30,tcp:80"],
        "filtered by source"
    );
    assert!(
        entries(&desired, "KUBE-LOAD-BALANCER-SOURCE-CIDR").is_empty(),
        "and no source allowed"
    );
}

#[test]
fn a_source_range_of_everything_is_stored_as_two_halves() {
    let desired = render(
        &state(vec![
            svc("ns", "open", "10.96.0.31", |s| {
                s.load_balancer_ips = vec!["5.6.7.31".parse().unwrap()];
                s.load_balancer_source_ranges = vec!["0.0.0.0/0".parse().unwrap()];
            })
            .with_endpoints(vec![ep("10.244.1.7", 80, NODE)]),
        ]),
        &context(IpFamily::V4),
    );
    assert_eq!(
        entries(&desired, "KUBE-LOAD-BALANCER-SOURCE-CIDR"),
        vec!["5.6.7.31,tcp:80,0.0.0.0/1", "5.6.7.31,tcp:80,128.0.0.0/1"],
        "ipset refuses /0"
    );
}
