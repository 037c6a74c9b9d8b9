//! The IPVS proxier: reads what the kernel holds once per sync, then, family by family, renders
//! what it should hold, applies the difference over netlink, syncs the family's ipsets in one
//! batch and rewrites its constant iptables rules with one iptables-restore. A full sync starts
//! from the kernel's real state, so a failure part-way is repaired by the next one, and state
//! removed by hand comes back.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use tracing::{debug, info, warn};

use super::aggregate::{Aggregate, Touched};
use super::plan::{Observed, Operation, diff};
use super::render::{DesiredIpvs, IpvsContext, SETS, set_name};
use super::settings::IpvsSettings;
use crate::config::ProxyMode;
use crate::model::{ChangeSummary, IpFamily, ProxyState};
use crate::proxier::driver::{Mode, SyncDriver, Written};
use crate::proxier::quarantine::{self, Failure, Quarantine, Refusals};
use crate::proxier::xtables::{JumpRule, missing_jumps};
use crate::proxier::{SyncError, SyncReport};
use crate::sys::host::link::{DummyLinks, Links};
use crate::sys::host::net::{LocalAddresses, Sysctl, ensure_sysctl};
use crate::sys::ipset::{Ipsets, SetEntries, SystemIpset, parse_save, sync_input};
use crate::sys::ipvs::codec::{CMD_DEL_DEST, CMD_NEW_DEST, CMD_SET_DEST};
use crate::sys::ipvs::{Ipvs, IpvsClient};
use crate::sys::xtables::{Iptables, table_section};

mod adopt;
mod apply;
mod partial;

/// The dummy link every service address is bound to.
pub const DUMMY_LINK: &str = "kube-ipvs0";

/// upstream's jumps from built-in chains in IPVS mode.
pub const IPVS_JUMP_RULES: [JumpRule; 9] = [
    JumpRule {
        table: "nat",
        from: "OUTPUT",
        to: "KUBE-SERVICES",
        spec: "-m comment --comment \"kubernetes service portals\"",
    },
    JumpRule {
        table: "nat",
        from: "PREROUTING",
        to: "KUBE-SERVICES",
        spec: "-m comment --comment \"kubernetes service portals\"",
    },
    JumpRule {
        table: "nat",
        from: "POSTROUTING",
        to: "KUBE-POSTROUTING",
        spec: "-m comment --comment \"kubernetes postrouting rules\"",
    },
    JumpRule {
        table: "filter",
        from: "FORWARD",
        to: "KUBE-FORWARD",
        spec: "-m comment --comment \"kubernetes forwarding rules\"",
    },
    JumpRule {
        table: "filter",
        from: "INPUT",
        to: "KUBE-NODE-PORT",
        spec: "-m comment --comment \"kubernetes health check rules\"",
    },
    JumpRule {
        table: "filter",
        from: "INPUT",
        to: "KUBE-PROXY-FIREWALL",
        spec: "-m comment --comment \"kube-proxy firewall rules\"",
    },
    JumpRule {
        table: "filter",
        from: "FORWARD",
        to: "KUBE-PROXY-FIREWALL",
        spec: "-m comment --comment \"kube-proxy firewall rules\"",
    },
    JumpRule {
        table: "filter",
        from: "INPUT",
        to: "KUBE-IPVS-FILTER",
        spec: "-m comment --comment \"kubernetes ipvs access filter\"",
    },
    JumpRule {
        table: "filter",
        from: "OUTPUT",
        to: "KUBE-IPVS-OUT-FILTER",
        spec: "-m comment --comment \"kubernetes ipvs access filter\"",
    },
];

/// The IPVS proxier.
pub type IpvsProxier<V = IpvsClient, L = Links, S = SystemIpset> = SyncDriver<IpvsMode<V, L, S>>;

/// IPVS mode's stages, which [`SyncDriver`] runs.
pub struct IpvsMode<V: Ipvs = IpvsClient, L: DummyLinks = Links, S: Ipsets = SystemIpset> {
    pub(crate) ipvs: V,
    pub(crate) links: L,
    pub(crate) ipset: S,
    iptables: Box<dyn Iptables>,
    sysctl: Box<dyn Sysctl>,
    addresses: Box<dyn LocalAddresses>,
    settings: IpvsSettings,
    /// Virtual servers this process programmed, by family and key (so stale ones on node
    /// addresses go too).
    programmed: BTreeMap<IpFamily, BTreeSet<String>>,
    initialized: bool,
    /// What the last successful sync left in the kernel; None forces the next sync to read it all.
    applied: Option<Applied>,
    /// Per family, the context and per-service fragments of the last render.
    aggregates: BTreeMap<IpFamily, (IpvsContext, Aggregate)>,
    /// Virtual servers, addresses and set entries the kernel refused, with why (applied one by
    /// one, a refused object costs only itself: no quarantine).
    refused: Refusals,
}

