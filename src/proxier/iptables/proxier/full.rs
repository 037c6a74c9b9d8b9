//! A full sync of one family: every service rendered while our chains' names are read (when
//! memory cannot tell them), the chains that already hold the right rules kept (see `adopt`),
//! stale chains deleted, jumps from the built-in chains restored, in transactions of whole
//! services.

use super::apply::restore_failure;
use super::*;

impl<I: Iptables> IptablesMode<I> {
    /// Programs every service of `family` (see [`Mode::full_sync`]).
    pub(super) fn program_all(
        &mut self,
        family: IpFamily,
        ctx: RenderContext,
        state: &ProxyState,
        quarantine: &Quarantine,
    ) -> Result<RestoreStats, Failure> {
        let base = render_base(&ctx);
        // Only what is ours is read: the rules of the built-in chains our jumps start from, our
        // chains' rules (to keep those already right), and nat's chain names (for stale service
        // chains) when memory cannot tell them: at the first full sync (a restart finds an
        // earlier run's chains) and after a failed restore. They are read while the services
        // render.
        let known = self.known_chains(family);
        let (services, existing) =
            render_reading_names(&mut self.iptables, family, &ctx, state, quarantine, known);
        let existing = existing.map_err(Failure::unattributed)?;
        let held = held_services(self.programmed.get(&family), state, quarantine);
        let services = with_held(services, &held);
        let held_chains: BTreeSet<&str> = held.values().flat_map(|s| s.chain_names()).collect();
        let wanted: HashSet<&str, ahash::RandomState> = services
            .values()
            .flat_map(|s| s.chains.keys().map(String::as_str))
            .chain(held_chains.iter().copied())
            .collect();
        let stale: Vec<String> = existing
            .iter()
            .filter(|chain| is_service_chain(chain) && !wanted.contains(chain.as_str()))
            .cloned()
            .collect();
        let missing = missing_jumps(&mut self.iptables, family, &base.jumps())
            .map_err(Failure::unattributed)?;
        // Traffic reaches our chains when the jumps into KUBE-SERVICES are in place.
        let reachable = !missing.iter().any(|jump| jump.to == KUBE_SERVICES);
        let (mut kept, trusted) = self
            .kept_chains(family, &base, &services, &existing)
            .map_err(Failure::unattributed)?;
        kept.nat.extend(held_chains.iter().map(|c| c.to_string()));
        let chain_count = wanted.len() - kept.nat.len().min(wanted.len()) + stale.len();
        let (text, stats) = full_restore(
            &base,
            &services,
            &FullSyncExtras {
                stale_chains: &stale,
                missing_jumps: &missing,
                chains_per_transaction: self
                    .iptables
                    .chains_per_transaction(chain_count, reachable),
                kept: kept.clone(),
            },
        );
        if !kept.is_empty() {
            info!(
                family = family.name(),
                kept = kept.len(),
                written = stats.nat_chains,
                stale = stale.len(),
                kept_by_name = trusted.len(),
                "Full sync: left the chains that already held the right rules"
            );
        }
        if !text.is_empty() {
            self.restore(family, &text)
                .map_err(|err| restore_failure(err, &text, &services))?;
        }
        let mut programmed: BTreeMap<NamespacedName, ProgrammedService> = services
            .iter()
            .filter(|(key, _)| !held.contains_key(*key))
            .map(|(key, rules)| (key.clone(), ProgrammedService::of(rules)))
            .collect();
        programmed.extend(held);
        self.programmed.insert(
            family,
            FamilyState {
                ctx,
                services: programmed,
                base,
            },
        );
        self.drifted.remove(&family);
        self.known.insert(family);
        if trusted.is_empty() {
            self.unverified.remove(&family);
        } else {
            self.unverified.insert(family, trusted);
            self.ask_for_sync();
        }
        Ok(stats)
    }

    /// Our nat chains, when memory can tell them.
    fn known_chains(&self, family: IpFamily) -> Option<BTreeSet<String>> {
        let programmed = self.programmed.get(&family)?;
        if !self.known.contains(&family) {
            return None;
        }
        Some(
            programmed
                .services
                .values()
                .flat_map(|s| s.chain_names().map(str::to_string))
                .chain(
                    NAT_CHAINS
                        .iter()
                        .chain([&KUBE_PROXY_CANARY])
                        .map(|c| c.to_string()),
                )
                .collect(),
        )
    }
}

/// Every service not quarantined, rendered while nat's chain names are read on another thread
/// (unless `known`); without a thread for the reader the sync fails, and the next one tries
/// again.
fn render_reading_names<I: Iptables>(
    iptables: &mut I,
    family: IpFamily,
    ctx: &RenderContext,
    state: &ProxyState,
    quarantine: &Quarantine,
    known: Option<BTreeSet<String>>,
) -> (
    BTreeMap<NamespacedName, ServiceRules>,
    Result<BTreeSet<String>, IptablesError>,
) {
    std::thread::scope(|scope| {
        let names = known.is_none().then(|| {
            std::thread::Builder::new()
                .name("iptables-read".into())
                .spawn_scoped(scope, move || iptables.chain_names(family, "nat"))
        });
        let services: BTreeMap<NamespacedName, ServiceRules> = state
            .services
            .iter()
            .filter(|(key, _)| !quarantine.contains(key))
            .map(|(key, ports)| {
                let rules = render_service(ports, state.endpoints.get(key), ctx);
                (key.clone(), rules)
            })
            .filter(|(_, rules)| !rules.is_empty())
            .collect();
        let existing = match names {
            Some(Ok(reader)) => reader.join().unwrap_or(Err(IptablesError::ReaderPanicked)),
            Some(Err(err)) => Err(IptablesError::NoThread(err.to_string())),
            None => Ok(known.unwrap_or_default()),
        };
        (services, existing)
    })
}

/// The quarantined services still in the state, as the kernel last accepted them.
fn held_services(
    previous: Option<&FamilyState>,
    state: &ProxyState,
    quarantine: &Quarantine,
) -> BTreeMap<NamespacedName, ProgrammedService> {
    previous
        .map(|previous| {
            previous
                .services
                .iter()
                .filter(|(key, _)| quarantine.contains(key) && state.services.contains_key(*key))
                .map(|(key, programmed)| (key.clone(), programmed.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// `services` and the `held` ones: a quarantined service's rules in the shared chains are
/// written again from memory, its own chains are left as they are.
fn with_held(
    mut services: BTreeMap<NamespacedName, ServiceRules>,
    held: &BTreeMap<NamespacedName, ProgrammedService>,
) -> BTreeMap<NamespacedName, ServiceRules> {
    for (key, programmed) in held {
        services.insert(
            key.clone(),
            ServiceRules {
                filter: programmed.filter.to_vec(),
                nat: programmed.nat.to_vec(),
                ..ServiceRules::default()
            },
        );
    }
    services
}
