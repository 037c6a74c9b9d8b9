//! A partial sync of one family: the changed services rendered again (and a service whose
//! chain a changed one evicts from its endpoint-map slot), and one transaction of what differs.

use super::apply::{transaction_failure, with_digests, with_endpoint_maps};
use super::full::service_objects;
use super::*;
use crate::proxier::nftables::slots::{SlotKey, map_id, map_named};

impl<N: Nftables> NftablesMode<N> {
    /// Programs the changed services of `family` (see [`Mode::partial_sync`]).
    pub(super) fn program_changed(
        &mut self,
        family: IpFamily,
        state: &ProxyState,
        changes: &ChangeSummary,
    ) -> Result<Stats, Failure> {
        let Some(current) = self.programmed.get(&family) else {
            return Err(Failure::unattributed(SyncError::NotSynced));
        };
        let Changed {
            rendered,
            changing_keys,
            slots,
        } = render_changed(current, state, changes);
        let deltas: Vec<Delta<'_>> = rendered
            .iter()
            .map(|(key, new)| Delta {
                old: current.services.get(key),
                new: new.as_ref(),
            })
            .collect();
        // Elements the services this sync leaves alone hold: counted, and where a count says
        // "held", confirmed among them.
        let changing: Vec<&Objects> = changing_keys
            .iter()
            .filter_map(|key| current.services.get(*key))
            .collect();
        let held_elsewhere = |set: &str, key: &str| {
            current.holders.held_elsewhere(set, key, &changing, || {
                current
                    .services
                    .iter()
                    .filter(|(service, _)| !changing_keys.contains(service))
                    .any(|(_, objects)| {
                        objects
                            .elements
                            .get(set)
                            .is_some_and(|elements| elements.contains_key(key))
                    })
            })
        };
        let Some((mut text, mut stats, removed)) =
            plan::partial(family_keyword(family), &deltas, &held_elsewhere)
        else {
            return Ok(Stats::default());
        };
        let (starting, ending) = endpoint_map_changes(current, &rendered);
        with_endpoint_maps(
            family,
            &mut text,
            &mut stats,
            &current.base,
            (&starting, &ending),
        );
        let digests = digests_after(current, &rendered);
        with_digests(family, &mut text, &mut stats, &current.digests, &digests);
        let involved: BTreeMap<NamespacedName, Objects> = rendered
            .iter()
            .filter_map(|(key, new)| {
                let objects = new.as_ref().or_else(|| current.services.get(key))?;
                Some((key.clone(), objects.clone()))
            })
            .collect();
        self.apply(family, &text)
            .map_err(|err| transaction_failure(err, &text, &involved))?;
        self.remember_stale(family, removed.chains);
        self.remember_changed(family, rendered, slots, digests);
        Ok(stats)
    }

    /// Memory after a partial sync's transaction was taken.
    fn remember_changed(
        &mut self,
        family: IpFamily,
        rendered: Vec<(NamespacedName, Option<Objects>)>,
        slots: SlotTable,
        digests: Digests,
    ) {
        let Some(current) = self.programmed.get_mut(&family) else {
            return;
        };
        current.digests = digests;
        current.slots = slots;
        for (key, objects) in rendered {
            if let Some(old) = current.services.get(&key) {
                current.holders.remove(old);
                current.slots.release(&old.slots);
            }
            if let Some(new) = &objects {
                current.holders.add(new);
                current.slots.add(&new.slots);
            }
            match objects {
                Some(objects) => current.services.insert(key, objects),
                None => current.services.remove(&key),
            };
        }
    }
}

/// The services a partial sync renders again, and the slot table they were granted in.
struct Changed<'a> {
    /// Each service's new objects (`None`: gone).
    rendered: Vec<(NamespacedName, Option<Objects>)>,
    /// The changed services and those evicted from their slots.
    changing_keys: BTreeSet<&'a NamespacedName>,
    slots: SlotTable,
}

/// Renders the changed services again. Their chains keep their slots; a slot one of them frees
/// is taken by no one before the next sync (its elements go in this transaction). A service
/// whose chain a changed one evicts from its slot (a smaller hash wins) is rewritten with it,
/// in the same transaction, whose deletions come before its additions. The slots are granted
/// in a copy of the table, kept if the transaction is.
fn render_changed<'a>(
    current: &'a FamilyState,
    state: &ProxyState,
    changes: &'a ChangeSummary,
) -> Changed<'a> {
    let mut slots = current.slots.clone();
    let render = |key: &NamespacedName, slots: &mut SlotTable| {
        state
            .services
            .get(key)
            .map(|ports| service_objects(ports, state.endpoints.get(key), &current.ctx, slots))
            .filter(|objects| !objects.is_empty())
    };
    let mut rendered: Vec<(NamespacedName, Option<Objects>)> = changes
        .changed_services
        .iter()
        .map(|key| (key.clone(), render(key, &mut slots)))
        .collect();
    let mut changing_keys: BTreeSet<&NamespacedName> = changes.changed_services.iter().collect();
    // The evicted: programmed services, and changed ones rendered before their evictor.
    let evicted: BTreeSet<&NamespacedName> = slots
        .take_evicted(current.services.keys().chain(&changes.changed_services))
        .into_iter()
        .collect();
    for key in evicted {
        let objects = render(key, &mut slots);
        match rendered.iter_mut().find(|(rendered, _)| rendered == key) {
            Some(entry) => entry.1 = objects,
            None => {
                changing_keys.insert(key);
                rendered.push((key.clone(), objects));
            }
        }
    }
    // Rendered again, they evict no one (their other chains hold their slots already).
    slots.take_evicted([]);
    Changed {
        rendered,
        changing_keys,
        slots,
    }
}

/// The endpoint maps the rendered services start to draw from (no slot held in them yet) and
/// those no chain will draw from once they replace their old objects: counted for the maps
/// their claims touch alone.
fn endpoint_map_changes(
    current: &FamilyState,
    rendered: &[(NamespacedName, Option<Objects>)],
) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut change: BTreeMap<u32, (SlotKey, isize)> = BTreeMap::new();
    for (key, new) in rendered {
        let old = current.services.get(key).into_iter().flat_map(|o| &o.slots);
        for claim in old.filter(|claim| current.slots.holds(claim)) {
            change.entry(map_id(claim.0)).or_insert((claim.0, 0)).1 -= 1;
        }
        for claim in new.iter().flat_map(|o| &o.slots) {
            change.entry(map_id(claim.0)).or_insert((claim.0, 0)).1 += 1;
        }
    }
    let (mut starting, mut ending) = (BTreeSet::new(), BTreeSet::new());
    for (id, (key, change)) in change {
        let before = current.slots.held_in_map_of(key) as isize;
        match (before, before + change) {
            (0, after) if after > 0 => starting.insert(map_named(id)),
            (before, 0) if before > 0 => ending.insert(map_named(id)),
            _ => false,
        };
    }
    (starting, ending)
}

/// The table's digests once the rendered services replace their old objects.
fn digests_after(current: &FamilyState, rendered: &[(NamespacedName, Option<Objects>)]) -> Digests {
    let mut digests = current.digests.clone();
    for (key, new) in rendered {
        if let Some(old) = current.services.get(key) {
            digests.remove(old);
        }
        if let Some(new) = new {
            digests.add(new);
        }
    }
    digests
}
