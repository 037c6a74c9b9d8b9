//! What the filter hooks do to a flow no map of the NAT chains knows: one to an address of a
//! ServiceCIDR no Service holds is dropped by `cluster-ips-check`.

use super::Reader;
use crate::proxier::explanation::{ExplainError, Outcome};
use crate::sys::nf_tables::expr::{Data, Expr};
use crate::sys::nf_tables::wire::NF_DROP;

/// The chain that rejects other ports of ClusterIPs and drops unallocated ones.
const CLUSTER_IPS_CHECK: &str = "cluster-ips-check";

impl Reader<'_> {
    /// The drop of `cluster-ips-check` (`ip daddr { CIDRS } drop`), when the destination is in
    /// one of its ServiceCIDRs.
    pub(super) fn unallocated_cluster_ip(&mut self) -> Result<Option<Outcome>, ExplainError> {
        let destination = self.flow.destination.ip();
        for rule in self.rules_of(CLUSTER_IPS_CHECK)? {
            let drops = rule.iter().any(|e| {
                matches!(e, Expr::Immediate { data: Data::Verdict(v), .. } if v.code == NF_DROP)
            });
            if drops && self.applies_reading(&rule, true)? == Some(true) {
                self.step(format!(
                    "{CLUSTER_IPS_CHECK}: {destination} is in a ServiceCIDR but no Service's"
                ));
                return Ok(Some(Outcome::Drop {
                    reason: format!(
                        "{destination} is an unallocated ClusterIP (in a ServiceCIDR, held by no Service)"
                    ),
                }));
            }
        }
        Ok(None)
    }
}
