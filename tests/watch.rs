//! The watch layer against the test API server, through kube-rs unmodified: first-list gating,
//! adds/updates/deletes, closed watches, 410 Gone, error answers, and a server restart.

mod support;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube_proxy_rs::k8s::{Refusal, Synced, WatchSink, build_client, spawn_watches};
use kube_proxy_rs::model::{ChangeTracker, NamespacedName, ProxyState};
use support::{Cluster, WAIT, eventually, node, seed_web, service, slice};
use test_apiserver::Resource;
use tokio::sync::watch;

/// A kind, and the refusal a watch reported for it (`None`: not refused).
type Reported = (&'static str, Option<Refusal>);

/// The daemon's view, minus the proxier: a tracker fed by the watches, drained into a state.
struct Follower {
    tracker: Arc<Mutex<ChangeTracker>>,
    state: ProxyState,
    synced: watch::Receiver<Synced>,
    notified: Arc<AtomicUsize>,
    /// What the watches reported of refusals, in order.
    refusals: Arc<Mutex<Vec<Reported>>>,
    _tasks: tokio::task::JoinSet<()>,
}

impl Follower {
    async fn start(cluster: &Cluster) -> Follower {
        let client = build_client(Some(&cluster.kubeconfig), None, None)
            .await
            .expect("client");
        let tracker = Arc::new(Mutex::new(ChangeTracker::default()));
        let notified = Arc::new(AtomicUsize::new(0));
        let (synced_tx, synced) = watch::channel(Synced::default());
        let counter = notified.clone();
        let refusals = Arc::new(Mutex::new(Vec::new()));
        let reported = refusals.clone();
        let sink = WatchSink {
            tracker: tracker.clone(),
            on_change: Arc::new(move || {
                counter.fetch_add(1, Ordering::SeqCst);
            }),
            on_invalid: Arc::new(|_, _| {}),
            on_refused: Arc::new(move |kind, refusal| {
                reported.lock().unwrap().push((kind, refusal));
            }),
            synced: synced_tx,
        };
        let tasks = spawn_watches(client, "node-a", true, sink);
        Follower {
            tracker,
            state: ProxyState::default(),
            synced,
            notified,
            refusals,
            _tasks: tasks,
        }
    }

    /// Applies what is pending, as a sync would.
    fn sync(&mut self) {
        let changes = self.tracker.lock().unwrap().take_changes();
        self.state.apply(changes);
    }

    fn services(&mut self) -> BTreeSet<String> {
        self.sync();
        self.state
            .services
            .keys()
            .map(ToString::to_string)
            .collect()
    }

    fn endpoint_ips(&mut self, ns: &str, svc: &str) -> Vec<String> {
        self.sync();
        let key = NamespacedName::new(ns, svc);
        let mut ips: Vec<String> = self
            .state
            .endpoints
            .get(&key)
            .into_iter()
            .flat_map(|m| m.values().flatten())
            .map(|e| e.ip.to_string())
            .collect();
        ips.sort();
        ips.dedup();
        ips
    }

    async fn wait_synced(&mut self) {
        tokio::time::timeout(WAIT, self.synced.wait_for(Synced::all))
            .await
            .expect("synced in time")
            .expect("watch alive");
    }
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

async fn seeded() -> Cluster {
    let cluster = Cluster::start().await;
    let s = &cluster.server;
    seed_web(s);
    s.apply(service("default", "api", "10.96.0.11", &[443, 8443]))
        .unwrap();
    cluster
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_list_gates_and_fills_the_state() {
    let cluster = seeded().await;
    // Services answer, EndpointSlice lists stall: nothing may count as synced until both are done.
    cluster.server.set_stalled(true);
    let mut f = Follower::start(&cluster).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!f.synced.borrow().all());
    cluster.server.set_stalled(false);
    f.wait_synced().await;
    assert_eq!(f.services(), set(&["default/api", "default/web"]));
    assert_eq!(
        f.endpoint_ips("default", "web"),
        vec!["10.244.1.5", "10.244.1.6"]
    );
    assert_eq!(f.state.node.name, "node-a");
    assert_eq!(
        f.state.node.addresses,
        vec!["192.168.1.10".parse::<IpAddr>().unwrap()]
    );
    assert_eq!(f.state.node.zone(), Some("zone-a"));
    assert!(f.notified.load(Ordering::SeqCst) > 0);
    // The requests carry upstream's selectors.
    let requests = cluster.server.requests();
    assert!(requests.iter().any(|r| r.starts_with("GET /api/v1/services?") && r.contains("labelSelector=%21service.kubernetes.io%2Fservice-proxy-name%2C%21service.kubernetes.io%2Fheadless")), "{requests:#?}");
    assert!(
        requests.iter().any(|r| r.starts_with("GET /api/v1/nodes?")
            && r.contains("fieldSelector=metadata.name%3Dnode-a")),
        "{requests:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_node_still_counts_as_listed() {
    let cluster = Cluster::start().await;
    cluster
        .server
        .apply(service("default", "web", "10.96.0.10", &[80]))
        .unwrap();
    let mut f = Follower::start(&cluster).await;
    f.wait_synced().await;
    assert_eq!(f.services(), set(&["default/web"]));
    // The node appearing later is picked up.
    cluster
        .server
        .apply(node("node-a", "192.168.1.10", "zone-a"))
        .unwrap();
    assert!(
        eventually(WAIT, || {
            f.sync();
            f.state.node.name == "node-a"
        })
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_updates_deletes_and_selectors() {
    let cluster = seeded().await;
    let s = &cluster.server;
    let mut f = Follower::start(&cluster).await;
    f.wait_synced().await;

    s.apply(service("shop", "cart", "10.96.1.1", &[80]))
        .unwrap();
    s.apply(slice(
        "default",
        "web",
        "1",
        80,
        &["10.244.1.5", "10.244.1.7"],
    ))
    .unwrap();
    s.delete(Resource::Services, "default", "api").unwrap();
    assert!(
        eventually(WAIT, || f.services() == set(&["default/web", "shop/cart"])).await,
        "{:?}",
        f.services()
    );
    assert!(
        eventually(WAIT, || f.endpoint_ips("default", "web")
            == ["10.244.1.5", "10.244.1.7"])
        .await
    );

    // Objects another proxy owns, and headless-labelled ones, are not ours; a label change moves
    // an object out of the selection, which reads as a delete.
    let mut other = service("shop", "other", "10.96.1.2", &[80]);
    other["metadata"]["labels"] =
        serde_json::json!({"service.kubernetes.io/service-proxy-name": "cilium"});
    s.apply(other).unwrap();
    let mut cart = service("shop", "cart", "10.96.1.1", &[80]);
    cart["metadata"]["labels"] = serde_json::json!({"service.kubernetes.io/headless": ""});
    s.apply(cart).unwrap();
    s.apply(service("shop", "marker", "10.96.1.3", &[80]))
        .unwrap();
    assert!(
        eventually(WAIT, || f.services()
            == set(&["default/web", "shop/marker"]))
        .await,
        "{:?}",
        f.services()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_objects_are_skipped_and_the_rest_works() {
    let cluster = seeded().await;
    let s = &cluster.server;
    let mut bad = service("default", "bad", "10.96.0.99", &[80]);
    bad["spec"]["ports"][0]["protocol"] = "ICMP".into();
    s.apply(bad).unwrap();
    let mut f = Follower::start(&cluster).await;
    f.wait_synced().await;
    assert_eq!(f.services(), set(&["default/api", "default/web"]));
    s.apply(service("default", "good", "10.96.0.98", &[80]))
        .unwrap();
    assert!(eventually(WAIT, || f.services().contains("default/good")).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_that_does_not_decode_is_skipped_and_the_rest_works() {
    let cluster = seeded().await;
    let s = &cluster.server;
    // A string where a number belongs: kube-rs cannot decode it as a Service.
    let mut ill_typed = service("default", "ill-typed", "10.96.0.97", &[80]);
    ill_typed["spec"]["ports"][0]["port"] = "eighty".into();
    s.apply(ill_typed.clone()).unwrap();
    let mut f = Follower::start(&cluster).await;
    f.wait_synced().await;
    assert_eq!(
        f.services(),
        set(&["default/api", "default/web"]),
        "listed despite it"
    );
    s.apply(service("default", "good", "10.96.0.98", &[80]))
        .unwrap();
    assert!(eventually(WAIT, || f.services().contains("default/good")).await);

    // Present during a relist (410 Gone) too: a Service created afterwards is followed.
    s.set_stalled(true);
    s.close_watches();
    s.apply(ill_typed).unwrap();
    s.compact();
    s.set_stalled(false);
    s.apply(service("default", "after-relist", "10.96.0.96", &[80]))
        .unwrap();
    assert!(
        eventually(WAIT, || f.services().contains("default/after-relist")).await,
        "{:?}",
        f.services()
    );
    assert!(!f.services().contains("default/ill-typed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_watches_reconnect() {
    let cluster = seeded().await;
    let s = &cluster.server;
    let mut f = Follower::start(&cluster).await;
    f.wait_synced().await;
    let watches_before = s
        .requests()
        .iter()
        .filter(|r| r.contains("watch=true"))
        .count();
    s.close_watches();
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.apply(service("default", "after-close", "10.96.0.20", &[80]))
        .unwrap();
    assert!(eventually(WAIT, || f.services().contains("default/after-close")).await);
    let watches_after = s
        .requests()
        .iter()
        .filter(|r| r.contains("watch=true"))
        .count();
    assert!(
        watches_after > watches_before,
        "{watches_before} -> {watches_after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gone_watch_relists_without_losing_state() {
    let cluster = seeded().await;
    let s = &cluster.server;
    let mut f = Follower::start(&cluster).await;
    f.wait_synced().await;
    let lists = |s: &test_apiserver::ApiServer| {
        s.requests()
            .iter()
            .filter(|r| r.starts_with("GET /api/v1/services?") && !r.contains("watch=true"))
            .count()
    };
    let lists_before = lists(s);
    // Watches are cut and cannot reconnect while the cluster changes and the history is compacted
    // past them: resuming gets 410 Gone and must relist.
    s.set_stalled(true);
    s.close_watches();
    s.delete(Resource::Services, "default", "api").unwrap();
    s.apply(service("default", "new", "10.96.0.21", &[80]))
        .unwrap();
    s.compact();
    s.set_stalled(false);
    assert!(
        eventually(WAIT, || f.services()
            == set(&["default/new", "default/web"]))
        .await,
        "{:?}",
        f.services()
    );
    assert!(lists(s) > lists_before, "a relist happened");
    assert_eq!(
        f.endpoint_ips("default", "web"),
        vec!["10.244.1.5", "10.244.1.6"],
        "unchanged state kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_answers_back_off_and_recover() {
    for code in [500, 429] {
        let cluster = seeded().await;
        let s = &cluster.server;
        let mut f = Follower::start(&cluster).await;
        f.wait_synced().await;
        s.fail_next(6, code);
        s.compact();
        s.close_watches();
        // While requests fail, the last state stays.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            f.services(),
            set(&["default/api", "default/web"]),
            "state kept during {code}s"
        );
        s.apply(service("default", "later", "10.96.0.22", &[80]))
            .unwrap();
        assert!(
            eventually(WAIT, || f.services().contains("default/later")).await,
            "recovered after {code}s"
        );
        let failed = s.requests().len();
        assert!(failed > 6, "the failures were seen");
    }
}

/// Windows requests are counted over, and the most tries of one watch each may hold, from the
/// least delays between tries. An outage's (0.25, 0.5, 1, 2, then 2 s each) allow 9 tries in
/// 12 s. A refusal is retried as an outage for its first 10 s, then its delays double up to a
/// minute (at least 4, 8, 16 s): 11 tries in 30 s, where an outage's delays would allow 18.
const OUTAGE_WINDOW: Duration = Duration::from_secs(12);
const MOST_OUTAGE_TRIES: usize = 9;
const REFUSAL_WINDOW: Duration = Duration::from_secs(30);
const MOST_REFUSED_TRIES: usize = 11;

/// The requests the server saw whose line starts with `prefix`, over `window` from now.
async fn requests_in(server: &test_apiserver::ApiServer, prefix: &str, window: Duration) -> usize {
    let count = || {
        server
            .requests()
            .iter()
            .filter(|line| line.starts_with(prefix) && !line.contains("watch=true"))
            .count()
    };
    let before = count();
    tokio::time::sleep(window).await;
    count() - before
}

const SERVICE_CIDR_LISTS: &str = "GET /apis/networking.k8s.io/v1/servicecidrs";

/// A resource the API server refuses (404: not served; 403: RBAC) is retried with backoff
/// while every other kind works; the refusal is reported once, and its end too when the
/// server serves it again.
async fn refused_service_cidrs(code: u16, refusal: Refusal) {
    let cluster = seeded().await;
    let s = &cluster.server;
    s.refuse(Resource::ServiceCidrs, Some(code));
    let mut f = Follower::start(&cluster).await;
    f.wait_synced().await;
    assert_eq!(f.services(), set(&["default/api", "default/web"]));
    let tries = requests_in(s, SERVICE_CIDR_LISTS, REFUSAL_WINDOW).await;
    assert!(
        (1..=MOST_REFUSED_TRIES).contains(&tries),
        "{code}: {tries} tries in {REFUSAL_WINDOW:?}"
    );
    let reported = f.refusals.lock().unwrap().clone();
    let refused: Vec<_> = reported.iter().filter(|(_, r)| r.is_some()).collect();
    assert_eq!(refused, [&("ServiceCIDR", Some(refusal))], "{reported:?}");
    s.refuse(Resource::ServiceCidrs, None);
    assert!(
        eventually(WAIT, || f.synced.borrow().service_cidrs).await,
        "listed once served"
    );
    assert_eq!(
        f.refusals.lock().unwrap().last(),
        Some(&("ServiceCIDR", None)),
        "the end of the refusal is reported"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_the_server_does_not_serve_is_retried_slowly() {
    refused_service_cidrs(404, Refusal::NotServed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_rbac_forbids_is_retried_slowly() {
    refused_service_cidrs(403, Refusal::Forbidden).await;
}

/// A list that fails for as long as the API server is unwell is retried at most every 2-4 s,
/// jittered, and the watch recovers when it is well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_that_keeps_failing_backs_off() {
    let cluster = seeded().await;
    let s = &cluster.server;
    s.refuse(Resource::ServiceCidrs, Some(503));
    let mut f = Follower::start(&cluster).await;
    f.wait_synced().await;
    let tries = requests_in(s, SERVICE_CIDR_LISTS, OUTAGE_WINDOW).await;
    assert!(
        (2..=MOST_OUTAGE_TRIES).contains(&tries),
        "{tries} tries in {OUTAGE_WINDOW:?}"
    );
    assert!(
        f.refusals.lock().unwrap().iter().all(|(_, r)| r.is_none()),
        "an outage is not a refusal"
    );
    s.refuse(Resource::ServiceCidrs, None);
    assert!(
        eventually(WAIT, || f.synced.borrow().service_cidrs).await,
        "listed once the server is well"
    );
}

/// A list of several pages whose later pages fail: the first page is no progress, so each try
/// (two requests) waits as an outage's does, and the list completes once they are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_whose_later_pages_fail_backs_off() {
    let cluster = seeded().await;
    let s = &cluster.server;
    // More than one page of kube-runtime's 500 objects.
    for i in 0..600u32 {
        let ip = format!("10.96.{}.{}", 10 + i / 250, 1 + i % 250);
        s.apply(service("many", &format!("svc-{i}"), &ip, &[80]))
            .unwrap();
    }
    s.refuse_later_pages(Resource::Services, Some(503));
    let f = Follower::start(&cluster).await;
    let requests = requests_in(s, "GET /api/v1/services", OUTAGE_WINDOW).await;
    assert!(
        (2..=2 * MOST_OUTAGE_TRIES).contains(&requests),
        "{requests} list requests in {OUTAGE_WINDOW:?}"
    );
    assert!(!f.synced.borrow().services, "no list completed");
    s.refuse_later_pages(Resource::Services, None);
    assert!(
        eventually(WAIT, || f.synced.borrow().services).await,
        "listed once every page is served"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_keeps_state_then_reconverges() {
    let cluster = seeded().await;
    let s = &cluster.server;
    let mut f = Follower::start(&cluster).await;
    f.wait_synced().await;
    s.stop().await;
    // While the server is away, the cluster changes.
    s.delete(Resource::Services, "default", "api").unwrap();
    s.apply(slice("default", "web", "1", 80, &["10.244.1.9"]))
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        f.services(),
        set(&["default/api", "default/web"]),
        "nothing cleared while away"
    );
    assert_eq!(
        f.endpoint_ips("default", "web"),
        vec!["10.244.1.5", "10.244.1.6"]
    );
    s.restart().await.expect("restart");
    assert!(
        eventually(WAIT, || f.services() == set(&["default/web"])).await,
        "{:?}",
        f.services()
    );
    assert!(eventually(WAIT, || f.endpoint_ips("default", "web") == ["10.244.1.9"]).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_lists_are_paginated() {
    let cluster = Cluster::start().await;
    for i in 0..1200u32 {
        let ip = format!("10.96.{}.{}", i / 250, i % 250 + 1);
        cluster
            .server
            .apply(service("bulk", &format!("svc-{i}"), &ip, &[80]))
            .unwrap();
    }
    let mut f = Follower::start(&cluster).await;
    f.wait_synced().await;
    assert_eq!(f.services().len(), 1200);
    let pages = cluster
        .server
        .requests()
        .iter()
        .filter(|r| r.starts_with("GET /api/v1/services?") && r.contains("continue="))
        .count();
    assert!(pages >= 2, "kube-rs followed continue tokens");
}
