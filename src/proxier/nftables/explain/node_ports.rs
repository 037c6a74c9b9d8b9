//! NodePorts: a destination NodePorts are served on, looked up in `@service-nodeports` and
//! `@no-endpoint-nodeports`; a loopback one, which nftables mode never DNATs, in the localhost
//! NodePorts reject map.

use super::Reader;
use crate::model::address::octets;
use crate::proxier::explanation::{ExplainError, Outcome, read_error};
use crate::proxier::nftables::render::{
    LOCALHOST_REJECT_PORTS, NO_ENDPOINT_NODEPORTS, NODEPORT_IPS, SERVICE_NODEPORTS, TABLE,
    localhost_rejected_counter,
};
use crate::sys::nf_tables::expr::Expr;
use crate::sys::nf_tables::read::counters;
use crate::sys::nf_tables::write::KeyType;

impl Reader<'_> {
    /// A NodePort, when the destination is an address NodePorts are served on.
    pub(super) fn node_port(&mut self) -> Result<Outcome, ExplainError> {
        let destination = self.flow.destination.ip();
        let listed = self
            .element(NODEPORT_IPS, &[self.address_type()], &octets(destination))?
            .is_some();
        if destination.is_loopback() && !listed {
            return self.localhost_node_port();
        }
        let local = self.session.local.contains(&destination) && self.node_ports_by_type()?;
        if !(listed || local) {
            return Ok(Outcome::Untouched {
                reason: format!(
                    "{destination} is no ClusterIP, external or load-balancer IP of a Service, and no NodePort address of this node"
                ),
            });
        }
        let nat = match self.port_element(SERVICE_NODEPORTS)? {
            Some(rest) => self.follow_verdict(&rest)?,
            None => Outcome::Untouched {
                reason: format!("no Service has NodePort {}", self.node_port_text()),
            },
        };
        // What the NAT chains leave alone meets the filter hooks' no-endpoint map.
        if !matches!(nat, Outcome::Untouched { .. }) {
            return Ok(nat);
        }
        Ok(match self.port_element(NO_ENDPOINT_NODEPORTS)? {
            Some(rest) => self.refusal(&rest),
            None => nat,
        })
    }

    /// NodePorts are served on every address of the node (`fib daddr type local` in chain
    /// `services`, for nodePortAddresses that hold them all) rather than on `@nodeport-ips`.
    fn node_ports_by_type(&mut self) -> Result<bool, ExplainError> {
        let by_type = |rule: &Vec<Expr>| {
            rule.iter()
                .any(|e| matches!(e, Expr::FibAddressType { .. }))
                && rule
                    .iter()
                    .any(|e| matches!(e, Expr::Lookup { set, .. } if set.name == SERVICE_NODEPORTS))
        };
        Ok(self.services_rules()?.iter().any(by_type))
    }

    /// A loopback NodePort: never DNATed in nftables mode; with the localhost NodePorts gate on,
    /// the ones the userspace proxy does not serve are rejected and counted.
    fn localhost_node_port(&mut self) -> Result<Outcome, ExplainError> {
        let destination = self.flow.destination.ip();
        if self.port_element(LOCALHOST_REJECT_PORTS)?.is_none() {
            return Ok(Outcome::Untouched {
                reason: format!(
                    "nftables mode programs no NodePort on {destination} (a loopback address)"
                ),
            });
        }
        let counter = localhost_rejected_counter(self.flow.protocol);
        let counted = counters(self.family, TABLE).map_err(read_error("the named counters"))?;
        self.explanation
            .reads
            .push("the named counters of our table".into());
        let so_far = match counted.get(counter) {
            Some(packets) => format!("{packets} packets so far"),
            None => "which is missing".into(),
        };
        Ok(Outcome::Reject {
            reason: format!(
                "the localhost NodePort proxy does not serve {} on {destination}; counted by counter {counter} ({so_far})",
                self.flow.protocol
            ),
        })
    }

    /// The element of the `protocol . port` map `map` for the flow, a step naming it when found.
    fn port_element(&mut self, map: &str) -> Result<Option<String>, ExplainError> {
        let key = self.protocol_and_port();
        let found = self.element(map, &[KeyType::Protocol, KeyType::Port], &key)?;
        if let Some(rest) = &found {
            self.step(format!("@{map}: {}{rest}", self.node_port_text()));
        }
        Ok(found)
    }
}
