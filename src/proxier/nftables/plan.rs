//! The text of one sync's nft transaction, from rendered objects: a full sync (everything
//! declared, our chains and top-level maps rewritten, stale objects flushed) or a partial one
//! (only what differs between a service's old and new objects). Pure; the proxier runs it.
//!
//! Order inside a transaction: objects are declared before anything refers to them, chains
//! are flushed before rules are added, element deletions come before additions (a key may move
//! between services), and sets are deleted last, when nothing refers to them any more.
//! Chains are never deleted here: a chain a map element referred to may still be held by the
//! kernel for a moment after the element goes (before 6.2), so stale chains are flushed now
//! and deleted by a later, separate transaction (see [`delete_chains`]).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::digests::{DIGEST_CHAIN, Digests};
use super::render::{Chain, Elements, HAIRPIN_CONNECTIONS, Objects, SetDef, TABLE, flowtable_spec};
use crate::proxier::naming::ChainSet;
use crate::sys::nf_tables::SetElements;

/// What a transaction removed that must be deleted later.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Removed {
    /// Chains flushed because nothing wants them any more.
    pub chains: Vec<String>,
}

/// Counts for logs and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub lines: usize,
    pub chains_written: usize,
    pub elements_changed: usize,
}

/// A transaction being written for one family.
struct Writer<'a> {
    family: &'a str,
    text: String,
    stats: Stats,
}

impl<'a> Writer<'a> {
    fn new(family: &'a str) -> Self {
        Writer {
            family,
            text: String::new(),
            stats: Stats::default(),
        }
    }

    /// One command: `<verb> <object> <family> kube-proxy <name>[ <rest>]`.
    fn line(&mut self, verb: &str, object: &str, name: &str, rest: &str) {
        let _ = write!(self.text, "{verb} {object} {} {TABLE} {name}", self.family);
        if !rest.is_empty() {
            self.text.push(' ');
            self.text.push_str(rest);
        }
        self.text.push('\n');
        self.stats.lines += 1;
    }

    fn declare_chain(&mut self, name: &str, chain: &Chain) {
        self.line("add", "chain", name, &chain.spec);
    }

    fn declare_set(&mut self, name: &str, set: &SetDef) {
        self.line("add", set.kind, name, &set.spec);
    }

    fn rules(&mut self, name: &str, chain: &Chain) {
        self.stats.chains_written += 1;
        for rule in &chain.rules {
            self.line("add", "rule", name, rule);
        }
    }

    fn element(&mut self, verb: &str, set: &str, key: &str, rest: &str) {
        self.stats.elements_changed += 1;
        let rest = if verb == "delete" { "" } else { rest };
        self.line(verb, "element", set, &format!("{{ {key}{rest} }}"));
    }

    /// [`DIGEST_CHAIN`] declared and holding `digests` (see `digests`).
    fn digests(&mut self, digests: &Digests) {
        self.line("add", "chain", DIGEST_CHAIN, "");
        self.line("flush", "chain", DIGEST_CHAIN, "");
        for rule in digests.rules() {
            self.line("add", "rule", DIGEST_CHAIN, &rule);
        }
    }

    fn finish(self) -> (String, Stats) {
        (self.text, self.stats)
    }
}

/// The lines that make [`DIGEST_CHAIN`] hold `digests`, to end a transaction with, and how many
/// they are.
pub fn digest_lines(family: &str, digests: &Digests) -> (String, usize) {
    let mut out = Writer::new(family);
    out.digests(digests);
    let (text, stats) = out.finish();
    (text, stats.lines)
}

/// What is in the table before a full sync, besides what memory says (a restart, a failure).
#[derive(Clone, Debug, Default)]
pub struct Existing {
    pub chains: ChainSet,
    pub sets: BTreeSet<String>,
    pub counters: BTreeSet<String>,
    pub flowtables: BTreeSet<String>,
    /// Chains that already hold exactly the rules they are to hold: not written.
    pub adopted: ChainSet,
    /// The elements the top-level sets and maps hold, when read (a restart): only the
    /// differences are written instead of flushing and refilling them.
    pub elements: Option<SetElements>,
    /// Top-level sets and maps whose elements the table's digests say are already right
    /// (a restart): left alone.
    pub trusted_sets: BTreeSet<String>,
    /// The base chains and the declarations are already right (a restart: by the digests, or
    /// the base chains read back unchanged and the digests vouching for the declarations):
    /// neither declared nor written again.
    pub base_kept: bool,
}

