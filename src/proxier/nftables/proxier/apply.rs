//! Applying a family's transactions, thinly: each runs as one transaction (a failure counts and
//! makes memory no longer exact); chains nothing wants are flushed at once and deleted a moment
//! later; a refused transaction is blamed on the service its failing line belongs to.

use super::*;

impl<N: Nftables> NftablesMode<N> {
    /// Runs one transaction, recording it when asked; a failure counts.
    pub(super) fn apply(&mut self, family: IpFamily, text: &str) -> Result<(), NftError> {
        if self.record_transactions {
            self.last_transactions.push((family, text.to_string()));
        }
        self.nft.apply(text).inspect_err(|_| {
            self.known.remove(&family);
            self.sync_failures += 1;
        })
    }

    /// Deletes the chains flushed at least `stale_chain_delay` ago, in one transaction of its
    /// own; if the kernel refuses it (one still in use), one by one, a few per sync. A chain
    /// that cannot go yet is tried again next sync; it is empty meanwhile.
    pub(super) fn delete_stale_chains(&mut self, family: IpFamily) {
        let now = Instant::now();
        let mut due: Vec<String> = self
            .stale_chains
            .get(&family)
            .map(|stale| {
                stale
                    .iter()
                    .filter(|(_, at)| now.duration_since(**at) >= self.stale_chain_delay)
                    .map(|(name, _)| name.clone())
                    .collect()
            })
            .unwrap_or_default();
        if due.is_empty() {
            return;
        }
        // A chain that is wanted again (its service came back) stays, and is stale no more.
        if let Some(programmed) = self.programmed.get(&family) {
            let wanted: BTreeSet<&String> = programmed
                .services
                .values()
                .flat_map(|s| s.chains.keys())
                .collect();
            let (again, gone): (Vec<String>, Vec<String>) =
                due.into_iter().partition(|name| wanted.contains(name));
            if let Some(stale) = self.stale_chains.get_mut(&family) {
                for name in &again {
                    stale.remove(name);
                }
            }
            due = gone;
        }
        if due.is_empty() {
            return;
        }
        let keyword = family_keyword(family);
        let all: Vec<&String> = due.iter().collect();
        let deleted: Vec<&String> = if self.nft.apply(&plan::delete_chains(keyword, &all)).is_ok() {
            all
        } else {
            all.into_iter()
                    .take(SINGLE_DELETIONS_PER_SYNC)
                    .filter(|name| {
                        self.nft
                            .apply(&plan::delete_chains(keyword, &[name]))
                            .inspect_err(|err| debug!(chain = %name, error = %err, "Stale chain not deleted yet"))
                            .is_ok()
                    })
                    .collect()
        };
        debug!(?family, chains = deleted.len(), "Deleted stale chains");
        if let Some(stale) = self.stale_chains.get_mut(&family) {
            for name in deleted {
                stale.remove(name);
            }
        }
    }

    /// Asks for a sync `delay` from now (when there is someone to ask).
    pub(super) fn wake_after(&self, delay: Duration, why: &'static str) {
        let Some(wake) = self.wake.clone() else {
            return;
        };
        let spawned = std::thread::Builder::new()
            .name("nftables-wake".into())
            .spawn(move || {
                std::thread::sleep(delay);
                wake();
            });
        if let Err(err) = spawned {
            debug!(error = %err, "{why} at the next sync");
        }
    }

    pub(super) fn remember_stale(&mut self, family: IpFamily, chains: Vec<String>) {
        if !chains.is_empty() {
            self.wake_after(
                self.stale_chain_delay + Duration::from_millis(100),
                "Stale chains will be deleted",
            );
        }
        let now = Instant::now();
        let stale = self.stale_chains.entry(family).or_default();
        for chain in chains {
            stale.entry(chain).or_insert(now);
        }
    }
}

/// Ends a sync's transaction `text` with the digest chain's new rules, when the digests change.
pub(super) fn with_digests(
    family: IpFamily,
    text: &mut String,
    stats: &mut Stats,
    held: &Digests,
    digests: &Digests,
) {
    if held != digests {
        let (lines, count) = plan::digest_lines(family_keyword(family), digests);
        text.push_str(&lines);
        stats.lines += count;
    }
}

/// A failed transaction `input`, whose services' objects are `services`.
pub(super) fn transaction_failure(
    error: NftError,
    input: &str,
    services: &BTreeMap<NamespacedName, Objects>,
) -> Failure {
    let line = match &error {
        NftError::Transaction { line, .. } => *line,
        _ => None,
    };
    Failure::at_line(error, input, line, "objects", |text| {
        owner_of_line(text, services)
    })
}

/// The service a transaction line belongs to: the one whose chain or set it names (the
/// command's object, or an element's verdict), or the one its comment names.
pub(super) fn owner_of_line(
    line: &str,
    services: &BTreeMap<NamespacedName, Objects>,
) -> Option<NamespacedName> {
    let owns = |name: &str| {
        services
            .iter()
            .find(|(_, o)| o.chains.contains_key(name) || o.sets.contains_key(name))
            .map(|(key, _)| key.clone())
    };
    let words: Vec<&str> = line.split_whitespace().collect();
    let named = words.get(4).and_then(|name| owns(name));
    let by_verdict = || {
        words
            .windows(2)
            .filter(|w| w[0] == "goto" || w[0] == "jump")
            .find_map(|w| owns(w[1].trim_end_matches([',', '}'])))
    };
    let by_comment = || {
        let comment = line.split("comment \"").nth(1)?;
        service_in_comment(comment.split('"').next()?).filter(|s| services.contains_key(s))
    };
    named.or_else(by_verdict).or_else(by_comment)
}

/// Declares the endpoint maps a sync starts to draw from at the start of `text`, and deletes
/// those it stops drawing from at its end (after the flushes and element deletions that free
/// them).
pub(super) fn with_endpoint_maps(
    family: IpFamily,
    text: &mut String,
    stats: &mut Stats,
    base: &Objects,
    (starting, ending): (&BTreeSet<String>, &BTreeSet<String>),
) {
    let (first, last) = plan::endpoint_maps(family_keyword(family), base, starting, ending);
    stats.lines += first.lines().count() + last.lines().count();
    text.insert_str(0, &first);
    text.push_str(&last);
}
