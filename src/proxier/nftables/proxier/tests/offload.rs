//! The flowtable fast path (`--offload-packet-threshold`) on the fakes: the table offloads
//! connections to ClusterIPs past the threshold to a flowtable over the node's links, the tracer
//! and `explain` say which connections it takes, a restart writes nothing, and turning it off
//! removes it.

use super::*;
use crate::proxier::explanation::Flow;
use crate::proxier::nftables::explain::Session;
use crate::proxier::nftables::flowtable::FlowtableDevices;
use crate::proxier::nftables::render::{FLOWTABLE, OFFLOAD_REQUESTS};
use crate::sys::host::link::fake::FakeLinkNames;
use crate::sys::nf_tables::trace::{Packet, Ruleset, trace_packet};

const OFFLOAD_RULE: &str = "ct original ip daddr @cluster-ips ct packets > 20 counter name \"flow-offload-requests\" flow add @kube-proxy-flowtable";

fn offloading(nft: FakeNftables, links: &FakeLinkNames) -> NftablesProxier<FakeNftables> {
    let mut settings = settings();
    settings.offload_after_packets = Some(20);
    let mut p = NftablesProxier::new(nft, settings, Box::new(FixedAddresses(vec![])))
        .with_flowtable_devices(FlowtableDevices::new(Box::new(links.clone())));
    p.record_transactions = true;
    p.stale_chain_delay = Duration::ZERO;
    p.verify_delay = Duration::ZERO;
    p
}

fn devices(nft: &FakeNftables) -> Vec<String> {
    let table = nft.table(V4, TABLE).expect("our table");
    table.flowtables[FLOWTABLE].iter().cloned().collect()
}

#[test]
fn clusterip_connections_past_the_threshold_are_offloaded_over_every_link() {
    let links = FakeLinkNames::of(&["lo", "eth0", "veth1"]);
    let mut p = offloading(FakeNftables::default(), &links);
    let state = state();
    p.sync(&state, &ChangeSummary::default()).unwrap();
    assert_eq!(devices(&p.nft), ["eth0", "veth1"]);
    let table = p.nft.table(V4, TABLE).unwrap().clone();
    assert!(table.counters.contains(OFFLOAD_REQUESTS));
    let forward = &table.chains["filter-forward"].1;
    assert!(
        forward
            .last()
            .is_some_and(|rule| rule.starts_with(OFFLOAD_RULE)),
        "{forward:?}"
    );
    // A link that appears is added at the next sync, alone.
    links.set(&["lo", "eth0", "veth1", "veth2"]);
    p.sync(&state, &ChangeSummary::default()).unwrap();
    assert!(
        p.nft
            .transactions
            .last()
            .is_some_and(|t| t.contains("devices = { \"veth2\" }")),
        "{:?}",
        p.nft.transactions.last()
    );
    assert_eq!(devices(&p.nft), ["eth0", "veth1", "veth2"]);

    // The tracer: a pod's connection to a ClusterIP is given to the flowtable past the
    // threshold; its first 20 packets are not, nor is a connection the node makes itself.
    let ruleset = Ruleset::from_fake(&p.nft, V4).unwrap();
    let local = [NODE_IP.parse().unwrap()];
    let packet = |src: &str, from_node: bool| Packet {
        src: src.parse().unwrap(),
        dst: "172.30.0.41".parse().unwrap(),
        sport: 40000,
        dport: 80,
        protocol: Protocol::Tcp,
        from_node,
    };
    let offloads = |packet: &Packet, packets: u64| -> Vec<Option<String>> {
        let paths = trace_packet(&ruleset, &local, packet, packets).unwrap();
        assert!(paths.iter().all(|p| p.dnat.is_some()), "{paths:?}");
        paths.into_iter().map(|p| p.offload).collect()
    };
    let from_pod = packet("10.0.0.5", false);
    assert_eq!(offloads(&from_pod, 21), [Some(FLOWTABLE.to_string())]);
    assert_eq!(offloads(&from_pod, 20), [None]);
    assert_eq!(offloads(&from_pod, 1), [None]);
    assert_eq!(offloads(&packet(NODE_IP, true), 21), [None]);

    // explain says so for a forwarded connection, and not for the node's own.
    let mut session = Session::with(Box::new(p.nft.clone()), local.to_vec());
    let explain = |session: &mut Session, source: &str| {
        let flow = Flow {
            destination: "172.30.0.41:80".parse().unwrap(),
            protocol: Protocol::Tcp,
            source: Some(source.parse().unwrap()),
        };
        session.explain(&flow).unwrap().steps
    };
    let said = "filter-forward: offloaded to flowtable kube-proxy-flowtable once it has seen more than 20 packets";
    let steps = explain(&mut session, "10.0.0.5");
    assert!(steps.iter().any(|s| s.starts_with(said)), "{steps:?}");
    let steps = explain(&mut session, NODE_IP);
    assert!(!steps.iter().any(|s| s.contains("flowtable")), "{steps:?}");
}

#[test]
fn a_restart_writes_nothing_and_turning_offload_off_removes_it() {
    let links = FakeLinkNames::of(&["eth0"]);
    let state = state();
    let mut first = offloading(FakeNftables::default(), &links);
    first.sync(&state, &ChangeSummary::default()).unwrap();
    let mut kernel = first.nft.clone();
    kernel.transactions.clear();

    // The restart trusts the digests, then reads the table back: nothing is written.
    let mut second = offloading(kernel.clone(), &links);
    for _ in 0..2 {
        second.sync(&state, &ChangeSummary::default()).unwrap();
    }
    assert_eq!(second.nft.transactions, Vec::<String>::new());
    assert_eq!(devices(&second.nft), ["eth0"]);

    // Restarted without the flag: the rule, the counter and the flowtable go.
    let mut off = proxier(kernel);
    for _ in 0..2 {
        off.sync(&state, &ChangeSummary::default()).unwrap();
    }
    let table = off.nft.table(V4, TABLE).unwrap();
    assert!(table.flowtables.is_empty(), "{:?}", table.flowtables);
    assert!(!table.counters.contains(OFFLOAD_REQUESTS));
    assert!(
        !table.chains["filter-forward"]
            .1
            .iter()
            .any(|rule| rule.contains("flow add")),
        "{:?}",
        table.chains["filter-forward"]
    );
    assert_table(&mut off, &state);
}