/// The kernel state as the last successful sync left it, so a sync of a few changed services
/// diffs against memory instead of dumping every virtual server's real servers.
struct Applied {
    kernel: Observed,
    sets: SetEntries,
    iptables: Vec<(IpFamily, String)>,
}

/// One sync's view of the kernel, shared by its families.
pub struct KernelView {
    depth: Depth,
    /// The families this node serves.
    families: Vec<IpFamily>,
    link: u32,
    observed: Observed,
    /// Whether `observed` was read from the kernel in full (else it is memory).
    read_all: bool,
    /// Local addresses of every link but kube-ipvs0, loopback and IPv6 link-local ones left out.
    local: Vec<IpAddr>,
    /// Our sets' entries: memory's, then each family's as its sync leaves them.
    sets: SetEntries,
    /// Each family's iptables input of the last sync, and of this one.
    previous_iptables: Vec<(IpFamily, String)>,
    iptables: Vec<(IpFamily, String)>,
}

/// How much of the kernel a sync reads before diffing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Depth {
    /// Everything: every virtual server's real servers, the sets, the iptables jumps.
    Full,
    /// A periodic sync with nothing changed: the virtual server list, kube-ipvs0's addresses, the
    /// real servers, our sets and the iptables rules are checked (drift repair).
    Check,
    /// Changed services only: memory, plus the real servers of draining virtual servers.
    Changes,
}

/// What a sync of a few services touches: their virtual servers and addresses, and their set
/// entries (set name, entry).
struct Scope {
    touched: Touched,
    entries: BTreeSet<(String, String)>,
}

