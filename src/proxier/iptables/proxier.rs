//! The iptables proxier: renders per service and family, decides full or partial sync, applies
//! with one iptables-restore per family, and remembers what it programmed so the next sync only
//! touches what changed. Full syncs happen at start, after a failure, when the canary chains are
//! gone (someone flushed the tables), when the node changes, and hourly as upstream.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use super::names::is_service_chain;
use super::nfacct::NfacctCounters;
use super::programmed::ProgrammedService;
use super::render::{
    BaseRules, JumpRule, KUBE_PROXY_CANARY, KUBE_SERVICES, NAT_CHAINS, NodePortAddresses,
    RenderContext, ServiceRules, render_base, render_service,
};
use super::restore::{FullSyncExtras, RestoreStats, ServiceDelta, full_restore, partial_restore};
use crate::config::KubeProxyConfiguration;
use crate::model::{ChangeSummary, IpFamily, NamespacedName, NodeInfo, ProxyState};
use crate::proxier::local::{LocalTraffic, selected_node_port_ips};
use crate::proxier::quarantine::{self, Failure, Quarantine, service_in_comment};
use crate::proxier::{FULL_SYNC_PERIOD, Proxier, SyncError, SyncReport};
use crate::sys::iptables::{Iptables, IptablesError, jump_target, tokenize};
use crate::sys::nf_events::ChangeEvents;

mod adopt;
mod drift;
use crate::sys::net::{LocalAddresses, Sysctl, ensure_sysctl};

const ROUTE_LOCALNET: &str = "net/ipv4/conf/all/route_localnet";

/// The parts of the configuration this proxier uses.
#[derive(Clone, Debug)]
pub struct IptablesSettings {
    pub masquerade_mark: u32,
    pub masquerade_all: bool,
    pub localhost_node_ports: bool,
    /// How local pod traffic is recognised.
    pub local_traffic: LocalTraffic,
    /// CIDRs or `primary`, as configured.
    pub node_port_addresses: Vec<String>,
    pub tcp_be_liberal: bool,
    /// How often the canary chains are checked (syncPeriod).
    pub canary_interval: Duration,
    /// The kernel's packet counters the rules may name (none until the daemon creates them).
    pub nfacct: NfacctCounters,
}

impl IptablesSettings {
    /// Takes them from a validated configuration.
    pub fn from_config(config: &KubeProxyConfiguration) -> Self {
        IptablesSettings {
            masquerade_mark: config.masquerade_mark(),
            masquerade_all: config.iptables.masquerade_all,
            localhost_node_ports: config.iptables.localhost_node_ports.unwrap_or(true),
            local_traffic: LocalTraffic::from_config(config),
            node_port_addresses: config.node_port_addresses.clone(),
            tcp_be_liberal: config.conntrack.tcp_be_liberal,
            canary_interval: config.iptables.sync_period.0,
            nfacct: NfacctCounters::default(),
        }
    }
}

/// What is programmed in one family.
struct FamilyState {
    ctx: RenderContext,
    services: BTreeMap<NamespacedName, ProgrammedService>,
    /// The service-independent rules.
    base: BaseRules,
}

/// The iptables proxier over any [`Iptables`] (the real tools or the fake).
pub struct IptablesProxier<I: Iptables> {
    iptables: I,
    settings: IptablesSettings,
    addresses: Box<dyn LocalAddresses>,
    sysctl: Box<dyn Sysctl>,
    /// Families in use, fixed at the first sync from the node's addresses.
    families: Vec<IpFamily>,
    programmed: BTreeMap<IpFamily, FamilyState>,
    /// Families whose service chains in the kernel are exactly those `programmed` holds.
    chains_known: BTreeSet<IpFamily>,
    /// Services whose rules the kernel refused.
    quarantine: Quarantine,
    /// What other programs change in the kernel, when it can tell (the nft back end).
    events: Option<Box<dyn ChangeEvents>>,
    /// Chains (table, chain) someone else changed since the last sync, per family.
    drifted: BTreeMap<IpFamily, BTreeSet<(String, String)>>,
    /// Endpoint chains the last full sync kept by name, not checked yet (see `adopt.rs`).
    unverified: BTreeMap<IpFamily, adopt::Trusted>,
    /// Asks the daemon for a sync (to check the rest of `unverified`).
    wake: Option<Arc<dyn Fn() + Send + Sync>>,
    needs_full_sync: bool,
    last_full_sync: Option<Instant>,
    last_canary_check: Option<Instant>,
    /// Failed restores so far (the metric's value).
    pub restore_failures: u64,
    /// When set, the restore input of the last sync is kept in `last_restore` (tests, benchmarks).
    pub record_restores: bool,
    /// The restore input of the last sync, when `record_restores` is set.
    pub last_restore: Vec<(IpFamily, String)>,
}

