//! Typed services and endpoints. Everything past the watch layer is one of these: no IP is a string.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ipnet::IpNet;

/// A namespace and a name: how Services, EndpointSlices and their owners are keyed.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamespacedName {
    pub namespace: String,
    pub name: String,
}

impl NamespacedName {
    /// Builds one from its parts.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        NamespacedName {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for NamespacedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A transport protocol a service port can carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// Parses the API's spelling (`TCP`, `UDP`, `SCTP`).
    pub fn from_api(text: &str) -> Option<Self> {
        match text {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    /// Lower case, as iptables' `-p` and upstream's chain-name hash spell it.
    /// The IP protocol number (`6`, `17`, `132`).
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }

    pub fn lower(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        })
    }
}

/// An IP family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    /// `IPv4` or `IPv6`, as the API (ipFamilies, addressType) and upstream's metrics spell it.
    pub fn name(self) -> &'static str {
        match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        }
    }

    /// The family's loopback address (127.0.0.1, ::1): where localhost NodePorts are served.
    pub fn loopback(self) -> IpAddr {
        match self {
            IpFamily::V4 => Ipv4Addr::LOCALHOST.into(),
            IpFamily::V6 => Ipv6Addr::LOCALHOST.into(),
        }
    }

    /// The family of an address.
    pub fn of(ip: &IpAddr) -> Self {
        if ip.is_ipv4() {
            IpFamily::V4
        } else {
            IpFamily::V6
        }
    }
}

/// One port of one service: `ns/name:port` plus the protocol (upstream's ServicePortName).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePortName {
    pub service: NamespacedName,
    /// The port's name; empty for a service's single unnamed port.
    pub port: String,
    pub protocol: Protocol,
}

impl ServicePortName {
    /// Builds one from its parts.
    pub fn new(namespace: &str, name: &str, port: &str, protocol: Protocol) -> Self {
        ServicePortName {
            service: NamespacedName::new(namespace, name),
            port: port.into(),
            protocol,
        }
    }

    /// Reads `ns/name:port` (or `ns/name`, an unnamed port) back, as the kernel's comments and
    /// chain names carry it, with the protocol that goes with it.
    pub fn parse(text: &str, protocol: Protocol) -> Option<Self> {
        let (service, port) = text.rsplit_once(':').unwrap_or((text, ""));
        let (namespace, name) = service.split_once('/')?;
        let valid = |part: &str| !part.is_empty() && !part.contains(['/', ':', ' ']);
        (valid(namespace) && valid(name) && !port.contains(['/', ' ']))
            .then(|| ServicePortName::new(namespace, name, port, protocol))
    }
}

impl fmt::Display for ServicePortName {
    /// `ns/name:port`, or `ns/name` for an unnamed port, as upstream prints (and hashes) it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port.is_empty() {
            write!(f, "{}", self.service)
        } else {
            write!(f, "{}:{}", self.service, self.port)
        }
    }
}

/// Everything a proxier needs to know about one service port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    pub name: ServicePortName,
    /// The service's cluster IPs, at most one per family.
    pub cluster_ips: Vec<IpAddr>,
    pub port: u16,
    /// The NodePort, when the service has one.
    pub node_port: Option<u16>,
    pub external_ips: Vec<IpAddr>,
    /// LoadBalancer ingress IPs that traffic reaches directly (ipMode Proxy ones are left out).
    pub load_balancer_ips: Vec<IpAddr>,
    pub load_balancer_source_ranges: Vec<IpNet>,
    /// The service asked for source ranges but none could be read: its load-balancer IPs accept
    /// no source at all (never open to every source).
    pub source_ranges_closed: bool,
    /// The ClientIP affinity timeout in seconds, when affinity is on.
    pub session_affinity_seconds: Option<u32>,
    /// externalTrafficPolicy Local on an externally reachable service.
    pub external_policy_local: bool,
    /// internalTrafficPolicy Local.
    pub internal_policy_local: bool,
    /// The port the node answers health checks on for externalTrafficPolicy Local LoadBalancers.
    pub health_check_node_port: Option<u16>,
}

