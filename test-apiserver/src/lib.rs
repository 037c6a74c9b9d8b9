//! A Kubernetes API server for tests and the sandbox: in-process, plain HTTP on loopback, serving
//! the part of the API kube-proxy uses (discovery; list with label/field selectors and pagination;
//! watch with resource versions, bookmarks and 410 Gone; create/replace/patch/delete) for v1
//! Services, Nodes, ConfigMaps, Events, discovery.k8s.io/v1 EndpointSlices, events.k8s.io/v1
//! Events and networking.k8s.io/v1 ServiceCIDRs. kube-rs talks to it
//! unmodified through a kubeconfig. Faults can be injected: closed watches, error answers, stalls,
//! restarts and compaction.

mod http;
mod load;
mod selector;
mod store;

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::Value;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{broadcast, watch};
use tokio::task::{JoinHandle, JoinSet};

pub use load::objects_from_yaml;
pub use selector::Selector;
pub use store::{EventType, Resource, WriteError};
use store::{Store, StoredEvent};

/// How many events the server keeps for watches to resume from, unless told otherwise.
pub const DEFAULT_HISTORY: usize = 10_000;

/// State shared by the listener, the connections and the test's handle.
pub(crate) struct Shared {
    pub store: Mutex<Store>,
    pub events: broadcast::Sender<Arc<StoredEvent>>,
    pub failures: Mutex<VecDeque<u16>>,
    /// Statuses to answer the next list requests (GETs that do not watch) with.
    pub list_failures: Mutex<VecDeque<u16>>,
    pub stalled: watch::Sender<bool>,
    pub watch_epoch: watch::Sender<u64>,
    pub requests: Mutex<Vec<String>>,
    /// Resources answered with an error status instead of being served.
    pub refused: Refusals,
    /// Resources whose list pages after the first are answered with an error status.
    pub refused_later_pages: Refusals,
    pub bookmark_interval: Duration,
}

/// The status codes some resources are answered with instead of being served.
#[derive(Default)]
pub(crate) struct Refusals(Mutex<Vec<(Resource, u16)>>);

impl Refusals {
    /// `resource` is answered with `code` from now on, or (`None`) served again.
    fn set(&self, resource: Resource, code: Option<u16>) {
        let mut refused = self.0.lock().unwrap_or_else(|p| p.into_inner());
        refused.retain(|(r, _)| *r != resource);
        refused.extend(code.map(|code| (resource, code)));
    }

    /// The code `resource` is answered with, if it is refused.
    pub(crate) fn code(&self, resource: Resource) -> Option<u16> {
        let refused = self.0.lock().unwrap_or_else(|p| p.into_inner());
        refused
            .iter()
            .find(|(r, _)| *r == resource)
            .map(|(_, code)| *code)
    }
}

impl Shared {
    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.store
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Writes under the store's lock and publishes the event in the same order as the history.
    pub fn write(
        &self,
        resource: Resource,
        object: Value,
        must_exist: bool,
        may_exist: bool,
    ) -> Result<Value, WriteError> {
        let mut store = self.store();
        let (object, event) = store.write(resource, object, must_exist, may_exist)?;
        let _ = self.events.send(event);
        Ok(object)
    }

    /// Deletes under the store's lock and publishes the event.
    pub fn delete(&self, resource: Resource, key: &store::ObjectKey) -> Result<Value, WriteError> {
        let mut store = self.store();
        let (object, event) = store.delete(resource, key)?;
        let _ = self.events.send(event);
        Ok(object)
    }
}

/// A running server and the handle tests steer it with.
pub struct ApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    listener: Mutex<Option<JoinHandle<()>>>,
}

/// Options for [`ApiServer::start_with`].
#[derive(Clone, Debug)]
pub struct Options {
    /// The address to listen on (port 0 picks one).
    pub addr: SocketAddr,
    /// Events kept for resuming watches.
    pub history: usize,
    /// How often watches that allow bookmarks get one.
    pub bookmark_interval: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            history: DEFAULT_HISTORY,
            bookmark_interval: Duration::from_secs(1),
        }
    }
}

impl ApiServer {
    /// Starts a server on a free loopback port.
    pub async fn start() -> io::Result<ApiServer> {
        Self::start_with(Options::default()).await
    }

    /// Starts a server on a listener bound elsewhere (in another network namespace, say).
    pub async fn start_on(
        listener: std::net::TcpListener,
        options: Options,
    ) -> io::Result<ApiServer> {
        listener.set_nonblocking(true)?;
        Self::start_listening(TcpListener::from_std(listener)?, options)
    }

    /// Starts a server with the given options.
    pub async fn start_with(options: Options) -> io::Result<ApiServer> {
        Self::start_listening(bind(options.addr)?, options)
    }

