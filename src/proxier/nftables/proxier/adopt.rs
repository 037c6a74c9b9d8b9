//! What a full sync finds in the table after a restart or a failure: names, the digests the
//! table keeps of itself, and, where the digests do not vouch for them, the chains' rule counts
//! and comments and the sets' elements. Chains that read back exactly as we would write them
//! are kept (see `digests`).

use super::*;
use crate::proxier::nftables::slots::is_endpoint_map;

impl<N: Nftables> NftablesMode<N> {
    /// What a full sync finds in the table: from memory when it did not `read` the table, else
    /// [`Self::existing`]. Also returns the digests the table holds and whether anything was
    /// taken on their word.
    pub(super) fn found(
        &mut self,
        family: IpFamily,
        base: &Objects,
        services: &BTreeMap<NamespacedName, Objects>,
        wanted: &Digests,
        read: Option<Result<ReadBack, Failure>>,
        trust: bool,
    ) -> Result<(Existing, Option<Digests>, bool), Failure> {
        let Some(read) = read else {
            let programmed = self
                .programmed
                .get(&family)
                .ok_or_else(|| Failure::unattributed(SyncError::NotSynced))?;
            let mut existing = Existing::default();
            // Of the endpoint maps, the table holds those a chain draws from.
            let maps_in_use = programmed.slots.maps_in_use();
            for objects in std::iter::once(&programmed.base).chain(programmed.services.values()) {
                existing.chains.extend(objects.chains.keys().cloned());
                existing.sets.extend(
                    objects
                        .sets
                        .keys()
                        .filter(|name| !is_endpoint_map(name) || maps_in_use.contains(*name))
                        .cloned(),
                );
            }
            existing.counters = programmed.base.counters.clone();
            existing.flowtables = programmed.base.flowtables.clone();
            existing.chains.extend(
                self.stale_chains
                    .get(&family)
                    .into_iter()
                    .flat_map(|s| s.keys().cloned()),
            );
            return Ok((existing, Some(programmed.digests.clone()), false));
        };
        Ok(self.existing(family, base, services, wanted, read?, trust))
    }

    /// What a full sync finds in the table, from what it `read` back: names, and, where the
    /// table's digests (when it can `trust` them) do not vouch for them, the chains' digests
    /// and the sets' elements. Also returns the digests the table holds, and whether anything
    /// was taken on their word (then the table is to be read back; when every part differed,
    /// everything was read already).
    pub(super) fn existing(
        &mut self,
        family: IpFamily,
        base: &Objects,
        services: &BTreeMap<NamespacedName, Objects>,
        wanted: &Digests,
        read: ReadBack,
        trust: bool,
    ) -> (Existing, Option<Digests>, bool) {
        let ReadBack {
            chains,
            sets,
            counters,
            flowtables,
            digests: held,
            elements,
        } = read;
        let trusted = held
            .as_ref()
            .filter(|held| trust && held.share_a_part(wanted));
        let vouched = trusted.map(|held| held.chains_alike(wanted));
        // Whether the last writer wrote a chain's group as we would, trusted or not: a chain
        // without a digest of its own is judged by its comments only there.
        let written_alike = held.as_ref().map(|held| held.chains_alike(wanted));
        // Endpoint maps are declared only while a chain draws from them (`plan::full`).
        let names_present = base.chains.keys().all(|name| chains.contains(name))
            && base
                .sets
                .keys()
                .filter(|name| !is_endpoint_map(name))
                .all(|name| sets.contains(name));
        // The table's digests say the base was declared as we would declare it.
        let declared_alike = held.as_ref().is_some_and(|held| held.same_layout(wanted));
        let layout_vouched = trusted.is_some() && declared_alike;
        // Unless the digests vouch for them, the base chains are read with the candidates.
        let check_base = !layout_vouched && names_present;
        let (adopted, chains_vouched, base_unchanged) = self.adopt_chains(
            family,
            base,
            services,
            &chains,
            vouched,
            check_base,
            |name| written_alike.as_ref().is_some_and(|alike| alike(name)),
        );
        // The top-level sets: trusted, or read (all of them already, when not trusting).
        let present = present_sets(base, &sets);
        let (trusted_sets, elements) = match trusted {
            // Digests that vouch for nothing: the reader, told to trust them, read no element
            // (see `read_table`).
            None if trust && held.is_some() && !present.is_empty() => (
                BTreeSet::new(),
                read_elements(&mut self.nft, family, &present),
            ),
            None => (BTreeSet::new(), elements),
            Some(held) => self.vouched_elements(family, held, wanted, present),
        };
        // The base is kept, its declarations included, when the digests vouch for it, or when
        // its chains read back unchanged and it was declared as we would declare it.
        let base_kept = names_present && (layout_vouched || (base_unchanged && declared_alike));
        let on_trust =
            trusted.is_some() && (chains_vouched || !trusted_sets.is_empty() || base_kept);
        let kept = adopted.len();
        if kept > 0 {
            info!(
                ?family,
                chains = kept,
                "Kept chains an earlier run programmed as they are"
            );
        }
        let existing = Existing {
            chains,
            sets,
            counters,
            flowtables,
            adopted,
            elements,
            trusted_sets,
            base_kept,
        };
        (existing, held, on_trust)
    }

