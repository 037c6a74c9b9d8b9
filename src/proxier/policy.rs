//! What one service port's traffic may reach on this node, decided once for the modes that
//! write a chain per traffic policy (iptables and nftables): which endpoint sets are in use,
//! whether internal (cluster IP) and external traffic have an endpoint they may use, and what
//! traffic without one meets.

use crate::model::{Endpoint, NodeContext, SelectedEndpoints, ServicePort, select_endpoints};

/// What traffic meets when it has no endpoint it may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The port has no endpoint at all: the client is told so at once.
    Reject,
    /// It has endpoints, but none this traffic may use (Local policy, none on this node).
    Drop,
}

/// One port's decisions.
#[derive(Debug)]
pub struct PortPolicy<'a> {
    pub selected: SelectedEndpoints<'a>,
    /// The port has endpoints (anywhere).
    pub has_endpoints: bool,
    /// The cluster-wide endpoint set is used (it gets the cluster policy chain).
    pub uses_cluster_endpoints: bool,
    /// The node-local endpoint set is used (it gets the local policy chain).
    pub uses_local_endpoints: bool,
    /// Internal traffic follows the Local policy (else the Cluster one).
    pub internal_local: bool,
    /// Internal traffic has an endpoint it may use.
    pub has_internal: bool,
    /// External traffic follows the Local policy (else the Cluster one).
    pub external_local: bool,
    /// External traffic has an endpoint it may use.
    pub has_external: bool,
    /// External traffic (NodePort, external IPs, load-balancer IPs) goes through the external
    /// chain.
    pub uses_external_chain: bool,
    /// Traffic to the load-balancer IPs is filtered by source (the firewall chain).
    pub uses_firewall: bool,
}

impl<'a> PortPolicy<'a> {
    /// The decisions for `port` with `endpoints`, on `node`.
    pub fn new(port: &ServicePort, endpoints: &'a [Endpoint], node: NodeContext<'_>) -> Self {
        let selected = select_endpoints(port, endpoints, node);
        let has_endpoints = selected.has_any_endpoints;
        let has_local = has_endpoints && !selected.local.is_empty();
        PortPolicy {
            has_endpoints,
            uses_cluster_endpoints: !selected.cluster.is_empty() && port.uses_cluster_endpoints(),
            uses_local_endpoints: !selected.local.is_empty() && port.uses_local_endpoints(),
            internal_local: port.internal_policy_local,
            has_internal: if port.internal_policy_local {
                has_local
            } else {
                has_endpoints
            },
            external_local: port.external_policy_local,
            has_external: if port.external_policy_local {
                has_local
            } else {
                has_endpoints
            },
            uses_external_chain: has_endpoints && port.externally_accessible(),
            uses_firewall: has_endpoints
                && !port.load_balancer_ips.is_empty()
                && port.has_source_ranges(),
            selected,
        }
    }

    /// What internal traffic without a usable endpoint meets.
    pub fn internal_refusal(&self) -> Option<Refusal> {
        self.refusal(self.has_internal)
    }

    /// What external traffic without a usable endpoint meets.
    pub fn external_refusal(&self) -> Option<Refusal> {
        self.refusal(self.has_external)
    }

    fn refusal(&self, usable: bool) -> Option<Refusal> {
        if !self.has_endpoints {
            Some(Refusal::Reject)
        } else if !usable {
            Some(Refusal::Drop)
        } else {
            None
        }
    }

