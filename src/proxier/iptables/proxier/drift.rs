//! Drift repair: chains of ours that another program changed (a chain flushed, a rule inserted
//! or deleted, a jump from a built-in chain removed) are rewritten from what was programmed. On
//! nft the kernel's change events say which chains changed, and the change itself asks for the
//! sync that repairs it (see `sys/nf_events.rs`): nothing is read back. Legacy has no events: each
//! syncPeriod one read of each table (what every legacy restore reads anyway) is compared with
//! what was programmed.

use std::collections::{BTreeMap, BTreeSet};

use tracing::{info, warn};

use super::super::plan::{SharedRules, repair_restore};
use super::super::programmed::ProgrammedService;
use super::super::render::{BaseRules, NAT_CHAINS, ServiceRules, render_service};
use super::apply::restore_failure;
use super::{Failure, IptablesMode};
use crate::model::{IpFamily, NamespacedName, ProxyState};
use crate::proxier::quarantine::Quarantine;
use crate::proxier::xtables::{is_jump, jump_sources, missing_jumps};
use crate::sys::xtables::{Iptables, builtin_chains};

impl<I: Iptables> IptablesMode<I> {
    /// Takes the changes others made since the last sync; true when only a full sync can repair
    /// them (events were lost, or a whole table was changed).
    pub(super) fn take_drift(&mut self) -> bool {
        let Some(events) = self.events.as_mut() else {
            return false;
        };
        let drift = events.take();
        if drift.lost {
            warn!("Missed some of the kernel's change events; doing a full sync");
            self.drifted.clear();
            return true;
        }
        let mut whole_table = false;
        for (family, table, chain) in drift.chains {
            if chain.is_empty() {
                whole_table = true;
            } else {
                self.drifted
                    .entry(family)
                    .or_default()
                    .insert((table, chain));
            }
        }
        if whole_table {
            warn!("Another program changed a whole iptables table; doing a full sync");
            self.drifted.clear();
        }
        whole_table
    }

    /// Rewrites the chains of ours in `family` that others changed; how many. The shared
    /// chains get the rules memory holds; a service's own chains are rendered again from
    /// `state` (which the sync that calls this has just programmed). A service the kernel
    /// refused keeps its chains as they are.
    pub(super) fn repair(
        &mut self,
        family: IpFamily,
        state: &ProxyState,
        quarantine: &Quarantine,
    ) -> Result<usize, Failure> {
        let Some(drifted) = self.drifted.remove(&family) else {
            return Ok(0);
        };
        let Some(programmed) = self.programmed.get(&family) else {
            return Ok(0);
        };
        let owner = |chain: &str| {
            programmed
                .services
                .iter()
                .find(|(_, service)| service.chain(chain).is_some())
                .map(|(key, _)| key)
        };
        let is_ours = |table: &str, chain: &str| {
            let shared = if table == "filter" {
                programmed.base.filter_chains().contains(&chain)
            } else {
                NAT_CHAINS.contains(&chain)
            };
            shared || (table == "nat" && owner(chain).is_some())
        };
        let ours: BTreeSet<(String, String)> = drifted
            .iter()
            .filter(|(table, chain)| is_ours(table, chain))
            .cloned()
            .collect();
        let jumps_touched = drifted
            .iter()
            .any(|(table, chain)| builtin_chains(table).contains(&chain.as_str()));
        if ours.is_empty() && !jumps_touched {
            return Ok(0);
        }
        let rendered: BTreeMap<NamespacedName, ServiceRules> = ours
            .iter()
            .filter(|(table, _)| table == "nat")
            .filter_map(|(_, chain)| owner(chain))
            .filter(|key| !quarantine.contains(key))
            .filter_map(|key| {
                let ports = state.services.get(key)?;
                let rules = render_service(ports, state.endpoints.get(key), &programmed.ctx);
                Some((key.clone(), rules))
            })
            .collect();
        let jumps = programmed.base.jumps();
        let missing = if jumps_touched {
            missing_jumps(&mut self.iptables, family, &jumps).map_err(Failure::unattributed)?
        } else {
            Vec::new()
        };
        let Some(programmed) = self.programmed.get(&family) else {
            return Ok(0);
        };
        let own: BTreeMap<&str, &Vec<String>> = rendered
            .values()
            .flat_map(|rules| &rules.chains)
            .map(|(chain, rules)| (chain.as_str(), rules))
            .collect();
        let shared = SharedRules::of_programmed(programmed.services.values());
        let Some((text, _)) = repair_restore(&programmed.base, &shared, &own, &ours, &missing)
        else {
            return Ok(0);
        };
        self.restore(family, &text)
            .map_err(|err| restore_failure(err, &text, &rendered))?;
        let repaired = ours.len() + missing.len();
        info!(
            family = family.name(),
            chains = ours.len(),
            jumps = missing.len(),
            "Repaired rules another program changed"
        );
        Ok(repaired)
    }
}

