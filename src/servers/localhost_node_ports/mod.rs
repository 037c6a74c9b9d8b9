//! Localhost NodePorts through a userspace TCP proxy (KEP-6032, gate
//! `KubeProxyNFTablesLocalhostNodePorts`): a listener on 127.0.0.1 and ::1 per TCP NodePort
//! with an endpoint, relaying each connection to an endpoint chosen as the kernel path chooses.
//! The kernel then needs no `route_localnet`. Listeners are reconciled after every successful
//! sync, for the services the sync changed (every service after a full one). Upstream runs it
//! in nftables mode only; we run it in every mode.

mod balancer;
mod relay;
mod targets;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};

use prometheus::{IntCounterVec, IntGaugeVec};
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use super::http::{ConnectionNames, ConnectionTable, listen};
use crate::model::{IpFamily, NamespacedName, ProxyState, ServicePortName};
use balancer::{Balancer, locked};
use targets::{Target, targets_of};

/// The relayed connections' metrics, apart from the HTTP servers'.
pub const CONNECTION_NAMES: ConnectionNames = ConnectionNames {
    open: (
        "kubeproxy_rs_localhost_nodeport_connections_open",
        "Connections the localhost NodePort proxy of kube-proxy-rs relays now",
    ),
    shed: (
        "kubeproxy_rs_localhost_nodeport_connections_shed_total",
        "Relayed localhost NodePort connections closed to make room for a new one, the longest without traffic first",
    ),
    timed_out: (
        "kubeproxy_rs_localhost_nodeport_connections_timed_out_total",
        "Localhost NodePort connections closed because their endpoint did not accept them within 5 seconds",
    ),
    limit: (
        "kubeproxy_rs_localhost_nodeport_connections_limit",
        "Connections the localhost NodePort proxy of kube-proxy-rs relays at most, together",
    ),
};

/// Connections relayed at once whatever the open-files limit: with their copy buffers, 128 MB
/// at most.
const MOST_RELAYS: usize = 2048;

/// How many connections the proxy relays at once, given the files left for connections under
/// the open-files limit: half of them, at two files a connection; at most [`MOST_RELAYS`].
/// (Its listeners take a file each besides: one per TCP NodePort and family.)
pub fn relay_capacity(spare_files: usize) -> usize {
    (spare_files / 4).clamp(1, MOST_RELAYS)
}

/// Upstream's listener metrics (labelled by family).
#[derive(Clone)]
pub struct ListenerMetrics {
    /// `kubeproxy_nftables_localhost_nodeport_listeners`.
    pub listeners: IntGaugeVec,
    /// `kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total`.
    pub creation_failures: IntCounterVec,
}

/// The families the proxy serves and each listener's balancer by the address it listens on,
/// shared with the debug endpoint (`explain` asks where a localhost NodePort's connections go).
#[derive(Clone)]
pub struct Relays {
    listeners: Arc<RwLock<BTreeMap<SocketAddr, Arc<Mutex<Balancer>>>>>,
    families: Arc<RwLock<Vec<IpFamily>>>,
}

impl Relays {
    /// Relays for a proxy that serves `families`.
    pub fn new(families: Vec<IpFamily>) -> Relays {
        Relays {
            listeners: Arc::default(),
            families: Arc::new(RwLock::new(families)),
        }
    }

