//! Conversion of API objects into the model, once, at the boundary. A malformed object is refused
//! with an error that says what is wrong; a bad entry in a list (one external IP, one endpoint) is
//! dropped with a warning and the rest of the object is kept, as upstream filters such entries.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, LazyLock, Mutex};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::discovery::v1::EndpointSlice as ApiEndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::rules;
use crate::model::{
    EndpointSlice, IpFamily, Names, NamespacedName, NodeInfo, Protocol, SliceEndpoint, SlicePort,
};

/// Labels that keep a Service or EndpointSlice away from kube-proxy: another proxy owns it, or
/// the service is headless.
pub const PROXY_EXCLUDING_LABELS: [&str; 2] = [
    "service.kubernetes.io/service-proxy-name",
    "service.kubernetes.io/headless",
];

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// upstream's default ClientIP affinity timeout (3 hours).
const DEFAULT_AFFINITY_SECONDS: u32 = 10_800;

/// Why an object was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{reason}")]
pub struct ConvertError {
    /// What is wrong, naming the field and value.
    pub reason: String,
}

fn invalid(reason: impl Into<String>) -> ConvertError {
    ConvertError {
        reason: reason.into(),
    }
}

/// A converted object with the entries that were dropped from it.
#[derive(Debug, PartialEq)]
pub struct Converted<T> {
    pub value: T,
    pub warnings: Vec<String>,
}

/// An object's namespace/name, or an error when either is missing.
pub fn object_key(meta: &ObjectMeta) -> Result<NamespacedName, ConvertError> {
    let name = meta
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| invalid("metadata.name is missing"))?;
    let namespace = meta.namespace.clone().unwrap_or_default();
    Ok(NamespacedName { namespace, name })
}

/// An EndpointSlice, or `None` for one kube-proxy ignores (FQDN).
pub fn endpoint_slice(
    slice: &ApiEndpointSlice,
) -> Result<Converted<Option<EndpointSlice>>, ConvertError> {
    let key = object_key(&slice.metadata)?;
    check_name(
        "metadata.namespace",
        &key.namespace,
        rules::is_dns1123_label,
    )?;
    check_name("metadata.name", &key.name, rules::is_dns1123_subdomain)?;
    let mut warnings = Vec::new();
    let family = match slice.address_type.as_str() {
        "IPv4" => IpFamily::V4,
        "IPv6" => IpFamily::V6,
        "FQDN" => {
            return Ok(Converted {
                value: None,
                warnings,
            });
        }
        other => {
            return Err(invalid(format!(
                "addressType: {other:?} is not IPv4, IPv6 or FQDN"
            )));
        }
    };
    let service_name = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(SERVICE_NAME_LABEL))
        .filter(|name| !name.is_empty())
        .ok_or_else(|| invalid(format!("label {SERVICE_NAME_LABEL} is missing")))?;
    check_name(
        &format!("label {SERVICE_NAME_LABEL}"),
        service_name,
        rules::is_dns1123_label,
    )?;

    let mut ports = slice_ports(slice, &mut warnings);
    let mut endpoints: Vec<SliceEndpoint> = slice
        .endpoints
        .iter()
        .flatten()
        .enumerate()
        .filter_map(|(index, ep)| slice_endpoint(index, ep, family, &mut warnings))
        .collect();
    // Kept for as long as the slice exists: no spare capacity.
    endpoints.shrink_to_fit();
    ports.shrink_to_fit();
    let service = NamespacedName::new(key.namespace.clone(), service_name.clone());
    Ok(Converted {
        value: Some(EndpointSlice {
            trigger_time: trigger_time(slice),
            name: key,
            service,
            family,
            ports,
            endpoints,
        }),
        warnings,
    })
}

/// A slice's ports kube-proxy can program; the others are dropped with a warning (a port
/// without a number means "all ports", which kube-proxy cannot program, and is dropped quietly).
fn slice_ports(slice: &ApiEndpointSlice, warnings: &mut Vec<String>) -> Vec<SlicePort> {
    let mut ports = Vec::new();
    for (index, port) in slice.ports.iter().flatten().enumerate() {
        let Some(number) = port.port else { continue };
        let Some(number) = port_u16(number) else {
            warnings.push(format!(
                "ports[{index}].port: {number} is not a port between 1 and 65535; ignored"
            ));
            continue;
        };
        let protocol_text = port.protocol.as_deref().unwrap_or("TCP");
        let Some(protocol) = Protocol::from_api(protocol_text) else {
            warnings.push(format!(
                "ports[{index}].protocol: {protocol_text:?} is not TCP, UDP or SCTP; ignored"
            ));
            continue;
        };
        let name = port.name.clone().unwrap_or_default();
        if !name.is_empty() && !rules::is_dns1123_label(&name) {
            warnings.push(format!(
                "ports[{index}].name: {name:?} is not a valid port name; ignored"
            ));
            continue;
        }
        ports.push(SlicePort {
            name,
            port: number,
            protocol,
        });
    }

    ports
}

