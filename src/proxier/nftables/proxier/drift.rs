//! Drift repair: the chains and sets of ours that another program changed (the kernel's change
//! events name them) are rewritten from memory.

use super::*;

impl<N: Nftables> NftablesMode<N> {
    /// Rewrites the chains and sets of ours that another program changed, from memory: a
    /// chain is declared, flushed and its rules added; a set or map is declared, flushed and
    /// refilled (an affinity set is only declared again: its elements are the clients'). A
    /// name memory does not know (someone added it to our table) makes the next sync full,
    /// which removes it. Returns how many objects were rewritten.
    pub(super) fn repair(
        &mut self,
        family: IpFamily,
        names: &BTreeSet<String>,
    ) -> Result<usize, Failure> {
        let Some(current) = self.programmed.get(&family) else {
            return Ok(0);
        };
        let objects: Vec<&Objects> = std::iter::once(&current.base)
            .chain(current.services.values())
            .collect();
        let pending = self.stale_chains.get(&family);
        let mut repairs = plan::Repairs {
            chains: Vec::new(),
            counters: &current.base.counters,
            flowtables: &current.base.flowtables,
            sets: Vec::new(),
        };
        let mut unknown = Vec::new();
        let mut digest_chain = false;
        for name in names {
            if name == DIGEST_CHAIN {
                digest_chain = true;
            } else if let Some(set) = name.strip_prefix('@') {
                match objects
                    .iter()
                    .find_map(|o| Some((o.sets.get(set)?, o.elements.get(set))))
                {
                    Some((def, _)) if set.starts_with("affinity-") => {
                        repairs.sets.push((set, def, None))
                    }
                    Some((def, _)) => {
                        let elements = objects.iter().filter_map(|o| o.elements.get(set)).collect();
                        repairs.sets.push((set, def, Some(elements)));
                    }
                    None => unknown.push(name.clone()),
                }
            } else if let Some(chain) = objects.iter().find_map(|o| o.chains.get(name)) {
                repairs.chains.push((name, chain));
            } else if !pending.is_some_and(|p| p.contains_key(name)) {
                unknown.push(name.clone());
            }
        }
        if !unknown.is_empty() {
            warn!(?family, objects = ?unknown, "Objects another program added to our nftables table; the next sync is a full one");
            self.full_sync_wanted = true;
            // ... reading the table's names, since memory does not hold them.
            self.known.remove(&family);
        }
        let count = repairs.chains.len() + repairs.sets.len() + usize::from(digest_chain);
        if count == 0 {
            return Ok(0);
        }
        let mut text = plan::repair(family_keyword(family), &repairs);
        if digest_chain {
            text.push_str(&plan::digest_lines(family_keyword(family), &current.digests).0);
        }
        let names: Vec<String> = repairs
            .chains
            .iter()
            .map(|(n, _)| n.to_string())
            .chain(repairs.sets.iter().map(|(n, _, _)| format!("@{n}")))
            .chain(digest_chain.then(|| DIGEST_CHAIN.to_string()))
            .collect();
        self.apply(family, &text).map_err(Failure::unattributed)?;
        info!(?family, objects = ?names, "Rewrote our nftables objects another program changed");
        Ok(count)
    }
}
