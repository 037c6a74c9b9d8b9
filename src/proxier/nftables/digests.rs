//! Digests of what our table holds, kept in the table itself, so that a restarted daemon can
//! tell what is already right without reading it all back (at 10,000 services, reading the
//! sets' 300,000 elements and 20,000 chains' rules took most of a restart).
//!
//! The table is cut into parts: its layout (the base chains and every declaration of the base),
//! the per-service chains in [`CHAIN_GROUPS`] groups by name, and each top-level set's or map's
//! elements. A part's digest is the wrapping sum of a 64-bit hash of each of its items: it does
//! not depend on order, and a partial sync updates it from what it adds and removes alone.
//!
//! The digests are written as the comments of the rules of [`DIGEST_CHAIN`] (a chain nothing
//! jumps to, so its rules never see a packet), in the same transaction as what they describe:
//! they describe what the table holds unless another program changed the table while no daemon
//! watched it, which the sync after a restart checks by reading the table.

use std::borrow::Cow;
use std::collections::BTreeMap;

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use super::render::Objects;

/// The chain whose rules carry the digests.
pub const DIGEST_CHAIN: &str = "kube-proxy-rs-digests";

/// Per-service chains are digested in these groups (by name), so that a restart after a change
/// reads back the rules of a sixteenth of them.
const CHAIN_GROUPS: [&str; 16] = [
    "chains-0", "chains-1", "chains-2", "chains-3", "chains-4", "chains-5", "chains-6", "chains-7",
    "chains-8", "chains-9", "chains-a", "chains-b", "chains-c", "chains-d", "chains-e", "chains-f",
];

/// A digest comment is at most this long: `nft` reads no longer comment back in.
const COMMENT_LENGTH: usize = 128;

const LAYOUT: &str = "layout";

/// Each part's digest, by the part's name (a set's name for its elements; parts whose digest
/// is 0, such as empty sets, are left out).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Digests(BTreeMap<String, u64>);

/// The hash an item of a part counts with: XXH3 (a published algorithm, the same in every
/// build and release, as what a restarted daemon reads back needs; every bit of it depends on
/// every bit of the text, as a sum of hashes needs), each part of the item hashed with the hash
/// of those before it as the seed, so that `("ab", "c")` and `("a", "bc")` hash apart. (FNV-1a,
/// a byte at a time, took a third of a render at 10,000 services.)
fn item_hash<'a>(parts: impl IntoIterator<Item = &'a str>) -> u64 {
    parts
        .into_iter()
        .fold(0, |seed, part| xxh3_64_with_seed(part.as_bytes(), seed))
}

/// The index of the group a per-service chain's (or set's) declaration and rules count in.
fn chain_group(name: &str) -> usize {
    (xxh3_64(name.as_bytes()) % CHAIN_GROUPS.len() as u64) as usize
}