/// How many chains one transaction of a full sync's service part holds. Each `numgen ... vmap`
/// rule binds an anonymous map, and the kernel walks the whole transaction for each binding:
/// one transaction's cost grows with the square of its size (at 5,000 services x 10 endpoints,
/// 36 s for one `nft -f`). Whole services per transaction keep each service atomic.
pub const CHAINS_PER_TRANSACTION: usize = 5_000;

/// The elements of `ours` that `theirs` lacks or holds with other text, both in key order (one
/// walk through each).
fn differing<'a>(
    ours: impl Iterator<Item = (&'a str, &'a str)>,
    theirs: impl Iterator<Item = (&'a str, &'a str)>,
) -> impl Iterator<Item = (&'a str, &'a str)> {
    let mut theirs = theirs.peekable();
    ours.filter_map(move |(key, rest)| {
        while theirs.next_if(|(other, _)| *other < key).is_some() {}
        match theirs.peek() {
            Some((other, other_rest)) if *other == key && *other_rest == rest => None,
            _ => Some((key, rest)),
        }
    })
}

/// Whether a set of our table with this name is a map (upstream's maps and the endpoint maps;
/// every other set of ours, affinity sets included, is a set).
fn is_map_name(name: &str) -> bool {
    use super::render::{
        FIREWALL_IPS, LOCALHOST_REJECT_PORTS, NO_ENDPOINT_NODEPORTS, NO_ENDPOINT_SERVICES,
        SERVICE_IPS, SERVICE_NODEPORTS,
    };
    [
        FIREWALL_IPS,
        LOCALHOST_REJECT_PORTS,
        NO_ENDPOINT_NODEPORTS,
        NO_ENDPOINT_SERVICES,
        SERVICE_IPS,
        SERVICE_NODEPORTS,
    ]
    .contains(&name)
        || super::slots::is_endpoint_map(name)
}

mod full;

pub use full::full;

/// One service's objects before and after a change (`None`: not programmed / gone).
pub struct Delta<'a> {
    pub old: Option<&'a Objects>,
    pub new: Option<&'a Objects>,
}