    /// Whether (internal, external) traffic has endpoints, but none on this node it may use
    /// (upstream's no-local-endpoints metric).
    pub fn no_local_endpoints(&self) -> (bool, bool) {
        (
            self.has_endpoints && !self.has_internal,
            self.has_endpoints && !self.has_external,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fixtures::{endpoint, service_port};

    const NODE: NodeContext<'static> = NodeContext {
        node_name: "node-a",
        zone: None,
    };

    #[test]
    fn a_port_without_endpoints_rejects_all_traffic() {
        let mut port = service_port("ns", "web", "http");
        port.node_port = Some(30080);
        let policy = PortPolicy::new(&port, &[], NODE);
        assert_eq!(policy.internal_refusal(), Some(Refusal::Reject));
        assert_eq!(policy.external_refusal(), Some(Refusal::Reject));
        assert!(!policy.uses_external_chain);
        assert_eq!(policy.no_local_endpoints(), (false, false));
    }

    #[test]
    fn local_external_traffic_without_a_local_endpoint_is_dropped() {
        let mut port = service_port("ns", "web", "http");
        port.node_port = Some(30080);
        port.external_policy_local = true;
        let endpoints = [endpoint("10.0.0.1", "node-b")];
        let policy = PortPolicy::new(&port, &endpoints, NODE);
        assert_eq!(policy.internal_refusal(), None);
        assert_eq!(policy.external_refusal(), Some(Refusal::Drop));
        assert!(policy.uses_external_chain && policy.uses_cluster_endpoints);
        assert!(!policy.uses_local_endpoints);
        assert_eq!(policy.no_local_endpoints(), (false, true));
    }

    #[test]
    fn source_ranges_need_load_balancer_ips() {
        let mut port = service_port("ns", "web", "http");
        port.load_balancer_source_ranges = vec!["203.0.113.0/24".parse().unwrap()];
        let endpoints = [endpoint("10.0.0.1", "node-a")];
        assert!(!PortPolicy::new(&port, &endpoints, NODE).uses_firewall);
        port.load_balancer_ips = vec!["1.2.3.4".parse().unwrap()];
        let policy = PortPolicy::new(&port, &endpoints, NODE);
        assert!(policy.uses_firewall && policy.has_internal && policy.has_external);
    }

    /// Upstream 1.37's TestNoEndpointsMetric, case by case: the internal and external traffic
    /// policies, the endpoints' nodes (this one is `node-a`), and whether internal and external
    /// traffic count as having no local endpoints.
    #[test]
    fn upstreams_no_local_endpoints_cases() {
        let local = ["node-a", "node1", "node2"];
        let remote = ["node0", "node1", "node2"];
        // (name, internal Local, external Local, the endpoints' nodes, counted as
        // (internal, external)).
        type Case<'a> = (&'a str, bool, bool, &'a [&'a str], (bool, bool));
        let cases: [Case; 7] = [
            (
                "internalTrafficPolicy is set and there are local endpoints",
                true,
                false,
                &local,
                (false, false),
            ),
            (
                "externalTrafficPolicy is set and there are local endpoints",
                false,
                true,
                &local,
                (false, false),
            ),
            (
                "both policies are set and there are local endpoints",
                true,
                true,
                &local,
                (false, false),
            ),
            (
                "internalTrafficPolicy is set and there are no local endpoints",
                true,
                false,
                &remote,
                (true, false),
            ),
            (
                "externalTrafficPolicy is set and there are no local endpoints",
                false,
                true,
                &remote,
                (false, true),
            ),
            (
                "both policies are set and there are no local endpoints",
                true,
                true,
                &remote,
                (true, true),
            ),
            (
                "both policies are set and there are no endpoints at all",
                true,
                true,
                &[],
                (false, false),
            ),
        ];
        for (name, internal_local, external_local, nodes, expected) in cases {
            let mut port = service_port("ns1", "svc1", "");
            port.internal_policy_local = internal_local;
            if external_local {
                port.node_port = Some(123);
                port.external_policy_local = true;
            }
            let endpoints: Vec<Endpoint> = nodes
                .iter()
                .enumerate()
                .map(|(i, node)| endpoint(&format!("10.0.1.{}", i + 1), node))
                .collect();
            let policy = PortPolicy::new(&port, &endpoints, NODE);
            assert_eq!(policy.no_local_endpoints(), expected, "{name}");
        }
    }
}
