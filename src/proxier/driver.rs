//! The sync every mode runs: which families, full or partial, the hourly full sync, a refused
//! service skipped and the rest programmed at once, and the report. A mode says how to render,
//! plan and apply one family's state through [`Mode`]; the driver decides what to ask of it.

use std::ops::{Deref, DerefMut};
use std::time::Instant;

use tracing::info;

use super::quarantine::{self, Failure, Quarantine};
use super::{FULL_SYNC_PERIOD, Proxier, SyncError, SyncReport};
use crate::config::ProxyMode;
use crate::model::{ChangeSummary, IpFamily, ProxyState};

/// What one family's sync wrote, as a mode counts it.
pub trait Written: Default {
    /// Lines (or commands) of kernel input written.
    fn lines(&self) -> usize;
    /// Logs what was written (at debug level).
    fn log(&self, family: IpFamily, full: bool);
    /// Adds this mode's own figures to the report.
    fn record(&self, _family: IpFamily, _report: &mut SyncReport) {}
}

/// One proxy mode, as the driver runs it: the stages of one family's sync.
pub trait Mode: Send {
    /// What a family's rendering depends on besides the services (the node, the settings); a
    /// change of it makes that family's next sync a full one.
    type Context: Clone + PartialEq;
    type Written: Written;
    /// What one sync carries from `begin` through every family's stages to `end` (the kernel
    /// as the sync read it, the drift it found): handed to each stage, gone when it ends.
    type Sync;

    /// Which mode this is.
    const MODE: ProxyMode;

    /// Starts a sync of `families` for `changes`: its state, and whether the mode wants a full
    /// one besides the driver's reasons (drift only a full sync repairs, say). `full` says
    /// whether the driver already does one.
    fn begin(
        &mut self,
        families: &[IpFamily],
        changes: &ChangeSummary,
        full: bool,
    ) -> Result<(Self::Sync, bool), Failure>;

    /// Prepares `family`'s sync (a sysctl it needs, chains due for deletion) and returns its
    /// context for `state`.
    fn prepare(
        &mut self,
        sync: &mut Self::Sync,
        family: IpFamily,
        state: &ProxyState,
    ) -> Self::Context;

    /// The context `family` was last programmed with, if it was.
    fn programmed_context(&self, family: IpFamily) -> Option<&Self::Context>;

    /// Programs every service of `family`, those in `quarantine` as the kernel last took them.
    fn full_sync(
        &mut self,
        sync: &mut Self::Sync,
        family: IpFamily,
        ctx: Self::Context,
        state: &ProxyState,
        quarantine: &Quarantine,
    ) -> Result<Self::Written, Failure>;

    /// Programs the services of `family` that `changes` names, as a full sync would leave them.
    fn partial_sync(
        &mut self,
        sync: &mut Self::Sync,
        family: IpFamily,
        state: &ProxyState,
        changes: &ChangeSummary,
        quarantine: &Quarantine,
    ) -> Result<Self::Written, Failure>;

    /// After `family`'s sync succeeded: repairs what other programs changed and checks what a
    /// restart took on trust; how many objects were repaired. `full` says whether the sync was
    /// a full one.
    fn settle(
        &mut self,
        sync: &mut Self::Sync,
        family: IpFamily,
        state: &ProxyState,
        full: bool,
        quarantine: &Quarantine,
    ) -> Result<usize, Failure>;

    /// Every family synced: what the sync leaves for the next one, and the mode's own counts
    /// for the report. No kernel access: the sync's writes are done.
    fn end(&mut self, sync: Self::Sync, full: bool, report: &mut SyncReport);
}

/// A mode and the sync state every mode keeps alike. It reads as its mode (`Deref`), so that a
/// caller reaches the mode's own settings and kernel interface through it.
pub struct SyncDriver<M: Mode> {
    pub(crate) mode: M,
    /// Families in use, fixed at the first sync from the node's addresses.
    families: Vec<IpFamily>,
    needs_full_sync: bool,
    last_full_sync: Option<Instant>,
    /// Services whose input the kernel refused.
    quarantine: Quarantine,
}

