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
use std::sync::{Arc, Mutex};

use prometheus::{IntCounterVec, IntGaugeVec};
use tokio::sync::watch;
use tracing::{debug, error, info};

use super::http::{ConnectionNames, ConnectionTable, listen};
use crate::model::{IpFamily, NamespacedName, ProxyState};
use balancer::{Balancer, locked};
pub use targets::{Target, targets_of};

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

/// How many connections the proxy relays at once, given the HTTP servers' share of the
/// open-files limit: half as many (each holds two files), at most [`MOST_RELAYS`].
pub fn relay_capacity(http_capacity: usize) -> usize {
    (http_capacity / 2).clamp(1, MOST_RELAYS)
}

/// Upstream's listener metrics (labelled by family).
#[derive(Clone)]
pub struct ListenerMetrics {
    /// `kubeproxy_nftables_localhost_nodeport_listeners`.
    pub listeners: IntGaugeVec,
    /// `kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total`.
    pub creation_failures: IntCounterVec,
}

struct Listener {
    service: NamespacedName,
    balancer: Arc<Mutex<Balancer>>,
    /// Closes the listener and its connections when set (or dropped).
    stop: watch::Sender<bool>,
}

/// The listeners, opened and closed as NodePorts come and go.
pub struct LocalhostNodePorts {
    families: Vec<IpFamily>,
    listeners: BTreeMap<SocketAddr, Listener>,
    /// The addresses each service's ports hold.
    held: BTreeMap<NamespacedName, Vec<SocketAddr>>,
    connections: ConnectionTable,
    metrics: ListenerMetrics,
}

impl LocalhostNodePorts {
    pub fn new(
        families: Vec<IpFamily>,
        connections: ConnectionTable,
        metrics: ListenerMetrics,
    ) -> Self {
        LocalhostNodePorts {
            families,
            listeners: BTreeMap::new(),
            held: BTreeMap::new(),
            connections,
            metrics,
        }
    }

    /// The families served.
    pub fn families(&self) -> &[IpFamily] {
        &self.families
    }

    /// The addresses listened on now.
    pub fn addresses(&self) -> Vec<SocketAddr> {
        self.listeners.keys().copied().collect()
    }

    /// Brings the listeners in line with `state` for the services in `changed`, or for every
    /// service when it is `None`. Must run inside the tokio runtime.
    pub fn sync(&mut self, state: &ProxyState, changed: Option<&BTreeSet<NamespacedName>>) {
        let services: Vec<NamespacedName> = match changed {
            Some(changed) => changed.iter().cloned().collect(),
            None => self
                .held
                .keys()
                .chain(state.services.keys())
                .cloned()
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
        };
        for service in services {
            let targets = targets_of(&service, state, &self.families);
            self.sync_service(&service, targets);
        }
        for family in [IpFamily::V4, IpFamily::V6] {
            let count = self
                .listeners
                .keys()
                .filter(|a| IpFamily::of(&a.ip()) == family)
                .count();
            if self.families.contains(&family) {
                self.metrics
                    .listeners
                    .with_label_values(&[family.name()])
                    .set(i64::try_from(count).unwrap_or(i64::MAX));
            }
        }
    }

    fn sync_service(&mut self, service: &NamespacedName, targets: Vec<(SocketAddr, Target)>) {
        let before = self.held.remove(service).unwrap_or_default();
        for address in &before {
            if !targets.iter().any(|(a, _)| a == address) {
                self.close(*address);
            }
        }
        let mut held = Vec::new();
        for (address, target) in targets {
            if let Some(listener) = self.listeners.get(&address) {
                if listener.service == *service {
                    locked(&listener.balancer).update(target);
                    held.push(address);
                } else {
                    // The API server allocates NodePorts uniquely; the kernel paths, too,
                    // serve such a port for one Service only, without a word.
                    debug!(%address, service = %service, holder = %listener.service, "NodePort already served on localhost for another Service; skipped");
                }
                continue;
            }
            if self.open(address, service, target) {
                held.push(address);
            }
        }
        if !held.is_empty() {
            self.held.insert(service.clone(), held);
        }
    }

    fn open(&mut self, address: SocketAddr, service: &NamespacedName, target: Target) -> bool {
        let family = IpFamily::of(&address.ip());
        let listener = match listen(address) {
            Ok(listener) => listener,
            Err(err) => {
                error!(%address, service_port = %target.port, error = %err, "Failed to create localhost nodeport proxy");
                self.metrics
                    .creation_failures
                    .with_label_values(&[family.name()])
                    .inc();
                return false;
            }
        };
        debug!(%address, service_port = %target.port, "Created localhost nodeport proxy");
        let balancer = Arc::new(Mutex::new(Balancer::new(target)));
        let (stop, stopped) = watch::channel(false);
        relay::serve(
            listener,
            balancer.clone(),
            self.connections.clone(),
            stopped,
        );
        self.listeners.insert(
            address,
            Listener {
                service: service.clone(),
                balancer,
                stop,
            },
        );
        true
    }

    fn close(&mut self, address: SocketAddr) {
        if let Some(listener) = self.listeners.remove(&address) {
            let _ = listener.stop.send(true);
            // Both families' listeners of a port count under one label.
            if !self.listeners.keys().any(|a| a.port() == address.port()) {
                self.connections.forget(relay::SERVER, address.port());
            }
            debug!(%address, service = %listener.service, "Removing localhost nodeport proxy");
        }
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
