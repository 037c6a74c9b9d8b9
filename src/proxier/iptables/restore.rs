//! iptables-restore input: a full sync (every chain of ours declared, so flushed and rewritten), or
//! a partial sync that touches only what changed: targeted `-D`/`-A`/`-I` edits of the shared
//! chains and rewrites of the changed services' own chains. Both are fed to one
//! `iptables-restore --noflush` per family.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::render::{
    BaseRules, FILTER_CHAINS, JumpRule, KUBE_PROXY_CANARY, KUBE_SERVICES, NAT_CHAINS, Rule,
    ServiceRules,
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

/// What a full sync writes besides the rules.
#[derive(Clone, Debug, Default)]
pub struct FullSyncExtras<'a> {
    /// Service chains found in the kernel that nothing uses any more: flushed and deleted.
    pub stale_chains: &'a [String],
    /// Jumps from built-in chains that are missing: inserted at the top.
    pub missing_jumps: &'a [JumpRule],
}

/// The whole desired state of one family as restore input.
pub fn full_restore(
    base: &BaseRules,
    services: &BTreeMap<NamespacedName, ServiceRules>,
    extras: &FullSyncExtras<'_>,
) -> (String, RestoreStats) {
    let mut out = Writer::default();

    out.line("*filter");
    for chain in FILTER_CHAINS.iter().chain([&KUBE_PROXY_CANARY]) {
        out.chain(chain);
    }
    out.jumps("filter", extras.missing_jumps);
    for chain in FILTER_CHAINS {
        for rule in services
            .values()
            .flat_map(|s| &s.filter)
            .chain(&base.filter)
            .filter(|r| r.chain == chain)
        {
            out.rule("-A", rule);
            out.stats.filter_rules += 1;
        }
    }
    out.line("COMMIT");

    out.line("*nat");
    let service_chains: BTreeMap<&String, &Vec<String>> =
        services.values().flat_map(|s| &s.chains).collect();
    for chain in NAT_CHAINS.iter().chain([&KUBE_PROXY_CANARY]) {
        out.chain(chain);
    }
    for chain in service_chains.keys().copied().chain(extras.stale_chains) {
        out.chain(chain);
    }
    out.jumps("nat", extras.missing_jumps);
    for chain in NAT_CHAINS {
        let tail = if chain == KUBE_SERVICES {
            base.nat_services_tail.as_slice()
        } else {
            &[]
        };
        for rule in services
            .values()
            .flat_map(|s| &s.nat)
            .chain(&base.nat)
            .chain(tail)
            .filter(|r| r.chain == chain)
        {
            out.rule("-A", rule);
            out.stats.nat_rules += 1;
        }
    }
    for (chain, rules) in &service_chains {
        for spec in *rules {
            out.append(chain, spec);
            out.stats.nat_rules += 1;
        }
    }
    for chain in extras.stale_chains {
        out.line(&format!("-X {chain}"));
    }
    out.stats.nat_chains = NAT_CHAINS.len() + service_chains.len();
    out.line("COMMIT");

    out.line("*mangle");
    out.chain(KUBE_PROXY_CANARY);
    out.line("COMMIT");
    out.finish()
}

/// One service's change: what was programmed and what is wanted (either may be absent).
pub struct ServiceDelta<'a> {
    pub old: Option<&'a ServiceRules>,
    pub new: Option<&'a ServiceRules>,
}

/// The edits that take the kernel from the old rules to the new ones for the changed services
/// only; `None` when nothing differs.
pub fn partial_restore(deltas: &[ServiceDelta<'_>]) -> Option<(String, RestoreStats)> {
    let empty = ServiceRules::default();
    let mut filter_delete = Vec::new();
    let mut filter_add = Vec::new();
    let mut nat_delete = Vec::new();
    let mut nat_add = Vec::new();
    let mut rewritten: BTreeMap<&String, &Vec<String>> = BTreeMap::new();
    let mut removed: BTreeSet<&String> = BTreeSet::new();
    for delta in deltas {
        let old = delta.old.unwrap_or(&empty);
        let new = delta.new.unwrap_or(&empty);
        diff_rules(
            &old.filter,
            &new.filter,
            &mut filter_delete,
            &mut filter_add,
        );
        diff_rules(&old.nat, &new.nat, &mut nat_delete, &mut nat_add);
        for (chain, rules) in &new.chains {
            if old.chains.get(chain) != Some(rules) {
                rewritten.insert(chain, rules);
            }
        }
        removed.extend(
            old.chains
                .keys()
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
            for spec in *rules {
                out.append(chain, spec);
                out.stats.nat_rules += 1;
            }
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

    fn append(&mut self, chain: &str, spec: &str) {
        if spec.is_empty() {
            let _ = writeln!(self.text, "-A {chain}");
        } else {
            let _ = writeln!(self.text, "-A {chain} {spec}");
        }
        self.stats.lines += 1;
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
