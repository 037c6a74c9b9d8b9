//! What the two modes that write iptables rules (iptables and IPVS) share: the jumps from the
//! kernel's built-in chains into ours, and finding those a built-in chain lacks by reading that
//! chain alone.

pub mod evaluate;
pub mod text;
#[cfg(test)]
pub mod tracer;

use crate::model::IpFamily;
use crate::sys::xtables::{Iptables, IptablesError, jump_target};

/// Chains both iptables-based modes declare (rewritten by whichever runs).
pub const SHARED_CHAINS: [&str; 5] = [
    "KUBE-SERVICES",
    "KUBE-POSTROUTING",
    "KUBE-MARK-MASQ",
    "KUBE-FORWARD",
    "KUBE-PROXY-FIREWALL",
];

/// A jump from a built-in chain to one of ours, kept at the top of the built-in chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JumpRule {
    pub table: &'static str,
    pub from: &'static str,
    pub to: &'static str,
    /// Everything before `-j`.
    pub spec: &'static str,
}

impl JumpRule {
    /// The rule's text after `-A <from> ` (or `-I <from> 1 `).
    pub fn rule_spec(&self) -> String {
        if self.spec.is_empty() {
            format!("-j {}", self.to)
        } else {
            format!("{} -j {}", self.spec, self.to)
        }
    }
}

/// The jumps of `jumps` that their built-in chains lack, from a read of those chains alone:
/// their rules' kernel form where the back end reads chains one at a time (nft, over netlink; a
/// jump is there when a rule holds exactly its form), else their text (`iptables -S`, matched
/// by target and comment).
pub fn missing_jumps<I: Iptables + ?Sized>(
    iptables: &mut I,
    family: IpFamily,
    jumps: &[JumpRule],
) -> Result<Vec<JumpRule>, IptablesError> {
    let mut missing = Vec::new();
    for table in ["filter", "nat"] {
        let from = jump_sources(jumps, table);
        if from.is_empty() {
            continue;
        }
        if let Some(fingerprint) = iptables.rule_fingerprinter()
            && let Some(held) = iptables.chain_fingerprints(family, table, &from)?
        {
            missing.extend(jumps.iter().filter(|jump| {
                let expected = fingerprint(family, &jump.rule_spec());
                let rules = from
                    .iter()
                    .position(|chain| *chain == jump.from)
                    .and_then(|at| held.get(at));
                jump.table == table
                    && !rules.is_some_and(|rules| expected.is_some_and(|f| rules.contains(&f)))
            }));
            continue;
        }
        let rules = iptables.chain_rules(family, table, &from)?;
        missing.extend(jumps.iter().filter(|jump| {
            jump.table == table
                && !rules
                    .get(jump.from)
                    .is_some_and(|rules| rules.iter().any(|rule| is_jump(rule, jump)))
        }));
    }
    Ok(missing)
}

/// The built-in chains of `table` that `jumps` start from.
pub fn jump_sources(jumps: &[JumpRule], table: &str) -> Vec<&'static str> {
    let mut from: Vec<&'static str> = jumps
        .iter()
        .filter(|j| j.table == table)
        .map(|j| j.from)
        .collect();
    from.sort_unstable();
    from.dedup();
    from
}

/// Whether a rule of a built-in chain is `jump` (our comment and target; the tools may print
/// its matches in another order than we wrote them).
pub fn is_jump(rule: &str, jump: &JumpRule) -> bool {
    jump_target(rule) == Some(jump.to)
        && jump
            .spec
            .split("--comment ")
            .nth(1)
            .is_none_or(|comment| rule.contains(comment))
}
