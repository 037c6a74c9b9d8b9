//! The full sync's transactions: declarations, then whole services, then the base, the
//! top-level maps and what is stale.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt::Write as _;

use super::{CHAINS_PER_TRANSACTION, Existing, Removed, Stats, Writer, differing, is_map_name};
use crate::model::NamespacedName;
use crate::proxier::naming::ChainSet;
use crate::proxier::nftables::digests::{DIGEST_CHAIN, Digests};
use crate::proxier::nftables::render::{Chain, Objects, TABLE, flowtable_spec};
use crate::proxier::nftables::slots::{is_endpoint_map, maps_of};

type NameSet<'a> = HashSet<&'a str, ahash::RandomState>;

/// A set's elements, each as (key, the rest of its text).
type ElementList<'a> = Vec<(&'a str, &'a str)>;

/// The full sync, as transactions to apply in order:
/// 1. the table, the top-level sets and maps, the base's counters and the fixed and base
///    chains declared (nothing written: what serves traffic is unchanged);
/// 2. whole services at a time: their affinity sets and chains declared, existing chains
///    flushed, their rules written (nothing refers to a new chain yet; an existing one is
///    rewritten atomically);
/// 3. the base chains flushed and written, stale chains flushed (returned in [`Removed`] for
///    deletion later), the top-level sets and maps brought to what they are to hold (only the
///    differing elements when they were read), stale sets deleted, and then stale counters (the
///    rules that counted with them flushed above).
///
/// What `existing` says is already right is left out: adopted chains, trusted sets, and the
/// base with its declarations when it is kept.
/// Affinity sets that stay are not flushed: they hold the clients' affinity. With `recreate`,
/// the table is deleted and made again first (after a failure whose cause the text cannot
/// name, such as a set of another layout with the same name). When `digests` are given (the
/// table's digests after the sync, when they differ from the ones it holds), the first
/// transaction empties the digest chain and the last one writes them.
pub fn full(
    family: &str,
    base: &Objects,
    services: &BTreeMap<NamespacedName, Objects>,
    existing: &Existing,
    recreate: bool,
    digests: Option<&Digests>,
) -> (Vec<String>, Stats, Removed) {
    let no_chains = ChainSet::default();
    let plan = FullSync {
        family,
        base,
        services,
        maps_in_use: maps_of(services.values().flat_map(|o| &o.slots)),
        existing,
        existing_chains: if recreate {
            &no_chains
        } else {
            &existing.chains
        },
        recreate,
        base_kept: existing.base_kept && !recreate,
    };
    let mut done = Transactions::default();
    done.finish(plan.declarations(digests.is_some()));
    for out in plan.services() {
        done.finish(out);
    }
    let mut out = Writer::new(family);
    let stale_chains = plan.base_and_stale_chains(&mut out);
    plan.top_level_elements(&mut out);
    plan.stale_sets(&mut out);
    if let Some(digests) = digests {
        out.digests(digests);
    }
    done.finish(out);
    (
        done.texts,
        done.stats,
        Removed {
            chains: stale_chains,
        },
    )
}

/// The transactions written so far, and their counts.
#[derive(Default)]
struct Transactions {
    texts: Vec<String>,
    stats: Stats,
}

impl Transactions {
    fn finish(&mut self, out: Writer<'_>) {
        let (text, written) = out.finish();
        self.stats.lines += written.lines;
        self.stats.chains_written += written.chains_written;
        self.stats.elements_changed += written.elements_changed;
        if !text.is_empty() {
            self.texts.push(text);
        }
    }
}

/// What one full sync writes from, and what it may leave alone.
struct FullSync<'a> {
    family: &'a str,
    base: &'a Objects,
    services: &'a BTreeMap<NamespacedName, Objects>,
    /// The endpoint maps some chain draws from: the only ones declared (see `slots`).
    maps_in_use: BTreeSet<String>,
    existing: &'a Existing,
    /// The chains the table holds (none after `recreate`).
    existing_chains: &'a ChainSet,
    recreate: bool,
    base_kept: bool,
}

