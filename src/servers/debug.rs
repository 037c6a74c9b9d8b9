//! The metrics server's debug endpoint, read-only and on the metrics address only (loopback by
//! default): what the daemon wants programmed for one Service (its last sync with the changes
//! that wait for the next), the endpoints it picks for each port and policy, and whether the
//! Service has changes waiting; and where the localhost NodePort proxy relays each listener's
//! connections. `kube-proxy-rs explain` compares it with what the kernel holds.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};

use hyper::StatusCode;

use super::{Relays, Reply};
use crate::model::{
    ChangeTracker, IpFamily, NamespacedName, NodeContext, ProxyState, ZONE_LABEL, ports_in_family,
    select_endpoints,
};
use crate::proxier::explanation::{
    Flow, NamedDestination, NamedRelay, Wanted, WantedPort, policy_name, port_of_flow,
};

/// Where it answers: `/debug/kube-proxy-rs/services/<namespace>/<name>`.
pub const SERVICES_PATH: &str = "/debug/kube-proxy-rs/services/";

/// Where it names the Service port of a destination:
/// `/debug/kube-proxy-rs/destinations/<protocol>/<address>/<port>[/node]` (`node`: the address
/// is one NodePorts answer on), for modes whose kernel objects carry no Service names (IPVS).
pub const DESTINATIONS_PATH: &str = "/debug/kube-proxy-rs/destinations/";

/// Where it says where a localhost NodePort listener relays to:
/// `/debug/kube-proxy-rs/localhost-node-ports/<address>/<port>`.
pub const RELAYS_PATH: &str = "/debug/kube-proxy-rs/localhost-node-ports/";

/// The part of `path` after [`SERVICES_PATH`] (empty for every Service), if it is one of ours.
fn services_route(path: &str) -> Option<&str> {
    path.strip_prefix(SERVICES_PATH)
        .or_else(|| (path == SERVICES_PATH.trim_end_matches('/')).then_some(""))
}

/// What the endpoint reads: the sync loop's state and the changes waiting for a sync.
pub struct DebugView {
    state: Arc<RwLock<ProxyState>>,
    tracker: Arc<Mutex<ChangeTracker>>,
    node_name: String,
    /// The localhost NodePort proxy's families and listeners.
    relays: Relays,
}

impl DebugView {
    pub fn new(
        state: Arc<RwLock<ProxyState>>,
        tracker: Arc<Mutex<ChangeTracker>>,
        node_name: String,
        relays: Relays,
    ) -> Self {
        DebugView {
            state,
            tracker,
            node_name,
            relays,
        }
    }

    /// The answer for `path`, if it is one of the endpoint's.
    pub fn route(&self, path: &str) -> Option<Reply> {
        if let Some(rest) = services_route(path) {
            return Some(self.reply(rest));
        }
        if let Some(rest) = path.strip_prefix(DESTINATIONS_PATH) {
            return Some(self.destination(rest));
        }
        path.strip_prefix(RELAYS_PATH).map(|rest| self.relay(rest))
    }

    /// The answer for `rest`, the path after [`SERVICES_PATH`]: `<namespace>/<name>` for one
    /// Service, empty for every Service (`explain --all`).
    fn reply(&self, rest: &str) -> Reply {
        let body = if rest.is_empty() {
            serde_json::to_string(&self.all())
        } else {
            let Some((namespace, name)) =
                rest.split_once('/').filter(|(_, name)| !name.contains('/'))
            else {
                return Reply::not_found();
            };
            let Some(wanted) = self.one(&NamespacedName::new(namespace, name)) else {
                return Reply::not_found();
            };
            serde_json::to_string(&wanted)
        };
        match body {
            Ok(body) => Reply::json(StatusCode::OK, body),
            Err(_) => Reply::not_found(),
        }
    }

    /// The answer for `rest`, the path after [`DESTINATIONS_PATH`]: the Service port a flow
    /// to that destination is bound for, with what the daemon wants for its Service.
    fn destination(&self, rest: &str) -> Reply {
        let parts: Vec<&str> = rest.split('/').collect();
        let (protocol, address, port, node) = match parts.as_slice() {
            [protocol, address, port] => (*protocol, *address, *port, false),
            [protocol, address, port, "node"] => (*protocol, *address, *port, true),
            _ => return Reply::not_found(),
        };
        let Ok(flow) = Flow::parse(&format!("{}/{protocol}", join(address, port)), None) else {
            return Reply::not_found();
        };
        let proxied = self.relays.families();
        let tracker = lock(&self.tracker);
        let state = read(&self.state);
        // Only the Services with a port of that number are looked at closely.
        let named = state
            .services
            .iter()
            .filter(|(_, ports)| {
                ports.values().any(|p| {
                    p.name.protocol == flow.protocol
                        && (p.port == flow.destination.port()
                            || p.node_port == Some(flow.destination.port()))
                })
            })
            .filter_map(|(service, _)| {
                wanted_of(service, &tracker, &state, &self.node_name, &proxied)
            })
            .find_map(|wanted| {
                let (service_port, policy) =
                    port_of_flow(std::slice::from_ref(&wanted), &flow, node)?;
                Some(NamedDestination {
                    service_port,
                    policy: policy.into(),
                    wanted,
                })
            });
        match named.map(|named| serde_json::to_string(&named)) {
            Some(Ok(body)) => Reply::json(StatusCode::OK, body),
            _ => Reply::not_found(),
        }
    }

