//! Change tracking: the watch side records what it sees as (previous, current) pairs per service,
//! dropping changes that cancel out; the sync side takes them and applies them to its own copy of
//! the state, learning which services changed. A sync costs O(changed services), not O(cluster).

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;

use super::endpoints::merge_slices;
use super::types::{EndpointSlice, EndpointsMap, NamespacedName, NodeInfo, ServicePortMap};

/// A pending change to one object: what the sync side last saw, and what it is now.
#[derive(Clone, Debug, PartialEq)]
pub struct Change<V> {
    pub previous: Option<V>,
    pub current: Option<V>,
}

/// Pending (previous, current) pairs by service; a pair whose two sides are equal is dropped.
#[derive(Clone, Debug)]
pub struct PendingChanges<V> {
    items: BTreeMap<NamespacedName, Change<V>>,
}

impl<V> Default for PendingChanges<V> {
    fn default() -> Self {
        PendingChanges {
            items: BTreeMap::new(),
        }
    }
}

impl<V: PartialEq + Clone> PendingChanges<V> {
    /// Records that `key` went from `previous` to `current`; keeps the oldest `previous` when the key
    /// already had a pending change. Returns whether anything is pending for `key` afterwards.
    pub fn record(
        &mut self,
        key: &NamespacedName,
        previous: Option<V>,
        current: Option<V>,
    ) -> bool {
        let change = self.items.entry(key.clone()).or_insert(Change {
            previous,
            current: None,
        });
        change.current = current;
        if change.previous == change.current {
            self.items.remove(key);
            return false;
        }
        true
    }

    /// The pending change of `key`, if it has one.
    pub fn get(&self, key: &NamespacedName) -> Option<&Change<V>> {
        self.items.get(key)
    }

    /// Takes every pending change.
    pub fn take(&mut self) -> BTreeMap<NamespacedName, Change<V>> {
        std::mem::take(&mut self.items)
    }

    /// How many services have a pending change.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// Everything a sync needs to apply: the pending changes of services, endpoints and the node.
#[derive(Clone, Debug, Default)]
pub struct Changes {
    pub services: BTreeMap<NamespacedName, Change<ServicePortMap>>,
    pub endpoints: BTreeMap<NamespacedName, Change<EndpointsMap>>,
    pub node: Option<Option<NodeInfo>>,
    /// Every ServiceCIDR's ranges, merged, when they changed.
    pub service_cidrs: Option<Vec<IpNet>>,
    /// When the pending endpoint changes were triggered (earliest per service).
    pub trigger_times: Vec<std::time::SystemTime>,
}

/// The watch side: the converted objects seen so far and the changes not yet synced.
#[derive(Debug, Default)]
pub struct ChangeTracker {
    services: BTreeMap<NamespacedName, ServicePortMap>,
    /// Slices by the service they belong to, then by slice name.
    slices: BTreeMap<NamespacedName, super::vec_map::VecMap<String, EndpointSlice>>,
    /// For each slice (its own namespace/name), the service it was filed under.
    slice_owner: BTreeMap<NamespacedName, NamespacedName>,
    node: Option<NodeInfo>,
    /// The ranges of each ServiceCIDR object.
    service_cidrs: BTreeMap<NamespacedName, Vec<IpNet>>,
    pending_service_cidrs: bool,
    pending_services: PendingChanges<ServicePortMap>,
    pending_endpoints: PendingChanges<EndpointsMap>,
    pending_node: Option<Option<NodeInfo>>,
    pending_triggers: BTreeMap<NamespacedName, std::time::SystemTime>,
    /// Services' externalIPs are dropped as they come (the AllowServiceExternalIPs gate off).
    without_external_ips: bool,
}

impl ChangeTracker {
    /// A tracker that keeps Services' `external_ips`, or drops every Service's externalIPs, as
    /// upstream does with the AllowServiceExternalIPs feature gate off: no mode then programs
    /// them.
    pub fn new(external_ips: bool) -> Self {
        ChangeTracker {
            without_external_ips: !external_ips,
            ..ChangeTracker::default()
        }
    }

    /// A Service was added, changed (`Some`) or deleted (`None`). Returns whether a change is pending.
    pub fn service_updated(&mut self, key: &NamespacedName, ports: Option<ServicePortMap>) -> bool {
        let mut ports = ports;
        if self.without_external_ips
            && let Some(ports) = ports.as_mut()
        {
            for port in ports.values_mut() {
                port.external_ips.clear();
                // The policy was read for an externally reachable port; it may be one no more.
                port.external_policy_local &= port.externally_accessible();
            }
        }
        let previous = match &ports {
            Some(ports) => self.services.insert(key.clone(), ports.clone()),
            None => self.services.remove(key),
        };
        self.pending_services.record(key, previous, ports)
    }

