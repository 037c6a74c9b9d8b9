//! The services, endpoints and node the modes' tests share, upstream's test scenarios among them.

use crate::model::{
    Endpoint, EndpointsMap, IpFamily, NamespacedName, Protocol, ServicePort, ServicePortMap,
    ServicePortName,
};
use crate::proxier::context::FamilyContext;
use crate::proxier::local::LocalDetector;

pub const NODE: &str = "test-node";
pub const NODE_IP: &str = "192.168.0.2";

/// One service: name, its ports, its endpoints.
pub struct Svc {
    pub key: NamespacedName,
    pub ports: ServicePortMap,
    pub endpoints: EndpointsMap,
}

/// A service `ns/name` with one TCP port `p80` (port 80), changed by `edit`.
pub fn svc(ns: &str, name: &str, cluster_ip: &str, edit: impl FnOnce(&mut ServicePort)) -> Svc {
    svc_port(ns, name, "p80", Protocol::Tcp, 80, cluster_ip, edit)
}

/// A service with one port of any name, protocol and number.
pub fn svc_port(
    ns: &str,
    name: &str,
    port_name: &str,
    protocol: Protocol,
    port: u16,
    cluster_ip: &str,
    edit: impl FnOnce(&mut ServicePort),
) -> Svc {
    let cluster_ips: Vec<std::net::IpAddr> = cluster_ip
        .split(',')
        .map(|ip| ip.parse().unwrap())
        .collect();
    let port_name = ServicePortName::new(ns, name, port_name, protocol);
    let mut sp = ServicePort {
        cluster_ips: cluster_ips.clone(),
        ..ServicePort::new(port_name, cluster_ips[0], port)
    };
    edit(&mut sp);
    Svc {
        key: NamespacedName::new(ns, name),
        ports: crate::model::VecMap::from([(sp.name.clone(), sp)]),
        endpoints: Default::default(),
    }
}

/// A ready endpoint at `ip:port` on `node` ("" for none).
pub fn ep(ip: &str, port: u16, node: &str) -> Endpoint {
    Endpoint::ready(
        ip.parse().unwrap(),
        port,
        (!node.is_empty()).then_some(node),
    )
}

impl Svc {
    /// Sets the endpoints of the service's only port (or of the named port).
    pub fn with_endpoints(mut self, endpoints: Vec<Endpoint>) -> Self {
        let name = self.ports.keys().next().unwrap().clone();
        self.endpoints.insert(name, endpoints);
        self
    }

    /// Adds another port to the service.
    pub fn add_port(
        mut self,
        port_name: &str,
        protocol: Protocol,
        port: u16,
        endpoints: Vec<Endpoint>,
    ) -> Self {
        let mut sp = self.ports.values().next().unwrap().clone();
        sp.name = ServicePortName {
            service: self.key.clone(),
            port: port_name.into(),
            protocol,
        };
        sp.port = port;
        self.endpoints.insert(sp.name.clone(), endpoints);
        self.ports.insert(sp.name.clone(), sp);
        self
    }
}

/// Upstream's TestOverallIPTablesRules and TestOverallNFTablesRules scenario (the endpoints on
/// this node as 1.37's nftables test places them; iptables mode's rules do not depend on it).
pub fn overall_services() -> Vec<Svc> {
    vec![
        svc("ns1", "svc1", "172.30.0.41", |_| {}).with_endpoints(vec![ep("10.180.0.1", 80, NODE)]),
        svc("ns2", "svc2", "172.30.0.42", |s| {
            s.node_port = Some(3001);
            s.load_balancer_ips = vec!["1.2.3.4".parse().unwrap()];
            s.external_ips = vec!["192.168.99.22".parse().unwrap()];
            s.external_policy_local = true;
            s.health_check_node_port = Some(30000);
        })
        .with_endpoints(vec![ep("10.180.0.2", 80, "")]),
        svc("ns3", "svc3", "172.30.0.43", |s| s.node_port = Some(3003)).with_endpoints(vec![ep(
            "10.180.0.3",
            80,
            NODE,
        )]),
        svc("ns4", "svc4", "172.30.0.44", |s| {
            s.external_ips = vec!["192.168.99.33".parse().unwrap()]
        })
        .with_endpoints(vec![ep("10.180.0.4", 80, ""), ep("10.180.0.5", 80, NODE)]),
        svc("ns5", "svc5", "172.30.0.45", |s| {
            s.node_port = Some(3002);
            s.load_balancer_ips = vec!["5.6.7.8".parse().unwrap()];
            s.load_balancer_source_ranges = vec!["203.0.113.0/25".parse().unwrap()];
            s.session_affinity_seconds = Some(10800);
        })
        .with_endpoints(vec![ep("10.180.0.3", 80, NODE)]),
        svc("ns6", "svc6", "172.30.0.46", |_| {}),
    ]
}

/// The node upstream's tests use, in `family` with the node address `node_ip`: mark 0x4000, no
/// masquerade-all, pods recognised by `pod_cidr`.
pub fn family_context(family: IpFamily, node_ip: &str, pod_cidr: &str) -> FamilyContext {
    FamilyContext {
        family,
        node_name: NODE.into(),
        zone: None,
        node_ip: Some(node_ip.parse().unwrap()),
        masquerade_mark: 0x4000,
        masquerade_all: false,
        local_detector: LocalDetector::Cidrs(vec![pod_cidr.parse().unwrap()]),
    }
}
