//! The watches: Services, EndpointSlices, this node's Node and (for nftables mode) the
//! ServiceCIDRs, each a kube-runtime watcher with
//! backoff, feeding the change tracker. A relist (at start, after 410 Gone, after a reconnect)
//! is buffered and applied as one diff when complete, so the state is never cleared while the API
//! server is away and nothing is reported until every kind has finished its first list.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice as ApiEndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use super::convert::{self, ConvertError, Converted, PROXY_EXCLUDING_LABELS};
use super::lenient::Lenient;
use super::retry::{Refusal, Reported, Retry, Subject};
use crate::model::{ChangeTracker, EndpointSlice, NamespacedName, NodeInfo, ServicePortMap};
use ipnet::IpNet;

/// The label selector upstream watches Services and EndpointSlices with (objects another proxy
/// owns, and headless services, are not ours):
/// `!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless`.
pub fn proxy_label_selector() -> String {
    PROXY_EXCLUDING_LABELS
        .iter()
        .map(|label| format!("!{label}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Which kinds have finished their first list.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Synced {
    pub services: bool,
    pub endpoint_slices: bool,
    pub node: bool,
    /// Not waited for: without them only the drop rule for unallocated ClusterIPs is missing,
    /// and a cluster whose RBAC predates them must still get its services.
    pub service_cidrs: bool,
}

impl Synced {
    /// Every kind the first sync needs has been listed once.
    pub fn all(&self) -> bool {
        self.services && self.endpoint_slices && self.node
    }
}

/// Something invalid that arrived from the API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvalidInput {
    /// A whole object was skipped.
    ObjectSkipped,
    /// An entry of an object (one address, one port) was ignored.
    EntryIgnored,
}

impl InvalidInput {
    /// As the metric's `outcome` label says it.
    pub fn as_str(self) -> &'static str {
        match self {
            InvalidInput::ObjectSkipped => "object_skipped",
            InvalidInput::EntryIgnored => "entry_ignored",
        }
    }
}

