//! ipset sync against the real kernel, in a network namespace this test creates.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use kube_proxy_rs::model::IpFamily;
use kube_proxy_rs::sys::ipset::{SetSpec, SetType, SystemIpset, parse_save, sync_input};
use support::netns::{Netns, require_netns};

fn set(entries: &[&str]) -> BTreeSet<String> {
    entries.iter().map(|e| e.to_string()).collect()
}

/// The sets this test reads back: ours, and another program's.
fn names() -> Vec<String> {
    [
        "KUBE-CLUSTER-IP",
        "KUBE-LOOP-BACK",
        "KUBE-LOAD-BALANCER-SOURCE-CIDR",
        "KUBE-NODE-PORT-TCP",
        "KUBE-6-CLUSTER-IP",
        "KUBE-IPVS-IPS",
        "OTHER",
    ]
    .map(String::from)
    .to_vec()
}

#[test]
fn sets_converge_with_minimal_batched_changes() {
    require_netns();
    let ns = Netns::new("ipset");
    ns.exec(&["ipset", "create", "OTHER", "hash:ip"]);
    ns.exec(&["ipset", "add", "OTHER", "192.0.2.1"]);
    let spec = |name: &str, set_type, family| SetSpec {
        name: name.into(),
        set_type,
        family,
    };
    let mut desired = BTreeMap::from([
        (
            spec("KUBE-CLUSTER-IP", SetType::HashIpPort, IpFamily::V4),
            set(&["10.96.0.1,tcp:443", "10.96.0.10,udp:53"]),
        ),
        (
            spec("KUBE-LOOP-BACK", SetType::HashIpPortIp, IpFamily::V4),
            set(&["10.244.1.5,tcp:8080,10.244.1.5"]),
        ),
        (
            spec(
                "KUBE-LOAD-BALANCER-SOURCE-CIDR",
                SetType::HashIpPortNet,
                IpFamily::V4,
            ),
            set(&["1.2.3.4,tcp:80,10.0.0.0/8"]),
        ),
        (
            spec("KUBE-NODE-PORT-TCP", SetType::BitmapPort, IpFamily::V4),
            set(&["30080"]),
        ),
        (
            spec("KUBE-6-CLUSTER-IP", SetType::HashIpPort, IpFamily::V6),
            set(&["fd00::1,tcp:443"]),
        ),
        (
            spec("KUBE-IPVS-IPS", SetType::HashIp, IpFamily::V4),
            set(&["10.96.0.1", "10.96.0.10"]),
        ),
    ]);
    let desired_run = desired.clone();
    let (first, second) = ns.run(move || {
        let ipset = SystemIpset;
        let input = sync_input(
            &desired_run,
            &parse_save(&ipset.save_sets(&names()).unwrap()),
        )
        .unwrap();
        ipset.restore(&input).unwrap();
        let again = sync_input(
            &desired_run,
            &parse_save(&ipset.save_sets(&names()).unwrap()),
        );
        (input, again)
    });
    assert!(
        first.contains("create KUBE-6-CLUSTER-IP hash:ip,port family inet6"),
        "{first}"
    );
    assert_eq!(second, None, "converged: nothing left to do");

    desired.insert(
        spec("KUBE-CLUSTER-IP", SetType::HashIpPort, IpFamily::V4),
        set(&["10.96.0.1,tcp:443", "10.96.0.11,tcp:80"]),
    );
    let desired_run = desired.clone();
    let (change, saved) = ns.run(move || {
        let ipset = SystemIpset;
        let input = sync_input(
            &desired_run,
            &parse_save(&ipset.save_sets(&names()).unwrap()),
        )
        .unwrap();
        ipset.restore(&input).unwrap();
        (input, parse_save(&ipset.save_sets(&names()).unwrap()))
    });
    assert_eq!(
        change,
        "del KUBE-CLUSTER-IP 10.96.0.10,udp:53\nadd KUBE-CLUSTER-IP 10.96.0.11,tcp:80\n"
    );
    for (spec, entries) in &desired {
        assert_eq!(&saved[&spec.name], entries, "{}", spec.name);
    }
    assert_eq!(saved["OTHER"], set(&["192.0.2.1"]), "other sets untouched");

    ns.run(|| {
        let ipset = SystemIpset;
        ipset
            .destroy(&["KUBE-CLUSTER-IP".into(), "KUBE-NOT-THERE".into()])
            .unwrap();
        assert!(!parse_save(&ipset.save_sets(&names()).unwrap()).contains_key("KUBE-CLUSTER-IP"));
    });
}

