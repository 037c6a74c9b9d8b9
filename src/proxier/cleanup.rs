//! Removing what kube-proxy owns: everything (`--cleanup`), or what the other mode left behind
//! (at start, after the first sync in the new mode, so traffic never goes unserved). Only our
//! chains, the rules that jump to them, our ipsets, virtual servers on our addresses and
//! kube-ipvs0 go; everything else on the node stays.

use std::collections::BTreeSet;
use std::net::IpAddr;

use tracing::{info, warn};

use super::ipvs::DUMMY_LINK;
use super::ipvs::render::{SETS, set_name};
use crate::model::IpFamily;
use crate::sys::ipset::SystemIpset;
use crate::sys::iptables::{Backend, Iptables, SystemIptables, jump_target, table_section};
use crate::sys::ipvs::{IpvsClient, VirtualServer};
use crate::sys::link::Links;

/// Whose state to remove.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leftovers {
    /// Both modes' (`--cleanup`).
    All,
    /// iptables mode's chains that IPVS mode does not use.
    IptablesMode,
    /// IPVS mode's chains, sets, virtual servers and kube-ipvs0.
    IpvsMode,
}

/// Chains both modes declare (rewritten by whichever runs).
const SHARED: [&str; 5] = [
    "KUBE-SERVICES",
    "KUBE-POSTROUTING",
    "KUBE-MARK-MASQ",
    "KUBE-FORWARD",
    "KUBE-PROXY-FIREWALL",
];
/// Chains only iptables mode uses, besides the per-service ones.
const IPTABLES_ONLY: [&str; 3] = [
    "KUBE-NODEPORTS",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-PROXY-CANARY",
];
const PER_SERVICE_PREFIXES: [&str; 6] = [
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-SEP-",
    "KUBE-FW-",
    "KUBE-EXT-",
    "KUBE-XLB-",
];
/// Chains only IPVS mode uses.
const IPVS_ONLY: [&str; 5] = [
    "KUBE-NODE-PORT",
    "KUBE-LOAD-BALANCER",
    "KUBE-SOURCE-RANGES-FIREWALL",
    "KUBE-IPVS-FILTER",
    "KUBE-IPVS-OUT-FILTER",
];
/// The node port range upstream defaults to: IPVS virtual servers on node addresses in it are ours.
const NODE_PORTS: std::ops::RangeInclusive<u16> = 30000..=32767;

impl Leftovers {
    /// Whether `chain` of `table` is one of the chains this removes.
    pub fn owns_chain(self, table: &str, chain: &str) -> bool {
        // IPVS mode has no filter KUBE-SERVICES: iptables mode's (REJECTs for services without
        // endpoints) must not outlive it.
        let iptables = IPTABLES_ONLY.contains(&chain)
            || PER_SERVICE_PREFIXES.iter().any(|p| chain.starts_with(p))
            || (table == "filter" && chain == "KUBE-SERVICES");
        let ipvs = IPVS_ONLY.contains(&chain);
        match self {
            Leftovers::All => iptables || ipvs || SHARED.contains(&chain),
            Leftovers::IptablesMode => iptables,
            Leftovers::IpvsMode => ipvs,
        }
    }
}

/// The `iptables-restore --noflush` input that removes the chains `remove` names from one table
/// of `saved` (`iptables-save` output) and every rule elsewhere that jumps to them; `None` when
/// there is nothing to remove.
pub fn removal_input(saved: &str, table: &str, remove: &dyn Fn(&str) -> bool) -> Option<String> {
    let section = table_section(saved, table);
    let chains: BTreeSet<&str> = section
        .lines()
        .filter_map(|line| line.strip_prefix(':'))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|chain| remove(chain))
        .collect();
    if chains.is_empty() {
        return None;
    }
    let mut out = format!("*{table}\n");
    for chain in &chains {
        out.push_str(&format!(":{chain} - [0:0]\n"));
    }
    for line in section.lines() {
        let Some(rule) = line.strip_prefix("-A ") else {
            continue;
        };
        let from = rule.split_whitespace().next().unwrap_or("");
        let target = jump_target(rule).unwrap_or("");
        if !chains.contains(from) && chains.contains(target) {
            out.push_str(&format!("-D {rule}\n"));
        }
    }
    for chain in &chains {
        out.push_str(&format!("-X {chain}\n"));
    }
    out.push_str("COMMIT\n");
    Some(out)
}

