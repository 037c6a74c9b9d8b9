//! The parts of the configuration IPVS mode uses, and the render context they give a family.

use std::net::IpAddr;

use ipnet::IpNet;

use super::render::IpvsContext;
use crate::config::KubeProxyConfiguration;
use crate::model::{IpFamily, NodeInfo};
use crate::proxier::context::FamilyContext;
use crate::proxier::local::{LocalTraffic, NodePortSelection};

/// The parts of the configuration IPVS mode uses.
#[derive(Clone, Debug)]
pub struct IpvsSettings {
    pub scheduler: String,
    pub masquerade_all: bool,
    pub masquerade_mark: u32,
    /// How local pod traffic is recognised.
    pub local_traffic: LocalTraffic,
    pub node_port_addresses: NodePortSelection,
    pub exclude_cidrs: Vec<IpNet>,
    pub strict_arp: bool,
    /// tcp, tcpfin, udp timeouts in seconds (0 keeps the kernel's).
    pub timeouts: (u32, u32, u32),
}

impl IpvsSettings {
    /// Takes them from a validated configuration.
    pub fn from_config(config: &KubeProxyConfiguration) -> Self {
        let secs = |d: crate::config::GoDuration| u32::try_from(d.0.as_secs()).unwrap_or(u32::MAX);
        IpvsSettings {
            scheduler: config.ipvs.scheduler.clone(),
            masquerade_all: config.iptables.masquerade_all,
            masquerade_mark: config.masquerade_mark(),
            local_traffic: LocalTraffic::from_config(config),
            node_port_addresses: NodePortSelection::new(&config.node_port_addresses),
            exclude_cidrs: config
                .ipvs
                .exclude_cidrs
                .iter()
                .filter_map(|c| c.parse().ok())
                .collect(),
            strict_arp: config.ipvs.strict_arp,
            timeouts: (
                secs(config.ipvs.tcp_timeout),
                secs(config.ipvs.tcp_fin_timeout),
                secs(config.ipvs.udp_timeout),
            ),
        }
    }

    /// The render context of one family on `node`, whose local addresses (kube-ipvs0's left
    /// out) are `local`.
    pub fn context(&self, family: IpFamily, node: &NodeInfo, local: &[IpAddr]) -> IpvsContext {
        let common = FamilyContext::new(
            family,
            node,
            self.masquerade_mark,
            self.masquerade_all,
            &self.local_traffic,
        );
        let local: Vec<IpAddr> = local
            .iter()
            .filter(|ip| IpFamily::of(ip) == family)
            .copied()
            .collect();
        let node_port_ips = self
            .node_port_addresses
            .select(common.node_ip, || local.clone())
            .unwrap_or_else(|| local.clone());
        IpvsContext {
            common,
            node_port_ips,
            local_addresses: local,
            scheduler: self.scheduler.clone(),
        }
    }
}
