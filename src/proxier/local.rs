//! What every mode needs to know about this node's traffic: how local pod traffic is recognised
//! (`detectLocalMode`) and which addresses accept NodePort traffic (`nodePortAddresses`).

use std::net::IpAddr;

use ipnet::IpNet;

use crate::config::{DetectLocalMode, KubeProxyConfiguration, feature_gates};
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
            "localhost" => nets.extend(localhost_nets()),
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
fn localhost_nets() -> impl Iterator<Item = IpNet> {
    ["127.0.0.0/8", "::1/128"]
        .into_iter()
        .filter_map(|net| net.parse().ok())
}

/// The feature gate that hands localhost NodePorts to the userspace proxy (KEP-6032).
pub const LOCALHOST_NODE_PORTS_GATE: &str = "KubeProxyNFTablesLocalhostNodePorts";

/// The families whose localhost NodePorts the userspace proxy serves: with its feature gate
/// on, those whose loopback address (127.0.0.1, ::1, where it listens) nodePortAddresses names
/// explicitly, by `localhost` or by a loopback CIDR holding it. `all` and 0.0.0.0/0 do not
/// count, as upstream; unlike upstream (kubernetes#142129), 127.0.0.2/32 does not either: the
/// proxy could not listen there.
pub fn localhost_proxy_families(config: &KubeProxyConfiguration) -> Vec<IpFamily> {
    if !feature_gates::enabled(&config.feature_gates, LOCALHOST_NODE_PORTS_GATE) {
        return Vec::new();
    }
    let named: Vec<IpNet> = loopback_nets(&config.node_port_addresses).collect();
    [IpFamily::V4, IpFamily::V6]
        .into_iter()
        .filter(|family| named.iter().any(|net| net.contains(&family.loopback())))
        .collect()
}

/// The loopback networks nodePortAddresses names: `localhost`'s, and its loopback CIDRs.
pub fn loopback_nets(configured: &[String]) -> impl Iterator<Item = IpNet> + '_ {
    configured.iter().flat_map(|entry| {
        let nets: Vec<IpNet> = if entry == "localhost" {
            localhost_nets().collect()
        } else {
            entry
                .parse::<IpNet>()
                .into_iter()
                .filter(|net| net.addr().is_loopback())
                .collect()
        };
        nets
    })
}

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

    #[test]
    fn the_proxy_serves_the_families_whose_loopback_address_is_named() {
        let families = |addresses: &[&str], gate: bool| {
            let mut config = KubeProxyConfiguration {
                node_port_addresses: addresses.iter().map(|a| a.to_string()).collect(),
                ..KubeProxyConfiguration::default()
            };
            config
                .feature_gates
                .insert(LOCALHOST_NODE_PORTS_GATE.into(), gate);
            localhost_proxy_families(&config)
        };
        let both = vec![IpFamily::V4, IpFamily::V6];
        assert_eq!(families(&["primary", "localhost"], true), both);
        assert!(
            families(&["localhost"], false).is_empty(),
            "the gate is off"
        );
        assert_eq!(families(&["127.0.0.0/8"], true), vec![IpFamily::V4]);
        assert_eq!(
            families(&["10.0.0.0/8", "::1/128"], true),
            vec![IpFamily::V6]
        );
        assert!(families(&["all", "0.0.0.0/0", "::/0"], true).is_empty());
        assert!(families(&[], true).is_empty());
        assert!(
            families(&["127.0.0.2/32"], true).is_empty(),
            "the proxy listens on 127.0.0.1 alone"
        );
    }

    /// Upstream 1.37's Test_useLocalhostNodePortProxy, case by case (its nodePortAddresses, the
    /// proxier's family, whether the proxy serves it).
    #[test]
    fn upstreams_cases_of_which_family_the_proxy_serves() {
        use IpFamily::{V4, V6};
        let cases: [(&str, IpFamily, &[&str], bool); 10] = [
            (
                "explicit IPv4 loopback activates",
                V4,
                &["127.0.0.0/8"],
                true,
            ),
            ("explicit IPv6 loopback activates", V6, &["::1/128"], true),
            (
                "IPv6 loopback does not activate an IPv4 proxier",
                V4,
                &["::1/128"],
                false,
            ),
            (
                "IPv4 loopback does not activate an IPv6 proxier",
                V6,
                &["127.0.0.0/8"],
                false,
            ),
            (
                "IPv4 all/zero-CIDR does not activate",
                V4,
                &["0.0.0.0/0"],
                false,
            ),
            ("IPv6 all/zero-CIDR does not activate", V6, &["::/0"], false),
            (
                "explicit loopback before all activates",
                V4,
                &["127.0.0.0/8", "0.0.0.0/0"],
                true,
            ),
            (
                "all before explicit loopback still activates",
                V4,
                &["0.0.0.0/0", "127.0.0.0/8"],
                true,
            ),
            (
                "non-loopback CIDR does not activate",
                V4,
                &["192.168.1.1/32"],
                false,
            ),
            (
                "empty addresses default to match-all and do not activate",
                V4,
                &[],
                false,
            ),
        ];
        for (name, family, addresses, expected) in cases {
            let config = KubeProxyConfiguration {
                node_port_addresses: addresses.iter().map(|a| a.to_string()).collect(),
                feature_gates: [(LOCALHOST_NODE_PORTS_GATE.to_string(), true)].into(),
                ..KubeProxyConfiguration::default()
            };
            let served = localhost_proxy_families(&config).contains(&family);
            assert_eq!(served, expected, "{name}");
        }
    }
}
