//! The nftables proxier against the stateful fake: a full sync programs exactly the rendered
//! table; after any change a partial sync leaves the table equal to a fresh full sync's while
//! writing only the changed service's objects; stale chains are flushed, then deleted; a
//! restart finds an earlier run's objects; a refused service is skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::apply::owner_of_line;
use super::full::{rerender_evicted, service_objects};
use super::*;
use crate::config::KubeProxyConfiguration;
use crate::model::{Endpoint, Protocol};
use crate::proxier::Proxier;
use crate::proxier::fixtures::{NODE, NODE_IP, ep, overall_services, svc};
use crate::proxier::nftables::render::Chain;
use crate::proxier::nftables::render::tests::{keep_maps_in_use, table};
use crate::proxier::nftables::slots::maps_of;
use crate::sys::host::net::FixedAddresses;
use crate::sys::nf_tables::fake::{FakeNftables, FakeTable};

const V4: IpFamily = IpFamily::V4;

fn settings() -> NftablesSettings {
    let mut config = KubeProxyConfiguration {
        cluster_cidr: "10.0.0.0/8".into(),
        ..KubeProxyConfiguration::default()
    };
    config.apply_defaults();
    NftablesSettings::from_config(&config)
}

fn proxier(nft: FakeNftables) -> NftablesProxier<FakeNftables> {
    let mut p = NftablesProxier::new(nft, settings(), Box::new(FixedAddresses(vec![])));
    p.record_transactions = true;
    p.stale_chain_delay = Duration::ZERO;
    p.verify_delay = Duration::ZERO;
    p
}

/// A new proxier on the table `kernel` holds (its transactions so far forgotten).
fn restarted_on(kernel: &FakeNftables) -> NftablesProxier<FakeNftables> {
    let mut nft = kernel.clone();
    nft.transactions.clear();
    proxier(nft)
}

fn node() -> NodeInfo {
    NodeInfo {
        name: NODE.into(),
        addresses: vec![NODE_IP.parse().unwrap()],
        ..NodeInfo::default()
    }
}

/// Upstream's overall test services as a state.
fn state() -> ProxyState {
    let mut state = ProxyState {
        node: node(),
        ..ProxyState::default()
    };
    for s in overall_services() {
        state.services.insert(s.key.clone(), s.ports);
        state.endpoints.insert(s.key.clone(), s.endpoints);
    }
    state
}

/// `endpoint` added to the first port of `service`.
fn add_endpoint(state: &mut ProxyState, service: &NamespacedName, endpoint: Endpoint) {
    if let Some(endpoints) = state
        .endpoints
        .get_mut(service)
        .and_then(|ports| ports.values_mut().next())
    {
        endpoints.push(endpoint);
    }
}

fn changed(keys: &[&NamespacedName]) -> ChangeSummary {
    ChangeSummary {
        changed_services: keys.iter().map(|k| (*k).clone()).collect(),
        ..ChangeSummary::default()
    }
}

/// The fake's table in the renderer's terms.
pub(super) fn as_objects(table: &FakeTable) -> Objects {
    let mut objects = Objects::default();
    for (name, (spec, rules)) in &table.chains {
        objects.chains.insert(
            name.clone(),
            crate::proxier::nftables::render::Chain {
                spec: spec.clone(),
                rules: rules.clone(),
            },
        );
    }
    for (name, set) in &table.sets {
        objects.sets.insert(
            name.clone(),
            crate::proxier::nftables::render::SetDef {
                kind: if set.kind == "map" { "map" } else { "set" },
                spec: set.spec.clone(),
            },
        );
        if !set.elements.is_empty() {
            objects
                .elements
                .insert(name.clone(), set.elements.clone().into_iter().collect());
        }
    }
    objects.counters = table.counters.clone();
    objects
}

/// What the table must hold for `state`: the renderer's objects, every service merged in.
fn expected(p: &mut NftablesProxier<FakeNftables>, state: &ProxyState) -> Objects {
    let ctx = p.context(V4, &state.node, &state.service_cidrs);
    let mut all = render_base(&ctx);
    stamp_digests(&mut all);
    // Rendered in key order on one thread, the evicted rendered again.
    let mut slots = SlotTable::default();
    let mut services: BTreeMap<NamespacedName, Objects> = state
        .services
        .iter()
        .map(|(key, ports)| {
            let objects = service_objects(ports, state.endpoints.get(key), &ctx, &mut slots);
            (key.clone(), objects)
        })
        .collect();
    let mut digests = Digests::of(&all, services.values());
    rerender_evicted(&mut slots, &mut services, state, &ctx, &mut digests);
    let services: Vec<Objects> = services.into_values().collect();
    assert_eq!(digests, Digests::of(&all, &services));
    keep_maps_in_use(&mut all, &maps_of(services.iter().flat_map(|o| &o.slots)));
    all.chains.insert(
        DIGEST_CHAIN.to_string(),
        Chain {
            spec: String::new(),
            rules: digests.rules(),
        },
    );
    for rendered in services {
        all.chains.extend(rendered.chains);
        all.sets.extend(rendered.sets);
        for (set, elements) in rendered.elements {
            all.elements
                .get_or_insert_with(set, Default::default)
                .extend(&elements);
        }
    }
    all.no_local_endpoints = (0, 0);
    all
}

