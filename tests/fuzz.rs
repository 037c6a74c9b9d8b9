//! Property tests of what comes from outside: the config loader and the conversion of API objects
//! never panic, whatever they are given; and every Service and EndpointSlice the conversion
//! accepts renders rules that the stateful fakes and then the real kernel (iptables-nft-restore
//! and nft in a namespace) accept, in one full sync of everything accepted, in iptables and in
//! nftables mode. Bounded: a few thousand
//! cases, seconds.

mod support;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube_proxy_rs::config::{decode_config, validate};
use kube_proxy_rs::k8s::convert::{endpoint_slice, object_key, service_ports};
use kube_proxy_rs::model::{ChangeSummary, ChangeTracker, NodeInfo, ProxyState};
use kube_proxy_rs::proxier::Proxier;
use kube_proxy_rs::proxier::iptables::IptablesProxier;
use kube_proxy_rs::proxier::nftables::{NftablesProxier, NftablesSettings};
use kube_proxy_rs::sys::host::net::{FakeSysctl, FixedAddresses};
use kube_proxy_rs::sys::nf_tables::fake::FakeNftables;
use kube_proxy_rs::sys::nf_tables::{Nftables, SystemNftables};
use kube_proxy_rs::sys::xtables::fake::FakeIptables;
use kube_proxy_rs::sys::xtables::{Backend, SystemIptables};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Value, json};
use support::netns::{Netns, require_netns};

const NAMES: &[&str] = &[
    "web",
    "a-b",
    "x1",
    "9lives",
    "",
    "A",
    "a b",
    "a\"b",
    "x\n-A KUBE-SERVICES -j DROP",
    "$(id)",
    "-lead",
    "tail-",
    "é",
    "a--b",
    "verylongnamethatgoesonandonandonandonandonandonandonandonandon",
];
const IPS: &[&str] = &[
    "10.96.0.1",
    "10.96.0.2",
    "172.30.0.041",
    "010.000.000.001",
    "fd00::1",
    "fd00::2",
    "::ffff:1.2.3.4",
    "1.2.3",
    "300.1.1.1",
    "",
    "None",
    "x",
    " 10.96.0.3 ",
    "0.0.0.0",
    "::",
];
const CIDRS: &[&str] = &[
    "10.0.0.0/8",
    "203.0.113.000/025",
    "bogus",
    "10.0.0.0/33",
    "fd00::/64",
    "0.0.0.0/0",
    "",
];
const PROTOCOLS: &[&str] = &["TCP", "UDP", "SCTP", "ICMP", "tcp", ""];
const TYPES: &[&str] = &[
    "ClusterIP",
    "NodePort",
    "LoadBalancer",
    "ExternalName",
    "Weird",
];

fn name() -> impl Strategy<Value = String> {
    select(NAMES).prop_map(String::from)
}

fn ip() -> impl Strategy<Value = String> {
    select(IPS).prop_map(String::from)
}

fn port_number() -> impl Strategy<Value = i64> {
    prop_oneof![1i64..=65535, -5i64..5, 65530i64..70000]
}

fn service_port() -> impl Strategy<Value = Value> {
    (name(), port_number(), select(PROTOCOLS), prop::option::of(port_number())).prop_map(
        |(name, port, protocol, node_port)| {
            json!({"name": name, "port": port, "protocol": protocol, "nodePort": node_port})
        },
    )
}

fn service() -> impl Strategy<Value = Value> {
    (
        (
            name(),
            name(),
            select(TYPES),
            prop::collection::vec(ip(), 0..3),
        ),
        prop::collection::vec(service_port(), 0..3),
        prop::collection::vec(ip(), 0..3),
        prop::collection::vec(select(CIDRS), 0..3),
        prop::collection::vec(ip(), 0..2),
        (
            select(&["None", "ClientIP", "Sticky", ""][..]),
            -5i64..90000,
            select(&["Cluster", "Local", ""][..]),
        ),
    )
        .prop_map(
            |(
                (name, namespace, kind, cluster_ips),
                ports,
                external,
                ranges,
                ingress,
                (affinity, timeout, policy),
            )| {
                let ingress: Vec<Value> = ingress.iter().map(|ip| json!({"ip": ip})).collect();
                json!({
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {
                        "type": kind, "clusterIPs": cluster_ips, "ports": ports,
                        "externalIPs": external, "loadBalancerSourceRanges": ranges,
                        "sessionAffinity": affinity,
                        "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": timeout}},
                        "externalTrafficPolicy": policy, "internalTrafficPolicy": policy,
                        "healthCheckNodePort": 31000,
                    },
                    "status": {"loadBalancer": {"ingress": ingress}},
                })
            },
        )
}

fn slice() -> impl Strategy<Value = Value> {
    (
        (name(), name(), name()),
        select(&["IPv4", "IPv6", "FQDN", "IPX"][..]),
        prop::collection::vec((name(), port_number(), select(PROTOCOLS)), 0..3),
        prop::collection::vec((ip(), any::<bool>(), name()), 0..4),
    )
        .prop_map(|((name, namespace, service), family, ports, endpoints)| {
            let ports: Vec<Value> = ports
                .iter()
                .map(|(name, port, protocol)| json!({"name": name, "port": port, "protocol": protocol}))
                .collect();
            let endpoints: Vec<Value> = endpoints
                .iter()
                .map(|(ip, ready, node)| {
                    json!({"addresses": [ip], "conditions": {"ready": ready}, "nodeName": node})
                })
                .collect();
            json!({
                "addressType": family,
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {"kubernetes.io/service-name": service}},
                "ports": ports, "endpoints": endpoints,
            })
        })
}

