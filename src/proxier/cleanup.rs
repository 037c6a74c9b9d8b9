//! Removing what kube-proxy owns: everything (`--cleanup`), or what the other modes left behind
//! (at start, after the first sync in the new mode, so traffic never goes unserved). Only our
//! chains, the rules that jump to them, our ipsets, virtual servers on our addresses,
//! kube-ipvs0 and nftables mode's `kube-proxy` tables go; everything else on the node stays.
//! Each mode names its own objects (its `cleanup`); the chains of the two iptables-based modes
//! are removed here, together, since rules of one may jump to chains of the other.

use std::collections::BTreeSet;
use std::net::IpAddr;

use tracing::{info, warn};

use super::xtables::SHARED_CHAINS;
use super::{iptables, ipvs, nftables};
use crate::model::IpFamily;
use crate::sys::nf_tables::SystemNftables;
use crate::sys::xtables::{
    Backend, ChainRules, Iptables, IptablesError, SystemIptables, builtin_chains, jump_target,
};

/// Whose state to remove.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leftovers {
    /// Every mode's (`--cleanup`).
    All,
    /// iptables mode's chains that IPVS mode does not use.
    IptablesMode,
    /// IPVS mode's chains, sets, virtual servers and kube-ipvs0.
    IpvsMode,
    /// Both iptables-based modes' (what nftables mode removes).
    XtablesModes,
    /// nftables mode's tables.
    NftablesMode,
}

impl Leftovers {
    /// The chains this removes when they are a fixed few (IPVS mode's), so they are looked up
    /// by name instead of listing a table of perhaps 100,000 chains.
    fn fixed_chains(self) -> Option<&'static [&'static str]> {
        (self == Leftovers::IpvsMode).then_some(&ipvs::cleanup::CHAINS)
    }

    /// Whether `chain` of `table` is one of the chains this removes.
    pub fn owns_chain(self, table: &str, chain: &str) -> bool {
        let iptables = iptables::cleanup::owns_chain(table, chain);
        let ipvs = ipvs::cleanup::CHAINS.contains(&chain);
        match self {
            Leftovers::All | Leftovers::XtablesModes => {
                iptables || ipvs || SHARED_CHAINS.contains(&chain)
            }
            Leftovers::IptablesMode => iptables,
            Leftovers::IpvsMode => ipvs,
            Leftovers::NftablesMode => false,
        }
    }
}

/// The `iptables-restore --noflush` input that removes the chains `delete` of `table`, and the
/// rules of `referrers` (chains that stay, with their rules as read) that jump to them. Three
/// steps, each its own transaction(s) when `per_transaction` asks for it: the jumps go, every
/// chain of `delete` and `flush_only` is flushed (which also drops their jumps to each other),
/// every chain of `delete` is deleted.
pub fn removal_input(
    table: &str,
    delete: &BTreeSet<String>,
    flush_only: &BTreeSet<String>,
    referrers: &ChainRules,
    per_transaction: Option<usize>,
) -> String {
    let mut out = format!("*{table}\n");
    for (from, rules) in referrers {
        for rule in rules {
            if jump_target(rule).is_some_and(|target| delete.contains(target)) {
                out.push_str(&format!("-D {from} {rule}\n"));
            }
        }
    }
    let limit = per_transaction.unwrap_or(usize::MAX).max(1);
    let mut flushed: Vec<&String> = delete.union(flush_only).collect();
    flushed.reverse();
    for (index, group) in flushed.chunks(limit).enumerate() {
        if per_transaction.is_some() || index == 0 {
            out.push_str(&format!("COMMIT\n*{table}\n"));
        }
        for chain in group {
            out.push_str(&format!(":{chain} - [0:0]\n"));
        }
    }
    let deleted: Vec<&String> = delete.iter().rev().collect();
    for (index, group) in deleted.chunks(limit).enumerate() {
        if per_transaction.is_some() || index > 0 {
            out.push_str(&format!("COMMIT\n*{table}\n"));
        }
        for chain in group {
            out.push_str(&format!("-X {chain}\n"));
        }
    }
    out.push_str("COMMIT\n");
    out
}

/// Removes `what` from both families of one back end; returns how many chains went. Reads only
/// chain names and the built-in chains' rules: a rule in another program's chain that jumps to
/// one of ours cannot be seen, so the chain it keeps in use is left (and named in the log).
pub fn remove_chains(iptables: &mut dyn Iptables, what: Leftovers) -> usize {
    let mut removed = 0;
    for family in [IpFamily::V4, IpFamily::V6] {
        for table in ["nat", "filter", "mangle"] {
            removed += remove_table_chains(iptables, family, table, what);
        }
    }
    removed
}

