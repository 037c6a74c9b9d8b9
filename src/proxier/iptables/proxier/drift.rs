//! Drift repair: chains of ours that another program changed (a chain flushed, a rule inserted
//! or deleted, a jump from a built-in chain removed) are rewritten from what was programmed at the
//! next sync, which the change itself asks for. The nft back end's change events say which chains
//! changed (see `sys/nf_events.rs`); nothing is read back to find out.

use std::collections::BTreeSet;

use tracing::{info, warn};

use super::super::restore::repair_restore;
use super::{Failure, IptablesProxier, missing_jumps};
use crate::model::IpFamily;
use crate::sys::iptables::{Iptables, builtin_chains};

impl<I: Iptables> IptablesProxier<I> {
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

    /// Rewrites the chains of ours in `family` that others changed, from memory; how many.
    pub(super) fn repair(&mut self, family: IpFamily) -> Result<usize, Failure> {
        let Some(drifted) = self.drifted.remove(&family) else {
            return Ok(0);
        };
        let Some(programmed) = self.programmed.get(&family) else {
            return Ok(0);
        };
        let is_ours = |table: &str, chain: &str| {
            let shared = if table == "filter" {
                programmed.base.filter_chains().contains(&chain)
            } else {
                super::super::render::NAT_CHAINS.contains(&chain)
            };
            shared
                || (table == "nat"
                    && programmed
                        .services
                        .values()
                        .any(|s| s.chains.contains_key(chain)))
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
        let jumps = programmed.base.jumps();
        let (base, services) = (programmed.base.clone(), programmed.services.clone());
        let missing = if jumps_touched {
            missing_jumps(&mut self.iptables, family, &jumps).map_err(Failure::unattributed)?
        } else {
            Vec::new()
        };
        let Some((text, _)) = repair_restore(&base, &services, &ours, &missing) else {
            return Ok(0);
        };
        self.restore(family, &text)
            .map_err(|err| Failure::of(err, &text, &services))?;
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
