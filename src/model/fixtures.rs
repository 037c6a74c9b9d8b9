//! Small builders for model values in tests.

use crate::model::Names;

use super::types::*;

/// A TCP ClusterIP service port `ns/name:port` on 10.96.0.1:80 with every option off.
pub fn service_port(namespace: &str, name: &str, port: &str) -> ServicePort {
    ServicePort::new(
        ServicePortName::new(namespace, name, port, Protocol::Tcp),
        "10.96.0.1".parse().unwrap(),
        80,
    )
}

/// A ready endpoint at `ip:8080` on `node`.
pub fn endpoint(ip: &str, node: &str) -> Endpoint {
    Endpoint::ready(ip.parse().unwrap(), 8080, Some(node))
}

/// The same endpoint, terminating but still serving.
pub fn terminating(mut ep: Endpoint) -> Endpoint {
    ep.ready = false;
    ep.terminating = true;
    ep
}

/// The same endpoint with zone hints.
pub fn hinted(mut ep: Endpoint, zones: &[&str]) -> Endpoint {
    ep.zone_hints = zones.iter().map(|z| z.to_string()).collect();
    ep
}

/// A one-port EndpointSlice `ns/slice` of service `ns/svc` with the given endpoints (ip, node).
pub fn slice(
    namespace: &str,
    slice: &str,
    service: &str,
    endpoints: &[(&str, &str)],
) -> EndpointSlice {
    EndpointSlice {
        trigger_time: None,
        name: NamespacedName::new(namespace, slice),
        service: NamespacedName::new(namespace, service),
        family: IpFamily::V4,
        ports: vec![SlicePort {
            name: "http".into(),
            port: 8080,
            protocol: Protocol::Tcp,
        }],
        endpoints: endpoints
            .iter()
            .map(|(ip, node)| SliceEndpoint {
                ip: ip.parse().unwrap(),
                ready: true,
                serving: true,
                terminating: false,
                node_name: Some((*node).into()),
                zone: None,
                zone_hints: Names::default(),
                node_hints: Names::default(),
            })
            .collect(),
    }
}

/// Puts `port` (of its own Service) and its `endpoints` into `state`.
pub fn insert_port(state: &mut super::ProxyState, port: ServicePort, endpoints: Vec<Endpoint>) {
    let key = port.name.service.clone();
    let mut by_port = super::VecMap::default();
    by_port.insert(port.name.clone(), endpoints);
    state.endpoints.insert(key.clone(), by_port);
    let mut ports = super::VecMap::default();
    ports.insert(port.name.clone(), port);
    state.services.insert(key, ports);
}
