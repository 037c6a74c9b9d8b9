//! Taking one family to its desired state: virtual servers and addresses over netlink (one the
//! kernel refuses is skipped and counted, not the sync), then its ipsets in one `ipset restore`,
//! then its iptables rules and the jumps to them.

use std::borrow::Cow;

use super::*;

impl<V: Ipvs, L: DummyLinks, S: Ipsets> IpvsMode<V, L, S> {
    /// Our sets of `family`: the only sets its sync reads.
    pub(super) fn set_names(family: IpFamily) -> Vec<String> {
        SETS.iter()
            .map(|(base, _, _)| set_name(base, family))
            .collect()
    }

    /// Applies the operations one by one and returns those the kernel took. One the kernel
    /// refuses is skipped, not the sync: logged once for its virtual server (or address), and
    /// counted, until an operation on it succeeds.
    pub(super) fn apply(&mut self, link: u32, operations: &[Operation]) -> Vec<Operation> {
        let mut applied = Vec::with_capacity(operations.len());
        for op in operations {
            let result = match op {
                Operation::Bind(ip) => self.links.add_address(link, *ip).map_err(SyncError::from),
                Operation::Unbind(ip) => self
                    .links
                    .delete_address(link, *ip)
                    .map_err(SyncError::from),
                Operation::AddService(vs) => self.ipvs.add_service(vs).map_err(SyncError::from),
                Operation::UpdateService(vs) => {
                    self.ipvs.update_service(vs).map_err(SyncError::from)
                }
                Operation::DeleteService(vs) => {
                    self.ipvs.delete_service(vs).map_err(SyncError::from)
                }
                Operation::AddReal(vs, rs) => self
                    .ipvs
                    .change_destination(CMD_NEW_DEST, vs, rs)
                    .map_err(SyncError::from),
                Operation::UpdateReal(vs, rs) => self
                    .ipvs
                    .change_destination(CMD_SET_DEST, vs, rs)
                    .map_err(SyncError::from),
                Operation::DeleteReal(vs, rs) => self
                    .ipvs
                    .change_destination(CMD_DEL_DEST, vs, rs)
                    .map_err(SyncError::from),
            };
            let subject = match op {
                Operation::Bind(ip) | Operation::Unbind(ip) => ip.to_string(),
                Operation::AddService(vs)
                | Operation::UpdateService(vs)
                | Operation::DeleteService(vs)
                | Operation::AddReal(vs, _)
                | Operation::UpdateReal(vs, _)
                | Operation::DeleteReal(vs, _) => vs.key(),
            };
            match result {
                Ok(()) => {
                    debug!(operation = ?op, "IPVS");
                    self.refused.accepted(&subject);
                    applied.push(op.clone());
                }
                Err(err) => {
                    if self.refused.refused(subject.clone(), err.to_string()) {
                        warn!(subject = %subject, operation = ?op, error = %err, "The kernel refused an IPVS change; skipping it, the rest is programmed");
                    }
                }
            }
        }
        applied
    }

    /// `ipset restore` of `input`; a line the kernel refuses (named in ipset's error) is
    /// dropped, logged once and counted, and the rest restored again.
    pub(super) fn restore_sets(&mut self, input: &str) -> Result<(), SyncError> {
        let mut lines: Vec<&str> = input.lines().collect();
        for _ in 0..quarantine::MAX_PER_SYNC {
            let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
            let err = match self.ipset.restore(&text) {
                Ok(()) => return Ok(()),
                Err(err) => err,
            };
            let refused = err
                .to_string()
                .split("Error in line ")
                .nth(1)
                .and_then(|rest| rest.split(':').next())
                .and_then(|n| n.trim().parse::<usize>().ok())
                .filter(|n| (1..=lines.len()).contains(n));
            let Some(line) = refused else {
                return Err(err.into());
            };
            let entry = lines.remove(line - 1).to_string();
            if self.refused.refused(entry.clone(), err.to_string()) {
                warn!(entry = %entry, error = %err, "The kernel refused an ipset entry; skipping it, the rest is programmed");
            }
        }
        Err(SyncError::TooManyRefused)
    }

    pub(super) fn sync_iptables(&mut self, family: IpFamily, rules: &str) -> Result<(), SyncError> {
        self.iptables
            .restore(family, rules)
            .map_err(SyncError::from)?;
        // Only the built-in chains our jumps start from are read.
        let missing = missing_jumps(self.iptables.as_mut(), family, &IPVS_JUMP_RULES)
            .map_err(SyncError::from)?;
        let mut by_table: BTreeMap<&str, String> = BTreeMap::new();
        for jump in &missing {
            let lines = by_table.entry(jump.table).or_default();
            lines.push_str(&format!("-I {} 1 {}\n", jump.from, jump.rule_spec()));
        }
        let input: String = by_table
            .into_iter()
            .map(|(table, lines)| format!("*{table}\n{lines}COMMIT\n"))
            .collect();
        if !input.is_empty() {
            self.iptables
                .restore(family, &input)
                .map_err(SyncError::from)?;
        }
        Ok(())
    }

