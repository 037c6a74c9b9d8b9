//! What every mode needs to know about this node's traffic: how local pod traffic is recognised
//! (`detectLocalMode`) and which addresses accept NodePort traffic (`nodePortAddresses`).

use std::net::IpAddr;

use ipnet::IpNet;

use crate::config::{DetectLocalMode, KubeProxyConfiguration};
use crate::model::{IpFamily, NodeInfo};

/// How traffic from this node's pods is recognised (upstream's LocalTrafficDetector).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LocalDetector {
    /// Not possible with this configuration: no masquerade of off-cluster traffic, no short-circuit.
    None,
    /// Source inside the pod CIDR(s).
    Cidrs(Vec<IpNet>),
    /// Arriving from the bridge.
    Bridge(String),
    /// Arriving from interfaces with this name prefix.
    InterfacePrefix(String),
}

/// Which local addresses accept NodePort traffic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodePortAddresses {
    /// Every local address (`nodePortAddresses` empty).
    All,
    /// These addresses only.
    Only(Vec<IpAddr>),
}

/// The configured way to recognise traffic from this node's pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalTraffic {
    pub mode: DetectLocalMode,
    pub cluster_cidrs: Vec<IpNet>,
    pub bridge_interface: String,
    pub interface_name_prefix: String,
}

impl LocalTraffic {
    /// Takes it from a validated configuration.
    pub fn from_config(config: &KubeProxyConfiguration) -> Self {
        LocalTraffic {
            mode: config
                .detect_local()
                .unwrap_or(DetectLocalMode::ClusterCidr),
            cluster_cidrs: config
                .cluster_cidr
                .split(',')
                .filter_map(|c| c.trim().parse().ok())
                .collect(),
            bridge_interface: config.detect_local.bridge_interface.clone(),
            interface_name_prefix: config.detect_local.interface_name_prefix.clone(),
        }
    }

    /// The detector for one family on this node; `None` when the mode has nothing to go on
    /// (no CIDR of this family), as upstream's no-op detector.
    pub fn detector(&self, family: IpFamily, node: &NodeInfo) -> LocalDetector {
        let of_family = |nets: &[IpNet]| -> Vec<IpNet> {
            nets.iter()
                .filter(|n| IpFamily::of(&n.addr()) == family)
                .copied()
                .collect()
        };
        let cidrs = |nets: Vec<IpNet>| {
            if nets.is_empty() {
                LocalDetector::None
            } else {
                LocalDetector::Cidrs(nets)
            }
        };
        match self.mode {
            DetectLocalMode::ClusterCidr => cidrs(of_family(&self.cluster_cidrs)),
            DetectLocalMode::NodeCidr => cidrs(of_family(&node.pod_cidrs)),
            DetectLocalMode::BridgeInterface => {
                LocalDetector::Bridge(self.bridge_interface.clone())
            }
            DetectLocalMode::InterfaceNamePrefix => {
                LocalDetector::InterfacePrefix(self.interface_name_prefix.clone())
            }
        }
    }
}

/// The addresses `nodePortAddresses` selects in one family: `None` means every local address
/// (the list is empty); `primary` means the node's own address; else the local addresses inside
/// the listed CIDRs. `local` gives this family's local addresses; it is only asked for CIDRs.
pub fn selected_node_port_ips(
    configured: &[String],
    node_ip: Option<IpAddr>,
    local: impl FnOnce() -> Vec<IpAddr>,
) -> Option<Vec<IpAddr>> {
    if configured.is_empty() {
        return None;
    }
    if configured.iter().any(|a| a == "primary") {
        return Some(node_ip.into_iter().collect());
    }
    let nets: Vec<IpNet> = configured.iter().filter_map(|c| c.parse().ok()).collect();
    let mut ips: Vec<IpAddr> = local()
        .into_iter()
        .filter(|ip| nets.iter().any(|n| n.contains(ip)))
        .collect();
    ips.sort();
    Some(ips)
}
