//! The IPVS proxier: reads what the kernel holds once per sync, then, family by family, renders
//! what it should hold, applies the difference over netlink, syncs the family's ipsets in one
//! batch and rewrites its constant iptables rules with one iptables-restore. A full sync starts
//! from the kernel's real state, so a failure part-way is repaired by the next one, and state
//! removed by hand comes back.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use tracing::{debug, info, warn};

use super::aggregate::{Aggregate, Touched};
use super::diff::{Observed, Operation, diff};
use super::render::{DesiredIpvs, IpvsContext, SETS, set_name};
use crate::config::{KubeProxyConfiguration, ProxyMode};
use crate::model::{ChangeSummary, IpFamily, NodeInfo, ProxyState};
use crate::proxier::driver::{Mode, SyncDriver, Written};
use crate::proxier::local::{LocalTraffic, selected_node_port_ips};
use crate::proxier::quarantine::{self, Failure, Quarantine};
use crate::proxier::xtables::{JumpRule, missing_jumps};
use crate::proxier::{SyncError, SyncReport};
use crate::sys::ipset::{SetEntries, SystemIpset, parse_save, sync_input};
use crate::sys::iptables::{Iptables, table_section};
use crate::sys::ipvs::IpvsClient;
use crate::sys::ipvs::codec::{CMD_DEL_DEST, CMD_NEW_DEST, CMD_SET_DEST};
use crate::sys::link::Links;
use crate::sys::net::{LocalAddresses, Sysctl, ensure_sysctl};

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

/// The parts of the configuration IPVS mode uses.
#[derive(Clone, Debug)]
pub struct IpvsSettings {
    pub scheduler: String,
    pub masquerade_all: bool,
    pub masquerade_mark: u32,
    /// How local pod traffic is recognised.
    pub local_traffic: LocalTraffic,
    pub node_port_addresses: Vec<String>,
    pub exclude_cidrs: Vec<IpNet>,
    pub strict_arp: bool,
    /// tcp, tcpfin, udp timeouts in seconds (0 keeps the kernel's).
    pub timeouts: (u32, u32, u32),
}

impl IpvsSettings {
    /// Takes them from a validated configuration.
    pub fn from_config(config: &KubeProxyConfiguration) -> Self {
        let secs = |d: crate::config::GoDuration| u32::try_from(d.0.as_secs()).unwrap_or(u32::MAX);
        IpvsSettings {
            scheduler: config.ipvs.scheduler.clone(),
            masquerade_all: config.iptables.masquerade_all,
            masquerade_mark: config.masquerade_mark(),
            local_traffic: LocalTraffic::from_config(config),
            node_port_addresses: config.node_port_addresses.clone(),
            exclude_cidrs: config
                .ipvs
                .exclude_cidrs
                .iter()
                .filter_map(|c| c.parse().ok())
                .collect(),
            strict_arp: config.ipvs.strict_arp,
            timeouts: (
                secs(config.ipvs.tcp_timeout),
                secs(config.ipvs.tcp_fin_timeout),
                secs(config.ipvs.udp_timeout),
            ),
        }
    }

    /// The render context of one family on `node`, whose local addresses (kube-ipvs0's left
    /// out) are `local`.
    pub fn context(&self, family: IpFamily, node: &NodeInfo, local: &[IpAddr]) -> IpvsContext {
        let of_family = |ip: &&IpAddr| IpFamily::of(ip) == family;
        let local: Vec<IpAddr> = local.iter().filter(of_family).copied().collect();
        let node_ip = node.addresses.iter().filter(of_family).copied().next();
        let node_port_ips =
            selected_node_port_ips(&self.node_port_addresses, node_ip, || local.clone())
                .unwrap_or_else(|| local.clone());
        let local_detector = self.local_traffic.detector(family, node);
        IpvsContext {
            family,
            node_name: node.name.clone(),
            zone: node.zone().map(str::to_string),
            node_ip,
            node_port_ips,
            local_addresses: local,
            scheduler: self.scheduler.clone(),
            masquerade_all: self.masquerade_all,
            masquerade_mark: self.masquerade_mark,
            local_detector,
        }
    }
}

/// The IPVS proxier.
pub type IpvsProxier = SyncDriver<IpvsMode>;

/// IPVS mode's stages, which [`SyncDriver`] runs.
pub struct IpvsMode {
    ipvs: IpvsClient,
    links: Links,
    ipset: SystemIpset,
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
    /// Virtual servers, addresses and set entries the kernel refused, with why.
    refused: BTreeMap<String, String>,
    /// The sync under way, from `begin` to `end`.
    current: Option<Current>,
}

