//! The KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1) as kubeadm writes it into the
//! `kube-system/kube-proxy` ConfigMap, with upstream's defaults (pkg/proxy/apis/config/v1alpha1).
//!
//! Fields that are pointers upstream (where nil and zero differ, like `masqueradeBit: 0`) are
//! `Option` here; after [`KubeProxyConfiguration::apply_defaults`] they are all `Some`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::duration::GoDuration;

/// The mode string that selects a proxier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyMode {
    /// KUBE-SERVICES -> KUBE-SVC -> KUBE-SEP chains (also what an empty mode means on Linux).
    Iptables,
    /// IPVS virtual servers with ipsets and a constant set of iptables rules.
    Ipvs,
    /// upstream's 1.34/1.35 `table ip kube-proxy` / `table ip6 kube-proxy`.
    Nftables,
}

impl ProxyMode {
    /// Every mode.
    pub const ALL: [ProxyMode; 3] = [ProxyMode::Iptables, ProxyMode::Ipvs, ProxyMode::Nftables];

    /// The mode a word names: empty means iptables, as on Linux upstream.
    pub fn parse(word: &str) -> Option<ProxyMode> {
        match word {
            "" => Some(ProxyMode::Iptables),
            word => ProxyMode::ALL
                .into_iter()
                .find(|mode| mode.as_str() == word),
        }
    }

    /// The name as the config and `/proxyMode` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyMode::Iptables => "iptables",
            ProxyMode::Ipvs => "ipvs",
            ProxyMode::Nftables => "nftables",
        }
    }
}

/// How traffic from local pods is told apart from the rest (upstream `detectLocalMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DetectLocalMode {
    /// Source inside `clusterCIDR` (the default).
    ClusterCidr,
    /// Source inside the Node's `spec.podCIDRs`.
    NodeCidr,
    /// Traffic entering from `detectLocal.bridgeInterface`.
    BridgeInterface,
    /// Traffic entering from interfaces named `detectLocal.interfaceNamePrefix*`.
    InterfaceNamePrefix,
}

/// The whole configuration file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct KubeProxyConfiguration {
    pub api_version: String,
    pub kind: String,
    pub feature_gates: BTreeMap<String, bool>,
    pub client_connection: ClientConnection,
    pub hostname_override: String,
    pub bind_address: String,
    pub healthz_bind_address: String,
    pub metrics_bind_address: String,
    pub bind_address_hard_fail: bool,
    pub enable_profiling: bool,
    pub show_hidden_metrics_for_version: String,
    pub mode: String,
    pub iptables: IptablesConfiguration,
    pub ipvs: IpvsConfiguration,
    pub nftables: NftablesConfiguration,
    pub winkernel: serde_json::Value,
    #[serde(rename = "detectLocalMode")]
    pub detect_local_mode: String,
    pub detect_local: DetectLocalConfiguration,
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: String,
    pub node_port_addresses: Vec<String>,
    pub oom_score_adj: Option<i32>,
    pub conntrack: ConntrackConfiguration,
    pub config_sync_period: GoDuration,
    pub port_range: String,
    pub logging: LoggingConfiguration,
    pub windows_run_as_service: bool,
}

/// How to reach the API server.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ClientConnection {
    pub kubeconfig: String,
    pub accept_content_types: String,
    pub content_type: String,
    pub qps: f32,
    pub burst: i32,
}

/// The `iptables` section.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct IptablesConfiguration {
    pub masquerade_bit: Option<i32>,
    pub masquerade_all: bool,
    pub localhost_node_ports: Option<bool>,
    pub sync_period: GoDuration,
    pub min_sync_period: GoDuration,
}

/// The `ipvs` section.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct IpvsConfiguration {
    pub sync_period: GoDuration,
    pub min_sync_period: GoDuration,
    pub scheduler: String,
    #[serde(rename = "excludeCIDRs")]
    pub exclude_cidrs: Vec<String>,
    #[serde(rename = "strictARP")]
    pub strict_arp: bool,
    pub tcp_timeout: GoDuration,
    pub tcp_fin_timeout: GoDuration,
    pub udp_timeout: GoDuration,
}

/// The `nftables` section.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct NftablesConfiguration {
    pub masquerade_bit: Option<i32>,
    pub masquerade_all: bool,
    pub sync_period: GoDuration,
    pub min_sync_period: GoDuration,
}

/// The `detectLocal` section.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct DetectLocalConfiguration {
    pub bridge_interface: String,
    pub interface_name_prefix: String,
}

/// The `conntrack` section.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ConntrackConfiguration {
    pub max_per_core: Option<i32>,
    pub min: Option<i32>,
    pub tcp_established_timeout: Option<GoDuration>,
    pub tcp_close_wait_timeout: Option<GoDuration>,
    pub tcp_be_liberal: bool,
    pub udp_timeout: GoDuration,
    pub udp_stream_timeout: GoDuration,
}

