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
    BaseRules, KUBE_PROXY_CANARY, KUBE_SERVICES, NAT_CHAINS, NodePortAddresses, RenderContext,
    ServiceRules, render_base, render_service,
};
use super::restore::{FullSyncExtras, RestoreStats, ServiceDelta, full_restore, partial_restore};
use crate::config::KubeProxyConfiguration;
use crate::config::ProxyMode;
use crate::model::{ChangeSummary, IpFamily, NamespacedName, NodeInfo, ProxyState};
use crate::proxier::SyncReport;
use crate::proxier::driver::{Mode, SyncDriver, Written};
use crate::proxier::local::{LocalTraffic, selected_node_port_ips};
use crate::proxier::quarantine::{Failure, Quarantine, service_in_comment};
use crate::proxier::xtables::missing_jumps;
use crate::sys::iptables::{Iptables, IptablesError, tokenize};
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
pub type IptablesProxier<I> = SyncDriver<IptablesMode<I>>;

/// iptables mode's stages, which [`SyncDriver`] runs.
pub struct IptablesMode<I: Iptables> {
    iptables: I,
    settings: IptablesSettings,
    addresses: Box<dyn LocalAddresses>,
    sysctl: Box<dyn Sysctl>,
    programmed: BTreeMap<IpFamily, FamilyState>,
    /// Families whose service chains in the kernel are exactly those `programmed` holds.
    chains_known: BTreeSet<IpFamily>,
    /// What other programs change in the kernel, when it can tell (the nft back end).
    events: Option<Box<dyn ChangeEvents>>,
    /// Chains (table, chain) someone else changed since the last sync, per family.
    drifted: BTreeMap<IpFamily, BTreeSet<(String, String)>>,
    /// Endpoint chains the last full sync kept by name, not checked yet (see `adopt.rs`).
    unverified: BTreeMap<IpFamily, adopt::Trusted>,
    /// Asks the daemon for a sync (to check the rest of `unverified`).
    wake: Option<Arc<dyn Fn() + Send + Sync>>,
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
        SyncDriver::drive(IptablesMode {
            iptables,
            settings,
            addresses,
            sysctl,
            programmed: BTreeMap::new(),
            chains_known: BTreeSet::new(),
            events: None,
            drifted: BTreeMap::new(),
            unverified: BTreeMap::new(),
            wake: None,
            last_canary_check: None,
            restore_failures: 0,
            record_restores: false,
            last_restore: Vec::new(),
        })
    }

    /// Asks for a sync with `wake` while endpoint chains kept by name wait to be checked.
    pub fn with_wake(mut self, wake: Arc<dyn Fn() + Send + Sync>) -> Self {
        self.mode.wake = Some(wake);
        self
    }

    /// Repairs what other programs change in our chains as they change it (see `drift.rs`).
    pub fn with_change_events(mut self, events: Box<dyn ChangeEvents>) -> Self {
        self.mode.events = Some(events);
        self
    }
}

impl<I: Iptables> IptablesMode<I> {
    /// How many endpoint chains kept by name at the last full sync are still to be checked.
    pub fn endpoint_chains_to_check(&self) -> usize {
        self.unverified.values().map(Vec::len).sum()
    }

    fn ask_for_sync(&self) {
        if let Some(wake) = &self.wake {
            wake();
        }
    }

    /// The kernel interface (for tests).
    pub fn iptables(&mut self) -> &mut I {
        &mut self.iptables
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

    /// Programs every service of `family` (see [`Mode::full_sync`]).
    fn program_all(
        &mut self,
        family: IpFamily,
        ctx: RenderContext,
        state: &ProxyState,
        quarantine: &Quarantine,
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
                        quarantine.contains(key) && state.services.contains_key(*key)
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

    /// Programs the changed services of `family` (see [`Mode::partial_sync`]).
    fn program_changed(
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
}

impl Written for RestoreStats {
    fn lines(&self) -> usize {
        self.lines
    }

    fn log(&self, family: IpFamily, full: bool) {
        debug!(
            ?family,
            full,
            filter_rules = self.filter_rules,
            nat_rules = self.nat_rules,
            nat_chains = self.nat_chains,
            lines = self.lines,
            "Reloaded iptables rules"
        );
    }

    fn record(&self, family: IpFamily, report: &mut SyncReport) {
        report
            .rules_written
            .push((family, "filter", self.filter_rules));
        report.rules_written.push((family, "nat", self.nat_rules));
    }
}

impl<I: Iptables> Mode for IptablesMode<I> {
    type Context = RenderContext;
    type Written = RestoreStats;
    const MODE: ProxyMode = ProxyMode::Iptables;

    /// A full sync is also wanted when a canary chain is gone (someone flushed the tables; they
    /// are looked for once a syncPeriod) or another program changed a whole table.
    fn begin(
        &mut self,
        families: &[IpFamily],
        _changes: &ChangeSummary,
        full: bool,
    ) -> Result<bool, Failure> {
        self.last_restore.clear();
        // What the back end read in the last sync may have changed since.
        self.iptables.forget_reads();
        let now = Instant::now();
        let canary_due = self
            .last_canary_check
            .is_none_or(|t| now.duration_since(t) >= self.settings.canary_interval);
        let mut wants_full = false;
        if canary_due && !full {
            self.last_canary_check = Some(now);
            for &family in families {
                if !self.canaries_present(family) {
                    warn!(
                        ?family,
                        "iptables canary chain missing (tables were flushed?); doing a full sync"
                    );
                    // Whatever else was removed with it, memory no longer says what exists.
                    self.chains_known.remove(&family);
                    wants_full = true;
                } else if self.events.is_none()
                    && let Err(err) = self.verify(family)
                {
                    warn!(?family, error = %err, "Cannot check our rules for changes by other programs");
                }
            }
        }
        Ok(self.take_drift() || wants_full)
    }

    /// IPv4 localhost NodePorts need route_localnet, set here when the context asks for them.
    fn prepare(&mut self, family: IpFamily, state: &ProxyState) -> RenderContext {
        let ctx = self.context(family, &state.node);
        self.ensure_route_localnet(&ctx);
        ctx
    }

    fn programmed_context(&self, family: IpFamily) -> Option<&RenderContext> {
        self.programmed.get(&family).map(|p| &p.ctx)
    }

    fn full_sync(
        &mut self,
        family: IpFamily,
        ctx: RenderContext,
        state: &ProxyState,
        quarantine: &Quarantine,
    ) -> Result<RestoreStats, Failure> {
        self.program_all(family, ctx, state, quarantine)
    }

    fn partial_sync(
        &mut self,
        family: IpFamily,
        state: &ProxyState,
        changes: &ChangeSummary,
        _quarantine: &Quarantine,
    ) -> Result<RestoreStats, Failure> {
        self.program_changed(family, state, changes)
    }

    /// After a partial sync: the endpoint chains a restart kept by name are checked a few at
    /// a time (a sync is asked for while some are left), and chains others changed repaired.
    fn settle(
        &mut self,
        family: IpFamily,
        state: &ProxyState,
        full: bool,
        quarantine: &Quarantine,
    ) -> Result<usize, Failure> {
        if full {
            return Ok(0);
        }
        if self.check_trusted(family, state, quarantine)? {
            self.ask_for_sync();
        }
        self.repair(family, state, quarantine)
    }

    /// Rule counts per family and table, from what each service programmed: no kernel read.
    fn end(&mut self, full: bool, report: &mut SyncReport) {
        if full {
            self.last_canary_check = Some(Instant::now());
        }
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
            report.rules.push((*family, "filter", filter_rules));
            report.rules.push((*family, "nat", nat_rules));
        }
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