/// The partial sync: for each changed service, only the chains whose rules differ, the
/// elements that differ and the affinity sets that come or go. `None` when nothing differs.
///
/// An element may belong to several services: always for @hairpin-connections (an endpoint's
/// address and port), and for a map key two services claim (a NodePort or an address given
/// twice, which the API server never allows). An element a service outside `deltas` holds
/// (`held_elsewhere(set, key)`) is neither deleted nor added again: the kernel holds that
/// service's, as a full sync gives a key to its first claimant. A hairpin element one of
/// `deltas` keeps is not deleted either.
pub fn partial(
    family: &str,
    deltas: &[Delta<'_>],
    held_elsewhere: &dyn Fn(&str, &str) -> bool,
) -> Option<(String, Stats, Removed)> {
    let empty = Objects::default();
    let pairs: Vec<(&Objects, &Objects)> = deltas
        .iter()
        .map(|d| (d.old.unwrap_or(&empty), d.new.unwrap_or(&empty)))
        .filter(|(old, new)| old != new)
        .collect();
    if pairs.is_empty() {
        return None;
    }
    let mut out = Writer::new(family);
    let mut removed = Removed::default();
    // Declarations of new sets, counters and chains.
    for (old, new) in &pairs {
        for (name, set) in new.sets.iter().filter(|(n, _)| !old.sets.contains_key(*n)) {
            out.declare_set(name, set);
        }
        for name in new.counters.difference(&old.counters) {
            out.line("add", "counter", name, "");
        }
        for name in new.flowtables.difference(&old.flowtables) {
            out.line("add", "flowtable", name, &flowtable_spec(&[]));
        }
        for (name, chain) in new
            .chains
            .iter()
            .filter(|(n, _)| !old.chains.contains_key(*n))
        {
            out.declare_chain(name, chain);
        }
    }
    // Flushes: chains whose rules change, and chains no longer wanted.
    for (old, new) in &pairs {
        for (name, chain) in &old.chains {
            match new.chains.get(name) {
                Some(now) if now.rules == chain.rules => {}
                Some(_) => out.line("flush", "chain", name, ""),
                None => {
                    out.line("flush", "chain", name, "");
                    removed.chains.push(name.clone());
                }
            }
        }
    }
    for (old, new) in &pairs {
        for (name, chain) in &new.chains {
            if old
                .chains
                .get(name)
                .is_none_or(|was| was.rules != chain.rules)
            {
                out.rules(name, chain);
            }
        }
    }
    // Elements: deletions first, then additions.
    let mut hairpins_kept: Option<BTreeSet<&str>> = None;
    for (old, new) in &pairs {
        for (set, elements) in &old.elements {
            let now = new.elements.get(set);
            for (key, rest) in elements {
                if now.and_then(|e| e.get(key)) == Some(rest) {
                    continue;
                }
                if set == HAIRPIN_CONNECTIONS {
                    let kept = hairpins_kept.get_or_insert_with(|| {
                        deltas
                            .iter()
                            .filter_map(|d| d.new?.elements.get(HAIRPIN_CONNECTIONS))
                            .flat_map(|e| e.keys())
                            .collect()
                    });
                    if kept.contains(key) {
                        continue;
                    }
                }
                if held_elsewhere(set, key) {
                    continue;
                }
                out.element("delete", set, key, rest);
            }
        }
    }
    for (old, new) in &pairs {
        for (set, elements) in &new.elements {
            let was: Option<&Elements> = old.elements.get(set);
            for (key, rest) in elements {
                if was.and_then(|e| e.get(key)) != Some(rest) && !held_elsewhere(set, key) {
                    out.element("add", set, key, rest);
                }
            }
        }
    }
    for (old, new) in &pairs {
        for (name, set) in old.sets.iter().filter(|(n, _)| !new.sets.contains_key(*n)) {
            out.line("delete", set.kind, name, "");
        }
        // After the flushes above took the rules that counted with them.
        for name in old.counters.difference(&new.counters) {
            out.line("delete", "counter", name, "");
        }
        for name in old.flowtables.difference(&new.flowtables) {
            out.line("delete", "flowtable", name, "");
        }
    }
    let (text, stats) = out.finish();
    Some((text, stats, removed))
}

/// The endpoint maps of `base` a sync starts to draw from (declared first in its transaction)
/// and those it stops drawing from (deleted last), as the transaction's first and last lines.
pub fn endpoint_maps(
    family: &str,
    base: &Objects,
    starting: &BTreeSet<String>,
    ending: &BTreeSet<String>,
) -> (String, String) {
    let mut first = Writer::new(family);
    for name in starting {
        if let Some(set) = base.sets.get(name.as_str()) {
            first.declare_set(name, set);
        }
    }
    let mut last = Writer::new(family);
    for name in ending {
        last.line("delete", "map", name, "");
    }
    (first.finish().0, last.finish().0)
}

/// Objects to rewrite because another program changed them.
pub struct Repairs<'a> {
    pub chains: Vec<(&'a str, &'a Chain)>,
    /// The base's counters, which its chains' rules may count with (declared again: `add`
    /// leaves an existing counter as it is).
    pub counters: &'a BTreeSet<String>,
    /// The base's flowtables, which its chains' rules may offload to (declared again).
    pub flowtables: &'a BTreeSet<String>,
    /// A set or map, and its elements (from every service) unless the kernel keeps them
    /// (affinity sets).
    pub sets: Vec<(&'a str, &'a SetDef, Option<Vec<&'a Elements>>)>,
}

/// The transaction that rewrites `repairs`: sets and counters first (rules refer to them), then
/// chains.
pub fn repair(family: &str, repairs: &Repairs<'_>) -> String {
    let mut out = Writer::new(family);
    if !repairs.chains.is_empty() {
        for name in repairs.counters {
            out.line("add", "counter", name, "");
        }
        for name in repairs.flowtables {
            out.line("add", "flowtable", name, &flowtable_spec(&[]));
        }
    }
    for (name, def, elements) in &repairs.sets {
        out.declare_set(name, def);
        if let Some(elements) = elements {
            out.line("flush", def.kind, name, "");
            for (key, rest) in elements.iter().flat_map(|e| e.iter()) {
                out.element("add", name, key, rest);
            }
        }
    }
    for (name, chain) in &repairs.chains {
        out.declare_chain(name, chain);
        out.line("flush", "chain", name, "");
    }
    for (name, chain) in &repairs.chains {
        out.rules(name, chain);
    }
    out.finish().0
}

/// The transaction that deletes `chains` (flushed by an earlier sync, unreferenced since).
pub fn delete_chains(family: &str, chains: &[&String]) -> String {
    let mut out = Writer::new(family);
    for name in chains {
        out.line("delete", "chain", name, "");
    }
    out.finish().0
}

#[cfg(test)]
mod tests;
