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
