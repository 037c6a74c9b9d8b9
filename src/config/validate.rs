//! Upstream's checks (pkg/proxy/apis/config/validation), run on a defaulted configuration.
//! Every failure names the field (as the YAML spells it) and the value.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use super::duration::GoDuration;
use super::feature_gates;
use super::types::NODE_PORT_KEYWORDS;
use super::types::{DetectLocalMode, KubeProxyConfiguration, ProxyMode};

/// The IPVS schedulers the kernel ships and upstream accepts.
pub const IPVS_SCHEDULERS: [&str; 11] = [
    "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "sh", "dh", "sed", "nq", "mh",
];

/// One field that failed validation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// The field's path, as the YAML spells it (`iptables.syncPeriod`).
    pub field: String,
    /// The value found, as text.
    pub value: String,
    /// What the value must be.
    pub reason: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: invalid value {:?}: {}",
            self.field, self.value, self.reason
        )
    }
}

/// Validates a configuration after [`KubeProxyConfiguration::apply_defaults`].
pub fn validate(config: &KubeProxyConfiguration) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut fail = |field: &str, value: &dyn fmt::Display, reason: &str| {
        errors.push(FieldError {
            field: field.into(),
            value: value.to_string(),
            reason: reason.into(),
        })
    };

    let mode = config.proxy_mode();
    if mode.is_none() {
        fail(
            "mode",
            &config.mode,
            "must be one of \"iptables\", \"ipvs\", \"nftables\" or empty",
        );
    }

    // Upstream 1.37 gates IPVS mode (KEP-5495: off by default in 1.40, then removed).
    if mode == Some(ProxyMode::Ipvs)
        && !feature_gates::enabled(&config.feature_gates, "KubeProxyIPVS")
    {
        fail(
            "mode",
            &config.mode,
            "ipvs mode needs the KubeProxyIPVS feature gate, which featureGates turns off (upstream deprecates ipvs mode; \"nftables\" replaces it)",
        );
    }
    check_mode_settings(config, mode, &mut fail);

    if config.config_sync_period.is_zero() {
        fail(
            "configSyncPeriod",
            &config.config_sync_period,
            "must be greater than 0",
        );
    }
    check_addresses(config, &mut fail);

    check_limits(config, &mut fail);
    check_detect_local(config, &mut fail);
    check_logging_and_client(config, &mut fail);
    errors
}

type Fail<'a> = dyn FnMut(&str, &dyn fmt::Display, &str) + 'a;

/// The proxy modes' sections: iptables' whatever the mode, and the configured mode's.
fn check_mode_settings(
    config: &KubeProxyConfiguration,
    mode: Option<ProxyMode>,
    fail: &mut Fail<'_>,
) {
    let ipt = &config.iptables;
    check_masquerade_bit("iptables.masqueradeBit", ipt.masquerade_bit, fail);
    check_periods("iptables", ipt.sync_period, ipt.min_sync_period, fail);

    if mode == Some(ProxyMode::Ipvs) {
        let ipvs = &config.ipvs;
        check_periods("ipvs", ipvs.sync_period, ipvs.min_sync_period, fail);
        if !ipvs.scheduler.is_empty() && !IPVS_SCHEDULERS.contains(&ipvs.scheduler.as_str()) {
            fail(
                "ipvs.scheduler",
                &ipvs.scheduler,
                &format!("must be one of {}", IPVS_SCHEDULERS.join(", ")),
            );
        }
        for (i, cidr) in ipvs.exclude_cidrs.iter().enumerate() {
            if cidr.parse::<IpNet>().is_err() {
                fail(
                    &format!("ipvs.excludeCIDRs[{i}]"),
                    cidr,
                    "must be a CIDR (like 10.0.0.0/8)",
                );
            }
        }
    }
    if mode == Some(ProxyMode::Nftables) {
        let nft = &config.nftables;
        check_masquerade_bit("nftables.masqueradeBit", nft.masquerade_bit, fail);
        check_periods("nftables", nft.sync_period, nft.min_sync_period, fail);
    }
}

/// The servers' addresses, the cluster CIDR and the NodePort addresses.
fn check_addresses(config: &KubeProxyConfiguration, fail: &mut Fail<'_>) {
    if config.bind_address.parse::<IpAddr>().is_err() {
        fail("bindAddress", &config.bind_address, "must be an IP address");
    }
    for (field, value) in [
        ("healthzBindAddress", &config.healthz_bind_address),
        ("metricsBindAddress", &config.metrics_bind_address),
    ] {
        match value.parse::<SocketAddr>() {
            // Empty: the server is off (upstream's --healthz-port=0 / --metrics-port=0).
            _ if value.is_empty() => {}
            Ok(addr) if addr.port() == 0 => fail(field, value, "port must be between 1 and 65535"),
            Ok(_) => {}
            Err(_) => fail(
                field,
                value,
                "must be IP:port (like 0.0.0.0:10256 or [::]:10256)",
            ),
        }
    }
    check_cluster_cidr(&config.cluster_cidr, fail);
    check_node_port_addresses(&config.node_port_addresses, fail);
}