    /// The families whose loopback NodePorts the proxy serves now.
    pub fn families(&self) -> Vec<IpFamily> {
        self.families
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn stop_serving(&self, family: IpFamily) {
        let mut families = self.families.write().unwrap_or_else(|p| p.into_inner());
        families.retain(|f| *f != family);
    }

    /// The service port whose connections the listener on `address` relays, and the endpoints
    /// it relays them to.
    pub fn of(&self, address: SocketAddr) -> Option<(ServicePortName, Vec<SocketAddr>)> {
        let relays = self.listeners.read().unwrap_or_else(|p| p.into_inner());
        let balancer = locked(relays.get(&address)?);
        let target = balancer.target();
        Some((target.port.clone(), target.endpoints.clone()))
    }

    fn insert(&self, address: SocketAddr, balancer: Arc<Mutex<Balancer>>) {
        let mut relays = self.listeners.write().unwrap_or_else(|p| p.into_inner());
        relays.insert(address, balancer);
    }

    fn remove(&self, address: SocketAddr) {
        let mut relays = self.listeners.write().unwrap_or_else(|p| p.into_inner());
        relays.remove(&address);
    }
}

struct Listener {
    service: NamespacedName,
    balancer: Arc<Mutex<Balancer>>,
    /// Closes the listener when set (or dropped); the connections it took run on.
    stop: watch::Sender<bool>,
}

/// The listeners, opened and closed as NodePorts come and go.
pub struct LocalhostNodePorts {
    listeners: BTreeMap<SocketAddr, Listener>,
    /// The addresses each service's ports hold.
    held: BTreeMap<NamespacedName, Vec<SocketAddr>>,
    /// Services with a port that could not be listened on: tried again at every sync.
    retry: BTreeSet<NamespacedName>,
    /// Addresses whose failure was logged as an error; a repeat is logged at debug level.
    failing: BTreeSet<SocketAddr>,
    /// Listeners open, IPv4's and IPv6's.
    open: [usize; 2],
    connections: ConnectionTable,
    metrics: ListenerMetrics,
    relays: Relays,
}

impl LocalhostNodePorts {
    /// A proxy for the families `relays` serves.
    pub fn new(connections: ConnectionTable, metrics: ListenerMetrics, relays: Relays) -> Self {
        LocalhostNodePorts {
            listeners: BTreeMap::new(),
            held: BTreeMap::new(),
            retry: BTreeSet::new(),
            failing: BTreeSet::new(),
            open: [0, 0],
            connections,
            metrics,
            relays,
        }
    }

    /// The addresses listened on now.
    pub fn addresses(&self) -> Vec<SocketAddr> {
        self.listeners.keys().copied().collect()
    }

    /// Brings the listeners in line with `state` for the services in `changed` and those whose
    /// ports could not be listened on before, or for every service when `changed` is `None`.
    /// Must run inside the tokio runtime.
    pub fn sync(&mut self, state: &ProxyState, changed: Option<&BTreeSet<NamespacedName>>) {
        let mut services = std::mem::take(&mut self.retry);
        match changed {
            Some(changed) => services.extend(changed.iter().cloned()),
            None => services.extend(self.held.keys().chain(state.services.keys()).cloned()),
        }
        // The node's families only: another family's endpoints are out of its reach.
        let node_families = state.node.families();
        let served = self.relays.families();
        let families: Vec<IpFamily> = served
            .iter()
            .copied()
            .filter(|f| node_families.contains(f))
            .collect();
        // Every address these services want, the first claimant's when two claim one.
        let mut wanted: BTreeMap<SocketAddr, (NamespacedName, Target)> = BTreeMap::new();
        for service in &services {
            for (address, target) in targets_of(service, state, &families) {
                wanted
                    .entry(address)
                    .or_insert_with(|| (service.clone(), target));
            }
        }
        // Addresses these services no longer want close; one another of them now wants moves
        // to it on the same socket (closing and listening again could find it still bound).
        for service in &services {
            for address in self.held.remove(service).unwrap_or_default() {
                match wanted.get(&address) {
                    Some((owner, _)) => {
                        if let Some(listener) = self.listeners.get_mut(&address) {
                            listener.service = owner.clone();
                        }
                    }
                    None => self.close(address),
                }
            }
        }
        for (address, (service, target)) in wanted {
            if self.serve(address, &service, target) {
                self.held.entry(service).or_default().push(address);
            } else {
                self.retry.insert(service);
            }
        }
        for family in &served {
            let open = self.open[family_index(*family)];
            self.metrics
                .listeners
                .with_label_values(&[family.name()])
                .set(i64::try_from(open).unwrap_or(i64::MAX));
        }
    }