    fn start_listening(listener: TcpListener, options: Options) -> io::Result<ApiServer> {
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::new(options.history)),
            events: broadcast::channel(4096).0,
            failures: Mutex::new(VecDeque::new()),
            list_failures: Mutex::new(VecDeque::new()),
            stalled: watch::channel(false).0,
            watch_epoch: watch::channel(0).0,
            requests: Mutex::new(Vec::new()),
            refused: Refusals::default(),
            refused_later_pages: Refusals::default(),
            bookmark_interval: options.bookmark_interval,
        });
        let addr = listener.local_addr()?;
        let server = ApiServer {
            shared,
            addr,
            listener: Mutex::new(None),
        };
        server.serve(listener);
        Ok(server)
    }

    fn serve(&self, listener: TcpListener) {
        let shared = self.shared.clone();
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        connections.spawn(http::serve_connection(shared.clone(), stream));
                    }
                    Some(_) = connections.join_next() => {}
                }
            }
        });
        *self.listener.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
    }

    /// The server's base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A kubeconfig that points kube-rs (or kubectl) at this server.
    pub fn kubeconfig_yaml(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n\
             users:\n- name: test\n  user: {{}}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n\
             current-context: test\n",
            self.url()
        )
    }

    /// Creates or replaces an object; its `kind` says which resource. Returns the stored object.
    pub fn apply(&self, object: Value) -> Result<Value, WriteError> {
        let resource = resource_of(&object)?;
        self.shared.write(resource, object, false, true)
    }

    /// Deletes an object.
    pub fn delete(
        &self,
        resource: Resource,
        namespace: &str,
        name: &str,
    ) -> Result<Value, WriteError> {
        self.shared
            .delete(resource, &(namespace.to_string(), name.to_string()))
    }

    /// Reads an object.
    pub fn get(&self, resource: Resource, namespace: &str, name: &str) -> Option<Value> {
        self.shared
            .store()
            .get(resource, &(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// Every object of a resource.
    pub fn list(&self, resource: Resource) -> Vec<Value> {
        self.shared
            .store()
            .list(resource)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// The current resource version.
    pub fn resource_version(&self) -> u64 {
        self.shared.store().resource_version
    }

    /// Ends every open watch stream, as a load balancer or API server restart would.
    pub fn close_watches(&self) {
        self.shared.watch_epoch.send_modify(|epoch| *epoch += 1);
    }

    /// Answers the next `count` requests with `status` (500, 429, ...).
    pub fn fail_next(&self, count: usize, status: u16) {
        let mut failures = self
            .shared
            .failures
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        failures.extend(std::iter::repeat_n(status, count));
    }

    /// Answers the next `count` list requests (not watches) with `status`.
    pub fn fail_next_lists(&self, count: usize, status: u16) {
        let mut failures = self
            .shared
            .list_failures
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        failures.extend(std::iter::repeat_n(status, count));
    }

    /// Answers every request for `resource` with `code` from now on, or (`None`) serves it
    /// again. 404 comes with the plain-text body a real server gives for a path it has no route
    /// for (a resource of a later release, a disabled API group); 403 with RBAC's Status for a
    /// ServiceAccount without the rule; any other code with an InternalError Status.
    pub fn refuse(&self, resource: Resource, code: Option<u16>) {
        self.shared.refused.set(resource, code);
    }

    /// Answers every list request for `resource` that continues a paginated list (one with a
    /// `continue` token) with `code` from now on, or (`None`) serves them again: a list of
    /// more than one page then never completes.
    pub fn refuse_later_pages(&self, resource: Resource, code: Option<u16>) {
        self.shared.refused_later_pages.set(resource, code);
    }

    /// While stalled, requests hang without an answer.
    pub fn set_stalled(&self, stalled: bool) {
        self.shared.stalled.send_replace(stalled);
    }

    /// Forgets the event history: watches resuming from an older version get 410 Gone.
    pub fn compact(&self) {
        self.shared.store().compact();
    }

    /// Stops listening and drops every connection and watch; the objects stay.
    pub async fn stop(&self) {
        let task = self
            .listener
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
        self.close_watches();
    }

    /// Listens again on the same address after [`ApiServer::stop`].
    pub async fn resume(&self) -> io::Result<()> {
        let listener = bind(self.addr)?;
        self.serve(listener);
        Ok(())
    }

    /// Stops, forgets the history (a restarted API server's watch cache starts empty), and listens again.
    pub async fn restart(&self) -> io::Result<()> {
        self.stop().await;
        self.compact();
        self.resume().await
    }

    /// Every request seen so far, as `METHOD path?query`.
    pub fn requests(&self) -> Vec<String> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Some(task) = self
            .listener
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            task.abort();
        }
        self.close_watches();
    }
}

fn resource_of(object: &Value) -> Result<Resource, WriteError> {
    let kind = object["kind"].as_str().unwrap_or_default();
    Resource::from_kind(kind)
        .ok_or_else(|| WriteError::Invalid(format!("kind {kind:?} is not served")))
}

fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(128)
}
