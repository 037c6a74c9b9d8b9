//! Which localhost NodePorts the userspace proxy serves and where their connections go
//! (KEP-6032): every TCP NodePort, in each family the proxy serves, that has an endpoint its
//! external traffic may use; that traffic's endpoints, chosen as the kernel path chooses them
//! (topology applied; this node's only under externalTrafficPolicy Local, where a port without
//! a local endpoint gets no listener and its connections are refused, as upstream).

use std::net::SocketAddr;
use std::time::Duration;

use crate::model::{
    IpFamily, NamespacedName, NodeContext, ProxyState, ServicePortName, ports_in_family,
    select_endpoints,
};

/// Where one localhost NodePort's connections go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub port: ServicePortName,
    /// The endpoints, sorted.
    pub endpoints: Vec<SocketAddr>,
    /// The ClientIP affinity timeout, when affinity is on.
    pub affinity: Option<Duration>,
}

/// The targets of `service`'s ports in `families`, by the address each listens on.
pub fn targets_of(
    service: &NamespacedName,
    state: &ProxyState,
    families: &[IpFamily],
) -> Vec<(SocketAddr, Target)> {
    let Some(ports) = state.services.get(service) else {
        return Vec::new();
    };
    // Most services have no TCP NodePort: skip them before their endpoints are sorted out.
    if !ports.values().any(|port| port.tcp_node_port().is_some()) {
        return Vec::new();
    }
    let endpoints = state.endpoints.get(service);
    let node = NodeContext {
        node_name: &state.node.name,
        zone: state.node.zone(),
    };
    let mut targets = Vec::new();
    for &family in families {
        for (port, all) in ports_in_family(ports, endpoints, family) {
            let Some(node_port) = port.tcp_node_port() else {
                continue;
            };
            let selected = select_endpoints(&port, &all, node);
            let used = if port.external_policy_local {
                &selected.local
            } else {
                &selected.cluster
            };
            if used.is_empty() {
                continue;
            }
            let mut endpoints: Vec<SocketAddr> = used
                .iter()
                .map(|ep| SocketAddr::new(ep.ip, ep.port))
                .collect();
            endpoints.sort();
            endpoints.dedup();
            let target = Target {
                port: port.name.clone(),
                endpoints,
                affinity: port
                    .session_affinity_seconds
                    .map(|s| Duration::from_secs(u64::from(s))),
            };
            targets.push((SocketAddr::new(family.loopback(), node_port), target));
        }
    }
    targets
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::model::fixtures::{endpoint, insert_port, service_port};
    use crate::model::{Endpoint, Protocol};

    fn state(port: crate::model::ServicePort, endpoints: Vec<Endpoint>) -> ProxyState {
        let mut state = ProxyState::default();
        state.node.name = "node-a".into();
        insert_port(&mut state, port, endpoints);
        state
    }

    fn web(node_port: Option<u16>) -> crate::model::ServicePort {
        let mut port = service_port("ns", "web", "http");
        port.node_port = node_port;
        port
    }

    fn addresses(targets: &[(SocketAddr, Target)]) -> Vec<String> {
        targets.iter().map(|(a, _)| a.to_string()).collect()
    }

    #[test]
    fn a_tcp_node_port_with_endpoints_is_served_in_each_family_it_has() {
        let endpoints = vec![
            endpoint("10.0.0.2", "node-b"),
            endpoint("10.0.0.1", "node-a"),
        ];
        let state = state(web(Some(30080)), endpoints);
        let service = NamespacedName::new("ns", "web");
        let targets = targets_of(&service, &state, &[IpFamily::V4, IpFamily::V6]);
        assert_eq!(
            addresses(&targets),
            ["127.0.0.1:30080"],
            "no IPv6 cluster IP"
        );
        assert_eq!(
            targets[0].1.endpoints,
            [
                "10.0.0.1:8080".parse().unwrap(),
                "10.0.0.2:8080".parse().unwrap()
            ]
        );
        assert_eq!(targets[0].1.affinity, None);
        assert!(targets_of(&service, &state, &[IpFamily::V6]).is_empty());
    }

    #[test]
    fn ports_without_node_port_endpoints_or_tcp_are_not_served() {
        let service = NamespacedName::new("ns", "web");
        let one = || vec![endpoint("10.0.0.1", "node-a")];
        assert!(targets_of(&service, &state(web(None), one()), &[IpFamily::V4]).is_empty());
        assert!(targets_of(&service, &state(web(Some(30080)), vec![]), &[IpFamily::V4]).is_empty());
        let mut udp = web(Some(30080));
        udp.name.protocol = Protocol::Udp;
        assert!(targets_of(&service, &state(udp, one()), &[IpFamily::V4]).is_empty());
        let mut not_ready = endpoint("10.0.0.1", "node-a");
        not_ready.ready = false;
        not_ready.serving = false;
        let state = state(web(Some(30080)), vec![not_ready]);
        assert!(targets_of(&service, &state, &[IpFamily::V4]).is_empty());
    }

    #[test]
    fn local_policy_uses_this_nodes_endpoints_and_none_means_no_listener() {
        let service = NamespacedName::new("ns", "web");
        let mut port = web(Some(30080));
        port.external_policy_local = true;
        port.session_affinity_seconds = Some(600);
        let both = vec![
            endpoint("10.0.0.1", "node-a"),
            endpoint("10.0.0.2", "node-b"),
        ];
        let targets = targets_of(&service, &state(port.clone(), both), &[IpFamily::V4]);
        assert_eq!(targets[0].1.endpoints, ["10.0.0.1:8080".parse().unwrap()]);
        assert_eq!(targets[0].1.affinity, Some(Duration::from_secs(600)));
        let remote = vec![endpoint("10.0.0.2", "node-b")];
        assert!(targets_of(&service, &state(port, remote), &[IpFamily::V4]).is_empty());
    }

    #[test]
    fn topology_hints_narrow_the_endpoints_as_in_the_kernel_path() {
        let service = NamespacedName::new("ns", "web");
        let mut here = endpoint("10.0.0.1", "node-a");
        here.node_hints = ["node-a"].into_iter().collect();
        let mut there = endpoint("10.0.0.2", "node-b");
        there.node_hints = ["node-b"].into_iter().collect();
        there.node_name = Some(Arc::from("node-b"));
        let targets = targets_of(
            &service,
            &state(web(Some(30080)), vec![here, there]),
            &[IpFamily::V4],
        );
        assert_eq!(targets[0].1.endpoints, ["10.0.0.1:8080".parse().unwrap()]);
    }
}
