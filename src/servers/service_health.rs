//! One HTTP server per Service with externalTrafficPolicy Local, on its healthCheckNodePort: load
//! balancers ask it whether this node has endpoints for the service (200) or not (503).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hyper::StatusCode;
use tracing::{error, info};

use super::http::{ConnectionTable, Reply, listen, serve_until};
use crate::model::{NamespacedName, ProxyState};

struct Server {
    service: NamespacedName,
    local_endpoints: Arc<AtomicUsize>,
    stop: tokio::sync::watch::Sender<bool>,
}

/// The servers, opened and closed as services come and go.
pub struct ServiceHealthServers {
    /// Addresses to listen on (nodePortAddresses); 0.0.0.0 when empty.
    addresses: Vec<IpAddr>,
    servers: BTreeMap<u16, Server>,
    /// The connections of every HTTP server of the process.
    connections: ConnectionTable,
}

/// The servers' name in the connection metrics.
const SERVER: &str = "healthcheck";

/// For each health-check port, the service and how many of its endpoints are ready on `node`.
pub fn wanted(state: &ProxyState, node: &str) -> BTreeMap<u16, (NamespacedName, usize)> {
    let mut wanted = BTreeMap::new();
    for (key, ports) in &state.services {
        for port in ports.values() {
            let Some(health_port) = port.health_check_node_port else {
                continue;
            };
            let local = state
                .endpoints
                .get(key)
                .and_then(|by_port| by_port.get(&port.name))
                .map(|endpoints| {
                    endpoints
                        .iter()
                        .filter(|ep| ep.ready && ep.is_local(node))
                        .count()
                })
                .unwrap_or(0);
            wanted.insert(health_port, (key.clone(), local));
        }
    }
    wanted
}

fn reply(service: &NamespacedName, local: usize) -> Reply {
    let body = serde_json::json!({
        "service": {"namespace": service.namespace, "name": service.name},
        "localEndpoints": local,
        "serviceProxyHealthy": true,
    });
    let status = if local > 0 {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    Reply::json(status, body.to_string())
}

impl ServiceHealthServers {
    pub fn new(addresses: Vec<IpAddr>, connections: ConnectionTable) -> Self {
        ServiceHealthServers {
            addresses,
            servers: BTreeMap::new(),
            connections,
        }
    }

    /// Sets the addresses new servers listen on; open servers keep theirs.
    pub fn set_addresses(&mut self, addresses: Vec<IpAddr>) {
        self.addresses = addresses;
    }

    /// The ports served now.
    pub fn ports(&self) -> Vec<u16> {
        self.servers.keys().copied().collect()
    }

    /// Opens servers for new ports, closes those no longer wanted, updates endpoint counts.
    /// Must run inside the tokio runtime.
    pub fn sync(&mut self, wanted: BTreeMap<u16, (NamespacedName, usize)>) {
        let connections = &self.connections;
        self.servers.retain(|port, server| {
            let keep = wanted
                .get(port)
                .is_some_and(|(service, _)| *service == server.service);
            if !keep {
                let _ = server.stop.send(true);
                connections.forget(SERVER, *port);
                info!(port = *port, service = %server.service, "Closed health check server");
            }
            keep
        });
        for (port, (service, local)) in wanted {
            if let Some(server) = self.servers.get(&port) {
                server.local_endpoints.store(local, Ordering::Relaxed);
                continue;
            }
            let local_endpoints = Arc::new(AtomicUsize::new(local));
            let (stop, stopped) = tokio::sync::watch::channel(false);
            let addresses = if self.addresses.is_empty() {
                vec![IpAddr::from([0, 0, 0, 0])]
            } else {
                self.addresses.clone()
            };
            let mut listening = false;
            for ip in addresses {
                let address = SocketAddr::new(ip, port);
                match listen(address) {
                    Ok(listener) => {
                        let (counter, name) = (local_endpoints.clone(), service.clone());
                        // Stops when told, or when the server's entry (the sender) goes.
                        let mut stopped = stopped.clone();
                        let stop = async move {
                            let _ = stopped.wait_for(|stop| *stop).await;
                        };
                        serve_until(listener, &self.connections, SERVER, stop, move |_| {
                            reply(&name, counter.load(Ordering::Relaxed))
                        });
                        listening = true;
                    }
                    Err(err) => {
                        error!(%address, service = %service, error = %err, "Failed to start health check server")
                    }
                }
            }
            if listening {
                info!(port, service = %service, "Opened health check server");
                self.servers.insert(
                    port,
                    Server {
                        service,
                        local_endpoints,
                        stop,
                    },
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_say_how_many_local_endpoints() {
        let service = NamespacedName::new("ns", "web");
        let ok = reply(&service, 2);
        assert_eq!(ok.status, StatusCode::OK);
        let body: serde_json::Value = serde_json::from_str(&ok.body).unwrap();
        assert_eq!(body["service"]["namespace"], "ns");
        assert_eq!(body["service"]["name"], "web");
        assert_eq!(body["localEndpoints"], 2);
        assert_eq!(reply(&service, 0).status, StatusCode::SERVICE_UNAVAILABLE);
    }
}