/// The kernel state as the last successful sync left it, so a sync of a few changed services
/// diffs against memory instead of dumping every virtual server's real servers.
struct Applied {
    kernel: Observed,
    sets: SetEntries,
    iptables: Vec<(IpFamily, String)>,
}

/// One sync's view of the kernel, shared by its families.
struct Current {
    depth: Depth,
    link: u32,
    observed: Observed,
    /// Whether `observed` was read from the kernel in full (else it is memory).
    read_all: bool,
    /// Local addresses, kube-ipvs0's, loopback and link-local ones left out.
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

fn sync_error(err: impl std::fmt::Display) -> SyncError {
    SyncError::Apply(err.to_string())
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
        Ok(SyncDriver::drive(IpvsMode {
            ipvs: IpvsClient::connect().map_err(sync_error)?,
            links: Links::open().map_err(sync_error)?,
            ipset: SystemIpset,
            iptables,
            sysctl,
            addresses,
            settings,
            programmed: BTreeMap::new(),
            initialized: false,
            applied: None,
            aggregates: BTreeMap::new(),
            refused: BTreeMap::new(),
            current: None,
        }))
    }
}

impl IpvsMode {
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

    fn bound(&mut self, link: u32) -> Result<BTreeSet<IpAddr>, SyncError> {
        Ok(self
            .links
            .addresses(link)
            .map_err(sync_error)?
            .into_iter()
            .collect())
    }

    fn observe(&mut self, link: u32) -> Result<Observed, SyncError> {
        let mut observed = Observed {
            bound: self.bound(link)?,
            ..Observed::default()
        };
        for vs in self.ipvs.services().map_err(sync_error)? {
            let reals = self.ipvs.destinations(&vs).map_err(sync_error)?;
            observed.services.insert(vs.key(), (vs, reals));
        }
        Ok(observed)
    }

    /// The kernel state to diff against at `depth`, and whether it was read in full. A change
    /// sync gets memory as it is: it re-reads the real servers it touches itself.
    fn observe_at(&mut self, depth: Depth, link: u32) -> Result<(Observed, bool), SyncError> {
        let mut remembered = match (depth, self.applied.as_mut()) {
            (Depth::Full, _) | (_, None) => return Ok((self.observe(link)?, true)),
            (_, Some(applied)) => std::mem::take(&mut applied.kernel),
        };
        if depth == Depth::Check {
            let services = self.ipvs.services().map_err(sync_error)?;
            let bound = self.bound(link)?;
            if !remembered.same_outline(&services, &bound) {
                info!("IPVS state changed outside kube-proxy-rs, reading all of it");
                return Ok((self.observe(link)?, true));
            }
            // Every virtual server's real servers: one removed by hand is put back now, not at
            // the hourly full sync (one dump per virtual server; no read of anything not ours).
            let all: Vec<String> = remembered.services.keys().cloned().collect();
            self.reread_real_servers(&mut remembered, &all)?;
        }
        Ok((remembered, false))
    }