impl<I: Iptables> IptablesMode<I> {
    /// Without change events (the legacy back end), checks every chain of ours against what was
    /// programmed from one read of each table (what legacy reads on every restore anyway): a
    /// chain flushed, a rule inserted or deleted, or a jump from a built-in chain gone is marked
    /// for repair. Rules are compared by count: the tools print some rules differently from how
    /// they were written.
    pub(super) fn verify(
        &mut self,
        family: IpFamily,
    ) -> Result<(), crate::sys::xtables::IptablesError> {
        let Some(programmed) = self.programmed.get(&family) else {
            return Ok(());
        };
        let expected = expected_counts(&programmed.base, &programmed.services);
        let jumps = programmed.base.jumps();
        let mut drifted = BTreeSet::new();
        for table in ["filter", "nat"] {
            let from = jump_sources(&jumps, table);
            let Some(snapshot) = self.iptables.snapshot(family, table, &from)? else {
                return Ok(());
            };
            for ((_, chain), count) in expected.iter().filter(|((t, _), _)| t == table) {
                if snapshot.rule_counts.get(chain) != Some(count) {
                    drifted.insert((table.to_string(), chain.clone()));
                }
            }
            for jump in jumps.iter().filter(|j| j.table == table) {
                let present = snapshot
                    .rules
                    .get(jump.from)
                    .is_some_and(|rules| rules.iter().any(|rule| is_jump(rule, jump)));
                if !present {
                    drifted.insert((table.to_string(), jump.from.to_string()));
                }
            }
        }
        if !drifted.is_empty() {
            warn!(
                family = family.name(),
                chains = drifted.len(),
                "Rules of ours were changed by another program"
            );
            self.drifted.entry(family).or_default().extend(drifted);
        }
        Ok(())
    }
}

/// How many rules each chain of ours holds as programmed, by (table, chain).
fn expected_counts(
    base: &BaseRules,
    services: &BTreeMap<NamespacedName, ProgrammedService>,
) -> BTreeMap<(String, String), usize> {
    let mut counts = BTreeMap::new();
    for chain in base.filter_chains() {
        counts.insert(("filter".to_string(), chain.to_string()), 0);
    }
    for chain in NAT_CHAINS {
        counts.insert(("nat".to_string(), chain.to_string()), 0);
    }
    let shared = services
        .values()
        .flat_map(|s| {
            s.filter
                .iter()
                .map(|r| ("filter", r))
                .chain(s.nat.iter().map(|r| ("nat", r)))
        })
        .chain(base.filter.iter().map(|r| ("filter", r)))
        .chain(
            base.nat
                .iter()
                .chain(&base.nat_services_tail)
                .map(|r| ("nat", r)),
        );
    for (table, rule) in shared {
        *counts
            .entry((table.to_string(), rule.chain.to_string()))
            .or_default() += 1;
    }
    for service in services.values() {
        for chain in service.chains.iter() {
            counts.insert(
                ("nat".to_string(), chain.name.to_string()),
                chain.rules as usize,
            );
        }
    }
    counts
}
