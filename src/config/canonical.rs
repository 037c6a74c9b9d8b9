//! The configuration's addresses as upstream reads them: with its sloppy parsers, so that an
//! IPv4 octet with leading zeros is decimal (`010.244.0.0/16` is 10.244.0.0/16; strict
//! IP/CIDR validation, KEP-4858, is the API server's and leaves kube-proxy's configuration
//! alone). Such an address is written back in canonical form once, before validation, and
//! every later reader parses strictly.

use std::net::{IpAddr, SocketAddr};

use super::KubeProxyConfiguration;
use crate::model::address::parse_ip;

/// Rewrites every address of `config` that only the sloppy parsers read.
pub fn canonical_addresses(config: &mut KubeProxyConfiguration) {
    if config.bind_address.parse::<IpAddr>().is_err()
        && let Some(ip) = parse_ip(&config.bind_address)
    {
        config.bind_address = ip.to_string();
    }
    canonical_host_port(&mut config.healthz_bind_address);
    canonical_host_port(&mut config.metrics_bind_address);
    let parts: Vec<String> = config
        .cluster_cidr
        .split(',')
        .map(|part| {
            let mut part = part.to_string();
            canonical_cidr(&mut part);
            part
        })
        .collect();
    if !config.cluster_cidr.is_empty() {
        config.cluster_cidr = parts.join(",");
    }
    config
        .node_port_addresses
        .iter_mut()
        .for_each(canonical_cidr);
    config
        .ipvs
        .exclude_cidrs
        .iter_mut()
        .for_each(canonical_cidr);
}

/// A CIDR's address without leading zeros; its length and host bits as written (ipnet's
/// parser takes leading zeros, but not every reader of the text is ipnet's).
fn canonical_cidr(text: &mut String) {
    if let Some((address, length)) = text.trim().split_once('/')
        && address.parse::<IpAddr>().is_err()
        && let Some(ip) = parse_ip(address)
    {
        *text = format!("{ip}/{length}");
    }
}

fn canonical_host_port(text: &mut String) {
    if text.parse::<SocketAddr>().is_ok() {
        return;
    }
    // IPv4 only: an IPv6 host without brackets is refused, as upstream's SplitHostPort does.
    if let Some((host, port)) = text.rsplit_once(':')
        && !host.contains(':')
        && let (Some(ip), Ok(port)) = (parse_ip(host), port.parse::<u16>())
    {
        *text = SocketAddr::new(ip, port).to_string();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_zeros_are_decimal_and_the_rest_is_left_as_written() {
        let mut config = KubeProxyConfiguration {
            bind_address: "010.000.000.001".into(),
            healthz_bind_address: "010.0.0.1:10256".into(),
            metrics_bind_address: "[::1]:10249".into(),
            cluster_cidr: "010.244.0.0/16, fd00::/48".into(),
            node_port_addresses: vec!["primary".into(), "192.168.010.0/24".into()],
            ..KubeProxyConfiguration::default()
        };
        config.ipvs.exclude_cidrs = vec!["010.9.0.0/16".into(), "not a cidr".into()];
        canonical_addresses(&mut config);
        assert_eq!(config.bind_address, "10.0.0.1");
        assert_eq!(config.healthz_bind_address, "10.0.0.1:10256");
        assert_eq!(config.metrics_bind_address, "[::1]:10249");
        assert_eq!(config.cluster_cidr, "10.244.0.0/16, fd00::/48");
        assert_eq!(config.node_port_addresses, ["primary", "192.168.10.0/24"]);
        assert_eq!(config.ipvs.exclude_cidrs, ["10.9.0.0/16", "not a cidr"]);
        // An address upstream refuses too is left for validation to name.
        config.bind_address = "10.0.0.256".into();
        config.metrics_bind_address = "::1:10249".into();
        canonical_addresses(&mut config);
        assert_eq!(config.bind_address, "10.0.0.256");
        assert_eq!(config.metrics_bind_address, "::1:10249");
    }
}
