//! Merging a service's EndpointSlices into endpoints per service port.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::types::{Endpoint, EndpointSlice, EndpointsMap, ServicePortName};

/// Merges the slices of one service. An endpoint listed by several slices appears once; a ready
/// copy wins over one that is not (a pod moving between slices is briefly in both).
pub fn merge_slices<'a>(slices: impl IntoIterator<Item = &'a EndpointSlice>) -> EndpointsMap {
    let mut merged: BTreeMap<ServicePortName, BTreeMap<(IpAddr, u16), Endpoint>> = BTreeMap::new();
    for slice in slices {
        for port in &slice.ports {
            let name = ServicePortName {
                service: slice.service.clone(),
                port: port.name.clone(),
                protocol: port.protocol,
            };
            let by_address = merged.entry(name).or_default();
            for ep in &slice.endpoints {
                let endpoint = Endpoint {
                    ip: ep.ip,
                    port: port.port,
                    ready: ep.ready,
                    serving: ep.serving,
                    terminating: ep.terminating,
                    node_name: ep.node_name.clone(),
                    zone: ep.zone.clone(),
                    zone_hints: ep.zone_hints.clone(),
                    node_hints: ep.node_hints.clone(),
                };
                match by_address.get(&(ep.ip, port.port)) {
                    Some(existing) if existing.ready || !endpoint.ready => {}
                    _ => {
                        by_address.insert((ep.ip, port.port), endpoint);
                    }
                }
            }
        }
    }
    merged
        .into_iter()
        .map(|(name, by_address)| {
            let mut endpoints: Vec<Endpoint> = by_address.into_values().collect();
            endpoints.shrink_to_fit();
            (name, endpoints)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::model::Names;

    use super::*;
    use crate::model::types::{IpFamily, NamespacedName, Protocol, SliceEndpoint, SlicePort};

    fn slice(name: &str, ports: &[(&str, u16)], endpoints: &[(&str, bool)]) -> EndpointSlice {
        EndpointSlice {
            trigger_time: None,
            name: NamespacedName::new("ns", name),
            service: NamespacedName::new("ns", "svc"),
            family: IpFamily::V4,
            ports: ports
                .iter()
                .map(|(n, p)| SlicePort {
                    name: (*n).into(),
                    port: *p,
                    protocol: Protocol::Tcp,
                })
                .collect(),
            endpoints: endpoints
                .iter()
                .map(|(ip, ready)| SliceEndpoint {
                    ip: ip.parse().unwrap(),
                    ready: *ready,
                    serving: *ready,
                    terminating: false,
                    node_name: None,
                    zone: None,
                    zone_hints: Names::default(),
                    node_hints: Names::default(),
                })
                .collect(),
        }
    }

    #[test]
    fn merges_ports_and_deduplicates_preferring_ready() {
        let a = slice(
            "a",
            &[("http", 80), ("https", 443)],
            &[("10.0.0.2", true), ("10.0.0.1", false)],
        );
        let b = slice(
            "b",
            &[("http", 80)],
            &[("10.0.0.1", true), ("10.0.0.3", true)],
        );
        let merged = merge_slices([&a, &b]);
        let http = &merged[&ServicePortName::new("ns", "svc", "http", Protocol::Tcp)];
        let shown: Vec<_> = http.iter().map(|e| (e.address(), e.ready)).collect();
        assert_eq!(
            shown,
            vec![
                ("10.0.0.1:80".into(), true),
                ("10.0.0.2:80".into(), true),
                ("10.0.0.3:80".into(), true)
            ]
        );
        let https = &merged[&ServicePortName::new("ns", "svc", "https", Protocol::Tcp)];
        assert_eq!(https.len(), 2);
        // The order of slices does not change the result.
        assert_eq!(merge_slices([&b, &a]), merged);
    }
}
