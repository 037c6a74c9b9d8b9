//! The iptables proxier: renders per service and family, decides full or partial sync, applies
//! with one iptables-restore per family, and remembers what it programmed so the next sync only
//! touches what changed. Full syncs happen at start, after a failure, when the canary chains are
//! gone (someone flushed the tables), when the node changes, and hourly as upstream.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use tracing::{debug, info, warn};

use super::names::is_service_chain;
use super::plan::{FullSyncExtras, RestoreStats, ServiceDelta, full_restore, partial_restore};
use super::programmed::{ProgrammedService, in_services};
use super::render::{
    BaseRules, KUBE_PROXY_CANARY, KUBE_SERVICES, NAT_CHAINS, NodePortAddresses, RenderContext,
    ServiceRules, render_base, render_service,
};
use super::settings::IptablesSettings;
use super::walk::WalkNotice;
use crate::config::ProxyMode;
use crate::model::{ChangeSummary, IpFamily, NamespacedName, NodeInfo, ProxyState};
use crate::proxier::context::FamilyContext;
use crate::proxier::driver::{Mode, SyncDriver, Written};
use crate::proxier::quarantine::{Failure, Quarantine, service_in_comment};
use crate::proxier::xtables::missing_jumps;
use crate::proxier::{SyncError, SyncReport};
use crate::sys::nf_tables::events::ChangeEvents;
use crate::sys::xtables::{Backend, Iptables, IptablesError, tokenize};

mod adopt;
mod apply;
mod drift;
mod full;
mod partial;

use crate::sys::host::net::{LocalAddresses, Sysctl, ensure_sysctl};

const ROUTE_LOCALNET: &str = "net/ipv4/conf/all/route_localnet";

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
    known: BTreeSet<IpFamily>,
    /// What other programs change in the kernel, when it can tell (the nft back end).
    events: Option<Box<dyn ChangeEvents>>,
    /// Chains (table, chain) someone else changed since the last sync, per family.
    drifted: BTreeMap<IpFamily, BTreeSet<(String, String)>>,
    /// Endpoint chains the last full sync kept by name, not checked yet (see `adopt.rs`).
    unverified: BTreeMap<IpFamily, adopt::Trusted>,
    /// Asks the daemon for a sync (to check the rest of `unverified`).
    wake: Option<Arc<dyn Fn() + Send + Sync>>,
    last_canary_check: Option<Instant>,
    /// Says in the log what KUBE-SERVICES' length costs each connection (set by the daemon's
    /// setup; tests and benchmarks leave it off).
    walk: Option<WalkNotice>,
    /// Failed restores so far (the metric's value).
    pub sync_failures: u64,
    /// When set, the restore input of the last sync is kept in `last_transactions` (tests,
    /// benchmarks).
    pub record_transactions: bool,
    /// The restore input of the last sync, when `record_transactions` is set.
    pub last_transactions: Vec<(IpFamily, String)>,
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
            known: BTreeSet::new(),
            events: None,
            drifted: BTreeMap::new(),
            unverified: BTreeMap::new(),
            wake: None,
            last_canary_check: None,
            walk: None,
            sync_failures: 0,
            record_transactions: false,
            last_transactions: Vec::new(),
        })
    }

    /// Asks for a sync with `wake` while endpoint chains kept by name wait to be checked.
    pub fn with_wake(mut self, wake: Arc<dyn Fn() + Send + Sync>) -> Self {
        self.mode.wake = Some(wake);
        self
    }

    /// Says in the log, at the first sync and as KUBE-SERVICES grows, what its length costs
    /// each new connection on `backend`.
    pub fn with_walk_notice(mut self, backend: Backend) -> Self {
        self.mode.walk = Some(WalkNotice::new(backend));
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
        let common = FamilyContext::new(
            family,
            node,
            self.settings.masquerade_mark,
            self.settings.masquerade_all,
            &self.settings.local_traffic,
        );
        let local = || {
            self.addresses
                .addresses()
                .into_iter()
                .filter(of_family)
                .collect()
        };
        let node_port_addresses = self
            .settings
            .node_port_addresses
            .addresses(common.node_ip, local);
        RenderContext {
            common,
            localhost_node_ports: self.settings.localhost_node_ports,
            localhost_proxy: self.settings.localhost_proxy,
            node_port_addresses,
            tcp_be_liberal: self.settings.tcp_be_liberal,
            nfacct: self.settings.nfacct,
        }
    }

    /// IPv4 localhost NodePorts need route_localnet (upstream sets it for the same reason).
    fn ensure_route_localnet(&mut self, ctx: &RenderContext) {
        let wants = ctx.common.family == IpFamily::V4
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
    /// Nothing beyond the proxier's own memory: drift found while verifying or adopting is
    /// kept there, as a full sync also records it.
    type Sync = ();
    const MODE: ProxyMode = ProxyMode::Iptables;

    /// A full sync is also wanted when a canary chain is gone (someone flushed the tables; they
    /// are looked for once a syncPeriod) or another program changed a whole table.
    fn begin(
        &mut self,
        families: &[IpFamily],
        _changes: &ChangeSummary,
        full: bool,
    ) -> Result<((), bool), Failure> {
        self.last_transactions.clear();
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
                    self.known.remove(&family);
                    wants_full = true;
                } else if self.events.is_none()
                    && let Err(err) = self.verify(family)
                {
                    warn!(?family, error = %err, "Cannot check our rules for changes by other programs");
                }
            }
        }
        Ok(((), self.take_drift() || wants_full))
    }

    /// IPv4 localhost NodePorts need route_localnet, set here when the context asks for them.
    fn prepare(&mut self, _sync: &mut (), family: IpFamily, state: &ProxyState) -> RenderContext {
        let ctx = self.context(family, &state.node);
        self.ensure_route_localnet(&ctx);
        ctx
    }

    fn programmed_context(&self, family: IpFamily) -> Option<&RenderContext> {
        self.programmed.get(&family).map(|p| &p.ctx)
    }

    fn full_sync(
        &mut self,
        _sync: &mut (),
        family: IpFamily,
        ctx: RenderContext,
        state: &ProxyState,
        quarantine: &Quarantine,
    ) -> Result<RestoreStats, Failure> {
        self.program_all(family, ctx, state, quarantine)
    }

    fn partial_sync(
        &mut self,
        _sync: &mut (),
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
        _sync: &mut (),
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
    fn end(&mut self, _sync: (), full: bool, report: &mut SyncReport) {
        if full {
            self.last_canary_check = Some(Instant::now());
        }
        for (family, programmed) in &self.programmed {
            let mut filter_rules = programmed.base.filter.len();
            let mut nat_rules = programmed.base.nat.len() + programmed.base.nat_services_tail.len();
            let mut no_local = (0, 0);
            let mut walked =
                in_services(&programmed.base.nat) + in_services(&programmed.base.nat_services_tail);
            for service in programmed.services.values() {
                walked += service.walked_rules as usize;
                no_local.0 += service.no_local_endpoints_internal as usize;
                no_local.1 += service.no_local_endpoints_external as usize;
                filter_rules += service.filter.len();
                nat_rules += service.nat.len() + service.chain_rules();
            }
            report.no_local_endpoints.push((*family, no_local));
            report.rules.push((*family, "filter", filter_rules));
            report.rules.push((*family, "nat", nat_rules));
            if let Some(walk) = &mut self.walk {
                walk.log(*family, walked);
            }
        }
    }
}
