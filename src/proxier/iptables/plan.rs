//! iptables-restore input: a full sync (every chain of ours declared, so flushed and rewritten), or
//! a partial sync that touches only what changed: targeted `-D`/`-A`/`-I` edits of the shared
//! chains and rewrites of the changed services' own chains. Both are fed to one
//! `iptables-restore --noflush` per family.

use crate::proxier::xtables::JumpRule;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::programmed::{ProgrammedService, digest};
use super::render::{
    BaseRules, KUBE_MARK_MASQ, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_PROXY_CANARY, KUBE_SERVICES,
    NAT_CHAINS, Rule, ServiceRules,
};
use crate::model::NamespacedName;

/// Counts for logs and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestoreStats {
    pub filter_rules: usize,
    pub nat_rules: usize,
    pub nat_chains: usize,
    /// Lines of restore input written.
    pub lines: usize,
}

pub use crate::proxier::naming::ChainSet;

/// Chains of ours that already hold exactly what a full sync would write, by table: the sync
/// leaves them alone (declaring a chain in a restore flushes it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeptChains {
    pub filter: ChainSet,
    pub nat: ChainSet,
    pub mangle: ChainSet,
}

impl KeptChains {
    /// Whether `chain` of `table` is kept.
    pub fn contains(&self, table: &str, chain: &str) -> bool {
        let chains = match table {
            "filter" => &self.filter,
            "nat" => &self.nat,
            "mangle" => &self.mangle,
            _ => return false,
        };
        chains.contains(chain)
    }

    /// How many chains are kept.
    pub fn len(&self) -> usize {
        self.filter.len() + self.nat.len() + self.mangle.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a full sync writes besides the rules, and how.
#[derive(Clone, Debug, Default)]
pub struct FullSyncExtras<'a> {
    /// Service chains found in the kernel that nothing uses any more: flushed and deleted.
    pub stale_chains: &'a [String],
    /// Jumps from built-in chains that are missing: inserted at the top.
    pub missing_jumps: &'a [JumpRule],
    /// Split the services' chains into transactions of about this many chains (see
    /// `Iptables::chains_per_transaction`); `None` writes each table in one.
    pub chains_per_transaction: Option<usize>,
    /// Chains left as they are.
    pub kept: KeptChains,
}

/// The whole desired state of one family as restore input.
///
/// Split into transactions, nat is written so that every state between two of them serves
/// traffic: first KUBE-MARK-MASQ and KUBE-POSTROUTING (targets of the service chains), then the
/// services' own chains a group at a time (each service's chains in one transaction, so none is
/// seen half written, and the KUBE-SERVICES rules still in place keep jumping to chains that
/// exist), and last KUBE-SERVICES and KUBE-NODEPORTS, the jumps into them, and the deletion of
/// stale chains. Within a group chains are declared in descending name order, which
/// iptables-nft-restore's sorted chain list inserts at its head.
pub fn full_restore(
    base: &BaseRules,
    services: &BTreeMap<NamespacedName, ServiceRules>,
    extras: &FullSyncExtras<'_>,
) -> (String, RestoreStats) {
    let mut out = Writer::default();
    let kept = &extras.kept;
    let shared = SharedRules::of_rendered(services.values());

    let filter_chains: Vec<&str> = base
        .filter_chains()
        .into_iter()
        .filter(|chain| !kept.contains("filter", chain))
        .collect();
    let filter_canary = !kept.contains("filter", KUBE_PROXY_CANARY);
    let filter_jumps = extras.missing_jumps.iter().any(|j| j.table == "filter");
    if !filter_chains.is_empty() || filter_canary || filter_jumps {
        out.line("*filter");
        for chain in &filter_chains {
            out.chain(chain);
        }
        if filter_canary {
            out.chain(KUBE_PROXY_CANARY);
        }
        out.jumps("filter", extras.missing_jumps);
        shared_filter_rules(&mut out, base, &shared.filter, &filter_chains);
        out.line("COMMIT");
    }

    let service_chains: BTreeMap<&String, &Vec<String>> = services
        .values()
        .flat_map(|s| &s.chains)
        .filter(|(chain, _)| !kept.contains("nat", chain))
        .collect();
    match extras.chains_per_transaction {
        None => nat_in_one(&mut out, base, &shared.nat, &service_chains, extras),
        Some(limit) => nat_in_groups(&mut out, base, &shared.nat, services, limit, extras),
    }
    out.stats.nat_chains = written(kept, &NAT_CHAINS).len() + service_chains.len();

    if !kept.contains("mangle", KUBE_PROXY_CANARY) {
        out.line("*mangle");
        out.chain(KUBE_PROXY_CANARY);
        out.line("COMMIT");
    }
    out.finish()
}

/// The shared nat chains of `chains` that a full sync writes (those not kept).
fn written<'a>(kept: &KeptChains, chains: &[&'a str]) -> Vec<&'a str> {
    chains
        .iter()
        .copied()
        .filter(|chain| !kept.contains("nat", chain))
        .collect()
}

