//! Proxiers: what turns the model into kernel state. Each mode renders the desired state (pure)
//! and applies it (thin); the sync loop only sees this trait.

pub mod cleanup;
pub mod conntrack;
pub mod context;
pub mod driver;
pub mod dry_run;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod iptables;
pub mod ipvs;
pub mod local;
pub mod modes;
pub mod naming;
pub mod nftables;
pub mod policy;
pub mod quarantine;
pub mod xtables;

use crate::config::ProxyMode;
use crate::model::{ChangeSummary, IpFamily, ProxyState};

/// upstream's FullSyncPeriod: even without a reason, every mode rewrites everything this often.
pub const FULL_SYNC_PERIOD: std::time::Duration = std::time::Duration::from_secs(3600);

/// Why a sync failed; the runner retries and the proxier does a full sync next time.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// Programming the kernel failed.
    #[error("{0}")]
    Apply(String),
}

/// What one sync did, for logs and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Whether this sync rewrote everything rather than the changed services only.
    pub full: bool,
    /// Service ports programmed in total.
    pub service_ports: usize,
    /// Services whose rules this sync rewrote.
    pub services_written: usize,
    /// Lines of kernel input written (restore lines).
    pub restore_lines: usize,
    /// Service ports without usable local endpoints for (internal, external) traffic, per
    /// family served.
    pub no_local_endpoints: Vec<(IpFamily, (usize, usize))>,
    /// Rules this program owns, per family and table, in the modes that write iptables rules
    /// and count them from memory.
    pub rules: Vec<(IpFamily, &'static str, usize)>,
    /// Rules this sync wrote, per family and table (upstream's `..._iptables_last`).
    pub rules_written: Vec<(IpFamily, &'static str, usize)>,
    /// Services skipped because the kernel refused their rules.
    pub skipped_services: usize,
    /// Chains of ours rewritten because another program changed them.
    pub repaired_chains: usize,
}

/// A proxy mode's programmer of kernel state.
pub trait Proxier: Send {
    /// The mode this proxier programs.
    fn mode(&self) -> ProxyMode;

    /// Brings the kernel in line with `state`. `changes` says what changed since the last sync
    /// handed to this proxier (successful or not); a proxier that failed keeps its own note to
    /// resync everything.
    /// Blocking: the sync loop runs on its own thread.
    fn sync(
        &mut self,
        state: &ProxyState,
        changes: &ChangeSummary,
    ) -> Result<SyncReport, SyncError>;
}