/// Where the watches deliver: the tracker, a callback that asks for a sync, one that counts
/// invalid input (by kind), one told when the API server starts or stops refusing a kind
/// ([`Refusal`]), and the synced flags.
#[derive(Clone)]
pub struct WatchSink {
    pub tracker: Arc<Mutex<ChangeTracker>>,
    pub on_change: Arc<dyn Fn() + Send + Sync>,
    pub on_invalid: Arc<dyn Fn(&'static str, InvalidInput) + Send + Sync>,
    pub on_refused: Arc<dyn Fn(&'static str, Option<Refusal>) + Send + Sync>,
    pub synced: watch::Sender<Synced>,
}

impl WatchSink {
    fn tracker(&self) -> MutexGuard<'_, ChangeTracker> {
        self.tracker
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn changed(&self, pending: bool) {
        if pending {
            (self.on_change)();
        }
    }
}

/// Starts the three watches; they run until the returned set is dropped.
pub fn spawn_watches(
    client: Client,
    node_name: &str,
    service_cidrs: bool,
    sink: WatchSink,
) -> JoinSet<()> {
    let mut tasks = JoinSet::new();
    if service_cidrs {
        let client = client.clone();
        let cidrs = move || {
            watcher(
                Api::<Lenient<ServiceCIDR>>::all(client.clone()),
                watcher::Config::default(),
            )
        };
        tasks.spawn(follow(cidrs, ServiceCidrKind, sink.clone()));
    }
    let selector = watcher::Config::default().labels(&proxy_label_selector());
    let services = {
        let (client, selector) = (client.clone(), selector.clone());
        move || {
            watcher(
                Api::<Lenient<Service>>::all(client.clone()),
                selector.clone(),
            )
        }
    };
    tasks.spawn(follow(services, ServiceKind, sink.clone()));
    let slices = {
        let (client, selector) = (client.clone(), selector.clone());
        move || {
            watcher(
                Api::<Lenient<ApiEndpointSlice>>::all(client.clone()),
                selector.clone(),
            )
        }
    };
    tasks.spawn(follow(slices, SliceKind, sink.clone()));
    let node_selector = watcher::Config::default().fields(&format!("metadata.name={node_name}"));
    let nodes = move || {
        watcher(
            Api::<Lenient<Node>>::all(client.clone()),
            node_selector.clone(),
        )
    };
    tasks.spawn(follow(
        nodes,
        NodeKind {
            name: node_name.to_string(),
        },
        sink,
    ));
    tasks
}

fn watcher<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send
where
    K: Resource + Clone + Debug + serde::de::DeserializeOwned + Send + 'static,
{
    // No kube-runtime backoff: `follow` waits between tries (k8s/retry.rs says why).
    watcher::watcher(api, config)
}

/// How one kind's objects reach the tracker.
trait Kind: Send + 'static {
    type Object: Resource<DynamicType = ()> + Send;
    type Value: Send;
    /// What logs say of it.
    const SUBJECT: Subject;
    /// The name logs use.
    const NAME: &'static str = Self::SUBJECT.kind;
    fn convert(&self, object: &Self::Object) -> Result<Converted<Self::Value>, ConvertError>;
    fn apply(
        &self,
        tracker: &mut ChangeTracker,
        key: &NamespacedName,
        value: Option<Self::Value>,
    ) -> bool;
    /// Applies a complete listing; keys in `keep` were present but malformed and keep their last state.
    fn replace(
        &self,
        tracker: &mut ChangeTracker,
        listing: BTreeMap<NamespacedName, Self::Value>,
        keep: &BTreeSet<NamespacedName>,
    ) -> bool;
    fn mark_synced(&self, synced: &mut Synced);
}

fn key_of<K: Resource>(object: &K) -> NamespacedName {
    NamespacedName::new(object.namespace().unwrap_or_default(), object.name_any())
}

/// While a watch is failing, a request that gets neither an answer nor an error for this long
/// (a connection the recovering API server accepted and forgot) is abandoned for a new watch.
const RECOVERY_STALL: Duration = Duration::from_secs(10);

async fn follow<K, S>(start: impl Fn() -> S + Send, kind: K, sink: WatchSink)
where
    K: Kind,
    S: Stream<Item = watcher::Result<Event<Lenient<K::Object>>>> + Send,
{
    let mut stream = Box::pin(start());
    let mut relist = Relist {
        listing: BTreeMap::new(),
        malformed: BTreeSet::new(),
    };
    let mut failing = false;
    let mut retry = Retry::new(K::SUBJECT);
    (sink.on_refused)(K::NAME, None);
    loop {
        let next = if failing {
            match tokio::time::timeout(RECOVERY_STALL, stream.next()).await {
                Ok(next) => next,
                Err(_) => {
                    info!(
                        kind = K::NAME,
                        "Watch of {} made no progress while recovering; starting it again",
                        K::NAME
                    );
                    stream = Box::pin(start());
                    continue;
                }
            }
        } else {
            stream.next().await
        };
        let Some(event) = next else { break };
        let event = match event {
            Ok(event) => event,
            Err(err) => {
                let (delay, reported) = retry.failed(&err);
                if let Reported::Refused(refusal) = reported {
                    (sink.on_refused)(K::NAME, Some(refusal));
                }
                failing = true;
                tokio::time::sleep(delay).await;
                continue;
            }
        };
        // Only a completed list or a delivered change is proof: a relist's start is not, nor
        // its first page when a later one may fail.
        if matches!(event, Event::InitDone | Event::Apply(_) | Event::Delete(_)) {
            if retry.progressed() {
                (sink.on_refused)(K::NAME, None);
            }
            if std::mem::take(&mut failing) {
                info!(kind = K::NAME, "Watch of {} is working again", K::NAME);
            }
        }
        on_event(&kind, event, &mut relist, &sink);
    }
}

/// A relist in progress: the objects listed so far, and the keys of malformed ones (they keep
/// their last state).
struct Relist<V> {
    listing: BTreeMap<NamespacedName, V>,
    malformed: BTreeSet<NamespacedName>,
}

/// One event of a watch: a relist gathered and applied whole once complete, a change applied
/// at once.
fn on_event<K: Kind>(
    kind: &K,
    event: Event<Lenient<K::Object>>,
    relist: &mut Relist<K::Value>,
    sink: &WatchSink,
) {
    let Relist { listing, malformed } = relist;
    match event {
        Event::Init => {
            debug!(kind = K::NAME, "Listing {}", K::NAME);
            listing.clear();
            malformed.clear();
        }
        Event::InitApply(object) => {
            let key = key_of(&object);
            match converted(kind, &object, &key, sink) {
                Some(value) => {
                    listing.insert(key, value);
                }
                None => {
                    malformed.insert(key);
                }
            }
        }
        Event::InitDone => {
            let count = listing.len();
            let pending = kind.replace(&mut sink.tracker(), std::mem::take(listing), malformed);
            sink.synced.send_modify(|synced| kind.mark_synced(synced));
            info!(kind = K::NAME, count, "Listed {}", K::NAME);
            sink.changed(pending);
        }
        Event::Apply(object) => {
            let key = key_of(&object);
            if let Some(value) = converted(kind, &object, &key, sink) {
                let pending = kind.apply(&mut sink.tracker(), &key, Some(value));
                sink.changed(pending);
            }
        }
        Event::Delete(object) => {
            let key = key_of(&object);
            let pending = kind.apply(&mut sink.tracker(), &key, None);
            sink.changed(pending);
        }
    }
}

fn converted<K: Kind>(
    kind: &K,
    object: &Lenient<K::Object>,
    key: &NamespacedName,
    sink: &WatchSink,
) -> Option<K::Value> {
    let decoded = match object {
        Lenient::Decoded(object) => kind.convert(object),
        Lenient::Undecodable { error, .. } => Err(ConvertError {
            reason: format!("does not decode: {error}"),
        }),
    };
    match decoded {
        Ok(converted) => {
            for warning in &converted.warnings {
                warn!(kind = K::NAME, object = %key, reason = %warning, "Ignoring an invalid entry of {}", K::NAME);
                (sink.on_invalid)(K::NAME, InvalidInput::EntryIgnored);
            }
            Some(converted.value)
        }
        Err(err) => {
            warn!(kind = K::NAME, object = %key, reason = %err, "Skipping malformed {}", K::NAME);
            (sink.on_invalid)(K::NAME, InvalidInput::ObjectSkipped);
            None
        }
    }
}

struct ServiceKind;

impl Kind for ServiceKind {
    type Object = Service;
    type Value = ServicePortMap;
    const SUBJECT: Subject = Subject {
        kind: "Service",
        resource: "services",
        api_version: "v1",
        without_it: "no Service can be programmed",
    };