/// The last nat transaction: the entry points, the canary, the jumps into them and the
/// deletion of stale chains; `None` when it has nothing to do.
fn nat_entries(
    out: &mut Writer,
    base: &BaseRules,
    shared: &[&Rule],
    entries: &[&str],
    extras: &FullSyncExtras<'_>,
    service_chains: &BTreeMap<&String, &Vec<String>>,
) {
    let canary = !extras.kept.contains("nat", KUBE_PROXY_CANARY);
    let jumps = extras.missing_jumps.iter().any(|j| j.table == "nat");
    if entries.is_empty()
        && !canary
        && !jumps
        && extras.stale_chains.is_empty()
        && service_chains.is_empty()
    {
        return;
    }
    out.line("*nat");
    for chain in entries {
        out.chain(chain);
    }
    if canary {
        out.chain(KUBE_PROXY_CANARY);
    }
    for chain in service_chains.keys().copied().chain(extras.stale_chains) {
        out.chain(chain);
    }
    out.jumps("nat", extras.missing_jumps);
    shared_nat_rules(out, base, shared, entries);
    for (chain, rules) in service_chains {
        out.chain_rules(chain, rules);
    }
    for chain in extras.stale_chains {
        out.line(&format!("-X {chain}"));
    }
    out.line("COMMIT");
}

/// nat as one transaction.
fn nat_in_one(
    out: &mut Writer,
    base: &BaseRules,
    shared: &[&Rule],
    service_chains: &BTreeMap<&String, &Vec<String>>,
    extras: &FullSyncExtras<'_>,
) {
    let entries = written(&extras.kept, &NAT_CHAINS);
    nat_entries(out, base, shared, &entries, extras, service_chains);
}

/// nat as several transactions, in the order [`full_restore`] explains.
fn nat_in_groups(
    out: &mut Writer,
    base: &BaseRules,
    shared: &[&Rule],
    services: &BTreeMap<NamespacedName, ServiceRules>,
    limit: usize,
    extras: &FullSyncExtras<'_>,
) {
    let targets = written(&extras.kept, &[KUBE_POSTROUTING, KUBE_MARK_MASQ]);
    if !targets.is_empty() {
        out.line("*nat");
        for chain in &targets {
            out.chain(chain);
        }
        shared_nat_rules(out, base, shared, &targets);
        out.line("COMMIT");
    }

    let mut group: Vec<(&String, &Vec<String>)> = Vec::new();
    for service in services.values() {
        group.extend(
            service
                .chains
                .iter()
                .filter(|(chain, _)| !extras.kept.contains("nat", chain)),
        );
        if group.len() >= limit.max(1) {
            chain_group(out, &mut group);
        }
    }
    chain_group(out, &mut group);

    let entries = written(&extras.kept, &[KUBE_SERVICES, KUBE_NODEPORTS]);
    nat_entries(out, base, shared, &entries, extras, &BTreeMap::new());
}

/// One transaction declaring and filling some services' chains (emptied afterwards).
fn chain_group(out: &mut Writer, group: &mut Vec<(&String, &Vec<String>)>) {
    if group.is_empty() {
        return;
    }
    group.sort_by(|a, b| b.0.cmp(a.0));
    out.line("*nat");
    for (chain, _) in group.iter() {
        out.chain(chain);
    }
    for (chain, rules) in group.iter() {
        out.chain_rules(chain, rules);
    }
    out.line("COMMIT");
    group.clear();
}

/// The services' rules in the shared chains, in service order.
#[derive(Clone, Debug, Default)]
pub struct SharedRules<'a> {
    pub filter: Vec<&'a Rule>,
    pub nat: Vec<&'a Rule>,
}

