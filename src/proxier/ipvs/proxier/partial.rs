//! A sync of a few services: those that changed rendered again, with the draining virtual
//! servers, and only their part of the kernel diffed.

use super::*;

impl<V: Ipvs, L: DummyLinks, S: Ipsets> IpvsMode<V, L, S> {
    /// The changed services of `family`, rendered again, with the draining virtual servers:
    /// what a sync of a few services diffs.
    pub(super) fn changed_part(
        &mut self,
        family: IpFamily,
        current: &KernelView,
        state: &ProxyState,
        changes: &ChangeSummary,
    ) -> Option<(DesiredIpvs, Scope)> {
        let (ctx, aggregate) = self.aggregates.get_mut(&family)?;
        let mut touched = Touched::default();
        for key in &changes.changed_services {
            touched.extend(aggregate.rerender(key, state, ctx));
        }
        touched.services.extend(
            current
                .observed
                .draining()
                .iter()
                .filter(|vs| IpFamily::of(&vs.address) == family)
                .map(|vs| vs.key()),
        );
        let part = aggregate.desired_part(ctx, &touched);
        let entries = touched
            .entries
            .iter()
            .map(|(base, entry)| (set_name(base, family), entry.clone()))
            .collect();
        Some((part, Scope { touched, entries }))
    }
}