    /// Serves `address` for `service`: its listener takes the new endpoints, or one is opened.
    /// False when it could not be (the port is taken, by another Service or program).
    fn serve(&mut self, address: SocketAddr, service: &NamespacedName, target: Target) -> bool {
        if let Some(listener) = self.listeners.get(&address) {
            if listener.service == *service {
                locked(&listener.balancer).update(target);
                return true;
            }
            // The API server allocates NodePorts uniquely; the kernel paths, too, serve such
            // a port for one Service only.
            debug!(%address, service = %service, holder = %listener.service, "NodePort already served on localhost for another Service; skipped");
            return false;
        }
        self.open(address, service, target)
    }

    fn open(&mut self, address: SocketAddr, service: &NamespacedName, target: Target) -> bool {
        let family = IpFamily::of(&address.ip());
        let listener = match listen(address) {
            Ok(listener) => listener,
            Err(err) => {
                self.failed(address, &target, &err);
                return false;
            }
        };
        self.failing.remove(&address);
        debug!(%address, service_port = %target.port, "Created localhost nodeport proxy");
        let balancer = Arc::new(Mutex::new(Balancer::new(target)));
        let (stop, stopped) = watch::channel(false);
        relay::serve(
            listener,
            balancer.clone(),
            self.connections.clone(),
            stopped,
        );
        self.relays.insert(address, balancer.clone());
        self.listeners.insert(
            address,
            Listener {
                service: service.clone(),
                balancer,
                stop,
            },
        );
        self.open[family_index(family)] += 1;
        true
    }

    /// A listener could not be opened: counted, logged (as an error the first time), and the
    /// family dropped when it has no loopback address (IPv6 turned off on the node).
    fn failed(&mut self, address: SocketAddr, target: &Target, err: &std::io::Error) {
        let family = IpFamily::of(&address.ip());
        self.metrics
            .creation_failures
            .with_label_values(&[family.name()])
            .inc();
        if err.raw_os_error() == Some(nix::libc::EADDRNOTAVAIL) {
            warn!(%address, error = %err, "No loopback address to serve localhost NodePorts on; not serving them in this family");
            self.relays.stop_serving(family);
        } else if self.failing.insert(address) {
            error!(%address, service_port = %target.port, error = %err, "Failed to create localhost nodeport proxy");
        } else {
            debug!(%address, service_port = %target.port, error = %err, "Failed to create localhost nodeport proxy");
        }
    }

    /// Stops taking connections on `address`; those it took run on (as connections the
    /// kernel path forwarded do) until either side ends them.
    fn close(&mut self, address: SocketAddr) {
        self.failing.remove(&address);
        if let Some(listener) = self.listeners.remove(&address) {
            let _ = listener.stop.send(true);
            self.relays.remove(address);
            let family = IpFamily::of(&address.ip());
            self.open[family_index(family)] -= 1;
            // Both families' listeners of a port count under one label.
            let other = match family {
                IpFamily::V4 => IpFamily::V6,
                IpFamily::V6 => IpFamily::V4,
            };
            if !self
                .listeners
                .contains_key(&SocketAddr::new(other.loopback(), address.port()))
            {
                self.connections.forget(relay::SERVER, address.port());
            }
            debug!(%address, service = %listener.service, "Removing localhost nodeport proxy");
        }
    }
}

fn family_index(family: IpFamily) -> usize {
    match family {
        IpFamily::V4 => 0,
        IpFamily::V6 => 1,
    }
}

impl Drop for LocalhostNodePorts {
    fn drop(&mut self) {
        let addresses = self.addresses();
        for address in addresses {
            self.close(address);
        }
    }
}

/// Logs which families' localhost NodePorts the proxy serves.
pub fn log_families(families: &[IpFamily]) {
    let names: Vec<&str> = families.iter().map(|f| f.name()).collect();
    info!(families = ?names, "Serving localhost NodePorts through the userspace proxy; route_localnet is left alone");
}

#[cfg(test)]
mod tests;