/// The OOM score and the conntrack sizes.
fn check_limits(config: &KubeProxyConfiguration, fail: &mut Fail<'_>) {
    if let Some(adj) = config
        .oom_score_adj
        .filter(|adj| !(-1000..=1000).contains(adj))
    {
        fail("oomScoreAdj", &adj, "must be between -1000 and 1000");
    }
    let ct = &config.conntrack;
    for (field, value) in [
        ("conntrack.maxPerCore", ct.max_per_core),
        ("conntrack.min", ct.min),
    ] {
        if let Some(v) = value.filter(|v| *v < 0) {
            fail(field, &v, "must be greater than or equal to 0");
        }
    }
}

/// How traffic from this node's pods is told apart.
fn check_detect_local(config: &KubeProxyConfiguration, fail: &mut Fail<'_>) {
    match config.detect_local() {
        None => fail(
            "detectLocalMode",
            &config.detect_local_mode,
            "must be one of \"ClusterCIDR\", \"NodeCIDR\", \"BridgeInterface\", \"InterfaceNamePrefix\" or empty",
        ),
        Some(DetectLocalMode::BridgeInterface)
            if config.detect_local.bridge_interface.is_empty() =>
        {
            fail(
                "detectLocal.bridgeInterface",
                &"",
                "must be set when detectLocalMode is BridgeInterface",
            )
        }
        Some(DetectLocalMode::InterfaceNamePrefix)
            if config.detect_local.interface_name_prefix.is_empty() =>
        {
            fail(
                "detectLocal.interfaceNamePrefix",
                &"",
                "must be set when detectLocalMode is InterfaceNamePrefix",
            )
        }
        Some(_) => {}
    }
}

/// The log format and the API client's rate.
fn check_logging_and_client(config: &KubeProxyConfiguration, fail: &mut Fail<'_>) {
    if !matches!(config.logging.format.as_str(), "text" | "json") {
        fail(
            "logging.format",
            &config.logging.format,
            "must be \"text\" or \"json\"",
        );
    }
    if config.client_connection.qps < 0.0 {
        fail(
            "clientConnection.qps",
            &config.client_connection.qps,
            "must be greater than or equal to 0",
        );
    }
    if config.client_connection.burst < 0 {
        fail(
            "clientConnection.burst",
            &config.client_connection.burst,
            "must be greater than or equal to 0",
        );
    }
}

fn check_masquerade_bit(field: &str, bit: Option<i32>, fail: &mut Fail<'_>) {
    if let Some(bit) = bit.filter(|bit| !(0..=31).contains(bit)) {
        fail(field, &bit, "must be between 0 and 31");
    }
}

fn check_periods(section: &str, sync: GoDuration, min_sync: GoDuration, fail: &mut Fail<'_>) {
    if sync.is_zero() {
        fail(
            &format!("{section}.syncPeriod"),
            &sync,
            "must be greater than 0",
        );
    }
    if min_sync > sync {
        fail(
            &format!("{section}.minSyncPeriod"),
            &min_sync,
            &format!("must be less than or equal to {section}.syncPeriod ({sync})"),
        );
    }
}

fn check_cluster_cidr(value: &str, fail: &mut Fail<'_>) {
    if value.is_empty() {
        return;
    }
    let parts: Vec<&str> = value.split(',').map(str::trim).collect();
    if parts.len() > 2 {
        fail(
            "clusterCIDR",
            &value,
            "must hold at most two CIDRs, one IPv4 and one IPv6",
        );
        return;
    }
    let mut nets = Vec::new();
    for part in &parts {
        match part.parse::<IpNet>() {
            Ok(net) => nets.push(net),
            Err(_) => {
                fail(
                    "clusterCIDR",
                    &value,
                    &format!("{part:?} is not a CIDR (like 10.244.0.0/16)"),
                );
                return;
            }
        }
    }
    if let [a, b] = nets.as_slice()
        && matches!(a, IpNet::V4(_)) == matches!(b, IpNet::V4(_))
    {
        fail(
            "clusterCIDR",
            &value,
            "two CIDRs must be one IPv4 and one IPv6",
        );
    }
}

fn check_node_port_addresses(values: &[String], fail: &mut Fail<'_>) {
    for (i, value) in values.iter().enumerate() {
        if !NODE_PORT_KEYWORDS.contains(&value.as_str()) && value.parse::<IpNet>().is_err() {
            fail(
                &format!("nodePortAddresses[{i}]"),
                value,
                "must be a CIDR (like 192.168.0.0/16) or one of the keywords \"primary\", \"localhost\", \"all\"",
            );
        }
    }
}