/// What one object set adds to each part: (part, sum).
fn contributions(objects: &Objects, base: bool) -> Vec<(Cow<'_, str>, u64)> {
    let mut out: Vec<(Cow<'_, str>, u64)> = Vec::new();
    let group = |name: &str| {
        Cow::Borrowed(if base {
            LAYOUT
        } else {
            CHAIN_GROUPS[chain_group(name)]
        })
    };
    for (name, chain) in objects.chains.iter() {
        if name == DIGEST_CHAIN {
            continue;
        }
        let parts = ["chain", name, &chain.spec];
        let hash = item_hash(
            parts
                .into_iter()
                .chain(chain.rules.iter().map(String::as_str)),
        );
        out.push((group(name), hash));
    }
    for (name, set) in objects.sets.iter() {
        out.push((group(name), item_hash(["set", name, set.kind, &set.spec])));
    }
    for name in &objects.counters {
        out.push((group(name), item_hash(["counter", name])));
    }
    for name in &objects.flowtables {
        out.push((group(name), item_hash(["flowtable", name])));
    }
    for (set, elements) in objects.elements.iter() {
        let sum = elements.iter().fold(0u64, |sum, (key, rest)| {
            sum.wrapping_add(item_hash([key, rest]))
        });
        out.push((Cow::Borrowed(set.as_str()), sum));
    }
    out
}

impl Digests {
    /// The digests of a table holding `base` and `services`, as a full sync sums them on the
    /// threads that render the services (with [`Digests::add`] and [`Digests::merge`]).
    #[cfg(test)]
    pub fn of<'a>(base: &Objects, services: impl IntoIterator<Item = &'a Objects>) -> Self {
        let mut digests = Digests::default();
        for objects in services {
            digests.add(objects);
        }
        digests.add_base(base);
        digests
    }

    /// The table's service-independent objects were added to the table.
    pub fn add_base(&mut self, base: &Objects) {
        self.update(contributions(base, true), u64::wrapping_add);
    }

    /// What `other`'s services added, added to these.
    pub fn merge(&mut self, other: Digests) {
        let parts = other
            .0
            .into_iter()
            .map(|(k, v)| (Cow::Owned(k), v))
            .collect();
        self.update(parts, u64::wrapping_add);
    }

    /// A service's objects were added to the table.
    pub fn add(&mut self, service: &Objects) {
        self.update(contributions(service, false), u64::wrapping_add);
    }

    /// A service's objects were removed from the table.
    pub fn remove(&mut self, service: &Objects) {
        self.update(contributions(service, false), u64::wrapping_sub);
    }

    fn update(&mut self, parts: Vec<(Cow<'_, str>, u64)>, op: fn(u64, u64) -> u64) {
        for (part, value) in parts {
            match self.0.get_mut(part.as_ref()) {
                Some(entry) => {
                    *entry = op(*entry, value);
                    if *entry == 0 {
                        self.0.remove(part.as_ref());
                    }
                }
                None if op(0, value) != 0 => {
                    self.0.insert(part.into_owned(), op(0, value));
                }
                None => {}
            }
        }
    }

    fn get(&self, part: &str) -> u64 {
        self.0.get(part).copied().unwrap_or(0)
    }

    /// Whether some part holds something and its digest is the same in both. When none does
    /// (the digests of another build, or a table that changed everywhere), they vouch for
    /// nothing, not even for the parts both leave out (empty sets).
    pub fn share_a_part(&self, other: &Digests) -> bool {
        self.0
            .iter()
            .any(|(part, value)| other.0.get(part) == Some(value))
    }

    /// The same parts, each with another value (as another build would hash them).
    #[cfg(test)]
    pub(crate) fn each_value_other(&self) -> Digests {
        Digests(
            self.0
                .iter()
                .map(|(part, value)| (part.clone(), value ^ 0x8000_0000_0000_0000))
                .collect(),
        )
    }

    /// Whether the layout (base chains, the base's declarations) is the same in both.
    pub fn same_layout(&self, other: &Digests) -> bool {
        self.get(LAYOUT) == other.get(LAYOUT)
    }

    /// Whether the chains of a chain's group are the same in both, for any chain.
    pub fn chains_alike(&self, other: &Digests) -> impl Fn(&str) -> bool + use<> {
        let alike = CHAIN_GROUPS.map(|group| self.get(group) == other.get(group));
        move |chain| alike[chain_group(chain)]
    }

    /// Whether `set`'s elements are the same in both.
    pub fn same_elements(&self, other: &Digests, set: &str) -> bool {
        self.get(set) == other.get(set)
    }

    /// The comments of [`DIGEST_CHAIN`]'s rules: `part=hex` words, at most
    /// [`COMMENT_LENGTH`] characters each.
    pub fn comments(&self) -> Vec<String> {
        let mut comments: Vec<String> = Vec::new();
        for (part, value) in &self.0 {
            let word = format!("{part}={value:016x}");
            match comments.last_mut() {
                Some(last) if last.len() + 1 + word.len() <= COMMENT_LENGTH => {
                    last.push(' ');
                    last.push_str(&word);
                }
                _ => comments.push(word),
            }
        }
        comments
    }

    /// The rules of [`DIGEST_CHAIN`] (a counter: `nft` writes no rule without a statement).
    pub fn rules(&self) -> Vec<String> {
        self.comments()
            .into_iter()
            .map(|comment| format!("counter comment \"{comment}\""))
            .collect()
    }

    /// The digests [`DIGEST_CHAIN`]'s rule comments hold; `None` if one of them is not ours
    /// (then nothing read back is trusted).
    pub fn parse<'a>(comments: impl IntoIterator<Item = &'a str>) -> Option<Digests> {
        let mut digests = Digests::default();
        for comment in comments {
            for word in comment.split(' ') {
                let (part, value) = word.split_once('=')?;
                let value = u64::from_str_radix(value, 16).ok()?;
                if part.is_empty() || value == 0 || digests.0.insert(part.into(), value).is_some() {
                    return None;
                }
            }
        }
        Some(digests)
    }
}

#[cfg(test)]
mod tests;