/// How many times a removal is retried without the chain another program's rule keeps in use.
const REMOVAL_ATTEMPTS: usize = 5;

fn remove_table_chains(
    iptables: &mut dyn Iptables,
    family: IpFamily,
    table: &str,
    what: Leftovers,
) -> usize {
    // Chains that may jump to the ones going: the built-in ones, and our shared chains that stay
    // (the other mode's KUBE-SERVICES); never a service's own chain, which jumps only to ours.
    let names = match what.fixed_chains() {
        Some(fixed) => {
            let ours: Vec<&str> = fixed
                .iter()
                .chain(&SHARED_CHAINS)
                .chain(&iptables::cleanup::CHAINS)
                .copied()
                .collect();
            iptables.existing_chains(family, table, &ours)
        }
        None => iptables.chain_names(family, table),
    };
    let Ok(names) = names else {
        return 0;
    };
    let mut chains: BTreeSet<String> = names
        .iter()
        .filter(|chain| what.owns_chain(table, chain))
        .cloned()
        .collect();
    let found = chains.len();
    if chains.is_empty() {
        return 0;
    }
    let mut referrers: Vec<&str> = builtin_chains(table).to_vec();
    referrers.extend(
        names
            .iter()
            .filter(|chain| {
                Leftovers::All.owns_chain(table, chain)
                    && !chains.contains(*chain)
                    && !iptables::cleanup::is_own_service_chain(chain)
            })
            .map(String::as_str),
    );
    let mut in_use = BTreeSet::new();
    for _ in 0..REMOVAL_ATTEMPTS {
        if chains.is_empty() {
            break;
        }
        let rules = match iptables.chain_rules(family, table, &referrers) {
            Ok(rules) => rules,
            Err(err) => {
                warn!(family = family.name(), table, error = %err, "Failed to read the chains that jump to ours");
                break;
            }
        };
        // The first transaction removes the jumps into them: nothing reaches them after it.
        let per_transaction = iptables.chains_per_transaction(chains.len(), false);
        let input = removal_input(table, &chains, &in_use, &rules, per_transaction);
        let err = match iptables.restore(family, &input) {
            Ok(()) => {
                chains.clear();
                break;
            }
            Err(err) => err,
        };
        // A chain that cannot be deleted is in use by a rule we did not read: it stays, emptied.
        let failed_chain = match &err {
            IptablesError::Restore {
                line: Some(line), ..
            } => input
                .lines()
                .nth(line.saturating_sub(1))
                .and_then(|l| l.strip_prefix("-X "))
                .map(str::to_string),
            _ => None,
        };
        let Some(chain) = failed_chain else {
            warn!(family = family.name(), table, error = %err, "Failed to remove kube-proxy chains");
            break;
        };
        warn!(family = family.name(), table, chain = %chain, "A chain of ours is in use by a rule that is not ours; it stays, emptied");
        chains.remove(&chain);
        in_use.insert(chain);
        // Sections before the failing one are applied: see what is left.
        match iptables.chain_names(family, table) {
            Ok(left) => chains.retain(|chain| left.contains(chain)),
            Err(_) => break,
        }
    }
    found.saturating_sub(chains.len() + in_use.len())
}

