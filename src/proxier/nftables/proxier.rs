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
use super::holders::ElementHolders;
use super::render::{
    Chain, NftContext, Objects, TABLE, comment_of, digest_of, render_base, render_service,
    stamp_digests,
};
use super::slots::SlotTable;
use super::transaction::{self, Delta, Existing, Stats};
use crate::config::KubeProxyConfiguration;
use crate::config::ProxyMode;
use crate::model::{ChangeSummary, IpFamily, NamespacedName, NodeInfo, ProxyState, ServicePortMap};
use crate::proxier::SyncReport;
use crate::proxier::driver::{Mode, SyncDriver, Written};
use crate::proxier::local::{LocalTraffic, NodePortAddresses, selected_node_port_ips};
use crate::proxier::naming::ChainSet;
use crate::proxier::quarantine::{Failure, Quarantine, service_in_comment};
use crate::sys::net::LocalAddresses;
use crate::sys::nf_events::ChangeEvents;
use crate::sys::nftables::{NftError, Nftables, RuleComments, SetElements, family_keyword};

/// A flushed chain is deleted once it has been unreferenced this long (before kernel 6.2 a
/// chain a just-deleted map element pointed to is still in use for a moment).
const STALE_CHAIN_DELAY: Duration = Duration::from_secs(1);
/// After a failed batch deletion, at most this many stale chains are tried one by one per sync.
const SINGLE_DELETIONS_PER_SYNC: usize = 64;
/// A restart that took parts of the table on the trust of its digests reads the table back
/// this long after, in a full sync of its own (see `digests`).
const VERIFY_DELAY: Duration = Duration::from_secs(1);

/// The parts of the configuration this proxier uses.
#[derive(Clone, Debug)]
pub struct NftablesSettings {
    pub masquerade_mark: u32,
    pub masquerade_all: bool,
    /// How local pod traffic is recognised.
    pub local_traffic: LocalTraffic,
    /// CIDRs or `primary`, as configured; upstream's nftables default (empty) is `primary`.
    pub node_port_addresses: Vec<String>,
}