impl<I: Iptables> IptablesProxier<I> {
    /// A proxier that will do a full sync first.
    pub fn new(
        iptables: I,
        settings: IptablesSettings,
        addresses: Box<dyn LocalAddresses>,
        sysctl: Box<dyn Sysctl>,
    ) -> Self {
        IptablesProxier {
            iptables,
            settings,
            addresses,
            sysctl,
            families: Vec::new(),
            programmed: BTreeMap::new(),
            chains_known: BTreeSet::new(),
            quarantine: Quarantine::default(),
            events: None,
            drifted: BTreeMap::new(),
            unverified: BTreeMap::new(),
            wake: None,
            needs_full_sync: true,
            last_full_sync: None,
            last_canary_check: None,
            restore_failures: 0,
            record_restores: false,
            last_restore: Vec::new(),
        }
    }

    /// Asks for a sync with `wake` while endpoint chains kept by name wait to be checked.
    pub fn with_wake(mut self, wake: Arc<dyn Fn() + Send + Sync>) -> Self {
        self.wake = Some(wake);
        self
    }

    /// How many endpoint chains kept by name at the last full sync are still to be checked.
    pub fn endpoint_chains_to_check(&self) -> usize {
        self.unverified.values().map(Vec::len).sum()
    }

    fn ask_for_sync(&self) {
        if let Some(wake) = &self.wake {
            wake();
        }
    }

    /// Repairs what other programs change in our chains as they change it (see `drift.rs`).
    pub fn with_change_events(mut self, events: Box<dyn ChangeEvents>) -> Self {
        self.events = Some(events);
        self
    }

    /// The kernel interface (for tests).
    pub fn iptables(&mut self) -> &mut I {
        &mut self.iptables
    }

    /// Makes the next sync a full one.
    pub fn force_full_sync(&mut self) {
        self.needs_full_sync = true;
    }