/// A transaction's text without the lines that keep the table's digests.
fn without_digest_chain(text: &str) -> String {
    text.lines()
        .filter(|line| !line.split(' ').any(|word| word == DIGEST_CHAIN))
        .map(|line| format!("{line}\n"))
        .collect()
}

fn programmed(p: &NftablesProxier<FakeNftables>) -> Objects {
    as_objects(p.nft.table(V4, TABLE).expect("table exists"))
}

fn assert_table(p: &mut NftablesProxier<FakeNftables>, state: &ProxyState) {
    let want = expected(p, state);
    let got = programmed(p);
    let missing: Vec<&String> = want
        .chains
        .keys()
        .filter(|c| !got.chains.contains_key(*c))
        .collect();
    let extra: Vec<&String> = got
        .chains
        .keys()
        .filter(|c| !want.chains.contains_key(*c))
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "chains missing {missing:?}, extra {extra:?}"
    );
    assert_eq!(got, want);
}

#[test]
fn a_full_sync_programs_the_rendered_table_and_its_golden() {
    let state = state();
    let mut p = proxier(FakeNftables::default());
    let report = p.sync(&state, &ChangeSummary::default()).unwrap();
    assert!(report.full);
    assert_table(&mut p, &state);
    // The same objects as upstream's TestOverallNFTablesRules (whose context adds a ServiceCIDR).
    let golden_ctx = crate::proxier::nftables::render::tests::context();
    let mut golden = table(&overall_services(), &golden_ctx);
    golden
        .chains
        .get_mut("cluster-ips-check")
        .unwrap()
        .rules
        .pop();
    golden.no_local_endpoints = (0, 0);
    // ... plus the digest comments (see `stamp_digests`).
    stamp_digests(&mut golden);
    // ... and the chain of the table's digests (checked by `assert_table`).
    let mut got = programmed(&p);
    assert!(got.chains.remove(DIGEST_CHAIN).is_some());
    assert_eq!(got, golden);
    assert_eq!(
        report.no_local_endpoints,
        vec![(IpFamily::V4, (0, 1))],
        "svc2: external Local, none local"
    );
}

