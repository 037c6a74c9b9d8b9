//! `--dry-run`'s proxier: it programs nothing and logs what it would program, every service
//! port with the endpoints it would use on this node, for the services that changed.

use tracing::info;

use super::{Proxier, SyncError, SyncReport};
use crate::config::ProxyMode;
use crate::model::{ChangeSummary, NamespacedName, NodeContext, ProxyState, select_endpoints};

/// Logs the services and endpoints a sync in `mode` would program.
#[derive(Debug)]
pub struct DryRunProxier {
    mode: ProxyMode,
    synced_once: bool,
}

impl DryRunProxier {
    pub fn new(mode: ProxyMode) -> Self {
        DryRunProxier {
            mode,
            synced_once: false,
        }
    }

    fn log_service(&self, state: &ProxyState, name: &NamespacedName) -> usize {
        let node = NodeContext {
            node_name: &state.node.name,
            zone: state.node.zone(),
        };
        let Some(ports) = state.services.get(name) else {
            info!(service = %name, "Service removed; would delete its rules");
            return 0;
        };
        let no_endpoints = Default::default();
        let endpoints = state.endpoints.get(name).unwrap_or(&no_endpoints);
        for port in ports.values() {
            let all = endpoints
                .get(&port.name)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let selected = select_endpoints(port, all, node);
            let shown: Vec<String> = selected
                .all_reachable
                .iter()
                .map(|ep| ep.address())
                .collect();
            let ips: Vec<String> = port.cluster_ips.iter().map(ToString::to_string).collect();
            info!(
                service_port = %port.name,
                protocol = %port.name.protocol,
                cluster_ips = %ips.join(","),
                port = port.port,
                node_port = port.node_port.unwrap_or(0),
                endpoints = %shown.join(","),
                "Would program service port"
            );
        }
        ports.len()
    }
}

impl Proxier for DryRunProxier {
    fn mode(&self) -> ProxyMode {
        self.mode
    }

    fn sync(
        &mut self,
        state: &ProxyState,
        changes: &ChangeSummary,
    ) -> Result<SyncReport, SyncError> {
        {
            let full = !self.synced_once || changes.node_changed;
            let names: Vec<&NamespacedName> = if full {
                state.services.keys().collect()
            } else {
                changes.changed_services.iter().collect()
            };
            for name in &names {
                self.log_service(state, name);
            }
            self.synced_once = true;
            Ok(SyncReport {
                full,
                service_ports: state.services.values().map(|ports| ports.len()).sum(),
                services_written: names.len(),
                ..SyncReport::default()
            })
        }
    }
}