    fn context(&self, family: IpFamily, node: &NodeInfo) -> RenderContext {
        let of_family = |ip: &IpAddr| IpFamily::of(ip) == family;
        let local_detector = self.settings.local_traffic.detector(family, node);
        let node_ip = node.addresses.iter().copied().find(of_family);
        let local = || {
            self.addresses
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
        RenderContext {
            family,
            node_name: node.name.clone(),
            zone: node.zone().map(str::to_string),
            node_ip,
            masquerade_mark: self.settings.masquerade_mark,
            masquerade_all: self.settings.masquerade_all,
            local_detector,
            localhost_node_ports: self.settings.localhost_node_ports,
            node_port_addresses,
            tcp_be_liberal: self.settings.tcp_be_liberal,
            nfacct: self.settings.nfacct,
        }
    }

    /// IPv4 localhost NodePorts need route_localnet (upstream sets it for the same reason).
    fn ensure_route_localnet(&mut self, ctx: &RenderContext) {
        let wants = ctx.family == IpFamily::V4
            && ctx.localhost_node_ports
            && match &ctx.node_port_addresses {
                NodePortAddresses::All => true,
                NodePortAddresses::Only(ips) => ips.iter().any(IpAddr::is_loopback),
            };
        if wants && let Err(err) = ensure_sysctl(self.sysctl.as_mut(), ROUTE_LOCALNET, "1") {
            warn!(error = %err, "Cannot enable route_localnet; NodePorts on 127.0.0.1 will not work");
        }
    }

    fn canaries_present(&mut self, family: IpFamily) -> bool {
        ["mangle", "nat", "filter"].into_iter().all(|table| {
            self.iptables
                .chain_exists(family, table, KUBE_PROXY_CANARY)
                .unwrap_or(false)
        })
    }

    fn full_sync(
        &mut self,
        family: IpFamily,
        ctx: RenderContext,
        state: &ProxyState,
    ) -> Result<RestoreStats, Failure> {
        let base = render_base(&ctx);
        // Only what is ours is read: the rules of the built-in chains our jumps start from, our
        // chains' rules (to keep those already right), and nat's chain names (for stale service
        // chains) when memory cannot tell them: at the first full sync (a restart finds an
        // earlier run's chains) and after a failed restore. They are read while the services
        // render.
        let known: Option<BTreeSet<String>> = match self.programmed.get(&family) {
            Some(programmed) if self.chains_known.contains(&family) => Some(
                programmed
                    .services
                    .values()
                    .flat_map(|s| s.chain_names().map(str::to_string))
                    .chain(
                        NAT_CHAINS
                            .iter()
                            .chain([&KUBE_PROXY_CANARY])
                            .map(|c| c.to_string()),
                    )
                    .collect(),
            ),
            _ => None,
        };
        let previous = self.programmed.get(&family);
        let quarantine = &self.quarantine;
        let iptables = &mut self.iptables;
        let (services, existing) = std::thread::scope(|scope| {
            // Without a thread for the reader, this sync fails (and the next one tries again).
            let names = known.is_none().then(|| {
                std::thread::Builder::new()
                    .name("iptables-read".into())
                    .spawn_scoped(scope, move || iptables.chain_names(family, "nat"))
            });
            let services: BTreeMap<NamespacedName, ServiceRules> = state
                .services
                .iter()
                .filter(|(key, _)| !quarantine.contains(key))
                .map(|(key, ports)| {
                    let rules = render_service(ports, state.endpoints.get(key), &ctx);
                    (key.clone(), rules)
                })
                .filter(|(_, rules)| !rules.is_empty())
                .collect();
            let existing = match names {
                Some(Ok(reader)) => reader.join().unwrap_or(Err(IptablesError::ReaderPanicked)),
                Some(Err(err)) => Err(IptablesError::NoThread(err.to_string())),
                None => Ok(known.unwrap_or_default()),
            };
            (services, existing)
        });
        let existing = existing.map_err(Failure::unattributed)?;
        // A quarantined service keeps what the kernel last accepted for it: its rules in the
        // shared chains are written again from memory, its own chains are left as they are.
        let held: BTreeMap<NamespacedName, ProgrammedService> = previous
            .map(|previous| {
                previous
                    .services
                    .iter()
                    .filter(|(key, _)| {
                        self.quarantine.contains(key) && state.services.contains_key(*key)
                    })
                    .map(|(key, programmed)| (key.clone(), programmed.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let mut to_write = services;
        for (key, programmed) in &held {
            to_write.insert(
                key.clone(),
                ServiceRules {
                    filter: programmed.filter.to_vec(),
                    nat: programmed.nat.to_vec(),
                    ..ServiceRules::default()
                },
            );
        }
        let services = to_write;
        let held_chains: BTreeSet<&str> = held.values().flat_map(|s| s.chain_names()).collect();
        let wanted: HashSet<&str, ahash::RandomState> = services
            .values()
            .flat_map(|s| s.chains.keys().map(String::as_str))
            .chain(held_chains.iter().copied())
            .collect();
        let stale: Vec<String> = existing
            .iter()
            .filter(|chain| is_service_chain(chain) && !wanted.contains(chain.as_str()))
            .cloned()
            .collect();
        let missing = missing_jumps(&mut self.iptables, family, &base.jumps())
            .map_err(Failure::unattributed)?;
        // Traffic reaches our chains when the jumps into KUBE-SERVICES are in place.
        let reachable = !missing.iter().any(|jump| jump.to == KUBE_SERVICES);
        let (mut kept, trusted) = self
            .kept_chains(family, &base, &services, &existing)
            .map_err(Failure::unattributed)?;
        kept.nat.extend(held_chains.iter().map(|c| c.to_string()));
        let chain_count = wanted.len() - kept.nat.len().min(wanted.len()) + stale.len();
        let (text, stats) = full_restore(
            &base,
            &services,
            &FullSyncExtras {
                stale_chains: &stale,
                missing_jumps: &missing,
                chains_per_transaction: self
                    .iptables
                    .chains_per_transaction(chain_count, reachable),
                kept: kept.clone(),
            },
        );
        if !kept.is_empty() {
            info!(
                family = family.name(),
                kept = kept.len(),
                written = stats.nat_chains,
                stale = stale.len(),
                kept_by_name = trusted.len(),
                "Full sync: left the chains that already held the right rules"
            );
        }
        if !text.is_empty() {
            self.restore(family, &text)
                .map_err(|err| restore_failure(err, &text, &services))?;
        }
        let mut programmed: BTreeMap<NamespacedName, ProgrammedService> = services
            .iter()
            .filter(|(key, _)| !held.contains_key(*key))
            .map(|(key, rules)| (key.clone(), ProgrammedService::of(rules)))
            .collect();
        programmed.extend(held);
        self.programmed.insert(
            family,
            FamilyState {
                ctx,
                services: programmed,
                base,
            },
        );
        self.drifted.remove(&family);
        self.chains_known.insert(family);
        if trusted.is_empty() {
            self.unverified.remove(&family);
        } else {
            self.unverified.insert(family, trusted);
            self.ask_for_sync();
        }
        Ok(stats)
    }

    fn partial_sync(
        &mut self,
        family: IpFamily,
        state: &ProxyState,
        changes: &ChangeSummary,
    ) -> Result<RestoreStats, Failure> {
        let Some(current) = self.programmed.get(&family) else {
            return Err(Failure::unattributed("no full sync yet"));
        };
        let rendered: Vec<(NamespacedName, Option<ServiceRules>)> = changes
            .changed_services
            .iter()
            .map(|key| {
                let rules = state
                    .services
                    .get(key)
                    .map(|ports| render_service(ports, state.endpoints.get(key), &current.ctx))
                    .filter(|rules| !rules.is_empty());
                (key.clone(), rules)
            })
            .collect();
        let deltas: Vec<ServiceDelta<'_>> = rendered
            .iter()
            .map(|(key, new)| ServiceDelta {
                old: current.services.get(key),
                new: new.as_ref(),
            })
            .collect();
        let Some((text, stats)) = partial_restore(&deltas) else {
            return Ok(RestoreStats::default());
        };
        let programmed: Vec<(NamespacedName, Option<ProgrammedService>)> = rendered
            .iter()
            .map(|(key, new)| (key.clone(), new.as_ref().map(ProgrammedService::of)))
            .collect();
        let involved: BTreeMap<NamespacedName, ProgrammedService> = programmed
            .iter()
            .filter_map(|(key, new)| {
                let rules = new.as_ref().or_else(|| current.services.get(key))?;
                Some((key.clone(), rules.clone()))
            })
            .collect();
        self.restore(family, &text)
            .map_err(|err| restore_failure(err, &text, &involved))?;
        if let Some(current) = self.programmed.get_mut(&family) {
            for (key, programmed) in programmed {
                match programmed {
                    Some(programmed) => current.services.insert(key, programmed),
                    None => current.services.remove(&key),
                };
            }
        }
        Ok(stats)
    }

    fn restore(&mut self, family: IpFamily, text: &str) -> Result<(), IptablesError> {
        if self.record_restores {
            self.last_restore.push((family, text.to_string()));
        }
        self.iptables.restore(family, text).inspect_err(|_| {
            // Some of its transactions may be in: the kernel's chains are read again next time.
            self.chains_known.remove(&family);
            self.restore_failures += 1;
        })
    }

    /// Programs one sync; on any error the next sync is a full one.
    fn sync_all(
        &mut self,
        state: &ProxyState,
        changes: &ChangeSummary,
    ) -> Result<SyncReport, SyncError> {
        self.last_restore.clear();
        // What the back end read in the last sync may have changed since.
        self.iptables.forget_reads();
        if self.families.is_empty() {
            self.families = state.node.families();
            info!(families = ?self.families, "iptables proxier serving IP families");
        }
        let now = Instant::now();
        let canary_due = self
            .last_canary_check
            .is_none_or(|t| now.duration_since(t) >= self.settings.canary_interval);
        let hourly = self
            .last_full_sync
            .is_some_and(|t| now.duration_since(t) >= FULL_SYNC_PERIOD);
        let mut full = self.needs_full_sync || self.last_full_sync.is_none() || hourly;
        self.quarantine.release_changed(changes);
        if hourly {
            self.quarantine.release_all();
        }
        if canary_due && !full {
            self.last_canary_check = Some(now);
            for family in self.families.clone() {
                if !self.canaries_present(family) {
                    warn!(
                        ?family,
                        "iptables canary chain missing (tables were flushed?); doing a full sync"
                    );
                    // Whatever else was removed with it, memory no longer says what exists.
                    self.chains_known.remove(&family);
                    full = true;
                } else if self.events.is_none()
                    && let Err(err) = self.verify(family)
                {
                    warn!(?family, error = %err, "Cannot check our rules for changes by other programs");
                }
            }
        }
        if self.take_drift() {
            full = true;
        }
        let mut report = SyncReport {
            full,
            ..SyncReport::default()
        };
        let mut written = Vec::new();
        for family in self.families.clone() {
            let ctx = self.context(family, &state.node);
            let ctx_changed = self.programmed.get(&family).is_none_or(|p| p.ctx != ctx);
            self.ensure_route_localnet(&ctx);
            let mut result = if full || ctx_changed {
                report.full = true;
                self.full_sync(family, ctx.clone(), state)
            } else {
                self.partial_sync(family, state, changes)
            };
            // The kernel refused one service's rules: skip it, and program the rest now.
            let mut skipped = 0;
            while let Err(Failure {
                culprit: Some(service),
                error,
            }) = &result
            {
                if skipped == quarantine::MAX_PER_SYNC
                    || !self.quarantine.add(service.clone(), error.to_string())
                {
                    break;
                }
                skipped += 1;
                report.full = true;
                result = self.full_sync(family, ctx.clone(), state);
            }
            if result.is_ok() && !report.full {
                result = self
                    .check_trusted(family, state)
                    .and_then(|left| {
                        if left {
                            self.ask_for_sync();
                        }
                        self.repair(family, state)
                    })
                    .map(|repaired| {
                        report.repaired_chains += repaired;
                        RestoreStats::default()
                    });
            }
            match result.map_err(|failure| failure.error) {
                Ok(stats) => {
                    debug!(
                        ?family,
                        full = report.full,
                        filter_rules = stats.filter_rules,
                        nat_rules = stats.nat_rules,
                        nat_chains = stats.nat_chains,
                        lines = stats.lines,
                        "Reloaded iptables rules"
                    );
                    report.restore_lines += stats.lines;
                    written.push((family, "filter", stats.filter_rules));
                    written.push((family, "nat", stats.nat_rules));
                }
                Err(err) => {
                    self.needs_full_sync = true;
                    return Err(err);
                }
            }
        }
        if report.full {
            self.needs_full_sync = false;
            self.last_full_sync = Some(now);
            self.last_canary_check = Some(now);
        }
        report.skipped_services = self.quarantine.len();
        report.service_ports = state.services.values().map(|ports| ports.len()).sum();
        report.services_written = if report.full {
            state.services.len()
        } else {
            changes.changed_services.len()
        };
        // Both in memory, from what each service programmed: no kernel read.
        for (family, programmed) in &self.programmed {
            let mut filter_rules = programmed.base.filter.len();
            let mut nat_rules = programmed.base.nat.len() + programmed.base.nat_services_tail.len();
            let mut no_local = (0, 0);
            for service in programmed.services.values() {
                no_local.0 += service.no_local_endpoints_internal as usize;
                no_local.1 += service.no_local_endpoints_external as usize;
                filter_rules += service.filter.len();
                nat_rules += service.nat.len() + service.chain_rules();
            }
            report.no_local_endpoints.push((*family, no_local));
            report
                .iptables_rules
                .push((*family, "filter", filter_rules));
            report.iptables_rules.push((*family, "nat", nat_rules));
        }
        report.iptables_written = written;
        Ok(report)
    }
}

impl<I: Iptables> Proxier for IptablesProxier<I> {
    fn mode(&self) -> &'static str {
        "iptables"
    }

    fn sync(
        &mut self,
        state: &ProxyState,
        changes: &ChangeSummary,
    ) -> Result<SyncReport, SyncError> {
        self.sync_all(state, changes)
    }
}

/// A service's rules, as far as telling whose a chain is goes.
trait OwnsChains {
    fn owns_chain(&self, chain: &str) -> bool;
}

impl OwnsChains for ServiceRules {
    fn owns_chain(&self, chain: &str) -> bool {
        self.chains.contains_key(chain)
    }
}

impl OwnsChains for ProgrammedService {
    fn owns_chain(&self, chain: &str) -> bool {
        self.chain(chain).is_some()
    }
}

/// A failed restore of `input`, whose services' rules are `services`.
fn restore_failure<S: OwnsChains>(
    error: IptablesError,
    input: &str,
    services: &BTreeMap<NamespacedName, S>,
) -> Failure {
    let line = match &error {
        IptablesError::Restore { line, .. } => *line,
        _ => None,
    };
    Failure::at_line(error, input, line, "rules", |text| {
        owner_of_line(text, services)
    })
}

/// The service a line of restore input belongs to: one whose chain it names, or the one its
/// comment names.
fn owner_of_line<S: OwnsChains>(
    line: &str,
    services: &BTreeMap<NamespacedName, S>,
) -> Option<NamespacedName> {
    let words = tokenize(line).ok()?;
    let by_chain = words.iter().find_map(|word| {
        let chain = word.trim_start_matches(':');
        is_service_chain(chain)
            .then(|| {
                services
                    .iter()
                    .find(|(_, rules)| rules.owns_chain(chain))
                    .map(|(key, _)| key.clone())
            })
            .flatten()
    });
    by_chain.or_else(|| {
        let comment = words
            .iter()
            .position(|w| w == "--comment")
            .and_then(|i| words.get(i + 1))?;
        service_in_comment(comment).filter(|service| services.contains_key(service))
    })
}

/// The jumps of `jumps` that their built-in chains lack, from a read of those chains alone:
/// their rules' kernel form where the back end reads chains one at a time (nft, over netlink; a
/// jump is there when a rule holds exactly its form), else their text (`iptables -S`, matched
/// by target and comment).
pub(crate) fn missing_jumps<I: Iptables + ?Sized>(
    iptables: &mut I,
    family: IpFamily,
    jumps: &[JumpRule],
) -> Result<Vec<JumpRule>, IptablesError> {
    let mut missing = Vec::new();
    for table in ["filter", "nat"] {
        let from = jump_sources(jumps, table);
        if from.is_empty() {
            continue;
        }
        if let Some(fingerprint) = iptables.rule_fingerprinter()
            && let Some(held) = iptables.chain_fingerprints(family, table, &from)?
        {
            missing.extend(jumps.iter().filter(|jump| {
                let expected = fingerprint(family, &jump.rule_spec());
                let rules = from
                    .iter()
                    .position(|chain| *chain == jump.from)
                    .and_then(|at| held.get(at));
                jump.table == table
                    && !rules.is_some_and(|rules| expected.is_some_and(|f| rules.contains(&f)))
            }));
            continue;
        }
        let rules = iptables.chain_rules(family, table, &from)?;
        missing.extend(jumps.iter().filter(|jump| {
            jump.table == table
                && !rules
                    .get(jump.from)
                    .is_some_and(|rules| rules.iter().any(|rule| is_jump(rule, jump)))
        }));
    }
    Ok(missing)
}

/// The built-in chains of `table` that `jumps` start from.
fn jump_sources(jumps: &[JumpRule], table: &str) -> Vec<&'static str> {
    let mut from: Vec<&'static str> = jumps
        .iter()
        .filter(|j| j.table == table)
        .map(|j| j.from)
        .collect();
    from.sort_unstable();
    from.dedup();
    from
}

/// Whether a rule of a built-in chain is `jump` (our comment and target; the tools may print
/// its matches in another order than we wrote them).
fn is_jump(rule: &str, jump: &JumpRule) -> bool {
    jump_target(rule) == Some(jump.to)
        && jump
            .spec
            .split("--comment ")
            .nth(1)
            .is_none_or(|comment| rule.contains(comment))
}