#[test]
fn partial_syncs_write_only_what_changed_and_end_as_a_full_sync_would() {
    let mut state = state();
    let mut p = proxier(FakeNftables::default());
    p.sync(&state, &ChangeSummary::default()).unwrap();
    let svc4 = NamespacedName::new("ns4", "svc4");
    let port4 = state.services[&svc4].keys().next().unwrap().clone();

    // One more endpoint: the shares of the chain's slot in its endpoint map change and the
    // endpoint's hairpin element is added, nothing else: no rule (the kernel validates the
    // whole table at a commit that adds one) and no endpoint chain.
    add_endpoint(&mut state, &svc4, ep("10.180.0.9", 80, NODE));
    let report = p.sync(&state, &changed(&[&svc4])).unwrap();
    assert!(!report.full);
    assert_table(&mut p, &state);
    // The table's digests change with it, in the same transaction (`assert_table` checks them).
    let text = &p.last_transactions[0].1;
    assert!(
        text.contains(&format!("flush chain ip kube-proxy {DIGEST_CHAIN}")),
        "{text}"
    );
    let text = &without_digest_chain(text);
    let lines: Vec<&str> = text.lines().collect();
    let (map, first) = ("endpoints-tcp-13", 4_217_569_280u64);
    let share = |index: u64| {
        (
            first + index * 16_384 / 3,
            first + (index + 1) * 16_384 / 3 - 1,
        )
    };
    let wanted: Vec<String> = [
        format!(
            "delete element ip kube-proxy {map} {{ {first}-{} }}",
            first + 8191
        ),
        format!(
            "delete element ip kube-proxy {map} {{ {}-{} }}",
            first + 8192,
            first + 16_383
        ),
    ]
    .into_iter()
    .chain(
        [(0, "10.180.0.4"), (1, "10.180.0.5"), (2, "10.180.0.9")]
            .into_iter()
            .map(|(index, ip)| {
                let (a, b) = share(index);
                format!("add element ip kube-proxy {map} {{ {a}-{b} : {ip} . 80 }}")
            }),
    )
    .chain([
        "add element ip kube-proxy hairpin-connections { 10.180.0.9 . 10.180.0.9 . tcp . 80 }"
            .to_string(),
    ])
    .collect();
    assert_eq!(lines, wanted, "{text}");

    // Endpoints go: the slot's shares change, the hairpin elements are deleted; no rule.
    state
        .endpoints
        .get_mut(&svc4)
        .unwrap()
        .get_mut(&port4)
        .unwrap()
        .truncate(1);
    p.sync(&state, &changed(&[&svc4])).unwrap();
    let text = &without_digest_chain(&p.last_transactions[0].1);
    // Three shares and two hairpin pairs go; one share, the whole slot, comes.
    assert_eq!(text.matches("delete element").count(), 5, "{text}");
    assert_eq!(text.matches("add element").count(), 1, "{text}");
    assert!(!text.contains("add rule"), "{text}");
    p.sync(&state, &ChangeSummary::default()).unwrap();
    assert_table(&mut p, &state);

    // No endpoints at all: the service-ips element becomes a reject.
    state
        .endpoints
        .get_mut(&svc4)
        .unwrap()
        .get_mut(&port4)
        .unwrap()
        .clear();
    p.sync(&state, &changed(&[&svc4])).unwrap();
    p.sync(&state, &ChangeSummary::default()).unwrap();
    assert_table(&mut p, &state);
    let text = &p
        .last_transactions
        .iter()
        .map(|t| without_digest_chain(&t.1))
        .collect::<String>();
    assert!(text.is_empty() || !text.contains("add rule"), "{text}");

    // Affinity on, a new service, a removed service.
    let svc1 = NamespacedName::new("ns1", "svc1");
    for port in state.services.get_mut(&svc1).unwrap().values_mut() {
        port.session_affinity_seconds = Some(60);
    }
    let new = svc("ns9", "svc9", "172.30.0.99", |s| s.node_port = Some(3099))
        .with_endpoints(vec![ep("10.180.9.1", 80, NODE), ep("10.180.9.2", 80, "")]);
    state.services.insert(new.key.clone(), new.ports);
    state.endpoints.insert(new.key.clone(), new.endpoints);
    let svc3 = NamespacedName::new("ns3", "svc3");
    state.services.remove(&svc3);
    state.endpoints.remove(&svc3);
    p.sync(&state, &changed(&[&svc1, &new.key, &svc3])).unwrap();
    p.sync(&state, &ChangeSummary::default()).unwrap();
    assert_table(&mut p, &state);

    // Affinity off again: the affinity sets go.
    for port in state.services.get_mut(&svc1).unwrap().values_mut() {
        port.session_affinity_seconds = None;
    }
    p.sync(&state, &changed(&[&svc1])).unwrap();
    p.sync(&state, &ChangeSummary::default()).unwrap();
    assert_table(&mut p, &state);
    assert!(
        !programmed(&p)
            .sets
            .keys()
            .any(|s| s.starts_with("affinity-") && s.contains("ns1/svc1"))
    );
}

#[test]
fn a_restart_finds_an_earlier_runs_objects_and_removes_what_is_gone() {
    let mut state = state();
    let mut first = proxier(FakeNftables::default());
    first.sync(&state, &ChangeSummary::default()).unwrap();
    let mut kernel = first.nft.clone();
    kernel.name_reads = 0;

    // While no daemon ran, svc5 (with affinity sets) and svc4 went.
    for gone in [
        NamespacedName::new("ns5", "svc5"),
        NamespacedName::new("ns4", "svc4"),
    ] {
        state.services.remove(&gone);
        state.endpoints.remove(&gone);
    }
    let mut second = proxier(kernel);
    second.sync(&state, &ChangeSummary::default()).unwrap();
    assert_eq!(
        second.nft.name_reads, 1,
        "names read once, at the first full sync"
    );
    // The sync after a restart reads the table back again; then no more.
    second.sync(&state, &ChangeSummary::default()).unwrap();
    assert_eq!(second.nft.name_reads, 2);
    second.sync(&state, &ChangeSummary::default()).unwrap();
    assert_table(&mut second, &state);
    assert!(
        !programmed(&second)
            .sets
            .keys()
            .any(|s| s.starts_with("affinity-"))
    );
    assert_eq!(second.nft.name_reads, 2);
}

