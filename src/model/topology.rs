//! Which endpoints a service uses on this node: the one function every proxier calls
//! (upstream's CategorizeEndpoints in pkg/proxy/topology.go).

use super::types::{Endpoint, ServicePort};

/// Where this node stands, for endpoint selection.
#[derive(Clone, Copy, Debug)]
pub struct NodeContext<'a> {
    pub node_name: &'a str,
    /// The node's `topology.kubernetes.io/zone`, when it has one.
    pub zone: Option<&'a str>,
}

/// The endpoints a service uses, by kind of traffic.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SelectedEndpoints<'a> {
    /// For traffic whose policy is Cluster: ready endpoints (narrowed by topology hints when they
    /// apply), else the serving-and-terminating ones.
    pub cluster: Vec<&'a Endpoint>,
    /// For traffic whose policy is Local: this node's ready endpoints, else its serving-and-terminating ones.
    pub local: Vec<&'a Endpoint>,
    /// The union of the two: every endpoint some traffic may reach (each needs its own rules).
    pub all_reachable: Vec<&'a Endpoint>,
    /// True if the service has a usable endpoint anywhere in the cluster: with none, traffic is
    /// rejected; with some but none usable here, Local traffic is dropped.
    pub has_any_endpoints: bool,
}

/// Which topology hints narrow the endpoints of Cluster-policy traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TopologyMode {
    /// No hints apply: every ready endpoint.
    None,
    /// `hints.forNodes` (trafficDistribution PreferSameNode): the endpoints hinted for this node.
    SameNode,
    /// `hints.forZones` (PreferSameZone, PreferClose, topology-mode Auto): those for its zone.
    SameZone,
}

/// Picks the endpoints `service` uses on this node, from all of its endpoints (upstream 1.35's
/// CategorizeEndpoints). Only the hints the EndpointSlice controller wrote count, never the
/// Service's trafficDistribution itself, as upstream.
pub fn select_endpoints<'a>(
    service: &ServicePort,
    endpoints: &'a [Endpoint],
    node: NodeContext<'_>,
) -> SelectedEndpoints<'a> {
    let mut selected = SelectedEndpoints::default();
    let serving_terminating = |ep: &&Endpoint| ep.serving && ep.terminating;

    let mut mode = TopologyMode::None;
    if service.uses_cluster_endpoints() {
        mode = topology_mode(endpoints, node);
        selected.cluster = endpoints
            .iter()
            .filter(|ep| ep.ready && available(ep, mode, node))
            .collect();
        if selected.cluster.is_empty() {
            selected.cluster = endpoints.iter().filter(serving_terminating).collect();
        }
        selected.has_any_endpoints = !selected.cluster.is_empty();
    }
    if !service.uses_local_endpoints() {
        selected.all_reachable = selected.cluster.clone();
        return selected;
    }

    let local = |ep: &&Endpoint| ep.is_local(node.node_name);
    selected.has_any_endpoints |= endpoints
        .iter()
        .any(|ep| ep.ready || (ep.serving && ep.terminating));
    let local_ready: Vec<&Endpoint> = endpoints
        .iter()
        .filter(local)
        .filter(|ep| ep.ready)
        .collect();
    let local_fallback = local_ready.is_empty();
    selected.local = if local_fallback {
        endpoints
            .iter()
            .filter(local)
            .filter(serving_terminating)
            .collect()
    } else {
        local_ready
    };

    if !service.uses_cluster_endpoints() {
        selected.all_reachable = selected.local.clone();
    } else if mode == TopologyMode::None && !local_fallback {
        // Both sets were drawn from the ready endpoints, so the local ones are inside the cluster ones.
        selected.all_reachable = selected.cluster.clone();
    } else {
        let mut union = selected.cluster.clone();
        for ep in &selected.local {
            if !union.iter().any(|c| std::ptr::eq(*c, *ep)) {
                union.push(ep);
            }
        }
        union.sort();
        selected.all_reachable = union;
    }
    selected
}

/// Node hints apply when every ready endpoint carries some and one names this node; else zone
/// hints, when every ready endpoint carries some and one names this node's zone; else none.
/// Endpoints that are not ready are not looked at.
fn topology_mode(endpoints: &[Endpoint], node: NodeContext<'_>) -> TopologyMode {
    let ready: Vec<&Endpoint> = endpoints.iter().filter(|ep| ep.ready).collect();
    if ready.is_empty() {
        return TopologyMode::None;
    }
    if ready.iter().all(|ep| !ep.node_hints.is_empty())
        && ready
            .iter()
            .any(|ep| ep.node_hints.contains(node.node_name))
    {
        return TopologyMode::SameNode;
    }
    let zone = node.zone.unwrap_or_default();
    if !zone.is_empty()
        && ready.iter().all(|ep| !ep.zone_hints.is_empty())
        && ready.iter().any(|ep| ep.zone_hints.contains(zone))
    {
        return TopologyMode::SameZone;
    }
    TopologyMode::None
}

fn available(ep: &Endpoint, mode: TopologyMode, node: NodeContext<'_>) -> bool {
    match mode {
        TopologyMode::None => true,
        TopologyMode::SameNode => ep.node_hints.contains(node.node_name),
        TopologyMode::SameZone => node.zone.is_some_and(|zone| ep.zone_hints.contains(zone)),
    }
}

#[cfg(test)]
mod tests;