/// The `logging` section (component-base's LoggingConfiguration); only format and verbosity act.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct LoggingConfiguration {
    pub format: String,
    pub flush_frequency: serde_json::Value,
    pub verbosity: u32,
    pub vmodule: serde_json::Value,
    pub options: serde_json::Value,
}

/// Upstream's `ports.ProxyHealthzPort`.
pub const HEALTHZ_PORT: u16 = 10256;
/// Upstream's `ports.ProxyStatusPort`.
pub const METRICS_PORT: u16 = 10249;

impl KubeProxyConfiguration {
    /// Fills every unset field the way upstream's `SetDefaults_KubeProxyConfiguration` does; kubeadm
    /// writes zero values (`syncPeriod: 0s`, `qps: 0`, `masqueradeBit: null`) and relies on this.
    pub fn apply_defaults(&mut self) {
        if self.api_version.is_empty() {
            self.api_version = "kubeproxy.config.k8s.io/v1alpha1".into();
        }
        if self.kind.is_empty() {
            self.kind = "KubeProxyConfiguration".into();
        }
        let ipv6_bind = self.bind_address.contains(':');
        if self.bind_address.is_empty() {
            self.bind_address = "0.0.0.0".into();
        }
        let (any, loopback) = if ipv6_bind {
            ("[::]", "[::1]")
        } else {
            ("0.0.0.0", "127.0.0.1")
        };
        self.healthz_bind_address =
            default_host_port(&self.healthz_bind_address, any, HEALTHZ_PORT);
        self.metrics_bind_address =
            default_host_port(&self.metrics_bind_address, loopback, METRICS_PORT);
        self.oom_score_adj.get_or_insert(-999);

        let ipt = &mut self.iptables;
        ipt.masquerade_bit.get_or_insert(14);
        ipt.localhost_node_ports.get_or_insert(true);
        default_duration(&mut ipt.sync_period, 30);
        default_duration(&mut ipt.min_sync_period, 1);

        default_duration(&mut self.ipvs.sync_period, 30);

        let nft = &mut self.nftables;
        nft.masquerade_bit.get_or_insert(14);
        default_duration(&mut nft.sync_period, 30);
        default_duration(&mut nft.min_sync_period, 1);

        default_duration(&mut self.config_sync_period, 15 * 60);

        let client = &mut self.client_connection;
        if client.content_type.is_empty() {
            client.content_type = "application/vnd.kubernetes.protobuf".into();
        }
        if client.qps == 0.0 {
            client.qps = 5.0;
        }
        if client.burst == 0 {
            client.burst = 10;
        }

        let ct = &mut self.conntrack;
        ct.max_per_core.get_or_insert(32 * 1024);
        ct.min.get_or_insert(128 * 1024);
        ct.tcp_established_timeout
            .get_or_insert(GoDuration::from_secs(24 * 3600));
        ct.tcp_close_wait_timeout
            .get_or_insert(GoDuration::from_secs(3600));

        if self.logging.format.is_empty() {
            self.logging.format = "text".into();
        }
    }

    /// The mode in force: empty means iptables, as on Linux upstream. `None` for an unknown word
    /// (validation reports that before anyone asks).
    pub fn proxy_mode(&self) -> Option<ProxyMode> {
        ProxyMode::parse(&self.mode)
    }

    /// The local-traffic detector in force (empty means ClusterCIDR).
    pub fn detect_local(&self) -> Option<DetectLocalMode> {
        match self.detect_local_mode.as_str() {
            "" | "ClusterCIDR" => Some(DetectLocalMode::ClusterCidr),
            "NodeCIDR" => Some(DetectLocalMode::NodeCidr),
            "BridgeInterface" => Some(DetectLocalMode::BridgeInterface),
            "InterfaceNamePrefix" => Some(DetectLocalMode::InterfaceNamePrefix),
            _ => None,
        }
    }

    /// The firewall mark that tells KUBE-POSTROUTING to masquerade: `1 << masqueradeBit`.
    pub fn masquerade_mark(&self) -> u32 {
        let bit = self.iptables.masquerade_bit.unwrap_or(14).clamp(0, 31);
        1u32 << bit
    }
}

/// Upstream's rule: empty -> `any:port`; a host alone gets the default port appended.
fn default_host_port(value: &str, any: &str, port: u16) -> String {
    if value.is_empty() {
        return format!("{any}:{port}");
    }
    let is_bare_ipv6 = value.parse::<std::net::Ipv6Addr>().is_ok();
    if is_bare_ipv6 {
        return format!("[{value}]:{port}");
    }
    let has_port = value
        .rsplit_once(':')
        .is_some_and(|(_, p)| !p.contains(']'));
    if has_port {
        value.to_string()
    } else {
        format!("{value}:{port}")
    }
}

fn default_duration(field: &mut GoDuration, secs: u64) {
    if field.is_zero() {
        *field = GoDuration::from_secs(secs);
    }
}

/// nodePortAddresses' keywords (upstream 1.37; before it, `primary` alone): the node's address,
/// the loopback addresses, every address. Mixed freely with each other and with CIDRs.
pub const NODE_PORT_KEYWORDS: [&str; 3] = ["primary", "localhost", "all"];