#[test]
fn a_service_the_kernel_refuses_is_skipped_and_the_rest_programmed() {
    let mut state = state();
    let nft = FakeNftables {
        refuse_containing: vec!["ns3/svc3".into()],
        ..FakeNftables::default()
    };
    let mut p = proxier(nft);
    let report = p.sync(&state, &ChangeSummary::default()).unwrap();
    assert_eq!(report.skipped_services, 1);
    let table = programmed(&p);
    assert!(table.chains.keys().any(|c| c.contains("ns1/svc1")));
    assert!(!table.chains.keys().any(|c| c.contains("ns3/svc3")));

    // It changes, the kernel takes it now: programmed.
    p.nft.refuse_containing.clear();
    let svc3 = NamespacedName::new("ns3", "svc3");
    for port in state.services.get_mut(&svc3).unwrap().values_mut() {
        port.port = 81;
    }
    let report = p.sync(&state, &changed(&[&svc3])).unwrap();
    assert_eq!(report.skipped_services, 0);
    assert_table(&mut p, &state);
}

#[test]
fn a_table_of_another_layout_is_recreated_after_one_failure() {
    let state = state();
    let mut nft = FakeNftables::default();
    nft.apply(
        "add table ip kube-proxy\nadd map ip kube-proxy service-ips { typeof ip daddr : verdict ; }\n",
    )
    .unwrap();
    let mut p = proxier(nft);
    assert!(p.sync(&state, &ChangeSummary::default()).is_err());
    p.sync(&state, &ChangeSummary::default()).unwrap();
    assert_table(&mut p, &state);
}

#[test]
fn lines_name_their_service() {
    let state = state();
    let ctx = crate::proxier::nftables::render::tests::context();
    let mut slots = SlotTable::default();
    let services: BTreeMap<NamespacedName, Objects> = state
        .services
        .iter()
        .map(|(k, ports)| {
            (
                k.clone(),
                render_service(ports, state.endpoints.get(k), &ctx, &mut slots),
            )
        })
        .collect();
    let svc2 = Some(NamespacedName::new("ns2", "svc2"));
    let chain = services[&NamespacedName::new("ns2", "svc2")]
        .chains
        .keys()
        .next()
        .unwrap()
        .clone();
    assert_eq!(
        owner_of_line(&format!("add rule ip kube-proxy {chain} drop"), &services),
        svc2
    );
    assert_eq!(
        owner_of_line(
            &format!(
                "add element ip kube-proxy service-ips {{ 1.2.3.4 . tcp . 80 : goto {chain} }}"
            ),
            &services
        ),
        svc2
    );
    assert_eq!(
        owner_of_line(
            "add element ip kube-proxy no-endpoint-services { 1.2.3.4 . tcp . 80 comment \"ns2/svc2:p80\" : drop }",
            &services
        ),
        svc2
    );
    assert_eq!(
        owner_of_line("add rule ip kube-proxy services jump x", &services),
        None
    );
}

#[test]
fn a_key_another_service_holds_goes_to_the_first_in_partial_syncs_too() {
    let mut state = state();
    let mut p = proxier(FakeNftables::default());
    p.sync(&state, &ChangeSummary::default()).unwrap();
    // A Service claiming ns3/svc3's NodePort (the API server forbids it; a test server may not):
    // the rest of it is programmed, the NodePort stays ns3/svc3's.
    let late = svc("ns9", "late", "172.30.0.99", |s| s.node_port = Some(3003))
        .with_endpoints(vec![ep("10.180.9.1", 80, "")]);
    state.services.insert(late.key.clone(), late.ports);
    state.endpoints.insert(late.key.clone(), late.endpoints);
    let report = p.sync(&state, &changed(&[&late.key])).unwrap();
    assert!(!report.full, "no failure, no full sync");
    assert_eq!(report.skipped_services, 0);
    let table = p.nft.table(IpFamily::V4, "kube-proxy").unwrap();
    assert!(
        table.sets["cluster-ips"]
            .elements
            .contains_key("172.30.0.99")
    );
    let nodeport = &table.sets["service-nodeports"].elements["tcp . 3003"];
    assert!(nodeport.contains("ns3/svc3"), "{nodeport}");
    // Deleting the late one leaves ns3/svc3's NodePort alone.
    state.services.remove(&late.key);
    state.endpoints.remove(&late.key);
    p.sync(&state, &changed(&[&late.key])).unwrap();
    let table = p.nft.table(IpFamily::V4, "kube-proxy").unwrap();
    assert!(table.sets["service-nodeports"].elements["tcp . 3003"].contains("ns3/svc3"));
}