impl ServicePort {
    /// A ClusterIP-only port `name` on `cluster_ip:port`, every other option off.
    pub fn new(name: ServicePortName, cluster_ip: IpAddr, port: u16) -> ServicePort {
        ServicePort {
            name,
            cluster_ips: vec![cluster_ip],
            port,
            node_port: None,
            external_ips: vec![],
            load_balancer_ips: vec![],
            load_balancer_source_ranges: vec![],
            source_ranges_closed: false,
            session_affinity_seconds: None,
            external_policy_local: false,
            internal_policy_local: false,
            health_check_node_port: None,
        }
    }

    /// Reachable from outside the cluster: a NodePort, an external IP or a LoadBalancer IP.
    pub fn externally_accessible(&self) -> bool {
        self.node_port.is_some()
            || !self.external_ips.is_empty()
            || !self.load_balancer_ips.is_empty()
    }

    /// Its NodePort if it is a TCP one: what the localhost NodePort proxy (KEP-6032) relays on
    /// a loopback address when it runs; the other protocols' loopback NodePorts are never
    /// served.
    pub fn tcp_node_port(&self) -> Option<u16> {
        self.node_port
            .filter(|_| self.name.protocol == Protocol::Tcp)
    }

    /// Traffic to its load-balancer IPs is filtered by source.
    pub fn has_source_ranges(&self) -> bool {
        !self.load_balancer_source_ranges.is_empty() || self.source_ranges_closed
    }

    /// Some traffic to it may go to any endpoint in the cluster: internal traffic under a Cluster
    /// policy, and any externally reachable service's (even with externalTrafficPolicy Local,
    /// pods' and the node's own traffic to its external addresses short-circuits to the cluster
    /// endpoints), as upstream's UsesClusterEndpoints.
    pub fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_policy_local || self.externally_accessible()
    }

    /// Some traffic to it may only go to endpoints on this node.
    pub fn uses_local_endpoints(&self) -> bool {
        self.internal_policy_local || (self.externally_accessible() && self.external_policy_local)
    }

    /// The port as one family sees it: its addresses of that family only; `None` without a
    /// cluster IP in that family.
    pub fn for_family(&self, family: IpFamily) -> Option<Cow<'_, ServicePort>> {
        let cluster_ip = self.cluster_ip(family)?;
        let of_family = |ip: &IpAddr| IpFamily::of(ip) == family;
        // A single-stack port (nearly all of them) is its own view: not copied.
        if self.cluster_ips.len() == 1
            && self.external_ips.iter().all(of_family)
            && self.load_balancer_ips.iter().all(of_family)
            && self
                .load_balancer_source_ranges
                .iter()
                .all(|net| of_family(&net.addr()))
        {
            return Some(Cow::Borrowed(self));
        }
        let mut view = self.clone();
        view.cluster_ips = vec![cluster_ip];
        view.external_ips.retain(of_family);
        view.load_balancer_ips.retain(of_family);
        view.load_balancer_source_ranges
            .retain(|net| of_family(&net.addr()));
        Some(Cow::Owned(view))
    }

    /// The cluster IP of one family, if the service has one.
    pub fn cluster_ip(&self, family: IpFamily) -> Option<IpAddr> {
        self.cluster_ips
            .iter()
            .copied()
            .find(|ip| IpFamily::of(ip) == family)
    }
}

/// A small set of names (an endpoint's topology hints), sorted, each shared: 16 bytes when
/// empty, which most are, where a `BTreeSet<String>` takes 24.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Names(Box<[Arc<str>]>);

impl Names {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.0.iter().any(|n| &**n == name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|n| &**n)
    }
}

impl<T: Into<Arc<str>>> FromIterator<T> for Names {
    fn from_iter<I: IntoIterator<Item = T>>(names: I) -> Self {
        let mut names: Vec<Arc<str>> = names.into_iter().map(Into::into).collect();
        names.sort();
        names.dedup();
        Names(names.into_boxed_slice())
    }
}

/// One endpoint of one service port, merged from the EndpointSlices.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Endpoint {
    pub ip: IpAddr,
    pub port: u16,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// Shared among the endpoints on one node (a node's name is stored once).
    pub node_name: Option<Arc<str>>,
    pub zone: Option<Arc<str>>,
    /// Zones this endpoint is meant to serve (topology hints); empty when it carries none.
    pub zone_hints: Names,
    /// Nodes this endpoint is meant to serve (`hints.forNodes`, PreferSameNode); empty when
    /// it carries none.
    pub node_hints: Names,
}

