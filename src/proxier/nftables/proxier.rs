//! The nftables proxier: renders per service and family, decides full or partial sync, applies
//! each family's sync as one nft transaction, and remembers what it programmed so the next sync
//! writes only what changed. Full syncs happen at start, after a failure, when the node changes
//! and hourly (as upstream); a partial sync writes the changed services' differing chains and
//! map elements only. Chains nothing wants are flushed at once and deleted a second later.
//! What other programs change in our table is known from the kernel's change events, and
//! exactly those chains and sets are rewritten at the next sync (see `repair`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use super::digests::{DIGEST_CHAIN, Digests};
use super::flowtable::FlowtableDevices;
use super::holders::ElementHolders;
use super::plan::{self, Delta, Existing, Stats};
use super::render::{
    Chain, NftContext, Objects, TABLE, comment_of, digest_of, render_base, render_service,
    stamp_digests,
};
use super::settings::NftablesSettings;
use super::slots::SlotTable;
use crate::config::ProxyMode;
use crate::model::{ChangeSummary, IpFamily, NamespacedName, NodeInfo, ProxyState, ServicePortMap};
use crate::proxier::context::FamilyContext;
use crate::proxier::driver::{Mode, SyncDriver, Written};
use crate::proxier::naming::ChainSet;
use crate::proxier::quarantine::{Failure, Quarantine, service_in_comment};
use crate::proxier::{SyncError, SyncReport};
use crate::sys::host::net::LocalAddresses;
use crate::sys::nf_tables::events::ChangeEvents;
use crate::sys::nf_tables::{NftError, Nftables, RuleComments, SetElements, family_keyword};

mod adopt;
mod apply;
mod drift;
mod full;
mod partial;

/// A flushed chain is deleted once it has been unreferenced this long (before kernel 6.2 a
/// chain a just-deleted map element pointed to is still in use for a moment).
const STALE_CHAIN_DELAY: Duration = Duration::from_secs(1);
/// After a failed batch deletion, at most this many stale chains are tried one by one per sync.
const SINGLE_DELETIONS_PER_SYNC: usize = 64;
/// A restart that took parts of the table on the trust of its digests reads the table back
/// this long after, in a full sync of its own (see `digests`).
const VERIFY_DELAY: Duration = Duration::from_secs(1);

/// What is programmed in one family's table.
struct FamilyState {
    ctx: NftContext,
    base: Objects,
    services: BTreeMap<NamespacedName, Objects>,
    /// How many services hold each element.
    holders: ElementHolders,
    /// Which policy chain holds which endpoint-map slot.
    slots: SlotTable,
    /// The digests of `base` and `services`, which the table's digest chain holds.
    digests: Digests,
}

/// The nftables proxier over any [`Nftables`] (the real one or the fake).
pub type NftablesProxier<N> = SyncDriver<NftablesMode<N>>;

/// nftables mode's stages, which [`SyncDriver`] runs.
pub struct NftablesMode<N: Nftables> {
    nft: N,
    settings: NftablesSettings,
    addresses: Box<dyn LocalAddresses>,
    programmed: BTreeMap<IpFamily, FamilyState>,
    /// Families whose table holds exactly the objects `programmed` says.
    known: BTreeSet<IpFamily>,
    /// Families whose table a restart took on the trust of its digests, in part, with when
    /// it is to be read back: the first sync from then on is a full one that reads it (those
    /// before it, partial ones from memory, so that changes right after a restart wait for no
    /// read).
    unverified: BTreeMap<IpFamily, Instant>,
    /// Whether the last full sync wrote only what differs from memory (then what other
    /// programs changed meanwhile is still to repair).
    last_full_sync_from_memory: bool,
    /// Chains flushed because nothing wants them, with when; deleted a moment later.
    stale_chains: BTreeMap<IpFamily, BTreeMap<String, Instant>>,
    /// Keeps the flowtable over the node's links, when connections are offloaded.
    flowtable_devices: Option<FlowtableDevices>,
    /// What other programs change in our table, when the kernel can tell.
    events: Option<Box<dyn ChangeEvents>>,
    /// The next sync is to be a full one (another program added to our table).
    full_sync_wanted: bool,
    /// Asks for a sync; called a moment after chains were flushed, so that they are deleted
    /// then rather than at the next periodic sync.
    wake: Option<Arc<dyn Fn() + Send + Sync>>,
    /// The next full sync deletes and recreates the table (a full sync failed for no reason
    /// a line of ours could name).
    recreate: bool,
    /// How long a flushed chain waits before it is deleted ([`STALE_CHAIN_DELAY`]).
    pub stale_chain_delay: Duration,
    /// How long after a restart that trusted the table's digests it is read back
    /// ([`VERIFY_DELAY`]).
    pub verify_delay: Duration,
    /// Failed transactions so far (`..._nftables_sync_failures_total`).
    pub sync_failures: u64,
    /// When set, the transactions of the last sync are kept in `last_transactions` (tests).
    pub record_transactions: bool,
    pub last_transactions: Vec<(IpFamily, String)>,
}

