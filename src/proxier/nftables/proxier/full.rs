//! A full sync of one family: every service rendered (on both cores, endpoint-map slots settled
//! between them), what the table holds found (from memory, or read back while the services
//! render), then the transactions that bring the table there. With memory exact and the
//! kernel's change events watched, a full sync writes only what differs from memory.

use super::adopt::{ReadBack, read_table};
use super::apply::{transaction_failure, with_digests, with_endpoint_maps};
use super::*;
use crate::proxier::nftables::plan::Removed;

impl<N: Nftables> NftablesMode<N> {
    /// Programs every service of `family` (see [`Mode::full_sync`]).
    pub(super) fn program_all(
        &mut self,
        family: IpFamily,
        ctx: NftContext,
        state: &ProxyState,
        quarantine: &Quarantine,
    ) -> Result<Stats, Failure> {
        let mut base = render_base(&ctx);
        stamp_digests(&mut base);
        // What the table holds is known from memory when memory is exact; else (at start, an
        // earlier run's objects, and after a failure) it is read: names and digests, and,
        // unless this is a restart that trusts the digests, the top-level sets' elements,
        // while the services render on the other core.
        let from_memory = self.programmed.contains_key(&family) && self.known.contains(&family);
        self.last_full_sync_from_memory = false;
        let trust = !self.programmed.contains_key(&family) && !self.recreate;
        let job = RenderJob {
            family,
            ctx: &ctx,
            base: &base,
            state,
            quarantine,
            read: (!from_memory).then_some(trust),
        };
        let previous = self.programmed.get(&family);
        let Rendered {
            mut services,
            mut digests,
            mut slots,
            read,
        } = render_all(&mut self.nft, previous, job)?;
        // A chain that lost its slot to a chain of a later service does without it.
        rerender_evicted(&mut slots, &mut services, state, &ctx, &mut digests);
        digests.add_base(&base);
        // Memory is exact and the kernel reports every change other programs make: a full
        // sync (the hourly one, a Node change) writes only what differs from what is
        // programmed, as a partial sync over every service and the base.
        if self.events.is_some() && from_memory && !self.recreate {
            self.last_full_sync_from_memory = true;
            return self.diff_sync(family, ctx, base, services, digests);
        }
        let (built, index) = self.plan_full(family, &base, &services, &digests, read, trust);
        let ((transactions, stats, removed), recreate, on_trust) = built?;
        let (holders, slots) = index?;
        for text in &transactions {
            if let Err(err) = self.apply(family, text) {
                let failure = transaction_failure(err, text, &services);
                if failure.culprit.is_none() {
                    self.recreate = true;
                }
                return Err(failure);
            }
        }
        if recreate {
            self.stale_chains.remove(&family);
        }
        self.remember_stale(family, removed.chains);
        let programmed = FamilyState {
            ctx,
            base,
            holders,
            slots,
            services,
            digests,
        };
        self.programmed.insert(family, programmed);
        self.settle_trust(family, on_trust);
        Ok(stats)
    }

    /// The full sync's transactions, from what the table holds (`read`, or memory), built
    /// while what memory keeps of the services is indexed on the other core.
    fn plan_full(
        &mut self,
        family: IpFamily,
        base: &Objects,
        services: &BTreeMap<NamespacedName, Objects>,
        digests: &Digests,
        read: Option<Result<ReadBack, Failure>>,
        trust: bool,
    ) -> (Result<Planned, Failure>, Result<Index, Failure>) {
        let index = || {
            (
                ElementHolders::of(services.values()),
                SlotTable::of(services.values().map(|o| o.slots.as_slice())),
            )
        };
        std::thread::scope(|scope| {
            let indexer = std::thread::Builder::new()
                .name("nftables-index".into())
                .spawn_scoped(scope, index)
                .ok();
            let built = self
                .found(family, base, services, digests, read, trust)
                .map(|(existing, held_digests, on_trust)| {
                    let recreate = std::mem::take(&mut self.recreate);
                    let write_digests = recreate || held_digests.as_ref() != Some(digests);
                    let built = plan::full(
                        family_keyword(family),
                        base,
                        services,
                        &existing,
                        recreate,
                        write_digests.then_some(digests),
                    );
                    (built, recreate, on_trust)
                });
            let index = match indexer {
                Some(indexer) => indexer.join().map_err(|_| {
                    Failure::unattributed(SyncError::Thread("the indexer of our services panicked"))
                }),
                None => Ok(index()),
            };
            (built, index)
        })
    }