    /// An EndpointSlice was added, changed (`Some`) or deleted (`None`), named by its own
    /// namespace/name. Returns whether a change is pending.
    pub fn slice_updated(
        &mut self,
        slice_key: &NamespacedName,
        slice: Option<EndpointSlice>,
    ) -> bool {
        let new_owner = slice.as_ref().map(|s| s.service.clone());
        let trigger = slice.as_ref().and_then(|s| s.trigger_time);
        let old_owner = self.slice_owner.get(slice_key).cloned();
        let affected: BTreeSet<NamespacedName> =
            old_owner.iter().chain(new_owner.iter()).cloned().collect();
        let before: BTreeMap<NamespacedName, EndpointsMap> = affected
            .iter()
            .map(|svc| (svc.clone(), self.merged(svc)))
            .collect();

        if let Some(owner) = &old_owner
            && let Some(of_service) = self.slices.get_mut(owner)
        {
            of_service.remove(&slice_key.name);
            if of_service.is_empty() {
                self.slices.remove(owner);
            }
        }
        self.slice_owner.remove(slice_key);
        if let Some(slice) = slice {
            self.slice_owner
                .insert(slice_key.clone(), slice.service.clone());
            let of_service = self.slices.entry(slice.service.clone()).or_default();
            of_service.insert(slice_key.name.clone(), slice);
            of_service.shrink_to_fit();
        }

        let mut pending = false;
        for (svc, previous) in before {
            let current = self.merged(&svc);
            let changed =
                self.pending_endpoints
                    .record(&svc, non_empty(previous), non_empty(current));
            if let (true, Some(trigger)) = (changed, trigger) {
                let earliest = self.pending_triggers.entry(svc).or_insert(trigger);
                *earliest = (*earliest).min(trigger);
            }
            pending |= changed;
        }
        pending
    }

    /// This node's Node object appeared, changed or went away.
    pub fn node_updated(&mut self, node: Option<NodeInfo>) -> bool {
        if self.node == node {
            return self.pending_node.is_some();
        }
        self.node = node.clone();
        self.pending_node = Some(node);
        true
    }

    /// A ServiceCIDR was added, changed (`Some`) or deleted (`None`).
    pub fn service_cidr_updated(
        &mut self,
        key: &NamespacedName,
        cidrs: Option<Vec<IpNet>>,
    ) -> bool {
        let changed = match cidrs {
            Some(cidrs) => self.service_cidrs.insert(key.clone(), cidrs.clone()) != Some(cidrs),
            None => self.service_cidrs.remove(key).is_some(),
        };
        self.pending_service_cidrs |= changed;
        self.pending_service_cidrs
    }

    /// Replaces every ServiceCIDR with a complete listing.
    pub fn replace_service_cidrs(
        &mut self,
        listing: BTreeMap<NamespacedName, Vec<IpNet>>,
        keep: &BTreeSet<NamespacedName>,
    ) -> bool {
        for key in stale_keys(self.service_cidrs.keys(), &listing, keep) {
            self.service_cidr_updated(&key, None);
        }
        for (key, cidrs) in listing {
            self.service_cidr_updated(&key, Some(cidrs));
        }
        self.pending_service_cidrs
    }

    /// Replaces every Service with a complete listing (after a relist), as updates and deletes.
    /// Services named in `keep` were listed but could not be read: they keep their last state.
    pub fn replace_services(
        &mut self,
        listing: BTreeMap<NamespacedName, ServicePortMap>,
        keep: &BTreeSet<NamespacedName>,
    ) -> bool {
        let mut pending = false;
        for key in stale_keys(self.services.keys(), &listing, keep) {
            pending |= self.service_updated(&key, None);
        }
        for (key, ports) in listing {
            pending |= self.service_updated(&key, Some(ports));
        }
        pending
    }

    /// Replaces every EndpointSlice with a complete listing (after a relist), as updates and deletes.
    /// Slices named in `keep` were listed but could not be read: they keep their last state.
    pub fn replace_slices(
        &mut self,
        listing: BTreeMap<NamespacedName, EndpointSlice>,
        keep: &BTreeSet<NamespacedName>,
    ) -> bool {
        let mut pending = false;
        for key in stale_keys(self.slice_owner.keys(), &listing, keep) {
            pending |= self.slice_updated(&key, None);
        }
        for (key, slice) in listing {
            let unchanged = self
                .slice_owner
                .get(&key)
                .and_then(|owner| self.slices.get(owner))
                .and_then(|of_service| of_service.get(&key.name))
                == Some(&slice);
            if !unchanged {
                pending |= self.slice_updated(&key, Some(slice));
            }
        }
        pending
    }