    /// Chains an earlier run wrote that are exactly what we would write stay as they are:
    /// those the table's digests vouch for, and those read back unchanged (see `unchanged`;
    /// a chain without a digest only where `written_alike` says its group is as we would write
    /// it); only chains that exist are read, and the base chains with them when `check_base`.
    /// Returns the adopted chains, whether the digests vouched for any, and whether the base
    /// chains read back unchanged.
    #[allow(clippy::too_many_arguments)]
    fn adopt_chains(
        &mut self,
        family: IpFamily,
        base: &Objects,
        services: &BTreeMap<NamespacedName, Objects>,
        chains: &ChainSet,
        vouched: Option<impl Fn(&str) -> bool>,
        check_base: bool,
        written_alike: impl Fn(&str) -> bool,
    ) -> (ChainSet, bool, bool) {
        let mut adopted = ChainSet::default();
        let mut candidates = BTreeSet::new();
        for name in services.values().flat_map(|objects| objects.chains.keys()) {
            if !chains.contains(name) {
                continue;
            }
            if vouched.as_ref().is_some_and(|vouched| vouched(name)) {
                adopted.insert(name.clone());
            } else {
                candidates.insert(name.clone());
            }
        }
        let chains_vouched = !adopted.is_empty();
        if check_base {
            candidates.extend(base.chains.keys().cloned());
        }
        let mut base_unchanged = false;
        if !candidates.is_empty() {
            match self.nft.rule_comments(family, TABLE, &candidates) {
                Ok(comments) => {
                    adopted.extend(adoptable(services, &comments, written_alike));
                    base_unchanged = check_base
                        && base
                            .chains
                            .iter()
                            .all(|(name, chain)| unchanged(name, chain, &comments));
                }
                Err(err) => {
                    warn!(?family, error = %err, "Cannot read our rules back; rewriting the chains");
                }
            }
        }
        (adopted, chains_vouched, base_unchanged)
    }

    /// Of the top-level sets `present`, those whose elements the `held` digests vouch for (left
    /// alone), and the elements of the others, read.
    fn vouched_elements(
        &mut self,
        family: IpFamily,
        held: &Digests,
        wanted: &Digests,
        present: Vec<(String, String)>,
    ) -> (BTreeSet<String>, Option<SetElements>) {
        let (vouched, differing): (Vec<_>, Vec<_>) = present
            .into_iter()
            .partition(|(name, _)| held.same_elements(wanted, name));
        let elements = if differing.is_empty() {
            Some(SetElements::new())
        } else {
            read_elements(&mut self.nft, family, &differing)
        };
        (
            vouched.into_iter().map(|(name, _)| name).collect(),
            elements,
        )
    }
}

/// What a full sync reads of our table before it knows what it wants.
pub(super) struct ReadBack {
    /// The table's chains (hashed here, on the reader's thread), sets and counters.
    chains: ChainSet,
    sets: BTreeSet<String>,
    counters: BTreeSet<String>,
    flowtables: BTreeSet<String>,
    /// The digests the table holds (see `digests`), if it holds digests of ours.
    digests: Option<Digests>,
    /// The elements of the top-level sets and maps present, unless the digests are to be
    /// trusted (then only the sets they do not vouch for are read, later), or when they cannot
    /// be read (the sets are then refilled).
    elements: Option<SetElements>,
}