    /// After a full sync that took what the table's digests vouch for: another program may
    /// have changed the table while no daemon watched it, so it is read back in a moment.
    fn settle_trust(&mut self, family: IpFamily, on_trust: bool) {
        if on_trust {
            info!(
                ?family,
                "Took what our table's digests vouch for as right; reading the table back in a moment"
            );
            self.unverified
                .insert(family, Instant::now() + self.verify_delay);
            self.wake_after(self.verify_delay, "The table will be read back");
        } else {
            self.unverified.remove(&family);
            self.known.insert(family);
        }
    }

    /// Brings the table from what memory says it holds to `base` and `services` (whose
    /// `digests` the full sync summed), writing only the differences.
    pub(super) fn diff_sync(
        &mut self,
        family: IpFamily,
        ctx: NftContext,
        base: Objects,
        services: BTreeMap<NamespacedName, Objects>,
        digests: Digests,
    ) -> Result<Stats, Failure> {
        let Some(current) = self.programmed.get(&family) else {
            return Err(Failure::unattributed(SyncError::NotSynced));
        };
        let keys: BTreeSet<&NamespacedName> =
            current.services.keys().chain(services.keys()).collect();
        let deltas: Vec<Delta<'_>> = std::iter::once(Delta {
            old: Some(&current.base),
            new: Some(&base),
        })
        .chain(keys.into_iter().map(|key| Delta {
            old: current.services.get(key),
            new: services.get(key),
        }))
        .collect();
        let mut stats = Stats::default();
        // Every service is among the deltas: none elsewhere keeps an element.
        let slots = SlotTable::of(services.values().map(|o| o.slots.as_slice()));
        if let Some((mut text, mut written, removed)) =
            plan::partial(family_keyword(family), &deltas, &|_, _| false)
        {
            let (before, after) = (current.slots.maps_in_use(), slots.maps_in_use());
            let starting = after.difference(&before).cloned().collect();
            let ending = before.difference(&after).cloned().collect();
            with_endpoint_maps(
                family,
                &mut text,
                &mut written,
                &current.base,
                (&starting, &ending),
            );
            with_digests(family, &mut text, &mut written, &current.digests, &digests);
            self.apply(family, &text)
                .map_err(|err| transaction_failure(err, &text, &services))?;
            self.remember_stale(family, removed.chains);
            stats = written;
        }
        self.programmed.insert(
            family,
            FamilyState {
                ctx,
                base,
                holders: ElementHolders::of(services.values()),
                slots,
                services,
                digests,
            },
        );
        Ok(stats)
    }
}

/// The transactions of a full sync and their counts, whether the table is made again, and
/// whether the digests were taken on trust.
type Planned = ((Vec<String>, Stats, Removed), bool, bool);
/// What memory keeps of the services besides their objects.
type Index = (ElementHolders, SlotTable);

/// What a full sync renders, and whether it reads the table meanwhile (`Some(trust)`).
struct RenderJob<'a> {
    family: IpFamily,
    ctx: &'a NftContext,
    base: &'a Objects,
    state: &'a ProxyState,
    quarantine: &'a Quarantine,
    read: Option<bool>,
}

/// Every service rendered, the slots they took, their digests, and the table read back.
struct Rendered {
    services: BTreeMap<NamespacedName, Objects>,
    digests: Digests,
    slots: SlotTable,
    read: Option<Result<ReadBack, Failure>>,
}

