//! A partial sync of one family: the changed services rendered again, and one restore of what
//! differs from what they programmed before.

use super::apply::restore_failure;
use super::*;

impl<I: Iptables> IptablesMode<I> {
    /// Programs the changed services of `family` (see [`Mode::partial_sync`]).
    pub(super) fn program_changed(
        &mut self,
        family: IpFamily,
        state: &ProxyState,
        changes: &ChangeSummary,
    ) -> Result<RestoreStats, Failure> {
        let Some(current) = self.programmed.get(&family) else {
            return Err(Failure::unattributed(SyncError::NotSynced));
        };
        let rendered: Vec<(NamespacedName, Option<ServiceRules>)> = changes
            .changed_services
            .iter()
            .map(|key| {
                let rules = state
                    .services
                    .get(key)
                    .map(|ports| render_service(ports, state.endpoints.get(key), &current.ctx))
                    .filter(|rules| !rules.is_empty());
                (key.clone(), rules)
            })
            .collect();
        let deltas: Vec<ServiceDelta<'_>> = rendered
            .iter()
            .map(|(key, new)| ServiceDelta {
                old: current.services.get(key),
                new: new.as_ref(),
            })
            .collect();
        let Some((text, stats)) = partial_restore(&deltas) else {
            return Ok(RestoreStats::default());
        };
        let programmed: Vec<(NamespacedName, Option<ProgrammedService>)> = rendered
            .iter()
            .map(|(key, new)| (key.clone(), new.as_ref().map(ProgrammedService::of)))
            .collect();
        let involved: BTreeMap<NamespacedName, ProgrammedService> = programmed
            .iter()
            .filter_map(|(key, new)| {
                let rules = new.as_ref().or_else(|| current.services.get(key))?;
                Some((key.clone(), rules.clone()))
            })
            .collect();
        self.restore(family, &text)
            .map_err(|err| restore_failure(err, &text, &involved))?;
        if let Some(current) = self.programmed.get_mut(&family) {
            for (key, programmed) in programmed {
                match programmed {
                    Some(programmed) => current.services.insert(key, programmed),
                    None => current.services.remove(&key),
                };
            }
        }
        Ok(stats)
    }
}