/// Our table's names and digests, and, unless `trust`ing the digests, the elements of the
/// top-level sets and maps of `base` it holds.
pub(super) fn read_table<N: Nftables>(
    nft: &mut N,
    family: IpFamily,
    base: &Objects,
    trust: bool,
) -> Result<ReadBack, Failure> {
    let names = nft.names(family, TABLE).map_err(Failure::unattributed)?;
    let digests = if names.chains.contains(DIGEST_CHAIN) {
        read_digests(nft, family)
    } else {
        None
    };
    let elements = if trust && digests.is_some() {
        None
    } else {
        let present = present_sets(base, &names.sets);
        if present.is_empty() {
            None
        } else {
            read_elements(nft, family, &present)
        }
    };
    Ok(ReadBack {
        chains: names.chains.into_iter().collect(),
        sets: names.sets,
        counters: names.counters,
        flowtables: names.flowtables,
        digests,
        elements,
    })
}

/// The top-level sets and maps of `base` that the table holds (name and declaration).
pub(super) fn present_sets(base: &Objects, sets: &BTreeSet<String>) -> Vec<(String, String)> {
    base.sets
        .iter()
        .filter(|(name, _)| sets.contains(*name))
        .map(|(name, set)| (name.clone(), set.spec.clone()))
        .collect()
}

/// The digests our table's digest chain holds; `None` if it holds anything else.
pub(super) fn read_digests<N: Nftables>(nft: &mut N, family: IpFamily) -> Option<Digests> {
    let chain = BTreeSet::from([DIGEST_CHAIN.to_string()]);
    let comments = nft
        .rule_comments(family, TABLE, &chain)
        .inspect_err(|err| warn!(?family, error = %err, "Cannot read our table's digests back"))
        .ok()?;
    let (count, comments) = comments.get(DIGEST_CHAIN)?;
    if *count == 0 || *count != comments.len() {
        return None;
    }
    Digests::parse(comments.iter().map(String::as_str))
}

/// The elements of `sets` (name and declaration); `None` when they cannot be read (the sets
/// are then refilled).
pub(super) fn read_elements<N: Nftables>(
    nft: &mut N,
    family: IpFamily,
    sets: &[(String, String)],
) -> Option<SetElements> {
    nft.elements(family, TABLE, sets)
        .inspect_err(|err| {
            warn!(?family, error = %err, "Cannot read our sets' elements back; refilling them");
        })
        .ok()
}

/// The chains of `services` the kernel already holds exactly (see [`unchanged`]). A chain
/// without a digest of its own (every rule carries a comment of upstream's) is taken on its
/// comments only where `written_alike` says its group of the table's digests is as we would
/// write it: an earlier layout (upstream 1.35's `jump mark-for-masquerade`, where 1.36 marks in
/// place) keeps the comments and changes the rules.
pub(super) fn adoptable(
    services: &BTreeMap<NamespacedName, Objects>,
    kernel: &RuleComments,
    written_alike: impl Fn(&str) -> bool,
) -> ChainSet {
    services
        .values()
        .flat_map(|objects| &objects.chains)
        .filter(|(name, chain)| {
            unchanged(name, chain, kernel) && (digest_of(chain).is_some() || written_alike(name))
        })
        .map(|(name, _)| name.clone())
        .collect()
}

/// Whether the kernel holds `chain` as we would write it: as many rules, and among their
/// comments the digest it would carry; for a chain without a digest (every rule carries a
/// comment of upstream's), the same comments. A rule changed in place under the same comment
/// is not seen.
pub(super) fn unchanged(name: &str, chain: &Chain, kernel: &RuleComments) -> bool {
    let (count, comments) = kernel
        .get(name)
        .map(|(count, comments)| (*count, comments.as_slice()))
        .unwrap_or((0, &[]));
    if count != chain.rules.len() {
        return false;
    }
    match digest_of(chain) {
        Some(digest) => comments.iter().any(|c| c == digest),
        None => {
            let mut ours: Vec<&str> = chain
                .rules
                .iter()
                .filter_map(|rule| comment_of(rule))
                .collect();
            let mut theirs: Vec<&str> = comments.iter().map(String::as_str).collect();
            ours.sort_unstable();
            theirs.sort_unstable();
            ours == theirs
        }
    }
}
