//! The sync loop: each sync takes the pending changes, applies them to the state and hands
//! both to the proxier; after a success it cleans stale UDP flows, reconciles the per-service
//! health-check servers and removes the other mode's leftovers.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::model::{ChangeSummary, ChangeTracker, ProxyState};
use crate::proxier::cleanup;
use crate::proxier::conntrack::UdpConntrackCleaner;
use crate::proxier::local::NodePortSelection;
use crate::proxier::profile::profile;
use crate::proxier::{Proxier, SyncError, SyncReport};
use crate::runner::Syncer;
use crate::servers::{
    LocalhostNodePorts, Metrics, ProxyHealth, ServiceHealthServers, health_check_ports,
};
use crate::sync_failures::{FailureLog, Verdict};
use crate::sys::conntrack::NetlinkConntrack;
use crate::sys::host::net::{LocalAddresses, SystemAddresses};

/// The UDP conntrack cleaner, on a ctnetlink socket in this namespace.
pub(super) fn open_conntrack() -> Option<UdpConntrackCleaner> {
    match NetlinkConntrack::open() {
        Ok(conntrack) => Some(UdpConntrackCleaner::new(Box::new(conntrack))),
        Err(err) => {
            warn!(error = %err, "Cannot open conntrack netlink; stale UDP flows will not be cleaned up");
            None
        }
    }
}

/// One sync: take the pending changes, apply them to the state, hand both to the proxier.
pub(super) struct SyncLoop {
    pub(super) tracker: Arc<Mutex<ChangeTracker>>,
    /// Shared with the metrics server's debug endpoint, which reads one Service of it.
    pub(super) state: SharedState,
    pub(super) proxier: Box<dyn Proxier>,
    pub(super) health: Arc<ProxyHealth>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) service_health: Option<ServiceHealthServers>,
    /// The localhost NodePort proxy, when it serves a family.
    pub(super) localhost_node_ports: Option<LocalhostNodePorts>,
    /// UDP conntrack cleanup; `None` in a dry run (or when ctnetlink cannot be opened).
    pub(super) conntrack: Option<UdpConntrackCleaner>,
    pub(super) node_port_addresses: NodePortSelection,
    pub(super) node_name: String,
    /// Whether the other mode's state has been removed (once, after the first successful sync).
    pub(super) leftovers_removed: bool,
    /// Failed syncs since the last successful one, for the log.
    pub(super) failures: FailureLog,
}

impl SyncLoop {
    /// After the first successful sync in this mode, removes what the other mode left behind:
    /// traffic is already served by the new rules when the old ones go.
    fn remove_other_mode(&mut self) {
        if self.leftovers_removed {
            return;
        }
        self.leftovers_removed = true;
        let mode = self.proxier.mode();
        info!(
            mode = mode.as_str(),
            "Removing the other proxy mode's leftovers"
        );
        let local = SystemAddresses.addresses();
        for other in profile(mode).leftovers {
            for family in cleanup::cleanup(*other, &local) {
                self.metrics.nftables_cleanup_failures(family);
            }
        }
    }

    /// Deletes the UDP flows a successful sync left pointing at endpoints that no longer serve.
    /// A failure is logged and does not fail the sync: the rules are right, and the cleaner
    /// checks every service next time.
    fn clean_udp_conntrack(&mut self, summary: &ChangeSummary, full: bool) {
        let Some(cleaner) = self.conntrack.as_mut() else {
            return;
        };
        let state = read(&self.state);
        match cleaner.after_sync(&state, summary, full, || SystemAddresses.addresses()) {
            Ok(report) => {
                for family in report {
                    self.metrics.conntrack_reconciled(
                        family.family,
                        family.elapsed,
                        family.deleted,
                    );
                    if family.deleted > 0 {
                        info!(
                            ip_family = family.family.name(),
                            entries = family.deleted,
                            "Deleted stale UDP conntrack entries"
                        );
                    }
                }
            }
            Err(err) => warn!(error = %err, "Failed to clean up stale UDP conntrack entries"),
        }
    }

