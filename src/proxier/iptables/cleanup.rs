//! iptables mode's own objects, by name, for `--cleanup` and for a switch to another mode.

use super::names::is_service_chain;

/// Chains only iptables mode declares, besides the per-service ones.
pub const CHAINS: [&str; 3] = [
    "KUBE-NODEPORTS",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-PROXY-CANARY",
];

/// Per-service chains of releases before 1.22 (`KUBE-XLB-*`, the Local policy's), which a node
/// upgraded through them may still hold.
const RETIRED_SERVICE_CHAIN_PREFIX: &str = "KUBE-XLB-";

/// Whether `chain` is a per-service chain of this mode, now or in an older release.
pub fn is_own_service_chain(chain: &str) -> bool {
    is_service_chain(chain) || chain.starts_with(RETIRED_SERVICE_CHAIN_PREFIX)
}

/// Whether `chain` of `table` is iptables mode's alone: IPVS mode has a nat KUBE-SERVICES, but
/// no filter one (where iptables mode REJECTs for services without endpoints).
pub fn owns_chain(table: &str, chain: &str) -> bool {
    CHAINS.contains(&chain)
        || is_own_service_chain(chain)
        || (table == "filter" && chain == "KUBE-SERVICES")
}