/// What one family's sync changed in the kernel.
#[derive(Debug, Default)]
pub struct Changed {
    /// IPVS and address operations the kernel took.
    operations: usize,
    /// Rules of the family's iptables input, per table.
    rules: [(&'static str, usize); 2],
}

/// The sysctls IPVS mode needs (upstream's, set once at start and by `--init-only`).
pub fn sysctls(strict_arp: bool) -> Vec<(&'static str, &'static str)> {
    let mut wanted = vec![
        ("net/ipv4/vs/conntrack", "1"),
        ("net/ipv4/vs/expire_nodest_conn", "1"),
        ("net/ipv4/vs/expire_quiescent_template", "1"),
        ("net/ipv4/ip_forward", "1"),
    ];
    if strict_arp {
        wanted.push(("net/ipv4/conf/all/arp_ignore", "1"));
        wanted.push(("net/ipv4/conf/all/arp_announce", "2"));
    }
    wanted
}

impl IpvsProxier {
    /// Opens the kernel interfaces (in this thread's network namespace).
    pub fn new(
        settings: IpvsSettings,
        iptables: Box<dyn Iptables>,
        sysctl: Box<dyn Sysctl>,
        addresses: Box<dyn LocalAddresses>,
    ) -> Result<Self, SyncError> {
        let kernel = IpvsKernel {
            ipvs: IpvsClient::connect().map_err(SyncError::from)?,
            links: Links::open().map_err(SyncError::from)?,
            ipset: SystemIpset,
            iptables,
            sysctl,
            addresses,
        };
        Ok(IpvsProxier::on(kernel, settings))
    }
}

/// The kernel surfaces IPVS mode programs.
pub struct IpvsKernel<V, L, S> {
    pub ipvs: V,
    pub links: L,
    pub ipset: S,
    pub iptables: Box<dyn Iptables>,
    pub sysctl: Box<dyn Sysctl>,
    pub addresses: Box<dyn LocalAddresses>,
}

impl<V: Ipvs, L: DummyLinks, S: Ipsets> IpvsProxier<V, L, S> {
    /// The proxier on these kernel surfaces (the system's, or fakes).
    pub fn on(kernel: IpvsKernel<V, L, S>, settings: IpvsSettings) -> Self {
        SyncDriver::drive(IpvsMode {
            ipvs: kernel.ipvs,
            links: kernel.links,
            ipset: kernel.ipset,
            iptables: kernel.iptables,
            sysctl: kernel.sysctl,
            addresses: kernel.addresses,
            settings,
            programmed: BTreeMap::new(),
            initialized: false,
            applied: None,
            aggregates: BTreeMap::new(),
            refused: Refusals::default(),
        })
    }
}

impl<V: Ipvs, L: DummyLinks, S: Ipsets> IpvsMode<V, L, S> {
    /// The sysctls and timeouts upstream sets once, at start.
    fn initialize(&mut self) {
        for (name, value) in sysctls(self.settings.strict_arp) {
            if let Err(err) = ensure_sysctl(self.sysctl.as_mut(), name, value) {
                warn!(error = %err, "Failed to set sysctl");
            }
        }
        let (tcp, tcp_fin, udp) = self.settings.timeouts;
        if (tcp, tcp_fin, udp) != (0, 0, 0)
            && let Err(err) = self.ipvs.set_timeouts(tcp, tcp_fin, udp)
        {
            warn!(error = %err, "Failed to configure IPVS timeouts");
        }
        self.initialized = true;
    }
}

impl Written for Changed {
    fn lines(&self) -> usize {
        self.operations
    }

    fn log(&self, family: IpFamily, full: bool) {
        debug!(
            ?family,
            full,
            operations = self.operations,
            "Applied IPVS changes"
        );
    }

    fn record(&self, family: IpFamily, report: &mut SyncReport) {
        for (table, rules) in self.rules {
            report.rules.push((family, table, rules));
        }
    }
}

impl<V: Ipvs, L: DummyLinks, S: Ipsets> Mode for IpvsMode<V, L, S> {
    type Context = IpvsContext;
    type Written = Changed;
    /// The kernel as this sync read it, shared by its families.
    type Sync = KernelView;
    const MODE: ProxyMode = ProxyMode::Ipvs;

    /// Reads the kernel as deep as the sync needs: all of it for a full sync (and when the
    /// Node changed), a check of what memory holds when nothing changed, memory alone
    /// otherwise. A full sync is wanted whenever all of it was read. Addresses of a family the
    /// node does not serve (left by a dual-stack setup) go from kube-ipvs0 first.
    fn begin(
        &mut self,
        families: &[IpFamily],
        changes: &ChangeSummary,
        full: bool,
    ) -> Result<(KernelView, bool), Failure> {
        if !self.initialized {
            self.initialize();
        }
        // What the iptables back end read in the last sync may have changed since.
        self.iptables.forget_reads();
        let depth = if full || self.applied.is_none() || changes.node_changed {
            Depth::Full
        } else if changes.changed_services.is_empty() {
            Depth::Check
        } else {
            Depth::Changes
        };
        let mut current = match self.start(depth, families) {
            Ok(current) => current,
            Err(err) => {
                // Part of the kernel may be unread: read everything next time.
                self.applied = None;
                return Err(Failure::from(err));
            }
        };
        let stray: Vec<Operation> = current
            .observed
            .bound
            .iter()
            .filter(|ip| !current.families.contains(&IpFamily::of(ip)))
            .map(|ip| Operation::Unbind(*ip))
            .collect();
        if !stray.is_empty() {
            let applied = self.apply(current.link, &stray);
            current.observed.apply(&applied);
        }
        // A check that found the kernel changed behind our back read all of it: a full sync.
        let wants_full = current.read_all;
        Ok((current, wants_full))
    }

    fn prepare(
        &mut self,
        current: &mut KernelView,
        family: IpFamily,
        state: &ProxyState,
    ) -> IpvsContext {
        self.settings.context(family, &state.node, &current.local)
    }

    fn programmed_context(&self, family: IpFamily) -> Option<&IpvsContext> {
        self.aggregates.get(&family).map(|(ctx, _)| ctx)
    }

    /// Every service of `family` rendered again and diffed against the kernel as it is (read
    /// now, when the sync began from memory: the node's addresses moved, say).
    fn full_sync(
        &mut self,
        current: &mut KernelView,
        family: IpFamily,
        ctx: IpvsContext,
        state: &ProxyState,
        _quarantine: &Quarantine,
    ) -> Result<Changed, Failure> {
        if !current.read_all {
            current.observed = self.observe(current.link)?;
            current.read_all = true;
        }
        let aggregate = Aggregate::build(state, &ctx);
        let desired = aggregate.desired(&ctx);
        self.aggregates.insert(family, (ctx, aggregate));
        Ok(self.program(family, current, desired, None)?)
    }

    /// The changed services of `family` diffed against memory; with no change, every service
    /// checked against the kernel (the check `begin` read).
    fn partial_sync(
        &mut self,
        current: &mut KernelView,
        family: IpFamily,
        state: &ProxyState,
        changes: &ChangeSummary,
        _quarantine: &Quarantine,
    ) -> Result<Changed, Failure> {
        let work = match current.depth {
            Depth::Changes => self
                .changed_part(family, current, state, changes)
                .map(|(part, scope)| (part, Some(scope))),
            Depth::Check | Depth::Full => self
                .aggregates
                .get(&family)
                .map(|(ctx, aggregate)| (aggregate.desired(ctx), None)),
        };
        match work {
            Some((desired, scope)) => Ok(self.program(family, current, desired, scope)?),
            None => Err(Failure::from(SyncError::NotSynced)),
        }
    }

    fn settle(
        &mut self,
        _current: &mut KernelView,
        _family: IpFamily,
        _state: &ProxyState,
        _full: bool,
        _quarantine: &Quarantine,
    ) -> Result<usize, Failure> {
        Ok(0)
    }

    /// Memory of what the kernel now holds, for the next sync; the kernel's refusals counted.
    fn end(&mut self, current: KernelView, _full: bool, report: &mut SyncReport) {
        self.applied = Some(Applied {
            kernel: current.observed,
            sets: current.sets,
            iptables: current.iptables,
        });
        report.skipped_services += self.refused.len();
    }
}

#[cfg(test)]
mod tests;