impl<M: Mode> SyncDriver<M> {
    /// Drives `mode`, whose first sync is a full one.
    pub fn drive(mode: M) -> Self {
        SyncDriver {
            mode,
            families: Vec::new(),
            needs_full_sync: true,
            last_full_sync: None,
            quarantine: Quarantine::default(),
        }
    }

    /// Makes the next sync a full one.
    pub fn force_full_sync(&mut self) {
        self.needs_full_sync = true;
    }

    /// One sync; on any error the next one is full.
    fn run(
        &mut self,
        state: &ProxyState,
        changes: &ChangeSummary,
    ) -> Result<SyncReport, SyncError> {
        if self.families.is_empty() {
            self.families = state.node.families();
            info!(families = ?self.families, "{} proxier serving IP families", M::MODE.as_str());
        }
        let now = Instant::now();
        let hourly = self
            .last_full_sync
            .is_some_and(|t| now.duration_since(t) >= FULL_SYNC_PERIOD);
        let mut full = self.needs_full_sync || self.last_full_sync.is_none() || hourly;
        let mut sync = match self.mode.begin(&self.families, changes, full) {
            Ok((sync, wanted)) => {
                full |= wanted;
                sync
            }
            Err(failure) => {
                self.needs_full_sync = true;
                return Err(failure.error);
            }
        };
        self.quarantine.release_changed(changes);
        if hourly {
            self.quarantine.release_all();
        }
        let mut report = SyncReport {
            full,
            ..SyncReport::default()
        };
        for family in self.families.clone() {
            match self.sync_family(&mut sync, family, full, state, changes, &mut report) {
                Ok(written) => {
                    written.log(family, report.full);
                    report.restore_lines += written.lines();
                    written.record(family, &mut report);
                }
                Err(failure) => {
                    self.needs_full_sync = true;
                    return Err(failure.error);
                }
            }
        }
        if report.full {
            self.needs_full_sync = false;
            self.last_full_sync = Some(now);
        }
        report.skipped_services = self.quarantine.len();
        report.service_ports = state.services.values().map(|ports| ports.len()).sum();
        report.services_written = if report.full {
            state.services.len()
        } else {
            changes.changed_services.len()
        };
        self.mode.end(sync, report.full, &mut report);
        Ok(report)
    }

    /// One family: full when asked or when its context changed, else partial; a service whose
    /// input the kernel refused is skipped and the rest programmed again at once, a few times
    /// at most; then the mode settles what is left.
    fn sync_family(
        &mut self,
        sync: &mut M::Sync,
        family: IpFamily,
        full: bool,
        state: &ProxyState,
        changes: &ChangeSummary,
        report: &mut SyncReport,
    ) -> Result<M::Written, Failure> {
        let ctx = self.mode.prepare(sync, family, state);
        let mut family_full = full || self.mode.programmed_context(family) != Some(&ctx);
        let mut result = if family_full {
            report.full = true;
            self.mode
                .full_sync(sync, family, ctx.clone(), state, &self.quarantine)
        } else {
            self.mode
                .partial_sync(sync, family, state, changes, &self.quarantine)
        };
        let mut skipped = 0;
        while let Err(Failure {
            culprit: Some(service),
            error,
        }) = &result
        {
            if skipped == quarantine::MAX_PER_SYNC
                || !self.quarantine.add(service.clone(), error.to_string())
            {
                break;
            }
            skipped += 1;
            report.full = true;
            family_full = true;
            result = self
                .mode
                .full_sync(sync, family, ctx.clone(), state, &self.quarantine);
        }
        let written = result?;
        report.repaired_chains +=
            self.mode
                .settle(sync, family, state, family_full, &self.quarantine)?;
        Ok(written)
    }
}

impl<M: Mode> Proxier for SyncDriver<M> {
    fn mode(&self) -> ProxyMode {
        M::MODE
    }

    fn sync(
        &mut self,
        state: &ProxyState,
        changes: &ChangeSummary,
    ) -> Result<SyncReport, SyncError> {
        self.run(state, changes)
    }
}

impl<M: Mode> Deref for SyncDriver<M> {
    type Target = M;

    fn deref(&self) -> &M {
        &self.mode
    }
}

impl<M: Mode> DerefMut for SyncDriver<M> {
    fn deref_mut(&mut self) -> &mut M {
        &mut self.mode
    }
}
