//! A node with thousands of services: a restarted daemon completes its first sync, ends with
//! exactly the rules a fresh start programs (stale chains of services deleted while it was down
//! removed) and then follows a new Service; a forced full sync at that size succeeds and leaves
//! the rules as they were. Every full sync reads only chain names and built-in chains (no
//! `iptables-save`, which at 10,000 services runs for minutes and then crashes).

mod support;

use std::time::Duration;

use kube_proxy_rs::model::{ChangeSummary, NamespacedName};
use kube_proxy_rs::proxier::Proxier;
use kube_proxy_rs::proxier::iptables::IptablesProxier;
use kube_proxy_rs::sys::host::net::{FakeSysctl, FixedAddresses};
use kube_proxy_rs::sys::xtables::{Backend, SystemIptables};
use support::cluster::Daemon;
use support::netns::{Netns, require_netns};
use support::rules::normalized_save;
use support::scale;
use test_apiserver::{ApiServer, Options, Resource};

/// Services on the node in these tests.
const SERVICES: usize = 3000;
/// A first sync at this size takes seconds; allow for a slow shared machine.
const SYNC_WAIT: Duration = Duration::from_secs(600);

/// A test API server inside `node` holding `range`, and a config file pointing at it.
async fn api_in(
    node: &Netns,
    dir: &tempfile::TempDir,
    range: std::ops::Range<usize>,
) -> (ApiServer, std::path::PathBuf) {
    let listener = node.run(|| std::net::TcpListener::bind("127.0.0.1:0").expect("bind api"));
    let api = ApiServer::start_on(listener, Options::default())
        .await
        .expect("api server");
    scale::populate(&api, range);
    let kubeconfig = dir.path().join(format!("kubeconfig-{}", node.name));
    std::fs::write(&kubeconfig, api.kubeconfig_yaml()).unwrap();
    let config = dir.path().join(format!("config-{}", node.name));
    std::fs::write(
        &config,
        format!(
            "mode: iptables\nclusterCIDR: 10.0.0.0/8\nclientConnection: {{kubeconfig: {}}}\n\
             iptables: {{syncPeriod: 5s, minSyncPeriod: 0s}}\n",
            kubeconfig.display()
        ),
    )
    .unwrap();
    (api, config)
}

/// Waits until the daemon has logged `count` completed syncs.
async fn synced(daemon: &Daemon, count: usize) {
    let done = support::eventually(SYNC_WAIT, || daemon.count("Synced proxy rules") >= count).await;
    assert!(
        done,
        "no sync number {count}:\n{}",
        daemon.lines.lock().unwrap().join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_daemon_converges_to_a_fresh_start_and_follows_changes() {
    require_netns();
    let dir = tempfile::tempdir().unwrap();
    let restarted = Netns::new("restarted");
    let (api, config) = api_in(&restarted, &dir, 0..SERVICES).await;
    let daemon = Daemon::spawn(&restarted, &config, &[]);
    synced(&daemon, 1).await;
    daemon.stop().await;

    // While it is down: a service goes, one arrives, one loses half of its endpoints.
    api.delete(Resource::Services, "bench", "svc-0").unwrap();
    api.delete(Resource::EndpointSlices, "bench", "svc-0-1")
        .unwrap();
    let (service, slice) = scale::api_objects(SERVICES);
    api.apply(service).unwrap();
    api.apply(slice).unwrap();
    let (_, mut slice) = scale::api_objects(1);
    slice["endpoints"].as_array_mut().unwrap().truncate(5);
    api.apply(slice).unwrap();

    let daemon = Daemon::spawn(&restarted, &config, &[]);
    synced(&daemon, 1).await;
    assert_eq!(
        daemon.count("Failed to sync"),
        0,
        "{:?}",
        daemon.lines.lock().unwrap()
    );

    let fresh = Netns::new("fresh");
    let (fresh_api, fresh_config) = api_in(&fresh, &dir, 1..SERVICES + 1).await;
    let (_, mut slice) = scale::api_objects(1);
    slice["endpoints"].as_array_mut().unwrap().truncate(5);
    fresh_api.apply(slice).unwrap();
    let reference = Daemon::spawn(&fresh, &fresh_config, &[]);
    synced(&reference, 1).await;
    reference.stop().await;
    for family in ["iptables", "ip6tables"] {
        let got = normalized_save(&restarted, Backend::Nft, family);
        let want = normalized_save(&fresh, Backend::Nft, family);
        assert!(
            got == want,
            "{family}: the restarted node differs from a fresh start"
        );
    }
    assert!(
        !restarted
            .output(&["iptables-nft", "-t", "nat", "-S", "KUBE-SERVICES"])
            .contains("bench/svc-0:http"),
        "the deleted service's rules went"
    );

    // It keeps following the API: a Service created now is programmed.
    let (service, slice) = scale::api_objects(SERVICES + 1);
    api.apply(service).unwrap();
    api.apply(slice).unwrap();
    let wanted = format!("bench/svc-{}:http cluster IP", SERVICES + 1);
    let followed = support::eventually(SYNC_WAIT, || {
        restarted
            .output(&["iptables-nft", "-t", "nat", "-S", "KUBE-SERVICES"])
            .contains(&wanted)
    })
    .await;
    assert!(
        followed,
        "a Service created after the restart was not programmed"
    );
    daemon.stop().await;
}

/// A proxier's full syncs on a programmed node, both back ends: a restart with a changed state,
/// then a forced full sync, each ending with the rules a single fresh sync programs.
#[test]
fn full_syncs_on_a_programmed_node_succeed_and_equal_a_fresh_sync() {
    require_netns();
    for backend in [Backend::Nft, Backend::Legacy] {
        let node = Netns::new("programmed");
        let fresh = Netns::new("fresh");
        let before = scale::state(SERVICES);
        let mut after = before.clone();
        for i in [0, 7, 11] {
            let key = NamespacedName::new("bench", format!("svc-{i}"));
            after.services.remove(&key);
            after.endpoints.remove(&key);
        }
        let more = scale::state(SERVICES + 20);
        for i in SERVICES..SERVICES + 20 {
            let key = NamespacedName::new("bench", format!("svc-{i}"));
            after
                .services
                .insert(key.clone(), more.services[&key].clone());
            after
                .endpoints
                .insert(key.clone(), more.endpoints[&key].clone());
        }
        let proxier = move || {
            IptablesProxier::new(
                SystemIptables::new(backend),
                scale::iptables_settings("10.0.0.0/8"),
                Box::new(FixedAddresses(vec![])),
                Box::new(FakeSysctl::default()),
            )
        };
        let (restart_state, forced_state) = (after.clone(), after.clone());
        node.run(move || {
            proxier()
                .sync(&before, &ChangeSummary::default())
                .expect("first sync");
            let mut restarted = proxier();
            let report = restarted
                .sync(&restart_state, &ChangeSummary::default())
                .expect("first sync after a restart");
            assert!(report.full);
            restarted.force_full_sync();
            let report = restarted
                .sync(&forced_state, &ChangeSummary::default())
                .expect("forced full sync");
            assert!(report.full);
        });
        fresh.run(move || {
            proxier()
                .sync(&after, &ChangeSummary::default())
                .expect("fresh sync");
        });
        let got = normalized_save(&node, backend, "iptables");
        let want = normalized_save(&fresh, backend, "iptables");
        assert!(got.contains("bench/svc-3019:http") && !got.contains("bench/svc-7:http"));
        assert!(
            got == want,
            "{backend:?}: full syncs on a programmed node differ from a fresh sync"
        );
    }
}