    /// Takes `family` to `desired` (the whole family's, or, with `touched`, the part of those
    /// services, addresses and set entries only): virtual servers and addresses, then sets,
    /// then iptables rules.
    pub(super) fn program(
        &mut self,
        family: IpFamily,
        current: &mut KernelView,
        desired: DesiredIpvs,
        scope: Option<Scope>,
    ) -> Result<Changed, SyncError> {
        let view = match &scope {
            Some(Scope { touched, .. }) => {
                // Draining ones are among the touched: their real servers are read here, once.
                self.reread_real_servers(&mut current.observed, &touched.services)?;
                Cow::Owned(
                    current
                        .observed
                        .restricted(&touched.services, &touched.bound),
                )
            }
            None => Cow::Borrowed(&current.observed),
        };
        let exclude = &self.settings.exclude_cidrs;
        let programmed = self.programmed.entry(family).or_default();
        let (observed, local) = (&current.observed, &current.local);
        let owned = |vs: &crate::sys::ipvs::VirtualServer| {
            IpFamily::of(&vs.address) == family
                && !exclude.iter().any(|net| net.contains(&vs.address))
                && (observed.bound.contains(&vs.address)
                    || programmed.contains(&vs.key())
                    || local.contains(&vs.address))
        };
        let operations = diff(&desired, &view, &owned, Some(family));
        drop(view);
        let applied = self.apply(current.link, &operations);
        current.observed.apply(&applied);
        let names = Self::set_names(family);
        if current.depth != Depth::Changes {
            let read = parse_save(&self.ipset.save_sets(&names).map_err(SyncError::from)?);
            current.sets.retain(|name, _| !names.contains(name));
            current.sets.extend(read);
        }
        let restricted;
        let sets = match &scope {
            Some(Scope { entries, .. }) => {
                restricted = restrict_sets(&current.sets, &desired, entries);
                &restricted
            }
            None => &current.sets,
        };
        if let Some(input) = sync_input(&desired.sets, sets) {
            self.restore_sets(&input)?;
        }
        let programmed = self.programmed.entry(family).or_default();
        match &scope {
            Some(Scope { touched, entries }) => {
                for (name, entry) in entries {
                    if let Some(set) = current.sets.get_mut(name) {
                        set.remove(entry);
                    }
                }
                for key in &touched.services {
                    if desired.services.contains_key(key) {
                        programmed.insert(key.clone());
                    } else {
                        programmed.remove(key);
                    }
                }
            }
            None => {
                current.sets.retain(|name, _| !names.contains(name));
                *programmed = desired.services.keys().cloned().collect();
            }
        }
        for (spec, entries) in desired.sets {
            current.sets.entry(spec.name).or_default().extend(entries);
        }
        let unchanged = current.depth == Depth::Changes
            && current
                .previous_iptables
                .iter()
                .any(|(known, text)| *known == family && *text == desired.iptables);
        if !unchanged {
            self.sync_iptables(family, &desired.iptables)?;
        }
        let rules = ["filter", "nat"]
            .map(|table| (table, rule_lines(table_section(&desired.iptables, table))));
        current.iptables.push((family, desired.iptables));
        Ok(Changed {
            operations: operations.len(),
            rules,
        })
    }
}

/// How many rules a restore section appends.
pub(super) fn rule_lines(section: &str) -> usize {
    section.lines().filter(|l| l.starts_with("-A ")).count()
}

/// The current entries of the touched ones, per set of `desired` (every set appears, so
/// `sync_input` creates none): the counterpart of `Aggregate::desired_part`.
pub(super) fn restrict_sets(
    sets: &SetEntries,
    desired: &DesiredIpvs,
    touched: &BTreeSet<(String, String)>,
) -> SetEntries {
    let mut current: SetEntries = desired
        .sets
        .keys()
        .map(|spec| (spec.name.clone(), BTreeSet::new()))
        .collect();
    for (name, entry) in touched {
        if sets
            .get(name)
            .is_some_and(|entries| entries.contains(entry))
            && let Some(entries) = current.get_mut(name)
        {
            entries.insert(entry.clone());
        }
    }
    current
}
