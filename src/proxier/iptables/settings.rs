//! The parts of the configuration iptables mode uses.

use std::time::Duration;

use super::nfacct::NfacctCounters;
use crate::config::KubeProxyConfiguration;
use crate::model::IpFamily;
use crate::proxier::local::{LocalTraffic, NodePortSelection, localhost_proxy_families};

/// The parts of the configuration this proxier uses.
#[derive(Clone, Debug)]
pub struct IptablesSettings {
    pub masquerade_mark: u32,
    pub masquerade_all: bool,
    /// IPv4 NodePorts on 127.0.0.1 through the kernel (route_localnet): off when the userspace
    /// proxy serves them.
    pub localhost_node_ports: bool,
    /// The userspace proxy serves IPv4 NodePorts on 127.0.0.1.
    pub localhost_proxy: bool,
    /// How local pod traffic is recognised.
    pub local_traffic: LocalTraffic,
    pub node_port_addresses: NodePortSelection,
    pub tcp_be_liberal: bool,
    /// How often the canary chains are checked (syncPeriod).
    pub canary_interval: Duration,
    /// The kernel's packet counters the rules may name (none until the daemon creates them).
    pub nfacct: NfacctCounters,
}

impl IptablesSettings {
    /// Takes them from a validated configuration.
    pub fn from_config(config: &KubeProxyConfiguration) -> Self {
        let localhost_proxy = localhost_proxy_families(config).contains(&IpFamily::V4);
        IptablesSettings {
            masquerade_mark: config.masquerade_mark(),
            masquerade_all: config.iptables.masquerade_all,
            localhost_node_ports: config.iptables.localhost_node_ports.unwrap_or(true)
                && !localhost_proxy,
            localhost_proxy,
            local_traffic: LocalTraffic::from_config(config),
            node_port_addresses: NodePortSelection::new(&config.node_port_addresses),
            tcp_be_liberal: config.conntrack.tcp_be_liberal,
            canary_interval: config.iptables.sync_period.0,
            nfacct: NfacctCounters::default(),
        }
    }
}