/// Two services whose service chains hash to one slot: the chain with the smaller hash holds
/// it whichever came first, the other keeps the anonymous map. When the winner comes second it
/// takes the slot in the same transaction that rewrites the loser, and a restart (which sees
/// both at once) keeps everything as it is.
#[test]
fn of_two_chains_hashing_to_one_slot_the_same_one_wins_in_any_order() {
    // Services svc-0, svc-1, ... until two service chains share a slot (about 5,000 names).
    let mut seen: BTreeMap<u64, (NamespacedName, u64)> = BTreeMap::new();
    let mut pair = None;
    for index in 0..200_000 {
        let key = NamespacedName::new("ns", format!("svc-{index}"));
        let port = crate::model::ServicePortName::new("ns", &key.name, "p80", Protocol::Tcp);
        let chain = crate::proxier::nftables::names::service_chain(&port);
        let (_, (slot, _, _)) = SlotTable::default().claim("tcp", &chain, &key).unwrap();
        // A pair whose first name in key order (the order a sync renders in) has the larger
        // hash: rendered first, it is evicted by the other in the same sync.
        let hash = crate::proxier::nftables::slots::name_hash(&chain);
        if let Some((other, other_hash)) = seen.get(&slot)
            && (other < &key) == (*other_hash > hash)
        {
            pair = Some((key, slot));
            break;
        }
        seen.entry(slot).or_insert((key, hash));
    }
    let (second, slot) = pair.expect("a collision among 200,000 names");
    let first = seen[&slot].0.clone();
    let service = |key: &NamespacedName, octet: u8| {
        svc(
            &key.namespace,
            &key.name,
            &format!("172.30.1.{octet}"),
            |_| {},
        )
        .with_endpoints(vec![
            ep(&format!("10.180.1.{octet}"), 80, ""),
            ep(&format!("10.180.2.{octet}"), 80, ""),
        ])
    };
    let holder_of = |p: &NftablesProxier<FakeNftables>| -> Vec<NamespacedName> {
        p.programmed[&V4]
            .services
            .iter()
            .filter(|(_, objects)| !objects.slots.is_empty())
            .map(|(key, _)| key.clone())
            .collect()
    };
    for (early, late) in [(&first, &second), (&second, &first)] {
        let mut state = ProxyState {
            node: node(),
            ..ProxyState::default()
        };
        let add = |state: &mut ProxyState, key: &NamespacedName, octet| {
            let s = service(key, octet);
            state.services.insert(s.key.clone(), s.ports);
            state.endpoints.insert(s.key.clone(), s.endpoints);
        };
        add(&mut state, early, 1);
        let mut p = proxier(FakeNftables::default());
        p.sync(&state, &ChangeSummary::default()).unwrap();
        assert_eq!(holder_of(&p), std::slice::from_ref(early));
        add(&mut state, late, 2);
        p.sync(&state, &changed(&[late])).unwrap();
        let holders = holder_of(&p);
        assert_eq!(holders.len(), 1, "{holders:?}");
        let winner = holders[0].clone();
        let text = &p.last_transactions[0].1;
        if winner == *late {
            // The loser's chain is rewritten in the transaction that gives the slot away.
            assert!(text.contains(&format!("/{}/tcp/p80 meta l4proto tcp dnat ip addr . port to numgen random mod 2 map {{", early.name)), "{text}");
        }
        assert_table(&mut p, &state);
        // A restart onto this table rewrites no service chain and no element.
        let mut kernel = p.nft.clone();
        kernel.transactions.clear();
        let mut restarted = proxier(kernel);
        restarted.sync(&state, &ChangeSummary::default()).unwrap();
        let written = restarted.nft.transactions.concat();
        assert!(
            !written
                .lines()
                .any(|l| l.contains("/tcp/p80") || l.contains(" element ")),
            "{written}"
        );
        assert_eq!(holder_of(&restarted), std::slice::from_ref(&winner));
        // Both created in one partial sync: the one rendered first loses the slot to the
        // other, and is rendered again without it, in the same transaction.
        let mut both = proxier(FakeNftables::default());
        let empty = ProxyState {
            node: node(),
            ..ProxyState::default()
        };
        both.sync(&empty, &ChangeSummary::default()).unwrap();
        both.sync(&state, &changed(&[early, late])).unwrap();
        assert_eq!(holder_of(&both), [winner]);
        assert_table(&mut both, &state);
    }
}

mod offload;
mod restarts_and_drift;
