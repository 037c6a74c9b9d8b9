//! A Service's ports, converted: what every port shares (addresses, source ranges, affinity,
//! traffic policies) read once, then each port.

use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Service, ServicePort as ApiServicePort, ServiceSpec};

use super::{
    ConvertError, Converted, DEFAULT_AFFINITY_SECONDS, check_name, invalid, object_key, parse_ip,
    parse_list, port_u16,
};
use crate::k8s::rules;
use crate::model::{NamespacedName, Protocol, ServicePort, ServicePortMap, ServicePortName};

/// A Service's ports. Headless, ExternalName and not-yet-allocated services have none.
pub fn service_ports(service: &Service) -> Result<Converted<ServicePortMap>, ConvertError> {
    let key = service_key(service)?;
    let spec = service
        .spec
        .as_ref()
        .ok_or_else(|| invalid("spec is missing"))?;
    let mut warnings = Vec::new();
    let mut map = ServicePortMap::new();
    let service_type = spec.type_.as_deref().unwrap_or("ClusterIP");
    let cluster_ips = if service_type == "ExternalName" {
        Vec::new()
    } else {
        cluster_ips(spec)?
    };
    if cluster_ips.is_empty() {
        return Ok(Converted {
            value: map,
            warnings,
        });
    }
    let shared = Shared::read(service, spec, key, cluster_ips, &mut warnings)?;
    for (index, port) in spec.ports.iter().flatten().enumerate() {
        let field = format!("spec.ports[{index}]");
        let service_port = shared.port(&field, port)?;
        let name = service_port.name.clone();
        if map.insert(name.clone(), service_port).is_some() {
            return Err(invalid(format!(
                "{field}: port {name} ({}) is listed twice",
                name.protocol
            )));
        }
    }
    // Kept for as long as the Service exists: no spare capacity.
    map.shrink_to_fit();
    Ok(Converted {
        value: map,
        warnings,
    })
}

/// The Service's namespace and name, both valid DNS labels.
fn service_key(service: &Service) -> Result<NamespacedName, ConvertError> {
    let key = object_key(&service.metadata)?;
    if key.namespace.is_empty() {
        return Err(invalid("metadata.namespace is missing"));
    }
    check_name(
        "metadata.namespace",
        &key.namespace,
        rules::is_dns1123_label,
    )?;
    check_name("metadata.name", &key.name, rules::is_dns1123_label)?;
    Ok(key)
}

/// The cluster IPs (`clusterIPs`, else `clusterIP`); none for a headless Service or one not
/// allocated yet.
fn cluster_ips(spec: &ServiceSpec) -> Result<Vec<IpAddr>, ConvertError> {
    let mut texts: Vec<&str> = spec
        .cluster_ips
        .iter()
        .flatten()
        .map(String::as_str)
        .collect();
    if texts.is_empty()
        && let Some(ip) = spec.cluster_ip.as_deref()
    {
        texts.push(ip);
    }
    if texts.contains(&"None") {
        return Ok(Vec::new());
    }
    texts
        .iter()
        .filter(|t| !t.is_empty())
        .map(|text| {
            parse_ip(text)
                .ok_or_else(|| invalid(format!("spec.clusterIPs: {text:?} is not an IP address")))
        })
        .collect()
}

/// The load balancer's IPs the node serves: not those with ipMode Proxy, whose load balancer
/// sends traffic to the node rather than to the VIP.
fn load_balancer_ips(service: &Service, warnings: &mut Vec<String>) -> Vec<IpAddr> {
    let ingress = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref());
    let mut ips = Vec::new();
    for entry in ingress.into_iter().flatten() {
        if entry.ip_mode.as_deref() == Some("Proxy") {
            continue;
        }
        if let Some(text) = entry.ip.as_deref() {
            match parse_ip(text) {
                Some(ip) => ips.push(ip),
                None => warnings.push(format!(
                    "status.loadBalancer.ingress: {text:?} is not an IP address; ignored"
                )),
            }
        }
    }
    ips
}

/// The source ranges that could be read, and whether some were asked for but none could be
/// read: ranges that cannot be read never widen access, so then no source is allowed.
fn source_ranges(spec: &ServiceSpec, warnings: &mut Vec<String>) -> (Vec<IpNet>, bool) {
    let asked = spec
        .load_balancer_source_ranges
        .as_deref()
        .unwrap_or_default();
    let ranges = parse_list(
        asked.iter(),
        "spec.loadBalancerSourceRanges",
        rules::parse_cidr,
        warnings,
    );
    let closed = !asked.is_empty() && ranges.is_empty();
    if closed {
        warnings.push(
            "spec.loadBalancerSourceRanges: no range could be read; its load-balancer IPs accept no traffic"
                .to_string(),
        );
    }
    (ranges, closed)
}