impl<'a> SharedRules<'a> {
    /// Those of rendered services.
    pub fn of_rendered(services: impl IntoIterator<Item = &'a ServiceRules>) -> Self {
        let mut shared = SharedRules::default();
        for service in services {
            shared.filter.extend(&service.filter);
            shared.nat.extend(&service.nat);
        }
        shared
    }

    /// Those of programmed services.
    pub fn of_programmed(services: impl IntoIterator<Item = &'a ProgrammedService>) -> Self {
        let mut shared = SharedRules::default();
        for service in services {
            shared.filter.extend(service.filter.iter());
            shared.nat.extend(service.nat.iter());
        }
        shared
    }
}

/// The rules of the shared filter chains `chains`, in that order: the services' and the base ones.
fn shared_filter_rules(out: &mut Writer, base: &BaseRules, services: &[&Rule], chains: &[&str]) {
    for chain in chains {
        for rule in services
            .iter()
            .copied()
            .chain(&base.filter)
            .filter(|r| r.chain == *chain)
        {
            out.rule("-A", rule);
            out.stats.filter_rules += 1;
        }
    }
}

/// The rules of the shared nat chains `chains`, in that order: the services' and the base ones.
fn shared_nat_rules(out: &mut Writer, base: &BaseRules, services: &[&Rule], chains: &[&str]) {
    for chain in chains {
        let tail = if *chain == KUBE_SERVICES {
            base.nat_services_tail.as_slice()
        } else {
            &[]
        };
        for rule in services
            .iter()
            .copied()
            .chain(&base.nat)
            .chain(tail)
            .filter(|r| r.chain == *chain)
        {
            out.rule("-A", rule);
            out.stats.nat_rules += 1;
        }
    }
}

/// Restore input that rewrites `chains` (table, chain) of ours, and inserts `missing_jumps`:
/// the repair of rules someone else changed. The shared chains get `shared` and the base rules;
/// a service chain gets its rules from `own` (it is left out if `own` lacks it, as are chains
/// that are not ours); `None` when nothing is left to write.
pub fn repair_restore(
    base: &BaseRules,
    shared: &SharedRules<'_>,
    own: &BTreeMap<&str, &Vec<String>>,
    chains: &BTreeSet<(String, String)>,
    missing_jumps: &[JumpRule],
) -> Option<(String, RestoreStats)> {
    let mut out = Writer::default();
    for table in ["filter", "nat"] {
        let wanted: Vec<&str> = chains
            .iter()
            .filter(|(t, _)| t == table)
            .map(|(_, chain)| chain.as_str())
            .collect();
        let shared_chains: Vec<&str> = if table == "filter" {
            base.filter_chains()
                .into_iter()
                .filter(|c| wanted.contains(c))
                .collect()
        } else {
            NAT_CHAINS
                .into_iter()
                .filter(|c| wanted.contains(c))
                .collect()
        };
        let own: Vec<(&str, &Vec<String>)> = if table == "nat" {
            wanted
                .iter()
                .filter_map(|chain| own.get(chain).map(|rules| (*chain, *rules)))
                .collect()
        } else {
            Vec::new()
        };
        let jumps = missing_jumps.iter().any(|j| j.table == table);
        if shared_chains.is_empty() && own.is_empty() && !jumps {
            continue;
        }
        out.line(&format!("*{table}"));
        for chain in shared_chains
            .iter()
            .copied()
            .chain(own.iter().map(|(c, _)| *c))
        {
            out.chain(chain);
        }
        if table == "filter" {
            shared_filter_rules(&mut out, base, &shared.filter, &shared_chains);
        } else {
            shared_nat_rules(&mut out, base, &shared.nat, &shared_chains);
            for (chain, rules) in &own {
                out.chain_rules(chain, rules);
            }
        }
        out.jumps(table, missing_jumps);
        out.line("COMMIT");
    }
    (out.stats.lines > 0).then(|| out.finish())
}

/// One service's change: what was programmed and what is wanted (either may be absent).
pub struct ServiceDelta<'a> {
    pub old: Option<&'a ProgrammedService>,
    pub new: Option<&'a ServiceRules>,
}

