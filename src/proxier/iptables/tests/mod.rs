//! Tests of the pure iptables renderer: golden restore texts, jump-target consistency, the packet
//! tracer, and incremental syncs against the stateful fake.

mod adoption;
mod drift;
mod full_sync;
pub(crate) mod golden;
mod incremental;
mod quarantine;
mod tracer;
mod tracer_cases;

use std::collections::BTreeMap;

use super::render::{
    LocalDetector, NodePortAddresses, RenderContext, ServiceRules, render_base, render_service,
};
use super::restore::{FullSyncExtras, full_restore};
use crate::model::{
    Endpoint, EndpointsMap, IpFamily, NamespacedName, Protocol, ServicePort, ServicePortMap,
    ServicePortName,
};

pub const NODE: &str = "test-node";
pub const NODE_IP: &str = "192.168.0.2";

/// The context upstream's tests use: cluster CIDR 10.0.0.0/8, mark 0x4000, localhost NodePorts on.
pub fn context() -> RenderContext {
    RenderContext {
        family: IpFamily::V4,
        node_name: NODE.into(),
        zone: None,
        node_ip: Some(NODE_IP.parse().unwrap()),
        masquerade_mark: 0x4000,
        masquerade_all: false,
        local_detector: LocalDetector::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]),
        localhost_node_ports: true,
        node_port_addresses: NodePortAddresses::All,
        tcp_be_liberal: false,
        nfacct: Default::default(),
    }
}

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

/// Renders services in a context.
pub fn render_all(services: &[Svc], ctx: &RenderContext) -> BTreeMap<NamespacedName, ServiceRules> {
    services
        .iter()
        .map(|s| {
            (
                s.key.clone(),
                render_service(&s.ports, Some(&s.endpoints), ctx),
            )
        })
        .collect()
}

/// The full restore text for services in a context, on a node with none of our rules yet.
pub fn full_text(services: &[Svc], ctx: &RenderContext) -> String {
    let base = render_base(ctx);
    let extras = FullSyncExtras {
        missing_jumps: &base.jumps(),
        ..FullSyncExtras::default()
    };
    full_restore(&base, &render_all(services, ctx), &extras).0
}

/// Compares texts line by line with a readable diff.
pub fn assert_text_eq(got: &str, want: &str) {
    if got.trim() == want.trim() {
        return;
    }
    let got_lines: Vec<&str> = got.trim().lines().collect();
    let want_lines: Vec<&str> = want.trim().lines().map(str::trim).collect();
    let mut report = String::new();
    for line in &want_lines {
        if !got_lines.contains(line) {
            report.push_str(&format!("- {line}\n"));
        }
    }
    for line in &got_lines {
        if !want_lines.contains(line) {
            report.push_str(&format!("+ {line}\n"));
        }
    }
    if report.is_empty() {
        report.push_str("same lines, different order");
    }
    panic!("restore text differs (- missing, + unexpected):\n{report}\nfull text:\n{got}");
}
