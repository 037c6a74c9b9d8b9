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

/// `nodePortAddresses`, read once (the config layer has checked every entry): upstream 1.37's
/// keywords and CIDRs, mixed freely.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodePortSelection {
    /// Every local address: an empty list, or `all` among the entries.
    all: bool,
    /// `primary`: the node's own address.
    primary: bool,
    /// The CIDRs given, and `localhost`'s (127.0.0.0/8, ::1/128).
    nets: Vec<IpNet>,
}

impl NodePortSelection {
    /// Reads the configured entries; an entry that is neither a keyword nor a CIDR (validation
    /// refused it before) selects nothing.
    pub fn new(configured: &[String]) -> Self {
        let mut selection = NodePortSelection {
            all: configured.is_empty(),
            ..NodePortSelection::default()
        };
        for entry in configured {
            match entry.as_str() {
                "all" => selection.all = true,
                "primary" => selection.primary = true,
                "localhost" => selection.nets.extend(localhost_nets()),
                cidr => selection.nets.extend(cidr.parse::<IpNet>().ok()),
            }
        }
        selection
    }

    /// As nftables mode reads it: an empty list is `primary` (upstream's default there).
    pub fn primary_by_default(configured: &[String]) -> Self {
        if configured.is_empty() {
            Self::new(&["primary".to_string()])
        } else {
            Self::new(configured)
        }
    }

    /// The addresses it selects in one family: `None` means every local address; `primary`
    /// adds the node's own address (unless it is a loopback one); a CIDR the local addresses
    /// inside it. `local` gives this family's local addresses; it is only asked for CIDRs.
    pub fn select(
        &self,
        node_ip: Option<IpAddr>,
        local: impl FnOnce() -> Vec<IpAddr>,
    ) -> Option<Vec<IpAddr>> {
        if self.all {
            return None;
        }
        let mut ips: Vec<IpAddr> = Vec::new();
        if self.primary {
            ips.extend(node_ip.filter(|ip| !ip.is_loopback()));
        }
        if !self.nets.is_empty() {
            ips.extend(
                local()
                    .into_iter()
                    .filter(|ip| self.nets.iter().any(|n| n.contains(ip))),
            );
        }
        ips.sort();
        ips.dedup();
        Some(ips)
    }

    /// [`Self::select`], as the rules take it.
    pub fn addresses(
        &self,
        node_ip: Option<IpAddr>,
        local: impl FnOnce() -> Vec<IpAddr>,
    ) -> NodePortAddresses {
        match self.select(node_ip, local) {
            None => NodePortAddresses::All,
            Some(ips) => NodePortAddresses::Only(ips),
        }
    }

    /// The loopback networks it names: `localhost`'s, and its loopback CIDRs.
    pub fn loopback_nets(&self) -> impl Iterator<Item = &IpNet> {
        self.nets.iter().filter(|net| net.addr().is_loopback())
    }

    /// It names loopback networks and nothing else: a mode that serves no NodePort on a
    /// loopback address serves none at all.
    pub fn only_loopback(&self) -> bool {
        !self.all
            && !self.primary
            && !self.nets.is_empty()
            && self.nets.iter().all(|net| net.addr().is_loopback())
    }
}

/// What `localhost` in nodePortAddresses stands for.
fn localhost_nets() -> impl Iterator<Item = IpNet> {
    ["127.0.0.0/8", "::1/128"]
        .into_iter()
        .filter_map(|net| net.parse().ok())
}

/// What a mode that programs no NodePort on a loopback address (IPVS, nftables) says, once at
/// start, of a nodePortAddresses that names loopback networks the localhost NodePort proxy
/// does not serve (`proxied`: the families it serves): that they are left out, and, when they
/// are all it names, that the node serves no NodePort.
pub fn unserved_loopback(
    selection: &NodePortSelection,
    proxied: &[IpFamily],
    mode: &str,
) -> Option<String> {
    // A wide CIDR (0.0.0.0/0) selects the loopback address too, and so loses it as well.
    let unserved = [IpFamily::V4, IpFamily::V6].into_iter().any(|family| {
        !proxied.contains(&family)
            && selection
                .nets
                .iter()
                .any(|net| net.contains(&family.loopback()))
    });
    if !unserved {
        return None;
    }
    let mut said = format!(
        "NodePorts on localhost addresses are not served by {mode} (as upstream): nodePortAddresses' loopback addresses are left out; the {LOCALHOST_NODE_PORTS_GATE} feature gate serves them through a userspace proxy"
    );
    if selection.only_loopback() && proxied.is_empty() {
        said.push_str(
            ". nodePortAddresses names nothing else, so this node serves no NodePort: add primary, or a CIDR of the node's addresses",
        );
    }
    Some(said)
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
    let selection = NodePortSelection::new(&config.node_port_addresses);
    [IpFamily::V4, IpFamily::V6]
        .into_iter()
        .filter(|family| {
            selection
                .loopback_nets()
                .any(|net| net.contains(&family.loopback()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selection(configured: &[&str]) -> NodePortSelection {
        let configured: Vec<String> = configured.iter().map(|c| c.to_string()).collect();
        NodePortSelection::new(&configured)
    }

    fn selected(configured: &[&str], node_ip: &str) -> Option<Vec<String>> {
        let local = || {
            ["127.0.0.1", "192.168.0.2", "10.244.1.1"]
                .map(|a| a.parse().unwrap())
                .to_vec()
        };
        selection(configured)
            .select(node_ip.parse().ok(), local)
            .map(|ips| ips.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn loopback_is_named_by_keyword_or_loopback_cidr() {
        let named = |entries: &[&str]| selection(entries).loopback_nets().next().is_some();
        assert!(named(&["primary", "localhost"]));
        assert!(named(&["127.0.0.0/8"]) && named(&["::1/128"]));
        assert!(!named(&["0.0.0.0/0", "all", "primary"]));
        assert!(!named(&[]));
    }

    #[test]
    fn loopback_alone_is_told_apart_and_said_to_serve_no_node_port() {
        assert!(selection(&["localhost"]).only_loopback());
        assert!(selection(&["127.0.0.0/8", "::1/128"]).only_loopback());
        for served in [
            &["localhost", "primary"][..],
            &["localhost", "all"],
            &[],
            &["10.0.0.0/8"],
        ] {
            assert!(!selection(served).only_loopback(), "{served:?}");
        }
        let said = |configured: &[&str], proxied: &[IpFamily]| {
            unserved_loopback(&selection(configured), proxied, "IPVS")
        };
        let alone = said(&["localhost"], &[]).expect("said");
        assert!(alone.contains("this node serves no NodePort"), "{alone}");
        let mixed = said(&["localhost", "primary"], &[]).expect("said");
        assert!(!mixed.contains("serves no NodePort"), "{mixed}");
        assert_eq!(said(&["localhost"], &[IpFamily::V4, IpFamily::V6]), None);
        let half = said(&["localhost"], &[IpFamily::V4]).expect("::1 is not proxied");
        assert!(!half.contains("serves no NodePort"), "{half}");
        assert_eq!(said(&["primary", "10.0.0.0/8"], &[]), None);
        let wide = said(&["0.0.0.0/0"], &[]).expect("0.0.0.0/0 holds 127.0.0.1");
        assert!(!wide.contains("serves no NodePort"), "{wide}");
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