/// A YAML document of configuration fields with values of every type.
fn config_text() -> impl Strategy<Value = String> {
    let fields = select(
        &[
            "mode",
            "clusterCIDR",
            "bindAddress",
            "healthzBindAddress",
            "metricsBindAddress",
            "nodePortAddresses",
            "oomScoreAdj",
            "configSyncPeriod",
            "detectLocalMode",
            "iptables",
            "ipvs",
            "conntrack",
            "clientConnection",
            "logging",
            "featureGates",
            "apiVersion",
            "kind",
            "mysteryField",
        ][..],
    );
    let values = select(
        &[
            "\"\"",
            "ipvs",
            "nftables",
            "bogus",
            "10.0.0.0/8",
            "-1",
            "99999999999999999999",
            "1.5",
            "true",
            "null",
            "[]",
            "[1, \"a\"]",
            "{}",
            "{syncPeriod: 1h}",
            "{syncPeriod: -1s}",
            "{masqueradeBit: 40}",
            "{maxPerCore: -3}",
            "\"1h2m3s\"",
            "\"3x\"",
            "0.0.0.0:99999",
            "{kubeconfig: 7}",
            "~",
            "'\\n'",
        ][..],
    );
    prop::collection::vec((fields, values), 0..8).prop_map(|pairs| {
        pairs
            .iter()
            .map(|(field, value)| format!("{field}: {value}\n"))
            .collect()
    })
}

/// A runner with a fixed seed: every run (and CI) tries the same cases.
fn runner(cases: u32) -> TestRunner {
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha))
}

#[test]
fn the_config_loader_never_panics() {
    let mut runner = runner(3000);
    let texts = prop_oneof![config_text(), ".{0,200}"];
    runner
        .run(&texts, |text| {
            if let Ok(mut decoded) = decode_config(&text, "fuzz.conf") {
                decoded.config.apply_defaults();
                let _ = validate(&decoded.config);
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn every_accepted_object_programs_and_none_panics() {
    require_netns();
    let mut runner = runner(2000);
    // The runner takes an Fn: what the cases accept is gathered through RefCells.
    let tracker = std::cell::RefCell::new(ChangeTracker::default());
    let accepted = std::cell::RefCell::new((0usize, 0usize));
    runner
        .run(&(service(), slice()), |(service, slice)| {
            if let Ok(service) = serde_json::from_value::<Service>(service)
                && let Ok(converted) = service_ports(&service)
                && let Ok(key) = object_key(&service.metadata)
            {
                accepted.borrow_mut().0 += 1;
                tracker
                    .borrow_mut()
                    .service_updated(&key, Some(converted.value));
            }
            if let Ok(slice) = serde_json::from_value::<EndpointSlice>(slice)
                && let Ok(converted) = endpoint_slice(&slice)
                && let Some(value) = converted.value
            {
                accepted.borrow_mut().1 += 1;
                tracker
                    .borrow_mut()
                    .slice_updated(&value.name.clone(), Some(value));
            }
            Ok(())
        })
        .unwrap();
    let accepted = accepted.into_inner();
    assert!(accepted.0 > 50 && accepted.1 > 50, "{accepted:?} accepted");
    let mut state = ProxyState {
        node: NodeInfo {
            name: "node-a".into(),
            addresses: vec![
                "192.168.0.2".parse().unwrap(),
                "fd00:192::2".parse().unwrap(),
            ],
            ..NodeInfo::default()
        },
        ..ProxyState::default()
    };
    state.apply(tracker.into_inner().take_changes());
    assert!(!state.services.is_empty());
    assert!(
        state
            .services
            .keys()
            .any(|key| state.endpoints.contains_key(key)),
        "some accepted services have endpoints"
    );

    fn proxier<I: kube_proxy_rs::sys::xtables::Iptables>(iptables: I) -> IptablesProxier<I> {
        IptablesProxier::new(
            iptables,
            support::scale::iptables_settings("10.244.0.0/16"),
            Box::new(FixedAddresses(vec!["192.168.0.2".parse().unwrap()])),
            Box::new(FakeSysctl::default()),
        )
    }
    let report = proxier(FakeIptables::default())
        .sync(&state, &ChangeSummary::default())
        .expect("the fake accepts every accepted object's rules");
    assert_eq!(report.skipped_services, 0);
    let node = Netns::new("fuzz");
    let services: BTreeMap<_, _> = state.services.clone();
    let nft_state = state.clone();
    let skipped = node.run(move || {
        let report = proxier(SystemIptables::new(Backend::Nft))
            .sync(&state, &ChangeSummary::default())
            .expect("the kernel accepts every accepted object's rules");
        report.skipped_services
    });
    assert_eq!(skipped, 0, "of {} services", services.len());

    // nftables mode: the same objects as nft text, accepted by nft and the kernel.
    let report = nftables_proxier(FakeNftables::default())
        .sync(&nft_state, &ChangeSummary::default())
        .expect("the fake accepts every accepted object's nftables objects");
    assert_eq!(report.skipped_services, 0);
    let skipped = node.run(move || {
        let report = nftables_proxier(SystemNftables::default())
            .sync(&nft_state, &ChangeSummary::default())
            .expect("nft and the kernel accept every accepted object's nftables objects");
        report.skipped_services
    });
    assert_eq!(skipped, 0, "of {} services", services.len());
}

fn nftables_proxier<N: Nftables>(nft: N) -> NftablesProxier<N> {
    let mut config = kube_proxy_rs::config::KubeProxyConfiguration {
        cluster_cidr: "10.244.0.0/16".into(),
        ..Default::default()
    };
    config.apply_defaults();
    NftablesProxier::new(
        nft,
        NftablesSettings::from_config(&config),
        Box::new(FixedAddresses(vec!["192.168.0.2".parse().unwrap()])),
    )
}
