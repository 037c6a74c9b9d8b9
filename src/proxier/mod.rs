//! Proxiers: what turns the model into kernel state. Each mode renders the desired state (pure)
//! and applies it (thin); the sync loop only sees this trait.

pub mod cleanup;
pub mod conntrack;
pub mod context;
pub mod driver;
pub mod dry_run;
pub mod explanation;
#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
pub(crate) mod flows;
pub mod iptables;
pub mod ipvs;
pub mod local;
pub mod modes;
pub mod naming;
pub mod nftables;
pub mod policy;
pub mod profile;
pub mod quarantine;
pub mod xtables;

use crate::config::ProxyMode;
use crate::model::{ChangeSummary, IpFamily, NamespacedName, ProxyState};
use crate::sys::host::link::LinkError;
use crate::sys::ipset::IpsetError;
use crate::sys::ipvs::IpvsError;
use crate::sys::nf_tables::NftError;
use crate::sys::xtables::IptablesError;

/// upstream's FullSyncPeriod: even without a reason, every mode rewrites everything this often.
pub const FULL_SYNC_PERIOD: std::time::Duration = std::time::Duration::from_secs(3600);

/// Why a sync failed, with its cause; the runner retries and the next sync is a full one.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// The iptables tools failed, or refused the input.
    #[error(transparent)]
    Iptables(Box<IptablesError>),
    /// nf_tables refused a transaction, or a read of our table failed.
    #[error(transparent)]
    Nftables(Box<NftError>),
    /// An IPVS operation or read failed.
    #[error(transparent)]
    Ipvs(Box<IpvsError>),
    /// kube-ipvs0 or its addresses could not be read or changed.
    #[error(transparent)]
    Link(Box<LinkError>),
    /// ipset failed, or refused the input.
    #[error(transparent)]
    Ipset(Box<IpsetError>),
    /// The kernel refused input that belongs to one service.
    #[error("{source} ({what} of Service {service})")]
    Refused {
        source: Box<SyncError>,
        /// What of the service it was (`rules`, `objects`).
        what: &'static str,
        service: Box<NamespacedName>,
    },
    /// A thread of the sync could not start.
    #[error("cannot start a thread: {0}")]
    Spawn(std::io::Error),
    /// A thread of the sync stopped.
    #[error("{0}")]
    Thread(&'static str),
    /// The sync needs what only a full sync leaves in memory.
    #[error("no full sync yet")]
    NotSynced,
    /// The kernel refused more ipset entries in one sync than are skipped.
    #[error("too many ipset entries refused in one sync")]
    TooManyRefused,
}

/// Each kernel surface's error is a [`SyncError`] of its own kind, boxed (a sync's result
/// stays small on its way through every stage).
macro_rules! sync_error_from {
    ($($kind:ident($error:ty)),* $(,)?) => {$(
        impl From<$error> for SyncError {
            fn from(error: $error) -> Self {
                SyncError::$kind(Box::new(error))
            }
        }
    )*};
}

sync_error_from!(
    Iptables(IptablesError),
    Nftables(NftError),
    Ipvs(IpvsError),
    Link(LinkError),
    Ipset(IpsetError),
);

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