impl Endpoint {
    /// A ready, serving endpoint (on `node`, when known), without zone or hints.
    pub fn ready(ip: IpAddr, port: u16, node: Option<&str>) -> Endpoint {
        Endpoint {
            ip,
            port,
            ready: true,
            serving: true,
            terminating: false,
            node_name: node.map(Arc::from),
            zone: None,
            zone_hints: Names::default(),
            node_hints: Names::default(),
        }
    }

    /// Runs on the named node.
    pub fn is_local(&self, node_name: &str) -> bool {
        self.node_name.as_deref() == Some(node_name)
    }

    /// `ip:port`, with brackets for IPv6.
    pub fn address(&self) -> String {
        std::net::SocketAddr::new(self.ip, self.port).to_string()
    }
}

/// Each port of a service that serves `family`, as that family sees it, with its endpoints of
/// that family: what both modes render a service from.
pub fn ports_in_family<'a>(
    ports: &'a ServicePortMap,
    endpoints: Option<&'a EndpointsMap>,
    family: IpFamily,
) -> impl Iterator<Item = (Cow<'a, ServicePort>, Cow<'a, [Endpoint]>)> + 'a {
    ports.values().filter_map(move |port| {
        let port = port.for_family(family)?;
        let all: &[Endpoint] = endpoints
            .and_then(|map| map.get(&port.name))
            .map(Vec::as_slice)
            .unwrap_or_default();
        // Borrowed when every endpoint is of the family (single-stack): rendering 10,000
        // services on two threads copied each endpoint, and the two threads fought over the
        // reference counts of the node names the copies share.
        let of_family = |ep: &Endpoint| IpFamily::of(&ep.ip) == family;
        let endpoints = if all.iter().all(of_family) {
            Cow::Borrowed(all)
        } else {
            Cow::Owned(all.iter().filter(|ep| of_family(ep)).cloned().collect())
        };
        Some((port, endpoints))
    })
}

/// One port that an EndpointSlice lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlicePort {
    pub name: String,
    pub port: u16,
    pub protocol: Protocol,
}

/// An endpoint as one EndpointSlice lists it (no port yet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceEndpoint {
    pub ip: IpAddr,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// Shared among the endpoints on one node (a node's name is stored once).
    pub node_name: Option<Arc<str>>,
    pub zone: Option<Arc<str>>,
    pub zone_hints: Names,
    pub node_hints: Names,
}

/// One EndpointSlice, typed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointSlice {
    /// The slice's own namespace and name.
    pub name: NamespacedName,
    /// The service it belongs to (label `kubernetes.io/service-name`).
    pub service: NamespacedName,
    pub family: IpFamily,
    pub ports: Vec<SlicePort>,
    pub endpoints: Vec<SliceEndpoint>,
    /// When the change this slice carries was triggered (annotation
    /// `endpoints.kubernetes.io/last-change-trigger-time`), for network programming latency.
    pub trigger_time: Option<std::time::SystemTime>,
}

/// This node, as its Node object describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// InternalIP and ExternalIP addresses, InternalIP first.
    pub addresses: Vec<IpAddr>,
    pub pod_cidrs: Vec<IpNet>,
}

/// The Node label that names its zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

impl NodeInfo {
    /// The IP families the node has addresses in, IPv4 first; IPv4 alone when it has none.
    pub fn families(&self) -> Vec<IpFamily> {
        let mut families: Vec<IpFamily> = self.addresses.iter().map(IpFamily::of).collect();
        families.sort();
        families.dedup();
        if families.is_empty() {
            families.push(IpFamily::V4);
        }
        families
    }

    /// The node's zone, from its `topology.kubernetes.io/zone` label.
    pub fn zone(&self) -> Option<&str> {
        self.labels
            .get(ZONE_LABEL)
            .map(String::as_str)
            .filter(|z| !z.is_empty())
    }
}

/// A service's ports, by name.
pub type ServicePortMap = super::vec_map::VecMap<ServicePortName, ServicePort>;

/// A service's endpoints, by service port.
pub type EndpointsMap = super::vec_map::VecMap<ServicePortName, Vec<Endpoint>>;
