//! IPVS mode's own objects, by name, for `--cleanup` and for a switch to another mode: its
//! chains, virtual servers, kube-ipvs0 and ipsets.

use std::net::IpAddr;

use tracing::{info, warn};

use super::proxier::DUMMY_LINK;
use super::render::{SETS, set_name};
use crate::model::IpFamily;
use crate::sys::host::link::Links;
use crate::sys::ipset::SystemIpset;
use crate::sys::ipvs::{IpvsClient, VirtualServer};

/// Chains only IPVS mode declares.
pub const CHAINS: [&str; 5] = [
    "KUBE-NODE-PORT",
    "KUBE-LOAD-BALANCER",
    "KUBE-SOURCE-RANGES-FIREWALL",
    "KUBE-IPVS-FILTER",
    "KUBE-IPVS-OUT-FILTER",
];
/// The node port range upstream defaults to: IPVS virtual servers on node addresses in it are ours.
const NODE_PORTS: std::ops::RangeInclusive<u16> = 30000..=32767;

/// Removes IPVS mode's kernel state: virtual servers on kube-ipvs0's addresses (and on `local`
/// addresses in the node port range), kube-ipvs0, our ipsets. Call after its iptables rules are
/// gone (a set in use cannot be destroyed).
pub fn remove_state(local: &[IpAddr]) {
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