/// Membership over netlink answers as `ipset test` does, for every set type IPVS mode uses, both
/// families, many tests in one send; a set's name is found from its kernel index.
#[test]
fn netlink_tests_answer_as_ipset_test_does() {
    use kube_proxy_rs::sys::ipset::netlink::{Entry, IpsetNetlink};
    require_netns();
    let ns = Netns::new("ipset-nl");
    for (name, kind, family) in [
        ("CLUSTER", "hash:ip,port", "inet"),
        ("LOOP", "hash:ip,port,ip", "inet"),
        ("CIDR", "hash:ip,port,net", "inet"),
        ("PORTS", "bitmap:port", ""),
        ("IPS", "hash:ip", "inet"),
        ("CLUSTER6", "hash:ip,port", "inet6"),
    ] {
        let mut args = vec!["ipset", "create", name, kind];
        if family.is_empty() {
            args.extend(["range", "0-65535"]);
        } else {
            args.extend(["family", family]);
        }
        ns.exec(&args);
    }
    for (set, entry) in [
        ("CLUSTER", "10.96.0.10,tcp:80"),
        ("LOOP", "10.244.1.5,udp:53,10.244.1.5"),
        ("CIDR", "192.168.200.1,tcp:80,192.168.100.0/24"),
        ("PORTS", "30080"),
        ("IPS", "10.96.0.10"),
        ("CLUSTER6", "fd00::10,tcp:80"),
    ] {
        ns.exec(&["ipset", "add", set, entry]);
    }
    let ip = |text: &str| Some(text.parse().unwrap());
    let service = |address: &str, protocol: u8, port: u16| Entry {
        address: ip(address),
        protocol: Some(protocol),
        port: Some(port),
        address2: None,
    };
    let with = |entry: Entry, address2: &str| Entry {
        address2: ip(address2),
        ..entry
    };
    let port = |port: u16| Entry {
        port: Some(port),
        ..Entry::default()
    };
    let address = |address: &str| Entry {
        address: ip(address),
        ..Entry::default()
    };
    let tests: Vec<(&'static str, Entry, Option<bool>)> = vec![
        ("CLUSTER", service("10.96.0.10", 6, 80), Some(true)),
        ("CLUSTER", service("10.96.0.10", 17, 80), Some(false)),
        ("CLUSTER", service("10.96.0.10", 6, 81), Some(false)),
        (
            "LOOP",
            with(service("10.244.1.5", 17, 53), "10.244.1.5"),
            Some(true),
        ),
        (
            "LOOP",
            with(service("10.244.1.5", 17, 53), "10.244.1.6"),
            Some(false),
        ),
        // A host address in a set of networks: in when a network of the set holds it.
        (
            "CIDR",
            with(service("192.168.200.1", 6, 80), "192.168.100.7"),
            Some(true),
        ),
        (
            "CIDR",
            with(service("192.168.200.1", 6, 80), "192.168.101.7"),
            Some(false),
        ),
        ("PORTS", port(30080), Some(true)),
        ("PORTS", port(30081), Some(false)),
        ("IPS", address("10.96.0.10"), Some(true)),
        ("IPS", address("10.96.0.11"), Some(false)),
        ("CLUSTER6", service("fd00::10", 6, 80), Some(true)),
        ("CLUSTER6", service("fd00::11", 6, 80), Some(false)),
        ("NOT-THERE", service("10.96.0.10", 6, 80), None),
    ];
    let (answers, names) = ns.run(move || {
        let mut ipset = IpsetNetlink::open().unwrap();
        let asked: Vec<(&str, Entry)> = tests.iter().map(|(s, e, _)| (*s, e.clone())).collect();
        let answers = ipset.test(&asked).unwrap();
        let expected: Vec<Option<bool>> = tests.iter().map(|(_, _, m)| *m).collect();
        let names: Vec<Option<String>> = [0, 5, 6].map(|i| ipset.name_of(i).unwrap()).to_vec();
        (answers == expected, names)
    });
    assert!(answers, "netlink answers differ from ipset's entries");
    assert_eq!(
        names,
        [Some("CLUSTER".to_string()), Some("CLUSTER6".into()), None]
    );
}