    /// Opens and closes the per-service health-check servers after a successful sync.
    fn sync_service_health(&mut self) {
        if self.service_health.is_none() {
            return;
        }
        let state = read(&self.state);
        let wanted = health_check_ports(&state, &self.node_name);
        if wanted.is_empty()
            && self
                .service_health
                .as_ref()
                .is_some_and(|s| s.ports().is_empty())
        {
            return;
        }
        let node_ip = state.node.addresses.first().copied();
        drop(state);
        let addresses = self
            .node_port_addresses
            .select(node_ip, || SystemAddresses.addresses())
            .unwrap_or_default();
        if let Some(servers) = self.service_health.as_mut() {
            servers.set_addresses(addresses);
            servers.sync(wanted);
        }
    }
}

impl SyncLoop {
    /// Opens and closes the localhost NodePort proxy's listeners after a successful sync: for
    /// the services it changed, every one after a full sync or a change of the Node.
    fn sync_localhost_node_ports(&mut self, summary: &ChangeSummary, full: bool) {
        let Some(proxy) = self.localhost_node_ports.as_mut() else {
            return;
        };
        let state = read(&self.state);
        let changed = (!full && !summary.node_changed).then_some(&summary.changed_services);
        proxy.sync(&state, changed);
    }
}

impl SyncLoop {
    /// After a successful sync: health, metrics, UDP flows, health-check servers, the
    /// localhost NodePort proxy, leftovers.
    fn succeeded(&mut self, report: &SyncReport, summary: &ChangeSummary, started: Instant) {
        self.health.updated();
        if let Verdict::Recovered { failures } = self.failures.succeeded() {
            info!(failures, "Synced proxy rules again after failed attempts");
        }
        let (families, services) = {
            let state = read(&self.state);
            (state.node.families(), state.services.len())
        };
        self.metrics.synced(
            &families,
            report,
            started.elapsed(),
            (summary.service_changes, summary.endpoint_changes),
            &summary.trigger_times,
        );
        self.clean_udp_conntrack(summary, report.full);
        self.sync_service_health();
        self.sync_localhost_node_ports(summary, report.full);
        self.remove_other_mode();
        debug!(
            mode = self.proxier.mode().as_str(),
            full = report.full,
            services,
            service_ports = report.service_ports,
            services_written = report.services_written,
            restore_lines = report.restore_lines,
            service_changes = summary.service_changes,
            endpoint_changes = summary.endpoint_changes,
            elapsed = ?started.elapsed(),
            "Synced proxy rules"
        );
    }

    /// After a failed sync: counted, and logged unless it repeats the last failure.
    fn failed(&mut self, err: &SyncError) {
        // After a success the next sync writes changes only (a failed one makes the next
        // full), as upstream counts partial restore failures.
        let partial = self.failures.is_clear();
        self.metrics.failed(
            &read(&self.state).node.families(),
            profile(self.proxier.mode()).failures,
            partial,
        );
        // Nothing is applied until a sync succeeds: past the health timeout the node reports
        // unhealthy, even when no new change is waiting.
        self.health.queued();
        let reason = err.to_string();
        if let Verdict::Log { repeats, since } = self.failures.failed(&reason, Instant::now()) {
            if repeats == 1 {
                error!(error = %reason, "Failed to sync proxy rules; retrying");
            } else {
                error!(error = %reason, repeats, since = ?Duration::from_secs(since.as_secs()), "Failed to sync proxy rules again; retrying");
            }
        }
    }
}

impl Syncer for SyncLoop {
    fn sync(&mut self) -> BoxFuture<'_, Result<(), ()>> {
        Box::pin(async move {
            let changes = self
                .tracker
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take_changes();
            self.metrics
                .pending(changes.services.len(), changes.endpoints.len());
            let summary = write(&self.state).apply(changes);
            let started = Instant::now();
            let shared = self.state.clone();
            let result = self.proxier.sync(&read(&shared), &summary);
            match result {
                Ok(report) => {
                    self.succeeded(&report, &summary, started);
                    Ok(())
                }
                Err(err) => {
                    self.failed(&err);
                    Err(())
                }
            }
        })
    }
}

/// The state the sync loop keeps, shared.
pub(super) type SharedState = Arc<RwLock<ProxyState>>;

fn read(state: &SharedState) -> std::sync::RwLockReadGuard<'_, ProxyState> {
    state
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write(state: &SharedState) -> std::sync::RwLockWriteGuard<'_, ProxyState> {
    state
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