impl<N: Nftables> NftablesProxier<N> {
    /// A proxier that will do a full sync first.
    pub fn new(nft: N, settings: NftablesSettings, addresses: Box<dyn LocalAddresses>) -> Self {
        SyncDriver::drive(NftablesMode {
            nft,
            settings,
            addresses,
            programmed: BTreeMap::new(),
            known: BTreeSet::new(),
            unverified: BTreeMap::new(),
            last_full_sync_from_memory: false,
            stale_chains: BTreeMap::new(),
            flowtable_devices: None,
            events: None,
            full_sync_wanted: false,
            wake: None,
            recreate: false,
            stale_chain_delay: STALE_CHAIN_DELAY,
            verify_delay: VERIFY_DELAY,
            sync_failures: 0,
            record_transactions: false,
            last_transactions: Vec::new(),
        })
    }

    /// Repairs what other programs change in our table as they change it.
    pub fn with_change_events(mut self, events: Box<dyn ChangeEvents>) -> Self {
        self.mode.events = Some(events);
        self
    }

    /// Keeps the flowtable over the node's links (offload on): after each sync, the links it
    /// lacks are added.
    pub fn with_flowtable_devices(mut self, devices: FlowtableDevices) -> Self {
        self.mode.flowtable_devices = Some(devices);
        self
    }

    /// Asks for a sync with `wake` once flushed chains can be deleted.
    pub fn with_wake(mut self, wake: Arc<dyn Fn() + Send + Sync>) -> Self {
        self.mode.wake = Some(wake);
        self
    }
}

impl<N: Nftables> NftablesMode<N> {
    /// The kernel interface (for tests).
    pub fn nft(&mut self) -> &mut N {
        &mut self.nft
    }

    fn context(&mut self, family: IpFamily, node: &NodeInfo, state_cidrs: &[IpNet]) -> NftContext {
        let of_family = |ip: &IpAddr| IpFamily::of(ip) == family;
        let common = FamilyContext::new(
            family,
            node,
            self.settings.masquerade_mark,
            self.settings.masquerade_all,
            &self.settings.local_traffic,
        );
        let addresses = &self.addresses;
        let local = || {
            addresses
                .addresses()
                .into_iter()
                .filter(of_family)
                .collect()
        };
        let node_port_addresses = self
            .settings
            .node_port_addresses
            .addresses(common.node_ip, local);
        NftContext {
            common,
            node_port_addresses,
            service_cidrs: state_cidrs
                .iter()
                .filter(|c| IpFamily::of(&c.addr()) == family)
                .copied()
                .collect(),
            localhost_rejects: self.settings.localhost_rejects(family),
            offload_after_packets: self.settings.offload_after_packets,
        }
    }
}

impl Written for Stats {
    fn lines(&self) -> usize {
        self.lines
    }

    fn log(&self, family: IpFamily, full: bool) {
        debug!(
            ?family,
            full,
            lines = self.lines,
            chains = self.chains_written,
            elements = self.elements_changed,
            "Applied nftables transaction"
        );
    }
}