/// Removes `what` from every back end and family, and IPVS state and nftables tables when they
/// are included. Returns how many nftables removals failed (for the cleanup-failures metric).
pub fn cleanup(what: Leftovers, local: &[IpAddr]) -> Vec<IpFamily> {
    let mut nft_failures = Vec::new();
    if matches!(what, Leftovers::All | Leftovers::NftablesMode) {
        nft_failures = nftables::cleanup::remove_tables(&mut SystemNftables::default());
    }
    if what == Leftovers::NftablesMode {
        return nft_failures;
    }
    // A back end whose tools are missing fails its save and is skipped.
    for backend in [Backend::Nft, Backend::Legacy] {
        let removed = remove_chains(&mut SystemIptables::new(backend), what);
        if removed > 0 {
            info!(
                backend = backend.as_str(),
                chains = removed,
                "Removed kube-proxy chains"
            );
        }
    }
    if what != Leftovers::IptablesMode {
        ipvs::cleanup::remove_state(local);
    }
    nft_failures
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::xtables::fake::{FakeIptables, Read};

    const V4: IpFamily = IpFamily::V4;

    /// A node with iptables-mode and IPVS-mode chains of ours and some of other programs'.
    fn node() -> FakeIptables {
        let mut ipt = FakeIptables::default();
        ipt.restore(
            V4,
            "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAAA - [0:0]\n:KUBE-SEP-BBBB - [0:0]\n\
             :KUBE-NODE-PORT - [0:0]\n:DOCKER - [0:0]\n\
             -A KUBE-SEP-BBBB -p tcp -j DNAT --to-destination 10.0.0.1:80\n\
             -A KUBE-SVC-AAAA -j KUBE-SEP-BBBB\n\
             -A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -j KUBE-SVC-AAAA\n\
             -A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT\n\
             -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -A OUTPUT -j DOCKER\nCOMMIT\n\
             *filter\n:KUBE-IPVS-FILTER - [0:0]\n:KUBE-FIREWALL - [0:0]\n\
             -A INPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-FILTER\n\
             -A INPUT -j KUBE-FIREWALL\nCOMMIT\n",
        )
        .unwrap();
        ipt
    }

    fn chains(ipt: &FakeIptables, table: &str) -> Vec<String> {
        ipt.table(V4, table)
            .chains
            .into_iter()
            .map(|(name, _)| name)
            .filter(|name| !builtin_chains(table).contains(&name.as_str()))
            .collect()
    }

    #[test]
    fn removes_our_chains_and_the_jumps_to_them_only() {
        for per_transaction in [None, Some(1)] {
            let mut ipt = node();
            ipt.chains_per_transaction = per_transaction;
            assert_eq!(remove_chains(&mut ipt, Leftovers::All), 5);
            assert_eq!(chains(&ipt, "nat"), ["DOCKER"]);
            assert_eq!(chains(&ipt, "filter"), ["KUBE-FIREWALL"], "the kubelet's");
            assert_eq!(
                ipt.table(V4, "nat").chain("OUTPUT").unwrap(),
                &["-j DOCKER"]
            );
            assert!(ipt.table(V4, "nat").chain("PREROUTING").unwrap().is_empty());
            assert_eq!(
                remove_chains(&mut ipt, Leftovers::All),
                0,
                "a second run finds nothing"
            );
        }
    }

    #[test]
    fn switching_modes_removes_only_the_other_modes_chains() {
        let mut ipt = node();
        assert_eq!(remove_chains(&mut ipt, Leftovers::IptablesMode), 2);
        assert_eq!(
            chains(&ipt, "nat"),
            ["KUBE-SERVICES", "KUBE-NODE-PORT", "DOCKER"]
        );
        assert_eq!(
            ipt.table(V4, "nat").chain("KUBE-SERVICES").unwrap(),
            &["-m addrtype --dst-type LOCAL -j KUBE-NODE-PORT"],
            "IPVS mode has a KUBE-SERVICES too"
        );
        let mut ipt = node();
        assert_eq!(remove_chains(&mut ipt, Leftovers::IpvsMode), 2);
        assert_eq!(chains(&ipt, "filter"), ["KUBE-FIREWALL"]);
        assert!(
            !ipt.table(V4, "nat")
                .chain("KUBE-SERVICES")
                .unwrap()
                .iter()
                .any(|rule| rule.contains("KUBE-NODE-PORT"))
        );
    }

    #[test]
    fn reads_only_chain_names_and_built_in_chains() {
        let mut ipt = node();
        remove_chains(&mut ipt, Leftovers::All);
        for read in &ipt.reads {
            if let Read::ChainRules { table, chains, .. } = read {
                assert!(
                    chains
                        .iter()
                        .all(|c| builtin_chains(table).contains(&c.as_str())),
                    "{read:?}"
                );
            }
        }
    }

    #[test]
    fn a_chain_another_programs_rule_uses_stays_and_the_rest_goes() {
        let mut ipt = node();
        ipt.add_foreign_rule(V4, "nat", "DOCKER", "-j KUBE-SVC-AAAA");
        assert_eq!(remove_chains(&mut ipt, Leftovers::All), 4);
        assert_eq!(chains(&ipt, "nat"), ["KUBE-SVC-AAAA", "DOCKER"]);
        assert!(
            ipt.table(V4, "nat")
                .chain("KUBE-SVC-AAAA")
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn ownership() {
        assert!(
            !Leftovers::All.owns_chain("filter", "KUBE-FIREWALL"),
            "the kubelet's"
        );
        assert!(
            !Leftovers::All.owns_chain("nat", "KUBE-MARK-DROP"),
            "the kubelet's"
        );
        assert!(Leftovers::IptablesMode.owns_chain("filter", "KUBE-SERVICES"));
        assert!(
            !Leftovers::IptablesMode.owns_chain("nat", "KUBE-SERVICES"),
            "IPVS mode has one too"
        );
    }
}
