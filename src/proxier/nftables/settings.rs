//! The parts of the configuration nftables mode uses.

use crate::config::{KubeProxyConfiguration, feature_gates};
use crate::model::{IpFamily, Protocol};
use crate::proxier::local::{
    LOCALHOST_NODE_PORTS_GATE, LocalTraffic, NodePortSelection, localhost_proxy_families,
};

/// The parts of the configuration this proxier uses.
#[derive(Clone, Debug)]
pub struct NftablesSettings {
    pub masquerade_mark: u32,
    pub masquerade_all: bool,
    /// How local pod traffic is recognised.
    pub local_traffic: LocalTraffic,
    /// nodePortAddresses; upstream's nftables default (empty) is `primary`.
    pub node_port_addresses: NodePortSelection,
    /// The families whose localhost NodePorts the userspace proxy serves.
    pub localhost_proxy: Vec<IpFamily>,
    /// The feature gate KubeProxyNFTablesLocalhostNodePorts is on: localhost NodePorts the
    /// proxy does not serve are rejected and counted.
    pub localhost_gate: bool,
    /// Offload connections to ClusterIPs past this many packets (`--offload-packet-threshold`,
    /// once the kernel is known to have flowtables; the configuration file has no field for it).
    pub offload_after_packets: Option<u32>,
}

impl NftablesSettings {
    /// The protocols whose NodePorts on `family`'s loopback address are rejected and counted
    /// (upstream 1.37): none with the gate off; UDP and SCTP where the proxy serves TCP; all
    /// three where it does not.
    pub fn localhost_rejects(&self, family: IpFamily) -> Vec<Protocol> {
        match (self.localhost_gate, self.localhost_proxy.contains(&family)) {
            (false, _) => Vec::new(),
            (true, true) => vec![Protocol::Udp, Protocol::Sctp],
            (true, false) => vec![Protocol::Tcp, Protocol::Udp, Protocol::Sctp],
        }
    }

    /// Takes them from a validated configuration.
    pub fn from_config(config: &KubeProxyConfiguration) -> Self {
        let bit = config.nftables.masquerade_bit.unwrap_or(14).clamp(0, 31);
        NftablesSettings {
            masquerade_mark: 1u32 << bit,
            masquerade_all: config.nftables.masquerade_all || config.iptables.masquerade_all,
            local_traffic: LocalTraffic::from_config(config),
            node_port_addresses: NodePortSelection::primary_by_default(&config.node_port_addresses),
            localhost_proxy: localhost_proxy_families(config),
            localhost_gate: feature_gates::enabled(
                &config.feature_gates,
                LOCALHOST_NODE_PORTS_GATE,
            ),
            offload_after_packets: None,
        }
    }
}
