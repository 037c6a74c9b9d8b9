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

/// Picks the endpoints `service` uses on this node, from all of its endpoints.
pub fn select_endpoints<'a>(
    service: &ServicePort,
    endpoints: &'a [Endpoint],
    node: NodeContext<'_>,
) -> SelectedEndpoints<'a> {
    let mut selected = SelectedEndpoints::default();
    let serving_terminating = |ep: &&Endpoint| ep.serving && ep.terminating;

    let mut use_topology = false;
    if service.uses_cluster_endpoints() {
        use_topology = can_use_topology(endpoints, node.zone);
        selected.cluster = endpoints
            .iter()
            .filter(|ep| {
                ep.ready && (!use_topology || node.zone.is_some_and(|z| ep.zone_hints.contains(z)))
            })
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
    } else if !use_topology && !local_fallback {
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

/// Topology hints apply only when every ready endpoint carries zone hints and at least one of them
/// names this node's zone; otherwise hints are ignored and every endpoint is used.
fn can_use_topology(endpoints: &[Endpoint], zone: Option<&str>) -> bool {
    let Some(zone) = zone else { return false };
    let mut has_endpoint_for_zone = false;
    for ep in endpoints.iter().filter(|ep| ep.ready) {
        if ep.zone_hints.is_empty() {
            return false;
        }
        has_endpoint_for_zone |= ep.zone_hints.contains(zone);
    }
    has_endpoint_for_zone
}

#[cfg(test)]
mod tests;