/// Removes `what` from both families of one back end; returns how many chains went.
pub fn remove_chains(iptables: &mut dyn Iptables, what: Leftovers) -> usize {
    let mut removed = 0;
    for family in [IpFamily::V4, IpFamily::V6] {
        let Ok(saved) = iptables.save(family, None) else {
            continue;
        };
        for table in ["nat", "filter", "mangle"] {
            let Some(input) = removal_input(&saved, table, &|c| what.owns_chain(table, c)) else {
                continue;
            };
            let count = input.lines().filter(|l| l.starts_with("-X")).count();
            match iptables.restore(family, &input) {
                Ok(()) => removed += count,
                Err(err) => {
                    warn!(?family, table, error = %err, "Failed to remove kube-proxy chains")
                }
            }
        }
    }
    removed
}

/// Removes IPVS mode's kernel state: virtual servers on kube-ipvs0's addresses (and on `local`
/// addresses in the node port range), kube-ipvs0, our ipsets. Call after its iptables rules are
/// gone (a set in use cannot be destroyed).
pub fn remove_ipvs_state(local: &[IpAddr]) {
    let mut links = match Links::open() {
        Ok(links) => links,
        Err(err) => return warn!(error = %err, "Failed to open rtnetlink"),
    };
    let bound = match links.index_of(DUMMY_LINK) {
        Ok(Some(index)) => links.addresses(index).unwrap_or_default(),
        _ => Vec::new(),
    };
    // No IPVS in the kernel: no virtual servers to remove.
    if let Ok(mut ipvs) = IpvsClient::connect() {
        remove_virtual_servers(&mut ipvs, |vs| {
            bound.contains(&vs.address)
                || (local.contains(&vs.address) && NODE_PORTS.contains(&vs.port))
        });
    }
    match links.delete(DUMMY_LINK) {
        Ok(true) => info!(link = DUMMY_LINK, "Removed the IPVS dummy link"),
        Ok(false) => {}
        Err(err) => warn!(error = %err, "Failed to delete {DUMMY_LINK}"),
    }
    let names: Vec<String> = [IpFamily::V4, IpFamily::V6]
        .into_iter()
        .flat_map(|family| SETS.iter().map(move |(base, _, _)| set_name(base, family)))
        .collect();
    match SystemIpset.destroy(&names) {
        Ok(0) => {}
        Ok(_) => info!("Removed the IPVS ipsets"),
        Err(err) => warn!(error = %err, "Failed to destroy the IPVS ipsets"),
    }
}

fn remove_virtual_servers(ipvs: &mut IpvsClient, ours: impl Fn(&VirtualServer) -> bool) {
    let mut count = 0;
    for vs in ipvs
        .services()
        .unwrap_or_default()
        .iter()
        .filter(|vs| ours(vs))
    {
        match ipvs.delete_service(vs) {
            Ok(()) => count += 1,
            Err(err) => warn!(error = %err, "Failed to delete an IPVS virtual server"),
        }
    }
    if count > 0 {
        info!(count, "Removed IPVS virtual servers");
    }
}

/// Removes `what` from every back end and family, and IPVS state when it is included.
pub fn cleanup(what: Leftovers, local: &[IpAddr]) {
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
        remove_ipvs_state(local);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAVED: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-AAAA - [0:0]
:KUBE-NODE-PORT - [0:0]
:DOCKER - [0:0]
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A OUTPUT -j DOCKER
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -j KUBE-SVC-AAAA
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT
COMMIT
*filter
:INPUT ACCEPT [0:0]
:KUBE-IPVS-FILTER - [0:0]
-A INPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-FILTER
COMMIT
";

    #[test]
    fn removes_the_chains_and_the_jumps_to_them_only() {
        let all = removal_input(SAVED, "nat", &|c| Leftovers::All.owns_chain("nat", c)).unwrap();
        assert_eq!(
            all,
            "*nat\n:KUBE-NODE-PORT - [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAAA - [0:0]\n\
             -D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -X KUBE-NODE-PORT\n-X KUBE-SERVICES\n-X KUBE-SVC-AAAA\nCOMMIT\n"
        );
        // Switching to IPVS: the per-service chains go, and KUBE-SERVICES' jump to one with them.
        let iptables = removal_input(SAVED, "nat", &|c| {
            Leftovers::IptablesMode.owns_chain("nat", c)
        });
        assert_eq!(
            iptables.unwrap(),
            "*nat\n:KUBE-SVC-AAAA - [0:0]\n-D KUBE-SERVICES -d 10.96.0.10/32 -p tcp -j KUBE-SVC-AAAA\n\
             -X KUBE-SVC-AAAA\nCOMMIT\n"
        );
        let ipvs = removal_input(SAVED, "filter", &|c| {
            Leftovers::IpvsMode.owns_chain("filter", c)
        })
        .unwrap();
        assert!(ipvs.contains(
            "-D INPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-FILTER"
        ));
        assert!(
            removal_input("*nat\n:DOCKER - [0:0]\nCOMMIT\n", "nat", &|c| {
                Leftovers::All.owns_chain("nat", c)
            })
            .is_none()
        );
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