    /// The answer for `rest`, the path after [`RELAYS_PATH`] (`<address>/<port>`): the service
    /// port the listener there relays, the policy of that traffic, the endpoints it relays to,
    /// and what the daemon wants for the Service.
    fn relay(&self, rest: &str) -> Reply {
        let Some((address, port)) = rest.split_once('/') else {
            return Reply::not_found();
        };
        let Ok(address) = join(address, port).parse::<SocketAddr>() else {
            return Reply::not_found();
        };
        let Some((port, endpoints)) = self.relays.of(address) else {
            return Reply::not_found();
        };
        // A Service whose deletion waits for a sync still has its listener.
        let wanted = self.one(&port.service).unwrap_or_else(|| Wanted {
            service: port.service.to_string(),
            pending_changes: true,
            ports: Vec::new(),
        });
        let family = IpFamily::of(&address.ip()).name();
        let external_local = wanted
            .ports
            .iter()
            .find(|p| {
                p.name == port.port && p.protocol == port.protocol.lower() && p.family == family
            })
            .is_some_and(|p| p.external_local);
        let named = NamedRelay {
            service_port: format!("{}:{}", port.service, port.port),
            policy: policy_name(external_local).into(),
            endpoints,
            wanted,
        };
        match serde_json::to_string(&named) {
            Ok(body) => Reply::json(StatusCode::OK, body),
            Err(_) => Reply::json(StatusCode::INTERNAL_SERVER_ERROR, "{}".into()),
        }
    }

    fn one(&self, service: &NamespacedName) -> Option<Wanted> {
        let proxied = self.relays.families();
        let tracker = lock(&self.tracker);
        let state = read(&self.state);
        wanted_of(service, &tracker, &state, &self.node_name, &proxied)
    }

    /// Every Service the daemon has synced.
    fn all(&self) -> Vec<Wanted> {
        let proxied = self.relays.families();
        let tracker = lock(&self.tracker);
        let state = read(&self.state);
        state
            .services
            .keys()
            .filter_map(|service| wanted_of(service, &tracker, &state, &self.node_name, &proxied))
            .collect()
    }
}

/// `address:port`, with brackets for IPv6.
fn join(address: &str, port: &str) -> String {
    if address.contains(':') {
        format!("[{address}]:{port}")
    } else {
        format!("{address}:{port}")
    }
}

fn lock(tracker: &Mutex<ChangeTracker>) -> std::sync::MutexGuard<'_, ChangeTracker> {
    tracker
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn read(state: &RwLock<ProxyState>) -> std::sync::RwLockReadGuard<'_, ProxyState> {
    state
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What the daemon wants for `service` (its last sync, with the changes waiting for the next
/// one), or `None` when it knows no such Service; `proxied` are the families whose loopback
/// NodePorts the localhost proxy serves.
fn wanted_of(
    service: &NamespacedName,
    tracker: &ChangeTracker,
    state: &ProxyState,
    node_name: &str,
    proxied: &[IpFamily],
) -> Option<Wanted> {
    let (ports_change, endpoints_change) = tracker.pending_for(service);
    let pending_changes = ports_change.is_some() || endpoints_change.is_some();
    let ports = match ports_change {
        Some(change) => change.current.as_ref()?,
        None => state.services.get(service)?,
    };
    let endpoints = match endpoints_change {
        Some(change) => change.current.as_ref(),
        None => state.endpoints.get(service),
    };
    let node = NodeContext {
        node_name,
        zone: state.node.labels.get(ZONE_LABEL).map(String::as_str),
    };
    let addresses = |chosen: &[&crate::model::Endpoint]| -> Vec<SocketAddr> {
        chosen
            .iter()
            .map(|ep| SocketAddr::new(ep.ip, ep.port))
            .collect()
    };
    let mut wanted_ports = Vec::new();
    for family in [IpFamily::V4, IpFamily::V6] {
        for (port, endpoints) in ports_in_family(ports, endpoints, family) {
            let selected = select_endpoints(&port, &endpoints, node);
            wanted_ports.push(WantedPort {
                name: port.name.port.clone(),
                protocol: port.name.protocol.lower().into(),
                family: family.name().into(),
                cluster_ip: port.cluster_ips.first().copied(),
                port: port.port,
                cluster: addresses(&selected.cluster),
                local: addresses(&selected.local),
                node_port: port.node_port,
                external_ips: port
                    .external_ips
                    .iter()
                    .chain(&port.load_balancer_ips)
                    .copied()
                    .collect(),
                internal_local: port.internal_policy_local,
                external_local: port.external_policy_local,
                localhost_proxy: proxied.contains(&family) && port.tcp_node_port().is_some(),
            });
        }
    }
    Some(Wanted {
        service: service.to_string(),
        pending_changes,
        ports: wanted_ports,
    })
}