/// The edits that take the kernel from the old rules to the new ones for the changed services
/// only; `None` when nothing differs.
pub fn partial_restore(deltas: &[ServiceDelta<'_>]) -> Option<(String, RestoreStats)> {
    let (empty_old, empty_new) = (ProgrammedService::default(), ServiceRules::default());
    let mut filter_delete = Vec::new();
    let mut filter_add = Vec::new();
    let mut nat_delete = Vec::new();
    let mut nat_add = Vec::new();
    let mut rewritten: BTreeMap<&str, &Vec<String>> = BTreeMap::new();
    let mut removed: BTreeSet<&str> = BTreeSet::new();
    for delta in deltas {
        let old = delta.old.unwrap_or(&empty_old);
        let new = delta.new.unwrap_or(&empty_new);
        diff_rules(
            &old.filter,
            &new.filter,
            &mut filter_delete,
            &mut filter_add,
        );
        diff_rules(&old.nat, &new.nat, &mut nat_delete, &mut nat_add);
        for (chain, rules) in &new.chains {
            if old.chain(chain).map(|c| c.digest) != Some(digest(rules)) {
                rewritten.insert(chain, rules);
            }
        }
        removed.extend(
            old.chain_names()
                .filter(|chain| !new.chains.contains_key(*chain)),
        );
    }
    // A chain one service drops and another takes over is rewritten, not deleted.
    removed.retain(|chain| !rewritten.contains_key(chain));
    if filter_delete.is_empty()
        && filter_add.is_empty()
        && nat_delete.is_empty()
        && nat_add.is_empty()
        && rewritten.is_empty()
        && removed.is_empty()
    {
        return None;
    }

    let mut out = Writer::default();
    if !filter_delete.is_empty() || !filter_add.is_empty() {
        out.line("*filter");
        for rule in &filter_delete {
            out.rule("-D", rule);
        }
        for rule in &filter_add {
            out.rule("-A", rule);
            out.stats.filter_rules += 1;
        }
        out.line("COMMIT");
    }
    if !nat_delete.is_empty() || !nat_add.is_empty() || !rewritten.is_empty() || !removed.is_empty()
    {
        out.line("*nat");
        for chain in rewritten.keys().copied().chain(removed.iter().copied()) {
            out.chain(chain);
        }
        for rule in &nat_delete {
            out.rule("-D", rule);
        }
        for rule in &nat_add {
            // New rules go above the KUBE-NODEPORTS jump, which must stay last in KUBE-SERVICES.
            if rule.chain == KUBE_SERVICES {
                out.line(&format!("-I {} 1 {}", rule.chain, rule.spec));
            } else {
                out.rule("-A", rule);
            }
            out.stats.nat_rules += 1;
        }
        for (chain, rules) in &rewritten {
            out.chain_rules(chain, rules);
        }
        for chain in &removed {
            out.line(&format!("-X {chain}"));
        }
        out.stats.nat_chains = rewritten.len();
        out.line("COMMIT");
    }
    Some(out.finish())
}

fn diff_rules<'a>(
    old: &'a [Rule],
    new: &'a [Rule],
    delete: &mut Vec<&'a Rule>,
    add: &mut Vec<&'a Rule>,
) {
    delete.extend(old.iter().filter(|rule| !new.contains(rule)));
    add.extend(new.iter().filter(|rule| !old.contains(rule)));
}

#[derive(Default)]
struct Writer {
    text: String,
    stats: RestoreStats,
}

impl Writer {
    fn line(&mut self, line: &str) {
        self.text.push_str(line);
        self.text.push('\n');
        self.stats.lines += 1;
    }

    fn chain(&mut self, chain: &str) {
        let _ = writeln!(self.text, ":{chain} - [0:0]");
        self.stats.lines += 1;
    }

    fn rule(&mut self, op: &str, rule: &Rule) {
        let _ = writeln!(self.text, "{op} {} {}", rule.chain, rule.spec);
        self.stats.lines += 1;
    }

    /// Appends a service chain's rules.
    fn chain_rules(&mut self, chain: &str, rules: &[String]) {
        for spec in rules {
            if spec.is_empty() {
                let _ = writeln!(self.text, "-A {chain}");
            } else {
                let _ = writeln!(self.text, "-A {chain} {spec}");
            }
            self.stats.lines += 1;
            self.stats.nat_rules += 1;
        }
    }

    fn jumps(&mut self, table: &str, jumps: &[JumpRule]) {
        for jump in jumps.iter().filter(|j| j.table == table) {
            let _ = writeln!(self.text, "-I {} 1 {}", jump.from, jump.rule_spec());
            self.stats.lines += 1;
        }
    }

    fn finish(self) -> (String, RestoreStats) {
        (self.text, self.stats)
    }
}