impl NftablesSettings {
    /// Takes them from a validated configuration.
    pub fn from_config(config: &KubeProxyConfiguration) -> Self {
        let node_port_addresses = if config.node_port_addresses.is_empty() {
            vec!["primary".to_string()]
        } else {
            config.node_port_addresses.clone()
        };
        let bit = config.nftables.masquerade_bit.unwrap_or(14).clamp(0, 31);
        NftablesSettings {
            masquerade_mark: 1u32 << bit,
            masquerade_all: config.nftables.masquerade_all || config.iptables.masquerade_all,
            local_traffic: LocalTraffic::from_config(config),
            node_port_addresses,
        }
    }
}

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
    /// What other programs change in our table, when the kernel can tell.
    events: Option<Box<dyn ChangeEvents>>,
    /// The objects of ours other programs changed since the last sync, per family (from the
    /// events); rewritten after the family's sync unless it read the table back.
    drifted: BTreeMap<IpFamily, BTreeSet<String>>,
    /// The next sync is to be a full one (another program added to our table).
    full_sync_wanted: bool,
    /// Asks for a sync; called a moment after chains were flushed, so that they are deleted
    /// then rather than at the next periodic sync.
    wake: Option<Arc<dyn Fn() + Send + Sync>>,
    /// The next full sync deletes and recreates the table (a full sync failed for no reason
    /// a line of ours could name).
    recreate: bool,
    /// Whether the loopback-NodePorts note was logged.
    logged_localhost: bool,
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
            events: None,
            drifted: BTreeMap::new(),
            full_sync_wanted: false,
            wake: None,
            recreate: false,
            logged_localhost: false,
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
        let node_ip = node.addresses.iter().copied().find(of_family);
        let addresses = &self.addresses;
        let local = || {
            addresses
                .addresses()
                .into_iter()
                .filter(of_family)
                .collect()
        };
        let node_port_addresses =
            match selected_node_port_ips(&self.settings.node_port_addresses, node_ip, local) {
                None => NodePortAddresses::All,
                Some(ips) => NodePortAddresses::Only(ips),
            };
        if let NodePortAddresses::Only(ips) = &node_port_addresses
            && ips.iter().any(IpAddr::is_loopback)
            && !std::mem::replace(&mut self.logged_localhost, true)
        {
            warn!(
                "NodePorts on localhost addresses are not served in nftables mode (as upstream); nodePortAddresses' loopback addresses are left out"
            );
        }
        NftContext {
            family,
            node_name: node.name.clone(),
            zone: node.zone().map(str::to_string),
            node_ip,
            masquerade_mark: self.settings.masquerade_mark,
            masquerade_all: self.settings.masquerade_all,
            local_detector: self.settings.local_traffic.detector(family, node),
            node_port_addresses,
            service_cidrs: state_cidrs
                .iter()
                .filter(|c| IpFamily::of(&c.addr()) == family)
                .copied()
                .collect(),
        }
    }

    /// Runs one transaction, recording it when asked; a failure counts.
    fn apply(&mut self, family: IpFamily, text: &str) -> Result<(), NftError> {
        if self.record_transactions {
            self.last_transactions.push((family, text.to_string()));
        }
        self.nft.apply(text).inspect_err(|_| {
            self.known.remove(&family);
            self.sync_failures += 1;
        })
    }

    /// Deletes the chains flushed at least `stale_chain_delay` ago, in one transaction of its
    /// own; if the kernel refuses it (one still in use), one by one, a few per sync. A chain
    /// that cannot go yet is tried again next sync; it is empty meanwhile.
    fn delete_stale_chains(&mut self, family: IpFamily) {
        let now = Instant::now();
        let mut due: Vec<String> = self
            .stale_chains
            .get(&family)
            .map(|stale| {
                stale
                    .iter()
                    .filter(|(_, at)| now.duration_since(**at) >= self.stale_chain_delay)
                    .map(|(name, _)| name.clone())
                    .collect()
            })
            .unwrap_or_default();
        if due.is_empty() {
            return;
        }
        // A chain that is wanted again (its service came back) stays, and is stale no more.
        if let Some(programmed) = self.programmed.get(&family) {
            let wanted: BTreeSet<&String> = programmed
                .services
                .values()
                .flat_map(|s| s.chains.keys())
                .collect();
            let (again, gone): (Vec<String>, Vec<String>) =
                due.into_iter().partition(|name| wanted.contains(name));
            if let Some(stale) = self.stale_chains.get_mut(&family) {
                for name in &again {
                    stale.remove(name);
                }
            }
            due = gone;
        }
        if due.is_empty() {
            return;
        }
        let keyword = family_keyword(family);
        let all: Vec<&String> = due.iter().collect();
        let deleted: Vec<&String> = if self
            .nft
            .apply(&transaction::delete_chains(keyword, &all))
            .is_ok()
        {
            all
        } else {
            all.into_iter()
                    .take(SINGLE_DELETIONS_PER_SYNC)
                    .filter(|name| {
                        self.nft
                            .apply(&transaction::delete_chains(keyword, &[name]))
                            .inspect_err(|err| debug!(chain = %name, error = %err, "Stale chain not deleted yet"))
                            .is_ok()
                    })
                    .collect()
        };
        debug!(?family, chains = deleted.len(), "Deleted stale chains");
        if let Some(stale) = self.stale_chains.get_mut(&family) {
            for name in deleted {
                stale.remove(name);
            }
        }
    }

    /// Asks for a sync `delay` from now (when there is someone to ask).
    fn wake_after(&self, delay: Duration, why: &'static str) {
        let Some(wake) = self.wake.clone() else {
            return;
        };
        let spawned = std::thread::Builder::new()
            .name("nftables-wake".into())
            .spawn(move || {
                std::thread::sleep(delay);
                wake();
            });
        if let Err(err) = spawned {
            debug!(error = %err, "{why} at the next sync");
        }
    }

    fn remember_stale(&mut self, family: IpFamily, chains: Vec<String>) {
        if !chains.is_empty() {
            self.wake_after(
                self.stale_chain_delay + Duration::from_millis(100),
                "Stale chains will be deleted",
            );
        }
        let now = Instant::now();
        let stale = self.stale_chains.entry(family).or_default();
        for chain in chains {
            stale.entry(chain).or_insert(now);
        }
    }

    /// Programs every service of `family` (see [`Mode::full_sync`]).
    fn program_all(
        &mut self,
        family: IpFamily,
        ctx: NftContext,
        state: &ProxyState,
        quarantine: &Quarantine,
    ) -> Result<Stats, Failure> {
        let mut base = render_base(&ctx);
        stamp_digests(&mut base);
        // What the table holds is known from memory when memory is exact; else (at start, an
        // earlier run's objects, and after a failure) it is read: names and digests, and,
        // unless this is a restart that trusts the digests, the top-level sets' elements,
        // while the services render on the other core.
        let from_memory = self.programmed.contains_key(&family) && self.known.contains(&family);
        self.last_full_sync_from_memory = false;
        let trust = !self.programmed.contains_key(&family) && !self.recreate;
        let previous = self.programmed.get(&family);
        // The slots programmed, for the render to find taken ones (see `slots`).
        let mut slots = previous.map(|p| p.slots.clone()).unwrap_or_default();
        let nft = &mut self.nft;
        // A quarantined service keeps what the kernel last accepted for it. The services'
        // digests are summed as they render, on each thread, while their objects are fresh.
        let render = |part: &[(&NamespacedName, &ServicePortMap)], slots: &mut SlotTable| {
            let mut digests = Digests::default();
            let rendered = part
                .iter()
                .filter_map(|(key, ports)| {
                    let objects = if quarantine.contains(key) {
                        previous?.services.get(*key)?.clone()
                    } else {
                        service_objects(ports, state.endpoints.get(*key), &ctx, slots)
                    };
                    digests.add(&objects);
                    (!objects.is_empty()).then(|| ((*key).clone(), objects))
                })
                .collect::<Vec<_>>();
            (rendered, digests)
        };
        let render = &render;
        let all: Vec<(&NamespacedName, &ServicePortMap)> = state.services.iter().collect();
        let (mut services, mut digests, read) = std::thread::scope(|scope| {
            let reader = match from_memory {
                true => None,
                false => Some(
                    std::thread::Builder::new()
                        .name("nftables-read".into())
                        .spawn_scoped(scope, || read_table(nft, family, &base, trust))
                        .map_err(|err| {
                            Failure::unattributed(format!("cannot start a thread: {err}"))
                        })?,
                ),
            };
            // Half of the services render on another thread, with a copy of the slot table
            // whose grants are then settled with this one's (see `SlotTable::merge`); here,
            // after the first half, if no thread can be had.
            let (mine, theirs) = all.split_at(all.len() / 2);
            let mut their_slots = slots.clone();
            let helper = std::thread::Builder::new()
                .name("nftables-render".into())
                .spawn_scoped(scope, move || {
                    (render(theirs, &mut their_slots), their_slots)
                })
                .ok();
            let (rendered, mut digests) = render(mine, &mut slots);
            let mut services: BTreeMap<NamespacedName, Objects> = rendered.into_iter().collect();
            let (rendered, their_digests) = match helper {
                Some(helper) => {
                    let ((rendered, their_digests), their_slots) = helper
                        .join()
                        .map_err(|_| Failure::unattributed("a renderer of services panicked"))?;
                    slots.merge(
                        their_slots,
                        rendered.iter().map(|(_, o)| o.slots.as_slice()),
                    );
                    (rendered, their_digests)
                }
                None => render(theirs, &mut slots),
            };
            services.extend(rendered);
            digests.merge(their_digests);
            let read = reader.map(|reader| {
                reader.join().unwrap_or_else(|_| {
                    Err(Failure::unattributed("the reader of our table panicked"))
                })
            });
            Ok::<_, Failure>((services, digests, read))
        })?;
        // A chain that lost its slot to a chain of a later service does without it.
        rerender_evicted(&mut slots, &mut services, state, &ctx, &mut digests);
        digests.add_base(&base);
        // Memory is exact and the kernel reports every change other programs make: a full
        // sync (the hourly one, a Node change) writes only what differs from what is
        // programmed, as a partial sync over every service and the base.
        if self.events.is_some() && from_memory && !self.recreate {
            self.last_full_sync_from_memory = true;
            return self.diff_sync(family, ctx, base, services, digests);
        }
        // What memory keeps of the services is indexed on the other core while what the table
        // holds is worked out and the transactions are built.
        let index = || {
            (
                ElementHolders::of(services.values()),
                SlotTable::of(services.values().map(|o| o.slots.as_slice())),
            )
        };
        let (built, index) = std::thread::scope(|scope| {
            let indexer = std::thread::Builder::new()
                .name("nftables-index".into())
                .spawn_scoped(scope, index)
                .ok();
            let built = self
                .found(family, &base, &services, &digests, read, trust)
                .map(|(existing, held_digests, on_trust)| {
                    let recreate = std::mem::take(&mut self.recreate);
                    let write_digests = recreate || held_digests.as_ref() != Some(&digests);
                    let built = transaction::full(
                        family_keyword(family),
                        &base,
                        &services,
                        &existing,
                        recreate,
                        write_digests.then_some(&digests),
                    );
                    (built, recreate, on_trust)
                });
            let index = match indexer {
                Some(indexer) => indexer
                    .join()
                    .map_err(|_| Failure::unattributed("the indexer of our services panicked")),
                None => Ok(index()),
            };
            (built, index)
        });
        let ((transactions, stats, removed), recreate, on_trust) = built?;
        let (holders, slots) = index?;
        for text in &transactions {
            if let Err(err) = self.apply(family, text) {
                let failure = transaction_failure(err, text, &services);
                if failure.culprit.is_none() {
                    self.recreate = true;
                }
                return Err(failure);
            }
        }
        if recreate {
            self.stale_chains.remove(&family);
        }
        self.remember_stale(family, removed.chains);
        self.programmed.insert(
            family,
            FamilyState {
                ctx,
                base,
                holders,
                slots,
                services,
                digests,
            },
        );
        if on_trust {
            // Another program may have changed the table while no daemon watched it: read it
            // back in a moment.
            info!(
                ?family,
                "Took what our table's digests vouch for as right; reading the table back in a moment"
            );
            self.unverified
                .insert(family, Instant::now() + self.verify_delay);
            self.wake_after(self.verify_delay, "The table will be read back");
        } else {
            self.unverified.remove(&family);
            self.known.insert(family);
        }
        Ok(stats)
    }

    /// What a full sync finds in the table: from memory when it did not `read` the table, else
    /// [`Self::existing`]. Also returns the digests the table holds and whether anything was
    /// taken on their word.
    fn found(
        &mut self,
        family: IpFamily,
        base: &Objects,
        services: &BTreeMap<NamespacedName, Objects>,
        wanted: &Digests,
        read: Option<Result<ReadBack, Failure>>,
        trust: bool,
    ) -> Result<(Existing, Option<Digests>, bool), Failure> {
        let Some(read) = read else {
            let programmed = self
                .programmed
                .get(&family)
                .ok_or_else(|| Failure::unattributed("no full sync yet"))?;
            let mut existing = Existing::default();
            for objects in std::iter::once(&programmed.base).chain(programmed.services.values()) {
                existing.chains.extend(objects.chains.keys().cloned());
                existing.sets.extend(objects.sets.keys().cloned());
            }
            existing.chains.extend(
                self.stale_chains
                    .get(&family)
                    .into_iter()
                    .flat_map(|s| s.keys().cloned()),
            );
            return Ok((existing, Some(programmed.digests.clone()), false));
        };
        Ok(self.existing(family, base, services, wanted, read?, trust))
    }

    /// What a full sync finds in the table, from what it `read` back: names, and, where the
    /// table's digests (when it can `trust` them) do not vouch for them, the chains' digests
    /// and the sets' elements. Also returns the digests the table holds, and whether anything
    /// was taken on their word (then the table is to be read back; when every part differed,
    /// everything was read already).
    fn existing(
        &mut self,
        family: IpFamily,
        base: &Objects,
        services: &BTreeMap<NamespacedName, Objects>,
        wanted: &Digests,
        read: ReadBack,
        trust: bool,
    ) -> (Existing, Option<Digests>, bool) {
        let ReadBack {
            chains,
            sets,
            digests: held,
            elements,
        } = read;
        let trusted = held
            .as_ref()
            .filter(|held| trust && held.share_a_part(wanted));
        // Chains an earlier run wrote that are exactly what we would write stay as they are:
        // those the table's digests vouch for, and those read back unchanged (see
        // `unchanged`). Only chains that exist are read.
        let mut adopted = ChainSet::default();
        let mut candidates = BTreeSet::new();
        let vouched = trusted.map(|held| held.chains_alike(wanted));
        for name in services.values().flat_map(|objects| objects.chains.keys()) {
            if !chains.contains(name) {
                continue;
            }
            if vouched.as_ref().is_some_and(|vouched| vouched(name)) {
                adopted.insert(name.clone());
            } else {
                candidates.insert(name.clone());
            }
        }
        let chains_vouched = !adopted.is_empty();
        let names_present = base.chains.keys().all(|name| chains.contains(name))
            && base.sets.keys().all(|name| sets.contains(name));
        // The table's digests say the base was declared as we would declare it.
        let declared_alike = held.as_ref().is_some_and(|held| held.same_layout(wanted));
        let layout_vouched = trusted.is_some() && declared_alike;
        // Unless the digests vouch for them, the base chains are read with the candidates.
        let check_base = !layout_vouched && names_present;
        if check_base {
            candidates.extend(base.chains.keys().cloned());
        }
        let mut base_unchanged = false;
        if !candidates.is_empty() {
            match self.nft.rule_comments(family, TABLE, &candidates) {
                Ok(comments) => {
                    adopted.extend(adoptable(services, &comments));
                    base_unchanged = check_base
                        && base
                            .chains
                            .iter()
                            .all(|(name, chain)| unchanged(name, chain, &comments));
                }
                Err(err) => {
                    warn!(?family, error = %err, "Cannot read our rules back; rewriting the chains");
                }
            }
        }
        // The top-level sets: trusted, or read (all of them already, when not trusting).
        let present = present_sets(base, &sets);
        let (trusted_sets, elements) = match trusted {
            // Digests that vouch for nothing: the reader, told to trust them, read no element
            // (see `read_table`).
            None if trust && held.is_some() && !present.is_empty() => (
                BTreeSet::new(),
                read_elements(&mut self.nft, family, &present),
            ),
            None => (BTreeSet::new(), elements),
            Some(held) => {
                let (vouched, differing): (Vec<_>, Vec<_>) = present
                    .into_iter()
                    .partition(|(name, _)| held.same_elements(wanted, name));
                let elements = if differing.is_empty() {
                    Some(SetElements::new())
                } else {
                    read_elements(&mut self.nft, family, &differing)
                };
                (
                    vouched.into_iter().map(|(name, _)| name).collect(),
                    elements,
                )
            }
        };
        // The base is kept, its declarations included, when the digests vouch for it, or when
        // its chains read back unchanged and it was declared as we would declare it.
        let base_kept = names_present && (layout_vouched || (base_unchanged && declared_alike));
        let on_trust =
            trusted.is_some() && (chains_vouched || !trusted_sets.is_empty() || base_kept);
        let kept = adopted.len();
        if kept > 0 {
            info!(
                ?family,
                chains = kept,
                "Kept chains an earlier run programmed as they are"
            );
        }
        let existing = Existing {
            chains,
            sets,
            adopted,
            elements,
            trusted_sets,
            base_kept,
        };
        (existing, held, on_trust)
    }

    /// Brings the table from what memory says it holds to `base` and `services` (whose
    /// `digests` the full sync summed), writing only the differences.
    fn diff_sync(
        &mut self,
        family: IpFamily,
        ctx: NftContext,
        base: Objects,
        services: BTreeMap<NamespacedName, Objects>,
        digests: Digests,
    ) -> Result<Stats, Failure> {
        let Some(current) = self.programmed.get(&family) else {
            return Err(Failure::unattributed("no full sync yet"));
        };
        let keys: BTreeSet<&NamespacedName> =
            current.services.keys().chain(services.keys()).collect();
        let deltas: Vec<Delta<'_>> = std::iter::once(Delta {
            old: Some(&current.base),
            new: Some(&base),
        })
        .chain(keys.into_iter().map(|key| Delta {
            old: current.services.get(key),
            new: services.get(key),
        }))
        .collect();
        let mut stats = Stats::default();
        // Every service is among the deltas: none elsewhere keeps an element.
        if let Some((mut text, mut written, removed)) =
            transaction::partial(family_keyword(family), &deltas, &|_, _| false)
        {
            with_digests(family, &mut text, &mut written, &current.digests, &digests);
            self.apply(family, &text)
                .map_err(|err| transaction_failure(err, &text, &services))?;
            self.remember_stale(family, removed.chains);
            stats = written;
        }
        self.programmed.insert(
            family,
            FamilyState {
                ctx,
                base,
                holders: ElementHolders::of(services.values()),
                slots: SlotTable::of(services.values().map(|o| o.slots.as_slice())),
                services,
                digests,
            },
        );
        Ok(stats)
    }

    /// Programs the changed services of `family` (see [`Mode::partial_sync`]).
    fn program_changed(
        &mut self,
        family: IpFamily,
        state: &ProxyState,
        changes: &ChangeSummary,
    ) -> Result<Stats, Failure> {
        let Some(current) = self.programmed.get(&family) else {
            return Err(Failure::unattributed("no full sync yet"));
        };
        // The changed services' chains keep their slots; a slot one of them frees is taken by
        // no one before the next sync (its elements go in this transaction). A service whose
        // chain a changed one evicts from its slot (a smaller hash wins) is rewritten with it,
        // in the same transaction, whose deletions come before its additions. The slots are
        // granted in a copy of the table, kept if the transaction is.
        let mut slots = current.slots.clone();
        let render = |key: &NamespacedName, slots: &mut SlotTable| {
            state
                .services
                .get(key)
                .map(|ports| service_objects(ports, state.endpoints.get(key), &current.ctx, slots))
                .filter(|objects| !objects.is_empty())
        };
        let mut rendered: Vec<(NamespacedName, Option<Objects>)> = changes
            .changed_services
            .iter()
            .map(|key| (key.clone(), render(key, &mut slots)))
            .collect();
        let mut changing_keys: BTreeSet<&NamespacedName> =
            changes.changed_services.iter().collect();
        // The evicted: programmed services, and changed ones rendered before their evictor.
        let evicted: BTreeSet<&NamespacedName> = slots
            .take_evicted(current.services.keys().chain(&changes.changed_services))
            .into_iter()
            .collect();
        for key in evicted {
            let objects = render(key, &mut slots);
            match rendered.iter_mut().find(|(rendered, _)| rendered == key) {
                Some(entry) => entry.1 = objects,
                None => {
                    changing_keys.insert(key);
                    rendered.push((key.clone(), objects));
                }
            }
        }
        // Rendered again, they evict no one (their other chains hold their slots already).
        slots.take_evicted([]);
        let deltas: Vec<Delta<'_>> = rendered
            .iter()
            .map(|(key, new)| Delta {
                old: current.services.get(key),
                new: new.as_ref(),
            })
            .collect();
        // Elements the services this sync leaves alone hold: counted, and where a count says
        // "held", confirmed among them.
        let changing: Vec<&Objects> = changing_keys
            .iter()
            .filter_map(|key| current.services.get(*key))
            .collect();
        let held_elsewhere = |set: &str, key: &str| {
            current.holders.held_elsewhere(set, key, &changing, || {
                current
                    .services
                    .iter()
                    .filter(|(service, _)| !changing_keys.contains(service))
                    .any(|(_, objects)| {
                        objects
                            .elements
                            .get(set)
                            .is_some_and(|elements| elements.contains_key(key))
                    })
            })
        };
        let Some((mut text, mut stats, removed)) =
            transaction::partial(family_keyword(family), &deltas, &held_elsewhere)
        else {
            return Ok(Stats::default());
        };
        let mut digests = current.digests.clone();
        for (key, new) in &rendered {
            if let Some(old) = current.services.get(key) {
                digests.remove(old);
            }
            if let Some(new) = new {
                digests.add(new);
            }
        }
        with_digests(family, &mut text, &mut stats, &current.digests, &digests);
        let involved: BTreeMap<NamespacedName, Objects> = rendered
            .iter()
            .filter_map(|(key, new)| {
                let objects = new.as_ref().or_else(|| current.services.get(key))?;
                Some((key.clone(), objects.clone()))
            })
            .collect();
        self.apply(family, &text)
            .map_err(|err| transaction_failure(err, &text, &involved))?;
        self.remember_stale(family, removed.chains);
        if let Some(current) = self.programmed.get_mut(&family) {
            current.digests = digests;
            current.slots = slots;
            for (key, objects) in rendered {
                if let Some(old) = current.services.get(&key) {
                    current.holders.remove(old);
                    current.slots.release(&old.slots);
                }
                if let Some(new) = &objects {
                    current.holders.add(new);
                    current.slots.add(&new.slots);
                }
                match objects {
                    Some(objects) => current.services.insert(key, objects),
                    None => current.services.remove(&key),
                };
            }
        }
        Ok(stats)
    }

    /// Rewrites the chains and sets of ours that another program changed, from memory: a
    /// chain is declared, flushed and its rules added; a set or map is declared, flushed and
    /// refilled (an affinity set is only declared again: its elements are the clients'). A
    /// name memory does not know (someone added it to our table) makes the next sync full,
    /// which removes it. Returns how many objects were rewritten.
    fn repair(&mut self, family: IpFamily, names: &BTreeSet<String>) -> Result<usize, Failure> {
        let Some(current) = self.programmed.get(&family) else {
            return Ok(0);
        };
        let objects: Vec<&Objects> = std::iter::once(&current.base)
            .chain(current.services.values())
            .collect();
        let pending = self.stale_chains.get(&family);
        let mut repairs = transaction::Repairs::default();
        let mut unknown = Vec::new();
        let mut digest_chain = false;
        for name in names {
            if name == DIGEST_CHAIN {
                digest_chain = true;
            } else if let Some(set) = name.strip_prefix('@') {
                match objects
                    .iter()
                    .find_map(|o| Some((o.sets.get(set)?, o.elements.get(set))))
                {
                    Some((def, _)) if set.starts_with("affinity-") => {
                        repairs.sets.push((set, def, None))
                    }
                    Some((def, _)) => {
                        let elements = objects.iter().filter_map(|o| o.elements.get(set)).collect();
                        repairs.sets.push((set, def, Some(elements)));
                    }
                    None => unknown.push(name.clone()),
                }
            } else if let Some(chain) = objects.iter().find_map(|o| o.chains.get(name)) {
                repairs.chains.push((name, chain));
            } else if !pending.is_some_and(|p| p.contains_key(name)) {
                unknown.push(name.clone());
            }
        }
        if !unknown.is_empty() {
            warn!(?family, objects = ?unknown, "Objects another program added to our nftables table; the next sync is a full one");
            self.full_sync_wanted = true;
            // ... reading the table's names, since memory does not hold them.
            self.known.remove(&family);
        }
        let count = repairs.chains.len() + repairs.sets.len() + usize::from(digest_chain);
        if count == 0 {
            return Ok(0);
        }
        let mut text = transaction::repair(family_keyword(family), &repairs);
        if digest_chain {
            text.push_str(&transaction::digest_lines(family_keyword(family), &current.digests).0);
        }
        let names: Vec<String> = repairs
            .chains
            .iter()
            .map(|(n, _)| n.to_string())
            .chain(repairs.sets.iter().map(|(n, _, _)| format!("@{n}")))
            .chain(digest_chain.then(|| DIGEST_CHAIN.to_string()))
            .collect();
        self.apply(family, &text).map_err(Failure::unattributed)?;
        info!(?family, objects = ?names, "Rewrote our nftables objects another program changed");
        Ok(count)
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
    const MODE: ProxyMode = ProxyMode::Nftables;

    /// A full sync is also wanted when a restart that trusted the table's digests is due to
    /// read it back, when another program deleted or replaced our table, when change events
    /// were lost, and when another program added objects to our table.
    fn begin(
        &mut self,
        _families: &[IpFamily],
        _changes: &ChangeSummary,
        _full: bool,
    ) -> Result<bool, Failure> {
        self.last_transactions.clear();
        let now = Instant::now();
        let mut full = std::mem::take(&mut self.full_sync_wanted);
        // A restart that trusted the table's digests reads the table back a moment later.
        if self.unverified.values().any(|due| now >= *due) {
            full = true;
        }
        self.drifted.clear();
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
                self.drifted.entry(family).or_default().insert(name);
            }
        }
        if drift.lost {
            warn!("nftables change events were lost; doing a full sync");
            full = true;
            self.known.clear();
        }
        Ok(full)
    }

    /// Chains flushed a moment ago are deleted first.
    fn prepare(&mut self, family: IpFamily, state: &ProxyState) -> NftContext {
        self.delete_stale_chains(family);
        self.context(family, &state.node, &state.service_cidrs)
    }

    fn programmed_context(&self, family: IpFamily) -> Option<&NftContext> {
        self.programmed.get(&family).map(|p| &p.ctx)
    }

    fn full_sync(
        &mut self,
        family: IpFamily,
        ctx: NftContext,
        state: &ProxyState,
        quarantine: &Quarantine,
    ) -> Result<Stats, Failure> {
        self.program_all(family, ctx, state, quarantine)
    }

    fn partial_sync(
        &mut self,
        family: IpFamily,
        state: &ProxyState,
        changes: &ChangeSummary,
        _quarantine: &Quarantine,
    ) -> Result<Stats, Failure> {
        self.program_changed(family, state, changes)
    }

    /// What other programs changed is rewritten, unless the sync read the table back.
    fn settle(
        &mut self,
        family: IpFamily,
        _state: &ProxyState,
        full: bool,
        _quarantine: &Quarantine,
    ) -> Result<usize, Failure> {
        let drifted = self.drifted.remove(&family);
        match drifted {
            Some(names) if !full || self.last_full_sync_from_memory => self.repair(family, &names),
            _ => Ok(0),
        }
    }

    fn end(&mut self, _full: bool, report: &mut SyncReport) {
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

/// What a full sync reads of our table before it knows what it wants.
struct ReadBack {
    /// The table's chains (hashed here, on the reader's thread) and sets.
    chains: ChainSet,
    sets: BTreeSet<String>,
    /// The digests the table holds (see `digests`), if it holds digests of ours.
    digests: Option<Digests>,
    /// The elements of the top-level sets and maps present, unless the digests are to be
    /// trusted (then only the sets they do not vouch for are read, later), or when they cannot
    /// be read (the sets are then refilled).
    elements: Option<SetElements>,
}

/// Our table's names and digests, and, unless `trust`ing the digests, the elements of the
/// top-level sets and maps of `base` it holds.
fn read_table<N: Nftables>(
    nft: &mut N,
    family: IpFamily,
    base: &Objects,
    trust: bool,
) -> Result<ReadBack, Failure> {
    let names = nft.names(family, TABLE).map_err(Failure::unattributed)?;
    let digests = if names.chains.contains(DIGEST_CHAIN) {
        read_digests(nft, family)
    } else {
        None
    };
    let elements = if trust && digests.is_some() {
        None
    } else {
        let present = present_sets(base, &names.sets);
        if present.is_empty() {
            None
        } else {
            read_elements(nft, family, &present)
        }
    };
    Ok(ReadBack {
        chains: names.chains.into_iter().collect(),
        sets: names.sets,
        digests,
        elements,
    })
}

/// The top-level sets and maps of `base` that the table holds (name and declaration).
fn present_sets(base: &Objects, sets: &BTreeSet<String>) -> Vec<(String, String)> {
    base.sets
        .iter()
        .filter(|(name, _)| sets.contains(*name))
        .map(|(name, set)| (name.clone(), set.spec.clone()))
        .collect()
}

/// The digests our table's digest chain holds; `None` if it holds anything else.
fn read_digests<N: Nftables>(nft: &mut N, family: IpFamily) -> Option<Digests> {
    let chain = BTreeSet::from([DIGEST_CHAIN.to_string()]);
    let comments = nft
        .rule_comments(family, TABLE, &chain)
        .inspect_err(|err| warn!(?family, error = %err, "Cannot read our table's digests back"))
        .ok()?;
    let (count, comments) = comments.get(DIGEST_CHAIN)?;
    if *count == 0 || *count != comments.len() {
        return None;
    }
    Digests::parse(comments.iter().map(String::as_str))
}

/// The elements of `sets` (name and declaration); `None` when they cannot be read (the sets
/// are then refilled).
fn read_elements<N: Nftables>(
    nft: &mut N,
    family: IpFamily,
    sets: &[(String, String)],
) -> Option<SetElements> {
    nft.elements(family, TABLE, sets)
        .inspect_err(|err| {
            warn!(?family, error = %err, "Cannot read our sets' elements back; refilling them");
        })
        .ok()
}

/// Renders again the services of `services` whose chains lost their slots while the others
/// rendered (they then do without; an eviction never leads to another).
fn rerender_evicted(
    slots: &mut SlotTable,
    services: &mut BTreeMap<NamespacedName, Objects>,
    state: &ProxyState,
    ctx: &NftContext,
    digests: &mut Digests,
) {
    let evicted: Vec<NamespacedName> = slots
        .take_evicted(services.keys())
        .into_iter()
        .cloned()
        .collect();
    for key in evicted {
        if let (Some(ports), Some(objects)) = (state.services.get(&key), services.get_mut(&key)) {
            digests.remove(objects);
            *objects = service_objects(ports, state.endpoints.get(&key), ctx, slots);
            digests.add(objects);
        }
    }
    // Rendered again, they evict no one (their other chains hold their slots already).
    slots.take_evicted([]);
}

/// One service's objects as this proxier writes them: rendered, each chain stamped with its
/// digest.
fn service_objects(
    ports: &crate::model::ServicePortMap,
    endpoints: Option<&crate::model::EndpointsMap>,
    ctx: &NftContext,
    slots: &mut SlotTable,
) -> Objects {
    let mut objects = render_service(ports, endpoints, ctx, slots);
    stamp_digests(&mut objects);
    objects.shrink_to_fit();
    objects
}

/// The chains of `services` the kernel already holds exactly (see [`unchanged`]).
fn adoptable(services: &BTreeMap<NamespacedName, Objects>, kernel: &RuleComments) -> ChainSet {
    services
        .values()
        .flat_map(|objects| &objects.chains)
        .filter(|(name, chain)| unchanged(name, chain, kernel))
        .map(|(name, _)| name.clone())
        .collect()
}

/// Whether the kernel holds `chain` as we would write it: as many rules, and among their
/// comments the digest it would carry; for a chain without a digest (every rule carries a
/// comment of upstream's), the same comments. A rule changed in place under the same comment
/// is not seen.
fn unchanged(name: &str, chain: &Chain, kernel: &RuleComments) -> bool {
    let (count, comments) = kernel
        .get(name)
        .map(|(count, comments)| (*count, comments.as_slice()))
        .unwrap_or((0, &[]));
    if count != chain.rules.len() {
        return false;
    }
    match digest_of(chain) {
        Some(digest) => comments.iter().any(|c| c == digest),
        None => {
            let mut ours: Vec<&str> = chain
                .rules
                .iter()
                .filter_map(|rule| comment_of(rule))
                .collect();
            let mut theirs: Vec<&str> = comments.iter().map(String::as_str).collect();
            ours.sort_unstable();
            theirs.sort_unstable();
            ours == theirs
        }
    }
}

/// Ends a sync's transaction `text` with the digest chain's new rules, when the digests change.
fn with_digests(
    family: IpFamily,
    text: &mut String,
    stats: &mut Stats,
    held: &Digests,
    digests: &Digests,
) {
    if held != digests {
        let (lines, count) = transaction::digest_lines(family_keyword(family), digests);
        text.push_str(&lines);
        stats.lines += count;
    }
}

/// A failed transaction `input`, whose services' objects are `services`.
fn transaction_failure(
    error: NftError,
    input: &str,
    services: &BTreeMap<NamespacedName, Objects>,
) -> Failure {
    let line = match &error {
        NftError::Transaction { line, .. } => *line,
        _ => None,
    };
    Failure::at_line(error, input, line, "objects", |text| {
        owner_of_line(text, services)
    })
}

/// The service a transaction line belongs to: the one whose chain or set it names (the
/// command's object, or an element's verdict), or the one its comment names.
fn owner_of_line(
    line: &str,
    services: &BTreeMap<NamespacedName, Objects>,
) -> Option<NamespacedName> {
    let owns = |name: &str| {
        services
            .iter()
            .find(|(_, o)| o.chains.contains_key(name) || o.sets.contains_key(name))
            .map(|(key, _)| key.clone())
    };
    let words: Vec<&str> = line.split_whitespace().collect();
    let named = words.get(4).and_then(|name| owns(name));
    let by_verdict = || {
        words
            .windows(2)
            .filter(|w| w[0] == "goto" || w[0] == "jump")
            .find_map(|w| owns(w[1].trim_end_matches([',', '}'])))
    };
    let by_comment = || {
        let comment = line.split("comment \"").nth(1)?;
        service_in_comment(comment.split('"').next()?).filter(|s| services.contains_key(s))
    };
    named.or_else(by_verdict).or_else(by_comment)
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod upstream_tests;