impl<N: Nftables> Mode for NftablesMode<N> {
    type Context = NftContext;
    type Written = Stats;
    /// The objects of ours other programs changed since the last sync, per family (from the
    /// events); rewritten after the family's sync unless it read the table back.
    type Sync = BTreeMap<IpFamily, BTreeSet<String>>;
    const MODE: ProxyMode = ProxyMode::Nftables;

    /// A full sync is also wanted when a restart that trusted the table's digests is due to
    /// read it back, when another program deleted or replaced our table, when change events
    /// were lost, and when another program added objects to our table.
    fn begin(
        &mut self,
        _families: &[IpFamily],
        _changes: &ChangeSummary,
        _full: bool,
    ) -> Result<(Self::Sync, bool), Failure> {
        self.last_transactions.clear();
        let now = Instant::now();
        let mut full = std::mem::take(&mut self.full_sync_wanted);
        // A restart that trusted the table's digests reads the table back a moment later.
        if self.unverified.values().any(|due| now >= *due) {
            full = true;
        }
        let mut drifted = Self::Sync::new();
        let drift = self.events.as_mut().map(|e| e.take()).unwrap_or_default();
        for (family, _, name) in drift.chains {
            if name.is_empty() {
                warn!(
                    ?family,
                    "Another program deleted or replaced our nftables table; doing a full sync"
                );
                full = true;
                // Memory no longer says what the table holds: read it and rewrite everything.
                self.known.remove(&family);
            } else {
                drifted.entry(family).or_default().insert(name);
            }
        }
        if drift.lost {
            warn!("nftables change events were lost; doing a full sync");
            full = true;
            self.known.clear();
        }
        Ok((drifted, full))
    }

    /// Chains flushed a moment ago are deleted first.
    fn prepare(
        &mut self,
        _drifted: &mut Self::Sync,
        family: IpFamily,
        state: &ProxyState,
    ) -> NftContext {
        self.delete_stale_chains(family);
        self.context(family, &state.node, &state.service_cidrs)
    }

    fn programmed_context(&self, family: IpFamily) -> Option<&NftContext> {
        self.programmed.get(&family).map(|p| &p.ctx)
    }

    fn full_sync(
        &mut self,
        _drifted: &mut Self::Sync,
        family: IpFamily,
        ctx: NftContext,
        state: &ProxyState,
        quarantine: &Quarantine,
    ) -> Result<Stats, Failure> {
        self.program_all(family, ctx, state, quarantine)
    }

    fn partial_sync(
        &mut self,
        _drifted: &mut Self::Sync,
        family: IpFamily,
        state: &ProxyState,
        changes: &ChangeSummary,
        _quarantine: &Quarantine,
    ) -> Result<Stats, Failure> {
        self.program_changed(family, state, changes)
    }

    /// What other programs changed is rewritten, unless the sync read the table back; the
    /// flowtable, when there is one, gains the links it lacks.
    fn settle(
        &mut self,
        drifted: &mut Self::Sync,
        family: IpFamily,
        _state: &ProxyState,
        full: bool,
        _quarantine: &Quarantine,
    ) -> Result<usize, Failure> {
        let repaired = match drifted.remove(&family) {
            Some(names) if !full || self.last_full_sync_from_memory => {
                self.repair(family, &names)?
            }
            _ => 0,
        };
        if let Some(devices) = self.flowtable_devices.as_mut()
            && self.settings.offload_after_packets.is_some()
        {
            devices.keep(&mut self.nft, family);
        }
        Ok(repaired)
    }

    fn end(&mut self, _drifted: Self::Sync, _full: bool, report: &mut SyncReport) {
        for (family, programmed) in &self.programmed {
            let mut no_local = (0, 0);
            for service in programmed.services.values() {
                no_local.0 += service.no_local_endpoints.0;
                no_local.1 += service.no_local_endpoints.1;
            }
            report.no_local_endpoints.push((*family, no_local));
        }
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod upstream_tests;
