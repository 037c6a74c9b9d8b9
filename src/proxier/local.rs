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

/// The addresses `nodePortAddresses` selects in one family, its keywords read as upstream 1.37
/// reads them (mixed freely with each other and with CIDRs): `None` means every local address
/// (an empty list, or `all`); `primary` adds the node's own address (unless it is a loopback
/// one); `localhost` the loopback addresses (127.0.0.0/8, ::1/128); a CIDR the local addresses
/// inside it. `local` gives this family's local addresses; it is only asked for CIDRs and
/// `localhost`.
pub fn selected_node_port_ips(
    configured: &[String],
    node_ip: Option<IpAddr>,
    local: impl FnOnce() -> Vec<IpAddr>,
) -> Option<Vec<IpAddr>> {
    if configured.is_empty() || configured.iter().any(|a| a == "all") {
        return None;
    }
    let mut ips: Vec<IpAddr> = Vec::new();
    let mut nets: Vec<IpNet> = Vec::new();
    for entry in configured {
        match entry.as_str() {
            "primary" => ips.extend(node_ip.filter(|ip| !ip.is_loopback())),
            "localhost" => {
                nets.extend(LOOPBACK_NETS.iter().filter_map(|n| n.parse::<IpNet>().ok()))
            }
            cidr => nets.extend(cidr.parse::<IpNet>().ok()),
        }
    }
    if !nets.is_empty() {
        ips.extend(
            local()
                .into_iter()
                .filter(|ip| nets.iter().any(|n| n.contains(ip))),
        );
    }
    ips.sort();
    ips.dedup();
    Some(ips)
}

/// What `localhost` in nodePortAddresses stands for.
const LOOPBACK_NETS: [&str; 2] = ["127.0.0.0/8", "::1/128"];

#[cfg(test)]
mod tests {
    use super::*;

    fn selected(configured: &[&str], node_ip: &str) -> Option<Vec<String>> {
        let configured: Vec<String> = configured.iter().map(|c| c.to_string()).collect();
        let local = || {
            ["127.0.0.1", "192.168.0.2", "10.244.1.1"]
                .map(|a| a.parse().unwrap())
                .to_vec()
        };
        selected_node_port_ips(&configured, node_ip.parse().ok(), local)
            .map(|ips| ips.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn keywords_mix_with_each_other_and_with_cidrs() {
        let some = |ips: &[&str]| Some(ips.iter().map(|ip| ip.to_string()).collect::<Vec<_>>());
        assert_eq!(selected(&[], "192.168.0.2"), None);
        assert_eq!(
            selected(&["primary"], "192.168.0.2"),
            some(&["192.168.0.2"])
        );
        assert_eq!(
            selected(&["localhost"], "192.168.0.2"),
            some(&["127.0.0.1"])
        );
        assert_eq!(
            selected(&["primary", "localhost"], "192.168.0.2"),
            some(&["127.0.0.1", "192.168.0.2"])
        );
        assert_eq!(
            selected(&["10.244.0.0/16", "primary"], "192.168.0.2"),
            some(&["10.244.1.1", "192.168.0.2"])
        );
        assert_eq!(selected(&["primary", "all"], "192.168.0.2"), None);
        // A node whose address in this family is loopback has no primary one.
        assert_eq!(selected(&["primary"], "127.0.0.1"), some(&[]));
        assert_eq!(selected(&["primary"], "none"), some(&[]));
    }
}