    fn convert(&self, object: &Service) -> Result<Converted<ServicePortMap>, ConvertError> {
        convert::service_ports(object)
    }

    fn apply(
        &self,
        tracker: &mut ChangeTracker,
        key: &NamespacedName,
        value: Option<ServicePortMap>,
    ) -> bool {
        tracker.service_updated(key, value)
    }

    fn replace(
        &self,
        tracker: &mut ChangeTracker,
        listing: BTreeMap<NamespacedName, ServicePortMap>,
        keep: &BTreeSet<NamespacedName>,
    ) -> bool {
        tracker.replace_services(listing, keep)
    }

    fn mark_synced(&self, synced: &mut Synced) {
        synced.services = true;
    }
}

struct SliceKind;

impl Kind for SliceKind {
    type Object = ApiEndpointSlice;
    /// `None` for a slice kube-proxy ignores (FQDN): it is listed, so it is not malformed.
    type Value = Option<EndpointSlice>;
    const SUBJECT: Subject = Subject {
        kind: "EndpointSlice",
        resource: "endpointslices.discovery.k8s.io",
        api_version: "discovery.k8s.io/v1, Kubernetes 1.21 and later",
        without_it: "no Service gets endpoints",
    };

    fn convert(
        &self,
        object: &ApiEndpointSlice,
    ) -> Result<Converted<Option<EndpointSlice>>, ConvertError> {
        convert::endpoint_slice(object)
    }