/// The ClientIP affinity's timeout, if the Service asks for affinity.
fn session_affinity(spec: &ServiceSpec) -> Result<Option<u32>, ConvertError> {
    match spec.session_affinity.as_deref() {
        Some("ClientIP") => {
            let timeout = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            match timeout {
                None => Ok(Some(DEFAULT_AFFINITY_SECONDS)),
                Some(t) if (1..=86_400).contains(&t) => Ok(Some(t as u32)),
                Some(t) => Err(invalid(format!(
                    "spec.sessionAffinityConfig.clientIP.timeoutSeconds: {t} is not between 1 and 86400"
                ))),
            }
        }
        None | Some("None") | Some("") => Ok(None),
        Some(other) => Err(invalid(format!(
            "spec.sessionAffinity: {other:?} is not ClientIP or None"
        ))),
    }
}

/// What every port of a Service shares.
struct Shared {
    key: NamespacedName,
    cluster_ips: Vec<IpAddr>,
    external_ips: Vec<IpAddr>,
    load_balancer_ips: Vec<IpAddr>,
    source_ranges: Vec<IpNet>,
    source_ranges_closed: bool,
    session_affinity_seconds: Option<u32>,
    internal_policy_local: bool,
    wants_external_local: bool,
    /// The health-check port, for a LoadBalancer Service.
    health_check_node_port: Option<u16>,
}

impl Shared {
    fn read(
        service: &Service,
        spec: &ServiceSpec,
        key: NamespacedName,
        cluster_ips: Vec<IpAddr>,
        warnings: &mut Vec<String>,
    ) -> Result<Shared, ConvertError> {
        let external_ips = parse_list(
            spec.external_ips.iter().flatten(),
            "spec.externalIPs",
            parse_ip,
            warnings,
        );
        let load_balancer_ips = load_balancer_ips(service, warnings);
        let (source_ranges, source_ranges_closed) = source_ranges(spec, warnings);
        let is_load_balancer = spec.type_.as_deref() == Some("LoadBalancer");
        Ok(Shared {
            key,
            cluster_ips,
            external_ips,
            load_balancer_ips,
            source_ranges,
            source_ranges_closed,
            session_affinity_seconds: session_affinity(spec)?,
            internal_policy_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
            wants_external_local: spec.external_traffic_policy.as_deref() == Some("Local"),
            health_check_node_port: spec
                .health_check_node_port
                .filter(|_| is_load_balancer)
                .and_then(port_u16),
        })
    }

    /// The port at `field` (`spec.ports[i]`).
    fn port(&self, field: &str, port: &ApiServicePort) -> Result<ServicePort, ConvertError> {
        let port_number = port_u16(port.port).ok_or_else(|| {
            invalid(format!(
                "{field}.port: {} is not a port between 1 and 65535",
                port.port
            ))
        })?;
        let protocol_text = port.protocol.as_deref().unwrap_or("TCP");
        let protocol = Protocol::from_api(protocol_text).ok_or_else(|| {
            invalid(format!(
                "{field}.protocol: {protocol_text:?} is not TCP, UDP or SCTP"
            ))
        })?;
        let port_name = port.name.clone().unwrap_or_default();
        if !port_name.is_empty() {
            check_name(
                &format!("{field}.name"),
                &port_name,
                rules::is_iana_service_name,
            )?;
        }
        let node_port = match port.node_port {
            None | Some(0) => None,
            Some(p) => Some(
                port_u16(p)
                    .ok_or_else(|| invalid(format!("{field}.nodePort: {p} is not a port")))?,
            ),
        };
        let mut service_port = ServicePort {
            name: ServicePortName {
                service: self.key.clone(),
                port: port_name,
                protocol,
            },
            cluster_ips: self.cluster_ips.clone(),
            port: port_number,
            node_port,
            external_ips: self.external_ips.clone(),
            load_balancer_ips: self.load_balancer_ips.clone(),
            load_balancer_source_ranges: self.source_ranges.clone(),
            source_ranges_closed: self.source_ranges_closed,
            session_affinity_seconds: self.session_affinity_seconds,
            external_policy_local: false,
            internal_policy_local: self.internal_policy_local,
            health_check_node_port: None,
        };
        service_port.external_policy_local =
            self.wants_external_local && service_port.externally_accessible();
        if service_port.external_policy_local {
            service_port.health_check_node_port = self.health_check_node_port;
        }
        Ok(service_port)
    }
}
