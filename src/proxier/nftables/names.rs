//! Object names in our nftables table, as upstream builds them so a node can switch between
//! kube-proxy and kube-proxy-rs: a prefix (`service-`, `local-`, `external-`, `firewall-`,
//! `endpoint-`, `affinity-`), the first 8 characters of the base32 SHA-256 of a readable base
//! name, `-`, and that base name (`ns/svc/tcp/port`, with `__ip/port` for endpoints), cut to 240
//! characters.

use crate::model::{Endpoint, ServicePortName};
use crate::proxier::naming::base32_sha256;

/// The longest name upstream writes (knftables' limit of 256 minus 16 for prefixes).
const MAX_NAME: usize = 240;

/// `HASH8-base`, cut to [`MAX_NAME`].
pub fn hash_and_truncate(base: &str) -> String {
    let name = format!("{}-{base}", base32_sha256(base, 8));
    if name.len() > MAX_NAME {
        let mut cut = MAX_NAME - 3;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}...", &name[..cut])
    } else {
        name
    }
}

/// `ns/svc/tcp/port`.
pub fn service_base(port: &ServicePortName) -> String {
    format!(
        "{}/{}/{}/{}",
        port.service.namespace,
        port.service.name,
        port.protocol.lower(),
        port.port
    )
}

/// `ns/svc/tcp/port__ip/port` (IPv6 `:` as `.`).
pub fn endpoint_base(port: &ServicePortName, endpoint: &Endpoint) -> String {
    let ip = endpoint.ip.to_string().replace(':', ".");
    format!("{}__{ip}/{}", service_base(port), endpoint.port)
}

/// The chain for Cluster-policy endpoints (as [`port_chains`] names it).
#[cfg(test)]
pub fn service_chain(port: &ServicePortName) -> String {
    port_chains(port).service
}

/// A service port's four chains.
pub struct PortChains {
    /// For Cluster-policy endpoints.
    pub service: String,
    /// For Local-policy endpoints.
    pub local: String,
    /// The entry for external traffic (NodePort, external and load-balancer IPs).
    pub external: String,
    /// Enforces loadBalancerSourceRanges.
    pub firewall: String,
}

/// The chains of `port`, its name hashed once.
pub fn port_chains(port: &ServicePortName) -> PortChains {
    let hash = hash_and_truncate(&service_base(port));
    PortChains {
        service: format!("service-{hash}"),
        local: format!("local-{hash}"),
        external: format!("external-{hash}"),
        firewall: format!("firewall-{hash}"),
    }
}

/// An endpoint's chain and ClientIP affinity set.
pub struct EndpointNames {
    pub chain: String,
    pub affinity: String,
}

/// The names of `endpoint`'s objects, its name hashed once.
pub fn endpoint_names(port: &ServicePortName, endpoint: &Endpoint) -> EndpointNames {
    let hash = hash_and_truncate(&endpoint_base(port, endpoint));
    EndpointNames {
        chain: format!("endpoint-{hash}"),
        affinity: format!("affinity-{hash}"),
    }
}

/// Service chains are the ones whose names hold a `/`; no fixed chain does.
pub fn is_service_chain(chain: &str) -> bool {
    chain.contains('/')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Protocol;

    #[test]
    fn upstream_check_values() {
        let svc = |ns: &str, name: &str| ServicePortName::new(ns, name, "p80", Protocol::Tcp);
        let ep = |ip: &str| Endpoint::ready(ip.parse().unwrap(), 80, None);
        assert_eq!(
            service_chain(&svc("ns1", "svc1")),
            "service-ULMVA6XW-ns1/svc1/tcp/p80"
        );
        assert_eq!(
            endpoint_names(&svc("ns1", "svc1"), &ep("10.180.0.1")).chain,
            "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
        );
        assert_eq!(
            hash_and_truncate("ns2/svc2/tcp/p80"),
            "42NFTM6N-ns2/svc2/tcp/p80"
        );
        assert_eq!(
            hash_and_truncate("ns2/svc2/tcp/p80__10.180.0.2/80"),
            "SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80"
        );
        assert_eq!(
            hash_and_truncate("ns3/svc3/tcp/p80"),
            "4AT6LBPK-ns3/svc3/tcp/p80"
        );
        assert_eq!(
            hash_and_truncate("ns4/svc4/tcp/p80"),
            "LAUZTJTB-ns4/svc4/tcp/p80"
        );
        assert_eq!(
            hash_and_truncate("ns4/svc4/tcp/p80__10.180.0.4/80"),
            "UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80"
        );
        assert_eq!(
            hash_and_truncate("ns5/svc5/tcp/p80"),
            "HVFWP5L3-ns5/svc5/tcp/p80"
        );
        assert_eq!(
            endpoint_names(&svc("ns5", "svc5"), &ep("10.180.0.3")).affinity,
            "affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80"
        );
        let kubernetes = ServicePortName::new("default", "kubernetes", "https", Protocol::Tcp);
        assert_eq!(
            hash_and_truncate(&service_base(&kubernetes)),
            "2QRHZV4L-default/kubernetes/tcp/https"
        );
        let v6 = endpoint_base(&svc("ns", "s"), &ep("fd00::1"));
        assert_eq!(v6, "ns/s/tcp/p80__fd00..1/80");
        let long = hash_and_truncate(&"x".repeat(300));
        assert_eq!(long.len(), 240);
        assert!(long.ends_with("..."));
        assert!(
            is_service_chain("service-ULMVA6XW-ns1/svc1/tcp/p80") && !is_service_chain("services")
        );
    }
}