    fn apply(
        &self,
        tracker: &mut ChangeTracker,
        key: &NamespacedName,
        value: Option<Option<EndpointSlice>>,
    ) -> bool {
        tracker.slice_updated(key, value.flatten())
    }

    fn replace(
        &self,
        tracker: &mut ChangeTracker,
        listing: BTreeMap<NamespacedName, Option<EndpointSlice>>,
        keep: &BTreeSet<NamespacedName>,
    ) -> bool {
        let usable = listing
            .into_iter()
            .filter_map(|(key, slice)| Some((key, slice?)))
            .collect();
        tracker.replace_slices(usable, keep)
    }

    fn mark_synced(&self, synced: &mut Synced) {
        synced.endpoint_slices = true;
    }
}

struct NodeKind {
    name: String,
}

impl Kind for NodeKind {
    type Object = Node;
    type Value = NodeInfo;
    const SUBJECT: Subject = Subject {
        kind: "Node",
        resource: "nodes",
        api_version: "v1",
        without_it: "this node's addresses, zone and pod CIDRs stay unknown",
    };

    fn convert(&self, object: &Node) -> Result<Converted<NodeInfo>, ConvertError> {
        Ok(convert::node_info(object))
    }

    fn apply(
        &self,
        tracker: &mut ChangeTracker,
        _key: &NamespacedName,
        value: Option<NodeInfo>,
    ) -> bool {
        match value {
            Some(node) => tracker.node_updated(Some(node)),
            None => {
                // Addresses and zone stay as last seen: forgetting them would break NodePorts.
                warn!(node = %self.name, "This node's Node object was deleted; keeping its last known state");
                false
            }
        }
    }

    fn replace(
        &self,
        tracker: &mut ChangeTracker,
        listing: BTreeMap<NamespacedName, NodeInfo>,
        _keep: &BTreeSet<NamespacedName>,
    ) -> bool {
        match listing.into_values().next() {
            Some(node) => tracker.node_updated(Some(node)),
            None => {
                warn!(node = %self.name, "Node not found; its addresses, zone and pod CIDRs are unknown until it appears");
                false
            }
        }
    }

    fn mark_synced(&self, synced: &mut Synced) {
        synced.node = true;
    }
}

struct ServiceCidrKind;

impl Kind for ServiceCidrKind {
    type Object = ServiceCIDR;
    type Value = Vec<IpNet>;
    const SUBJECT: Subject = Subject {
        kind: "ServiceCIDR",
        resource: "servicecidrs.networking.k8s.io",
        api_version: "networking.k8s.io/v1, Kubernetes 1.33 and later",
        without_it: "nftables mode drops no traffic to unallocated ClusterIPs until it does, and programs every Service as usual",
    };

    fn convert(&self, object: &ServiceCIDR) -> Result<Converted<Vec<IpNet>>, ConvertError> {
        Ok(convert::service_cidr(object))
    }

    fn apply(
        &self,
        tracker: &mut ChangeTracker,
        key: &NamespacedName,
        value: Option<Vec<IpNet>>,
    ) -> bool {
        tracker.service_cidr_updated(key, value)
    }

    fn replace(
        &self,
        tracker: &mut ChangeTracker,
        listing: BTreeMap<NamespacedName, Vec<IpNet>>,
        keep: &BTreeSet<NamespacedName>,
    ) -> bool {
        tracker.replace_service_cidrs(listing, keep)
    }

    fn mark_synced(&self, synced: &mut Synced) {
        synced.service_cidrs = true;
    }
}