/// Endpoint `index` of a slice of `family`, or `None` (with a warning) when it has no address
/// of that family.
fn slice_endpoint(
    index: usize,
    ep: &k8s_openapi::api::discovery::v1::Endpoint,
    family: IpFamily,
    warnings: &mut Vec<String>,
) -> Option<SliceEndpoint> {
    let Some(text) = ep.addresses.first() else {
        warnings.push(format!("endpoints[{index}]: no address; ignored"));
        return None;
    };
    let ip = match parse_ip(text) {
        Some(ip) if IpFamily::of(&ip) == family => ip,
        _ => {
            let want = if family == IpFamily::V4 {
                "IPv4"
            } else {
                "IPv6"
            };
            warnings.push(format!(
                "endpoints[{index}].addresses: {text:?} is not an {want} address; ignored"
            ));
            return None;
        }
    };
    let conditions = ep.conditions.as_ref();
    let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
    // As upstream: an unset condition is ready and serving, and not terminating.
    let serving = conditions.and_then(|c| c.serving).unwrap_or(true);
    let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
    let hints = ep.hints.as_ref();
    let zone_hints: Names = hints
        .and_then(|h| h.for_zones.as_ref())
        .into_iter()
        .flatten()
        .map(|z| shared(&z.name))
        .collect();
    let node_hints: Names = hints
        .and_then(|h| h.for_nodes.as_ref())
        .into_iter()
        .flatten()
        .map(|n| shared(&n.name))
        .collect();
    Some(SliceEndpoint {
        ip,
        ready,
        serving,
        terminating,
        node_name: ep
            .node_name
            .as_deref()
            .filter(|n| !n.is_empty())
            .map(shared),
        zone: ep.zone.as_deref().filter(|z| !z.is_empty()).map(shared),
        zone_hints,
        node_hints,
    })
}

/// The slice's `endpoints.kubernetes.io/last-change-trigger-time`, if present and readable.
fn trigger_time(slice: &ApiEndpointSlice) -> Option<std::time::SystemTime> {
    let text = slice
        .metadata
        .annotations
        .as_ref()?
        .get("endpoints.kubernetes.io/last-change-trigger-time")?;
    let time = chrono::DateTime::parse_from_rfc3339(text).ok()?;
    Some(time.with_timezone(&chrono::Utc).into())
}

/// A ServiceCIDR's ranges (`spec.cidrs`); an entry that does not parse is ignored with a warning.
pub fn service_cidr(object: &ServiceCIDR) -> Converted<Vec<IpNet>> {
    let mut warnings = Vec::new();
    let mut cidrs = Vec::new();
    let listed = object
        .spec
        .as_ref()
        .and_then(|s| s.cidrs.clone())
        .unwrap_or_default();
    for text in listed {
        match rules::parse_cidr(&text) {
            Some(cidr) => cidrs.push(cidr.trunc()),
            None => warnings.push(format!("spec.cidrs: {text:?} is not a CIDR")),
        }
    }
    Converted {
        value: cidrs,
        warnings,
    }
}

/// This node's addresses, labels and pod CIDRs.
pub fn node_info(node: &Node) -> Converted<NodeInfo> {
    let mut warnings = Vec::new();
    let name = node.metadata.name.clone().unwrap_or_default();
    let labels: BTreeMap<String, String> = node
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let status = node.status.as_ref();
    let mut addresses = Vec::new();
    for wanted in ["InternalIP", "ExternalIP"] {
        for address in status
            .and_then(|s| s.addresses.as_ref())
            .into_iter()
            .flatten()
        {
            if address.type_ != wanted {
                continue;
            }
            match parse_ip(&address.address) {
                Some(ip) if !addresses.contains(&ip) => addresses.push(ip),
                Some(_) => {}
                None => warnings.push(format!(
                    "status.addresses: {:?} is not an IP address; ignored",
                    address.address
                )),
            }
        }
    }
    let spec = node.spec.as_ref();
    let mut cidr_texts: Vec<&String> = spec
        .and_then(|s| s.pod_cidrs.as_ref())
        .into_iter()
        .flatten()
        .collect();
    if cidr_texts.is_empty()
        && let Some(cidr) = spec.and_then(|s| s.pod_cidr.as_ref())
    {
        cidr_texts.push(cidr);
    }
    let pod_cidrs = parse_list(
        cidr_texts.into_iter(),
        "spec.podCIDRs",
        rules::parse_cidr,
        &mut warnings,
    );
    Converted {
        value: NodeInfo {
            name,
            labels,
            addresses,
            pod_cidrs,
        },
        warnings,
    }
}

fn parse_ip(text: &str) -> Option<IpAddr> {
    rules::parse_ip(text)
}

/// Refuses an object whose `field` holds a name the API's `rule` would not allow.
fn check_name(field: &str, name: &str, rule: fn(&str) -> bool) -> Result<(), ConvertError> {
    if rule(name) {
        Ok(())
    } else {
        Err(invalid(format!("{field}: {name:?} is not a valid name")))
    }
}

fn port_u16(port: i32) -> Option<u16> {
    u16::try_from(port).ok().filter(|p| *p != 0)
}

fn parse_list<'a, T>(
    items: impl Iterator<Item = &'a String>,
    field: &str,
    parse: impl Fn(&str) -> Option<T>,
    warnings: &mut Vec<String>,
) -> Vec<T> {
    let mut parsed = Vec::new();
    for text in items {
        match parse(text) {
            Some(value) => parsed.push(value),
            None => warnings.push(format!("{field}: {text:?} is not valid; ignored")),
        }
    }
    parsed
}

/// One shared copy of a node's or zone's name: 100,000 endpoints name a few nodes, and the
/// watch side's and the sync side's copies of each endpoint hold a pointer instead of a string.
/// Holds at most [`SHARED_NAMES`] names (hostile input with a name per endpoint only costs
/// the sharing).
fn shared(name: &str) -> Arc<str> {
    static NAMES: LazyLock<Mutex<HashSet<Arc<str>>>> = LazyLock::new(Mutex::default);
    let mut names = NAMES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(known) = names.get(name) {
        return known.clone();
    }
    if names.len() >= SHARED_NAMES {
        names.clear();
    }
    let new: Arc<str> = Arc::from(name);
    names.insert(new.clone());
    new
}

/// How many names [`shared`] keeps.
const SHARED_NAMES: usize = 16_384;

mod service;

pub use service::service_ports;

#[cfg(test)]
mod tests;
