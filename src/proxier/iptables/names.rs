//! Chain names, hashed exactly as upstream so that a node switching from kube-proxy to us (or
//! back) keeps the same chains: a prefix plus the first 16 characters of the base32 SHA-256 of
//! `ns/svc:port` + the lower-case protocol (+ `ip:port` for endpoint chains).

use crate::model::ServicePortName;
use crate::proxier::naming::base32_sha256;

/// Every chain name prefix a service's own chains use.
pub const SERVICE_CHAIN_PREFIXES: [&str; 5] = [
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-EXT-",
    "KUBE-FW-",
    "KUBE-SEP-",
];

/// The prefix of endpoint chains (KUBE-SEP-*).
pub const SEP_PREFIX: &str = "KUBE-SEP-";

fn hash16(text: &str) -> String {
    base32_sha256(text, 16)
}

fn port_proto(name: &ServicePortName) -> String {
    format!("{name}{}", name.protocol.lower())
}

/// KUBE-SVC-*: the endpoints for Cluster traffic policy.
pub fn cluster_policy_chain(name: &ServicePortName) -> String {
    format!("KUBE-SVC-{}", hash16(&port_proto(name)))
}

/// KUBE-SVL-*: the endpoints for Local traffic policy.
pub fn local_policy_chain(name: &ServicePortName) -> String {
    format!("KUBE-SVL-{}", hash16(&port_proto(name)))
}

/// KUBE-EXT-*: where external traffic (NodePort, external IPs, LoadBalancer IPs) goes first.
pub fn external_chain(name: &ServicePortName) -> String {
    format!("KUBE-EXT-{}", hash16(&port_proto(name)))
}

/// KUBE-FW-*: the loadBalancerSourceRanges allow-list.
pub fn firewall_chain(name: &ServicePortName) -> String {
    format!("KUBE-FW-{}", hash16(&port_proto(name)))
}

/// KUBE-SEP-*: one endpoint; `endpoint` is `ip:port` (`[ip]:port` for IPv6).
pub fn endpoint_chain(name: &ServicePortName, endpoint: &str) -> String {
    format!(
        "KUBE-SEP-{}",
        hash16(&format!("{}{endpoint}", port_proto(name)))
    )
}

/// True for the per-service chains this program owns (and may delete when unused).
pub fn is_service_chain(chain: &str) -> bool {
    SERVICE_CHAIN_PREFIXES
        .iter()
        .any(|prefix| chain.starts_with(prefix))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Protocol;

    #[test]
    fn upstream_check_values() {
        let name = ServicePortName::new("ns1", "svc1", "p80", Protocol::Tcp);
        assert_eq!(cluster_policy_chain(&name), "KUBE-SVC-XPGD46QRK7WJZT7O");
        assert_eq!(
            endpoint_chain(&name, "10.180.0.1:80"),
            "KUBE-SEP-SXIVWICOYRO3J4NJ"
        );
        // From upstream's TestOverallIPTablesRules.
        let svc2 = ServicePortName::new("ns2", "svc2", "p80", Protocol::Tcp);
        assert_eq!(external_chain(&svc2), "KUBE-EXT-GNZBNJ2PO5MGZ6GT");
        let svc5 = ServicePortName::new("ns5", "svc5", "p80", Protocol::Tcp);
        assert_eq!(firewall_chain(&svc5), "KUBE-FW-NUKIZ6OKUXPJNT4C");
        assert_eq!(
            endpoint_chain(&svc5, "10.180.0.3:80"),
            "KUBE-SEP-I77PXRDZVX7PMWMN"
        );
        assert!(is_service_chain("KUBE-SVL-AAAA") && !is_service_chain("KUBE-SERVICES"));
    }
}
