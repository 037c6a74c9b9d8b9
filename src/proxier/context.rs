//! What every mode's rendering of one family knows of the node and the configuration, besides
//! its mode's own settings: built once, the same way, for each mode's context.

use std::net::IpAddr;

use super::local::{LocalDetector, LocalTraffic};
use crate::model::{IpFamily, NodeContext, NodeInfo};

/// The node, one of its families, and the masquerading every mode does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FamilyContext {
    pub family: IpFamily,
    pub node_name: String,
    pub zone: Option<String>,
    /// The node's primary address in this family (LoadBalancer source ranges that include it).
    pub node_ip: Option<IpAddr>,
    pub masquerade_mark: u32,
    pub masquerade_all: bool,
    /// How traffic from this node's pods is recognised.
    pub local_detector: LocalDetector,
}

impl FamilyContext {
    /// `family` on `node`, with the configured masquerading and local-traffic detection.
    pub fn new(
        family: IpFamily,
        node: &NodeInfo,
        masquerade_mark: u32,
        masquerade_all: bool,
        local_traffic: &LocalTraffic,
    ) -> Self {
        FamilyContext {
            family,
            node_name: node.name.clone(),
            zone: node.zone().map(str::to_string),
            node_ip: node
                .addresses
                .iter()
                .copied()
                .find(|ip| IpFamily::of(ip) == family),
            masquerade_mark,
            masquerade_all,
            local_detector: local_traffic.detector(family, node),
        }
    }

    /// The node as endpoint selection sees it.
    pub fn node(&self) -> NodeContext<'_> {
        NodeContext {
            node_name: &self.node_name,
            zone: self.zone.as_deref(),
        }
    }
}