impl<'a> FullSync<'a> {
    /// A top-level set whose elements are left alone.
    fn trusted(&self, set: &str) -> bool {
        !self.recreate && self.existing.trusted_sets.contains(set)
    }

    /// Whether the table is to hold set `name`: an endpoint map only while a chain draws from
    /// it, anything else of the base's always.
    fn declared(&self, name: &str) -> bool {
        !is_endpoint_map(name) || self.maps_in_use.contains(name)
    }

    /// The base and every service's objects.
    fn all(&self) -> impl Iterator<Item = &'a Objects> + use<'a> {
        std::iter::once(self.base).chain(self.services.values())
    }

    /// The first transaction: the table, its top-level sets and maps and the fixed and base
    /// chains declared; the digest chain emptied when the digests are about to change.
    fn declarations(&self, digests_change: bool) -> Writer<'a> {
        let (family, base) = (self.family, self.base);
        let mut out = Writer::new(family);
        if !self.base_kept {
            if self.recreate {
                let _ = writeln!(
                    out.text,
                    "add table {family} {TABLE}\ndelete table {family} {TABLE}"
                );
            }
            let _ = writeln!(
                out.text,
                "add table {family} {TABLE} {{ comment \"rules for kube-proxy\" ; }}"
            );
            for (name, set) in base.sets.iter().filter(|(n, _)| self.declared(n)) {
                out.declare_set(name, set);
            }
            for name in &base.counters {
                out.line("add", "counter", name, "");
            }
            for name in &base.flowtables {
                out.line("add", "flowtable", name, &flowtable_spec(&[]));
            }
            for (name, chain) in &base.chains {
                out.declare_chain(name, chain);
            }
        } else {
            // The base is kept: only an endpoint map a chain now draws from that the table lacks.
            for name in &self.maps_in_use {
                if let Some(set) = base.sets.get(name.as_str())
                    && !self.existing.sets.contains(name)
                {
                    out.declare_set(name, set);
                }
            }
        }
        if digests_change {
            // Until the last transaction writes them, the table holds none (a daemon stopped
            // between two transactions must not trust them).
            out.line("add", "chain", DIGEST_CHAIN, "");
            out.line("flush", "chain", DIGEST_CHAIN, "");
        }
        out
    }

    /// The services' transactions: whole services, up to [`CHAINS_PER_TRANSACTION`] chains
    /// each.
    fn services(&self) -> Vec<Writer<'a>> {
        let mut transactions = Vec::new();
        let mut out = Writer::new(self.family);
        let mut chains_in_transaction = 0;
        for objects in self.services.values() {
            if chains_in_transaction >= CHAINS_PER_TRANSACTION {
                transactions.push(std::mem::replace(&mut out, Writer::new(self.family)));
                chains_in_transaction = 0;
            }
            chains_in_transaction += self.service(objects, &mut out);
        }
        transactions.push(out);
        transactions
    }

    /// One service's affinity sets and chains declared, existing chains flushed, rules
    /// written; returns how many chains it wrote.
    fn service(&self, objects: &Objects, out: &mut Writer<'_>) -> usize {
        let recreate = self.recreate;
        for (name, set) in objects
            .sets
            .iter()
            .filter(|(n, _)| recreate || !self.existing.sets.contains(*n))
        {
            out.declare_set(name, set);
        }
        let written: Vec<(&String, &Chain)> = objects
            .chains
            .iter()
            .filter(|(name, _)| recreate || !self.existing.adopted.contains(name.as_str()))
            .collect();
        for (name, chain) in &written {
            out.declare_chain(name, chain);
        }
        for (name, _) in written
            .iter()
            .filter(|(n, _)| self.existing_chains.contains(n.as_str()))
        {
            out.line("flush", "chain", name, "");
        }
        for (name, chain) in &written {
            out.rules(name, chain);
        }
        written.len()
    }

    /// The last transaction's start: the base chains flushed and written, stale chains flushed
    /// (returned, in name order as the table lists them, for deletion later), the top-level
    /// sets whose elements were not read flushed.
    fn base_and_stale_chains(&self, out: &mut Writer<'_>) -> Vec<String> {
        let base = self.base;
        for name in base
            .chains
            .keys()
            .filter(|n| !self.base_kept && self.existing_chains.contains(n.as_str()))
        {
            out.line("flush", "chain", name, "");
        }
        let wanted: NameSet = self
            .all()
            .flat_map(|o| o.chains.keys())
            .map(String::as_str)
            .collect();
        let mut stale_chains: Vec<String> = self
            .existing_chains
            .iter()
            .filter(|name| !wanted.contains(name.as_str()) && *name != DIGEST_CHAIN)
            .cloned()
            .collect();
        stale_chains.sort_unstable();
        for name in &stale_chains {
            out.line("flush", "chain", name, "");
        }
        if !self.recreate {
            let present = self.existing.elements.as_ref();
            for (name, set) in base.sets.iter().filter(|(n, _)| self.declared(n)) {
                if present.is_none_or(|p| !p.contains_key(name)) && !self.trusted(name) {
                    out.line("flush", set.kind, name, "");
                }
            }
        }
        if !self.base_kept {
            for (name, chain) in &base.chains {
                out.rules(name, chain);
            }
        }
        stale_chains
    }

    /// Each top-level set's elements, in key order (sorted lists: at 10,000 services there are
    /// 300,000). A key two services claim (a NodePort or an IP given twice, which the API
    /// server never allows) goes to the first: adding it again with other data would fail the
    /// transaction.
    fn wanted_elements(&self) -> BTreeMap<&'a str, ElementList<'a>> {
        let mut wanted: BTreeMap<&str, ElementList> = BTreeMap::new();
        for objects in self.all() {
            for (set, elements) in objects
                .elements
                .iter()
                .filter(|(set, _)| !self.trusted(set))
            {
                wanted.entry(set).or_default().extend(elements.iter());
            }
        }
        for elements in wanted.values_mut() {
            // Stable: of equal keys, the first service's stays first and is kept.
            elements.sort_by(|a, b| a.0.cmp(b.0));
            elements.dedup_by(|later, earlier| later.0 == earlier.0);
        }
        wanted
    }

    /// The top-level sets brought to what they are to hold: of those read back, what differs
    /// goes (deletions first), then what is missing comes.
    fn top_level_elements(&self, out: &mut Writer<'_>) {
        let wanted = self.wanted_elements();
        let present = self.existing.elements.as_ref().filter(|_| !self.recreate);
        let present_elements = |set: &str| {
            present
                .and_then(|p| p.get(set))
                .into_iter()
                .flatten()
                .map(|(key, rest)| (key.as_str(), rest.as_str()))
        };
        // An endpoint map no chain draws from goes whole (`stale_sets`).
        for set in present
            .into_iter()
            .flat_map(|p| p.keys())
            .filter(|set| !self.trusted(set) && self.declared(set))
        {
            let wanted = wanted
                .get(set.as_str())
                .map(Vec::as_slice)
                .unwrap_or_default();
            for (key, rest) in differing(present_elements(set), wanted.iter().copied()) {
                out.element("delete", set, key, rest);
            }
        }
        for (set, elements) in &wanted {
            for (key, rest) in differing(elements.iter().copied(), present_elements(set)) {
                out.element("add", set, key, rest);
            }
        }
    }

    /// Sets the table holds that nothing wants any more.
    fn stale_sets(&self, out: &mut Writer<'_>) {
        if self.recreate {
            return;
        }
        let wanted_sets: BTreeSet<&String> = self
            .all()
            .flat_map(|o| o.sets.keys())
            .filter(|name| self.declared(name))
            .collect();
        for name in self
            .existing
            .sets
            .iter()
            .filter(|n| !wanted_sets.contains(n))
        {
            // A stale set's kind is unknown here; nft deletes a map with `delete map` only.
            let kind = if is_map_name(name) { "map" } else { "set" };
            out.line("delete", kind, name, "");
        }
        // Counters the stale chains (flushed above) counted with.
        for name in self.existing.counters.difference(&self.base.counters) {
            out.line("delete", "counter", name, "");
        }
        for name in self.existing.flowtables.difference(&self.base.flowtables) {
            out.line("delete", "flowtable", name, "");
        }
    }
}
