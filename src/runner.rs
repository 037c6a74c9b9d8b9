//! The bounded-frequency sync runner (upstream's BoundedFrequencyRunner): a sync runs at most once
//! per `min_interval`, at least once per `max_interval`, again soon after a failure (backing off up
//! to `max_interval`), and requests that arrive while one waits or runs coalesce into one sync.
//! Never a trailing debounce: a steady stream of requests cannot starve it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::{Instant, sleep_until};

/// The intervals a runner keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Intervals {
    /// No two syncs start closer than this (minSyncPeriod).
    pub min_interval: Duration,
    /// A sync runs at least this often, changes or not (syncPeriod).
    pub max_interval: Duration,
    /// The first retry after a failed sync; doubled on each further failure up to `max_interval`.
    pub retry_interval: Duration,
}

/// Something the runner calls; `Err` asks for a retry.
pub trait Syncer {
    /// Runs one sync.
    fn sync(&mut self) -> futures::future::BoxFuture<'_, Result<(), ()>>;
}

/// A cheap handle that asks for a sync.
#[derive(Clone, Debug, Default)]
pub struct SyncRequester {
    requested: Arc<AtomicBool>,
    notify: Arc<Notify>,
}

impl SyncRequester {
    /// Asks for a sync as soon as `min_interval` allows.
    pub fn request(&self) {
        self.requested.store(true, Ordering::Release);
        self.notify.notify_one();
    }

    fn take(&self) -> bool {
        self.requested.swap(false, Ordering::AcqRel)
    }
}

/// Runs `syncer` on the schedule until `shutdown` turns true. The first sync runs at once.
pub async fn run(
    intervals: Intervals,
    requester: SyncRequester,
    mut shutdown: watch::Receiver<bool>,
    syncer: &mut (dyn Syncer + Send),
) {
    let mut last_start: Option<Instant> = None;
    let mut retry_at: Option<Instant> = None;
    let mut retry_delay = intervals.retry_interval;
    let mut due = true;
    loop {
        if *shutdown.borrow() {
            return;
        }
        if !due && !requester.take() {
            let periodic = last_start.map_or_else(Instant::now, |t| t + intervals.max_interval);
            let wake = retry_at.map_or(periodic, |r| r.min(periodic));
            tokio::select! {
                _ = requester.notify.notified() => {
                    if !requester.take() {
                        continue;
                    }
                }
                _ = sleep_until(wake) => {}
                _ = shutdown.changed() => return,
            }
        }
        if let Some(last) = last_start {
            let earliest = last + intervals.min_interval;
            if Instant::now() < earliest {
                tokio::select! {
                    _ = sleep_until(earliest) => {}
                    _ = shutdown.changed() => return,
                }
            }
        }
        // Whatever was requested until now is covered by this sync.
        requester.take();
        due = false;
        last_start = Some(Instant::now());
        match syncer.sync().await {
            Ok(()) => {
                retry_at = None;
                retry_delay = intervals.retry_interval;
            }
            Err(()) => {
                retry_at = Some(Instant::now() + retry_delay);
                retry_delay = (retry_delay * 2).min(intervals.max_interval);
            }
        }
    }
}

#[cfg(test)]
mod tests;
