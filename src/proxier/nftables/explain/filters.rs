//! What the filter hooks do to a flow after the NAT chains: one the NAT chains left alone
//! meets the no-endpoint maps (a Service whose traffic policy leaves this traffic no endpoint
//! is dropped there), and one to an address of a ServiceCIDR no Service holds is dropped by
//! `cluster-ips-check`.

use super::Reader;
use crate::proxier::explanation::{ExplainError, Outcome};
use crate::proxier::nftables::render::NO_ENDPOINT_SERVICES;
use crate::sys::nf_tables::expr::{Data, Expr};
use crate::sys::nf_tables::wire::NF_DROP;
use crate::sys::nf_tables::write::KeyType;

/// The chain that rejects other ports of ClusterIPs and drops unallocated ones.
const CLUSTER_IPS_CHECK: &str = "cluster-ips-check";

impl Reader<'_> {
    /// `outcome`, unless the NAT chains left the flow untouched and `map` (a no-endpoint map)
    /// refuses it.
    pub(super) fn filtered(
        &mut self,
        outcome: Outcome,
        map: &str,
    ) -> Result<Outcome, ExplainError> {
        if !matches!(outcome, Outcome::Untouched { .. }) {
            return Ok(outcome);
        }
        let found = if map == NO_ENDPOINT_SERVICES {
            let layout = [self.address_type(), KeyType::Protocol, KeyType::Port];
            let key = self.service_key();
            let found = self.element(map, &layout, &key)?;
            if let Some(rest) = &found {
                self.step(format!("@{map}: {}{rest}", self.key_text()));
            }
            found
        } else {
            self.port_element(map)?
        };
        Ok(match found {
            Some(rest) => self.refusal(&rest),
            None => outcome,
        })
    }

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