/// Renders every service of `job`, half of them on another thread with a copy of the slot
/// table whose grants are then settled with this one's (see `SlotTable::merge`; here, after
/// the first half, if no thread can be had), while a third thread reads the table when asked.
/// A quarantined service keeps what the kernel last accepted for it (in `previous`). The
/// services' digests are summed as they render, on each thread, while their objects are fresh.
fn render_all<N: Nftables>(
    nft: &mut N,
    previous: Option<&FamilyState>,
    job: RenderJob<'_>,
) -> Result<Rendered, Failure> {
    let RenderJob {
        family,
        ctx,
        base,
        state,
        quarantine,
        read,
    } = job;
    // The slots programmed, for the render to find taken ones (see `slots`).
    let mut slots = previous.map(|p| p.slots.clone()).unwrap_or_default();
    let render = |part: &[(&NamespacedName, &ServicePortMap)], slots: &mut SlotTable| {
        let mut digests = Digests::default();
        let rendered = part
            .iter()
            .filter_map(|(key, ports)| {
                let objects = if quarantine.contains(key) {
                    previous?.services.get(*key)?.clone()
                } else {
                    service_objects(ports, state.endpoints.get(*key), ctx, slots)
                };
                digests.add(&objects);
                (!objects.is_empty()).then(|| ((*key).clone(), objects))
            })
            .collect::<Vec<_>>();
        (rendered, digests)
    };
    let render = &render;
    let all: Vec<(&NamespacedName, &ServicePortMap)> = state.services.iter().collect();
    std::thread::scope(|scope| {
        let reader = match read {
            None => None,
            Some(trust) => Some(
                std::thread::Builder::new()
                    .name("nftables-read".into())
                    .spawn_scoped(scope, move || read_table(nft, family, base, trust))
                    .map_err(|err| Failure::unattributed(SyncError::Spawn(err)))?,
            ),
        };
        let (mine, theirs) = all.split_at(all.len() / 2);
        let mut their_slots = slots.clone();
        let helper = std::thread::Builder::new()
            .name("nftables-render".into())
            .spawn_scoped(scope, move || {
                (render(theirs, &mut their_slots), their_slots)
            })
            .ok();
        let (rendered, mut digests) = render(mine, &mut slots);
        let mut services: BTreeMap<NamespacedName, Objects> = rendered.into_iter().collect();
        let (rendered, their_digests) = match helper {
            Some(helper) => {
                let ((rendered, their_digests), their_slots) = helper.join().map_err(|_| {
                    Failure::unattributed(SyncError::Thread("a renderer of services panicked"))
                })?;
                slots.merge(
                    their_slots,
                    rendered.iter().map(|(_, o)| o.slots.as_slice()),
                );
                (rendered, their_digests)
            }
            None => render(theirs, &mut slots),
        };
        services.extend(rendered);
        digests.merge(their_digests);
        let read = reader.map(|reader| {
            reader.join().unwrap_or_else(|_| {
                Err(Failure::unattributed(SyncError::Thread(
                    "the reader of our table panicked",
                )))
            })
        });
        Ok(Rendered {
            services,
            digests,
            slots,
            read,
        })
    })
}

/// Renders again the services of `services` whose chains lost their slots while the others
/// rendered (they then do without; an eviction never leads to another).
pub(super) fn rerender_evicted(
    slots: &mut SlotTable,
    services: &mut BTreeMap<NamespacedName, Objects>,
    state: &ProxyState,
    ctx: &NftContext,
    digests: &mut Digests,
) {
    let evicted: Vec<NamespacedName> = slots
        .take_evicted(services.keys())
        .into_iter()
        .cloned()
        .collect();
    for key in evicted {
        if let (Some(ports), Some(objects)) = (state.services.get(&key), services.get_mut(&key)) {
            digests.remove(objects);
            *objects = service_objects(ports, state.endpoints.get(&key), ctx, slots);
            digests.add(objects);
        }
    }
    // Rendered again, they evict no one (their other chains hold their slots already).
    slots.take_evicted([]);
}

/// One service's objects as this proxier writes them: rendered, each chain stamped with its
/// digest.
pub(super) fn service_objects(
    ports: &crate::model::ServicePortMap,
    endpoints: Option<&crate::model::EndpointsMap>,
    ctx: &NftContext,
    slots: &mut SlotTable,
) -> Objects {
    let mut objects = render_service(ports, endpoints, ctx, slots);
    stamp_digests(&mut objects);
    objects.shrink_to_fit();
    objects
}