    /// Reads again the real servers of the named virtual servers that `observed` holds: their
    /// connection counts decide whether a removed real server drains or goes at once.
    fn reread_real_servers<'a>(
        &mut self,
        observed: &mut Observed,
        keys: impl IntoIterator<Item = &'a String>,
    ) -> Result<(), SyncError> {
        for key in keys {
            if let Some((vs, reals)) = observed.services.get_mut(key) {
                *reals = self.ipvs.destinations(vs).map_err(sync_error)?;
            }
        }
        Ok(())
    }

    /// Our sets of `family`: the only sets its sync reads.
    fn set_names(family: IpFamily) -> Vec<String> {
        SETS.iter()
            .map(|(base, _, _)| set_name(base, family))
            .collect()
    }

    /// Applies the operations one by one and returns those the kernel took. One the kernel
    /// refuses is skipped, not the sync: logged once for its virtual server (or address), and
    /// counted, until an operation on it succeeds.
    fn apply(&mut self, link: u32, operations: &[Operation]) -> Vec<Operation> {
        let mut applied = Vec::with_capacity(operations.len());
        for op in operations {
            let result = match op {
                Operation::Bind(ip) => self.links.add_address(link, *ip).map_err(sync_error),
                Operation::Unbind(ip) => self.links.delete_address(link, *ip).map_err(sync_error),
                Operation::AddService(vs) => self.ipvs.add_service(vs).map_err(sync_error),
                Operation::UpdateService(vs) => self.ipvs.update_service(vs).map_err(sync_error),
                Operation::DeleteService(vs) => self.ipvs.delete_service(vs).map_err(sync_error),
                Operation::AddReal(vs, rs) => self
                    .ipvs
                    .change_destination(CMD_NEW_DEST, vs, rs)
                    .map_err(sync_error),
                Operation::UpdateReal(vs, rs) => self
                    .ipvs
                    .change_destination(CMD_SET_DEST, vs, rs)
                    .map_err(sync_error),
                Operation::DeleteReal(vs, rs) => self
                    .ipvs
                    .change_destination(CMD_DEL_DEST, vs, rs)
                    .map_err(sync_error),
            };
            let subject = match op {
                Operation::Bind(ip) | Operation::Unbind(ip) => ip.to_string(),
                Operation::AddService(vs)
                | Operation::UpdateService(vs)
                | Operation::DeleteService(vs)
                | Operation::AddReal(vs, _)
                | Operation::UpdateReal(vs, _)
                | Operation::DeleteReal(vs, _) => vs.key(),
            };
            match result {
                Ok(()) => {
                    debug!(operation = ?op, "IPVS");
                    self.refused.remove(&subject);
                    applied.push(op.clone());
                }
                Err(err) => {
                    if self
                        .refused
                        .insert(subject.clone(), err.to_string())
                        .is_none()
                    {
                        warn!(subject = %subject, operation = ?op, error = %err, "The kernel refused an IPVS change; skipping it, the rest is programmed");
                    }
                }
            }
        }
        applied
    }

    /// `ipset restore` of `input`; a line the kernel refuses (named in ipset's error) is
    /// dropped, logged once and counted, and the rest restored again.
    fn restore_sets(&mut self, input: &str) -> Result<(), SyncError> {
        let mut lines: Vec<&str> = input.lines().collect();
        for _ in 0..quarantine::MAX_PER_SYNC {
            let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
            let err = match self.ipset.restore(&text) {
                Ok(()) => return Ok(()),
                Err(err) => err,
            };
            let refused = err
                .to_string()
                .split("Error in line ")
                .nth(1)
                .and_then(|rest| rest.split(':').next())
                .and_then(|n| n.trim().parse::<usize>().ok())
                .filter(|n| (1..=lines.len()).contains(n));
            let Some(line) = refused else {
                return Err(sync_error(err));
            };
            let entry = lines.remove(line - 1).to_string();
            if self
                .refused
                .insert(entry.clone(), err.to_string())
                .is_none()
            {
                warn!(entry = %entry, error = %err, "The kernel refused an ipset entry; skipping it, the rest is programmed");
            }
        }
        Err(SyncError::Apply(
            "too many ipset entries refused in one sync".into(),
        ))
    }

    fn sync_iptables(&mut self, family: IpFamily, rules: &str) -> Result<(), SyncError> {
        self.iptables.restore(family, rules).map_err(sync_error)?;
        // Only the built-in chains our jumps start from are read.
        let missing =
            missing_jumps(self.iptables.as_mut(), family, &IPVS_JUMP_RULES).map_err(sync_error)?;
        let mut by_table: BTreeMap<&str, String> = BTreeMap::new();
        for jump in &missing {
            let lines = by_table.entry(jump.table).or_default();
            lines.push_str(&format!("-I {} 1 {}\n", jump.from, jump.rule_spec()));
        }
        let input: String = by_table
            .into_iter()
            .map(|(table, lines)| format!("*{table}\n{lines}COMMIT\n"))
            .collect();
        if !input.is_empty() {
            self.iptables.restore(family, &input).map_err(sync_error)?;
        }
        Ok(())
    }

    /// The sync under way (begun, not ended).
    fn current(&mut self) -> Result<Current, Failure> {
        self.current
            .take()
            .ok_or_else(|| Failure::unattributed("an IPVS family sync outside a sync"))
    }

    /// Starts a sync at `depth`: kube-ipvs0 made sure of and the kernel read as deep as
    /// asked. Memory of the last sync is taken: only a sync that ends gives it back.
    fn start(&mut self, depth: Depth) -> Result<(), SyncError> {
        let link = self.links.ensure_dummy(DUMMY_LINK).map_err(sync_error)?;
        let (observed, read_all) = self.observe_at(depth, link)?;
        let local: Vec<IpAddr> = self
            .addresses
            .addresses()
            .into_iter()
            .filter(|ip| !observed.bound.contains(ip) && !ip.is_loopback() && !is_link_local(ip))
            .collect();
        let (sets, previous_iptables) = match self.applied.take() {
            Some(applied) if depth == Depth::Changes => (applied.sets, applied.iptables),
            Some(applied) => (SetEntries::new(), applied.iptables),
            None => (SetEntries::new(), Vec::new()),
        };
        self.current = Some(Current {
            depth,
            link,
            observed,
            read_all,
            local,
            sets,
            previous_iptables,
            iptables: Vec::new(),
        });
        Ok(())
    }

    /// Takes `family` to `desired` (the whole family's, or, with `touched`, the part of those
    /// services, addresses and set entries only): virtual servers and addresses, then sets,
    /// then iptables rules.
    fn program(
        &mut self,
        family: IpFamily,
        current: &mut Current,
        desired: DesiredIpvs,
        scope: Option<Scope>,
    ) -> Result<Changed, SyncError> {
        let view = match &scope {
            Some(Scope { touched, .. }) => {
                // Draining ones are among the touched: their real servers are read here, once.
                self.reread_real_servers(&mut current.observed, &touched.services)?;
                current
                    .observed
                    .restricted(&touched.services, &touched.bound)
            }
            None => current.observed.of_family(family),
        };
        let exclude = &self.settings.exclude_cidrs;
        let programmed = self.programmed.entry(family).or_default();
        let (observed, local) = (&current.observed, &current.local);
        let owned = |vs: &crate::sys::ipvs::VirtualServer| {
            IpFamily::of(&vs.address) == family
                && !exclude.iter().any(|net| net.contains(&vs.address))
                && (observed.bound.contains(&vs.address)
                    || programmed.contains(&vs.key())
                    || local.contains(&vs.address))
        };
        let operations = diff(&desired, &view, &owned);
        drop(view);
        let applied = self.apply(current.link, &operations);
        current.observed.apply(&applied);
        let names = Self::set_names(family);
        if current.depth != Depth::Changes {
            let read = parse_save(&self.ipset.save_sets(&names).map_err(sync_error)?);
            current.sets.retain(|name, _| !names.contains(name));
            current.sets.extend(read);
        }
        let restricted;
        let sets = match &scope {
            Some(Scope { entries, .. }) => {
                restricted = restrict_sets(&current.sets, &desired, entries);
                &restricted
            }
            None => &current.sets,
        };
        if let Some(input) = sync_input(&desired.sets, sets) {
            self.restore_sets(&input)?;
        }
        let programmed = self.programmed.entry(family).or_default();
        match &scope {
            Some(Scope { touched, entries }) => {
                for (name, entry) in entries {
                    if let Some(set) = current.sets.get_mut(name) {
                        set.remove(entry);
                    }
                }
                for key in &touched.services {
                    if desired.services.contains_key(key) {
                        programmed.insert(key.clone());
                    } else {
                        programmed.remove(key);
                    }
                }
            }
            None => {
                current.sets.retain(|name, _| !names.contains(name));
                *programmed = desired.services.keys().cloned().collect();
            }
        }
        for (spec, entries) in desired.sets {
            current.sets.entry(spec.name).or_default().extend(entries);
        }
        let unchanged = current.depth == Depth::Changes
            && current
                .previous_iptables
                .iter()
                .any(|(known, text)| *known == family && *text == desired.iptables);
        if !unchanged {
            self.sync_iptables(family, &desired.iptables)?;
        }
        let rules = ["filter", "nat"]
            .map(|table| (table, rule_lines(table_section(&desired.iptables, table))));
        current.iptables.push((family, desired.iptables));
        Ok(Changed {
            operations: operations.len(),
            rules,
        })
    }

    /// The changed services of `family`, rendered again, with the draining virtual servers:
    /// what a sync of a few services diffs.
    fn changed_part(
        &mut self,
        family: IpFamily,
        current: &Current,
        state: &ProxyState,
        changes: &ChangeSummary,
    ) -> Option<(DesiredIpvs, Scope)> {
        let (ctx, aggregate) = self.aggregates.get_mut(&family)?;
        let mut touched = Touched::default();
        for key in &changes.changed_services {
            touched.extend(aggregate.rerender(key, state, ctx));
        }
        touched.services.extend(
            current
                .observed
                .draining()
                .iter()
                .filter(|vs| IpFamily::of(&vs.address) == family)
                .map(|vs| vs.key()),
        );
        let part = aggregate.desired_part(ctx, &touched);
        let entries = touched
            .entries
            .iter()
            .map(|(base, entry)| (set_name(base, family), entry.clone()))
            .collect();
        Some((part, Scope { touched, entries }))
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

impl Mode for IpvsMode {
    type Context = IpvsContext;
    type Written = Changed;
    const MODE: ProxyMode = ProxyMode::Ipvs;

    /// Reads the kernel as deep as the sync needs: all of it for a full sync (and when the
    /// Node changed), a check of what memory holds when nothing changed, memory alone
    /// otherwise. A full sync is wanted whenever all of it was read.
    fn begin(
        &mut self,
        _families: &[IpFamily],
        changes: &ChangeSummary,
        full: bool,
    ) -> Result<bool, Failure> {
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
        if let Err(err) = self.start(depth) {
            // Part of the kernel may be unread: read everything next time.
            self.applied = None;
            return Err(Failure::from(err));
        }
        // A check that found the kernel changed behind our back read all of it: a full sync.
        Ok(self
            .current
            .as_ref()
            .is_some_and(|current| current.read_all))
    }

    fn prepare(&mut self, family: IpFamily, state: &ProxyState) -> IpvsContext {
        let local = self
            .current
            .as_ref()
            .map(|current| current.local.as_slice())
            .unwrap_or_default();
        self.settings.context(family, &state.node, local)
    }

    fn programmed_context(&self, family: IpFamily) -> Option<&IpvsContext> {
        self.aggregates.get(&family).map(|(ctx, _)| ctx)
    }

    /// Every service of `family` rendered again and diffed against the kernel as it is (read
    /// now, when the sync began from memory: the node's addresses moved, say).
    fn full_sync(
        &mut self,
        family: IpFamily,
        ctx: IpvsContext,
        state: &ProxyState,
        _quarantine: &Quarantine,
    ) -> Result<Changed, Failure> {
        let mut current = self.current()?;
        if !current.read_all {
            current.observed = self.observe(current.link)?;
            current.read_all = true;
        }
        let aggregate = Aggregate::build(state, &ctx);
        let desired = aggregate.desired(&ctx);
        self.aggregates.insert(family, (ctx, aggregate));
        let changed = self.program(family, &mut current, desired, None);
        self.current = Some(current);
        Ok(changed?)
    }

    /// The changed services of `family` diffed against memory; with no change, every service
    /// checked against the kernel (the check `begin` read).
    fn partial_sync(
        &mut self,
        family: IpFamily,
        state: &ProxyState,
        changes: &ChangeSummary,
        _quarantine: &Quarantine,
    ) -> Result<Changed, Failure> {
        let mut current = self.current()?;
        let work = match current.depth {
            Depth::Changes => self
                .changed_part(family, &current, state, changes)
                .map(|(part, scope)| (part, Some(scope))),
            Depth::Check | Depth::Full => self
                .aggregates
                .get(&family)
                .map(|(ctx, aggregate)| (aggregate.desired(ctx), None)),
        };
        let changed = match work {
            Some((desired, scope)) => self.program(family, &mut current, desired, scope),
            None => Err(SyncError::Apply("no full sync yet".into())),
        };
        self.current = Some(current);
        Ok(changed?)
    }

    fn settle(
        &mut self,
        _family: IpFamily,
        _state: &ProxyState,
        _full: bool,
        _quarantine: &Quarantine,
    ) -> Result<usize, Failure> {
        Ok(0)
    }

    /// Memory of what the kernel now holds, for the next sync; the kernel's refusals counted.
    fn end(&mut self, _full: bool, report: &mut SyncReport) {
        if let Some(current) = self.current.take() {
            self.applied = Some(Applied {
                kernel: current.observed,
                sets: current.sets,
                iptables: current.iptables,
            });
        }
        report.skipped_services += self.refused.len();
    }
}

/// How many rules a restore section appends.
fn rule_lines(section: &str) -> usize {
    section.lines().filter(|l| l.starts_with("-A ")).count()
}

/// The current entries of the touched ones, per set of `desired` (every set appears, so
/// `sync_input` creates none): the counterpart of `Aggregate::desired_part`.
fn restrict_sets(
    sets: &SetEntries,
    desired: &DesiredIpvs,
    touched: &BTreeSet<(String, String)>,
) -> SetEntries {
    let mut current: SetEntries = desired
        .sets
        .keys()
        .map(|spec| (spec.name.clone(), BTreeSet::new()))
        .collect();
    for (name, entry) in touched {
        if sets
            .get(name)
            .is_some_and(|entries| entries.contains(entry))
            && let Some(entries) = current.get_mut(name)
        {
            entries.insert(entry.clone());
        }
    }
    current
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
        IpAddr::V4(v4) => v4.is_link_local(),
    }
}