    /// The changes of one Service waiting for a sync: its ports, and its endpoints.
    pub fn pending_for(
        &self,
        key: &NamespacedName,
    ) -> (
        Option<&Change<ServicePortMap>>,
        Option<&Change<EndpointsMap>>,
    ) {
        (
            self.pending_services.get(key),
            self.pending_endpoints.get(key),
        )
    }

    /// True when a sync has something to do.
    pub fn has_pending(&self) -> bool {
        !self.pending_services.is_empty()
            || !self.pending_endpoints.is_empty()
            || self.pending_node.is_some()
            || self.pending_service_cidrs
    }

    /// Takes every pending change, for one sync.
    pub fn take_changes(&mut self) -> Changes {
        Changes {
            services: self.pending_services.take(),
            endpoints: self.pending_endpoints.take(),
            node: self.pending_node.take(),
            service_cidrs: std::mem::take(&mut self.pending_service_cidrs).then(|| {
                let mut all: Vec<IpNet> = self.service_cidrs.values().flatten().copied().collect();
                all.sort();
                all.dedup();
                all
            }),
            trigger_times: std::mem::take(&mut self.pending_triggers)
                .into_values()
                .collect(),
        }
    }

    /// How many Services and EndpointSlices the watch side holds.
    pub fn counts(&self) -> (usize, usize) {
        (self.services.len(), self.slice_owner.len())
    }

    fn merged(&self, service: &NamespacedName) -> EndpointsMap {
        self.slices
            .get(service)
            .map(|s| merge_slices(s.values()))
            .unwrap_or_default()
    }
}

/// Keys held now that a complete listing no longer has (and that are not kept despite that).
fn stale_keys<'a, V>(
    held: impl Iterator<Item = &'a NamespacedName>,
    listing: &BTreeMap<NamespacedName, V>,
    keep: &BTreeSet<NamespacedName>,
) -> Vec<NamespacedName> {
    held.filter(|k| !listing.contains_key(*k) && !keep.contains(*k))
        .cloned()
        .collect()
}

fn non_empty(map: EndpointsMap) -> Option<EndpointsMap> {
    if map.is_empty() { None } else { Some(map) }
}

/// What one sync learned from applying changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangeSummary {
    /// Services whose ports or endpoints changed.
    pub changed_services: BTreeSet<NamespacedName>,
    /// How many service changes and endpoint changes were applied (for the metrics).
    pub service_changes: usize,
    pub endpoint_changes: usize,
    /// The Node changed (labels, addresses, pod CIDRs): every service may render differently.
    pub node_changed: bool,
    /// When the applied endpoint changes were triggered, for network programming latency.
    pub trigger_times: Vec<std::time::SystemTime>,
}

/// The sync side: the state the proxier programs, updated only by applying changes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProxyState {
    pub services: BTreeMap<NamespacedName, ServicePortMap>,
    pub endpoints: BTreeMap<NamespacedName, EndpointsMap>,
    pub node: NodeInfo,
    /// The cluster's ServiceCIDRs (nftables mode drops traffic to unallocated addresses in them).
    pub service_cidrs: Vec<IpNet>,
}

impl ProxyState {
    /// Applies the changes taken from a tracker.
    pub fn apply(&mut self, changes: Changes) -> ChangeSummary {
        let mut summary = ChangeSummary {
            service_changes: changes.services.len(),
            endpoint_changes: changes.endpoints.len(),
            trigger_times: changes.trigger_times,
            ..ChangeSummary::default()
        };
        for (key, change) in changes.services {
            set_or_remove(&mut self.services, &key, change.current);
            summary.changed_services.insert(key);
        }
        for (key, change) in changes.endpoints {
            set_or_remove(&mut self.endpoints, &key, change.current);
            summary.changed_services.insert(key);
        }
        if let Some(node) = changes.node {
            self.node = node.unwrap_or_default();
            summary.node_changed = true;
        }
        if let Some(cidrs) = changes.service_cidrs {
            self.service_cidrs = cidrs;
        }
        summary
    }
}

fn set_or_remove<V>(map: &mut BTreeMap<NamespacedName, V>, key: &NamespacedName, value: Option<V>) {
    match value {
        Some(value) => {
            map.insert(key.clone(), value);
        }
        None => {
            map.remove(key);
        }
    }
}

#[cfg(test)]
mod tests;
