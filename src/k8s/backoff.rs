//! How long a watch waits before it tries again: 0.5 s, doubling up to a cap, each delay half
//! fixed and half random.
//!
//! An error that the next try may not see (the API server away, overloaded, restarting) is
//! capped at 4 s: a node reflects the API server's state within a few seconds of its return
//! (client-go's 30 s cap left nodes stale for up to a minute), while a fleet of thousands of
//! nodes spreads its retries over each window instead of arriving in step: at most one attempt
//! per watch every 2-4 s per node, and each attempt that reaches a recovering server is a list
//! served from its watch cache (resourceVersion 0).
//!
//! A refusal that retrying soon will not change (404: the resource is not served; 403: RBAC
//! forbids it) is capped at 60 s: an attempt every 30-60 s per watch per node, which a cluster
//! of 5,000 nodes makes about 110 requests a second of, where the transient cap would make
//! 1,700. The first tries still come within seconds, for the RBAC rule applied a moment after
//! the DaemonSet.

use std::time::{Duration, SystemTime};

/// The first delay after a failure.
pub const FIRST_DELAY: Duration = Duration::from_millis(500);
/// The longest delay after an error the next try may not see.
pub const MAX_DELAY: Duration = Duration::from_secs(4);
/// The longest delay after a refusal (404, 403).
pub const MAX_REFUSED_DELAY: Duration = Duration::from_secs(60);

/// Exponential backoff with equal jitter, reset by progress.
pub struct WatchBackoff {
    next: Duration,
    random: u64,
}

impl WatchBackoff {
    /// A backoff at its first delay, its randomness seeded from the clock and the process.
    pub fn new() -> Self {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Self::with_seed(nanos ^ (u64::from(std::process::id()) << 32))
    }

    /// A backoff with a given seed (tests).
    pub fn with_seed(seed: u64) -> Self {
        WatchBackoff {
            next: FIRST_DELAY,
            random: seed | 1,
        }
    }

    /// The delay before the next try, at most `cap`; the one after it doubles.
    pub fn next_delay(&mut self, cap: Duration) -> Duration {
        let delay = self.next.min(cap);
        self.next = (delay * 2).min(cap);
        let half = delay / 2;
        let spread = half.as_millis() as u64;
        let jitter = if spread == 0 {
            0
        } else {
            self.random() % (spread + 1)
        };
        half + Duration::from_millis(jitter)
    }

    /// Back to the first delay: the watch made progress.
    pub fn reset(&mut self) {
        self.next = FIRST_DELAY;
    }

    /// xorshift64: plenty for spreading retries.
    fn random(&mut self) -> u64 {
        self.random ^= self.random << 13;
        self.random ^= self.random >> 7;
        self.random ^= self.random << 17;
        self.random
    }
}

impl Default for WatchBackoff {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delays(backoff: &mut WatchBackoff, cap: Duration, count: usize) -> Vec<Duration> {
        (0..count).map(|_| backoff.next_delay(cap)).collect()
    }

    fn within(delays: &[Duration], bounds: &[u64]) {
        for (delay, bound) in delays.iter().zip(bounds) {
            let bound = Duration::from_millis(*bound);
            assert!(
                *delay >= bound / 2 && *delay <= bound,
                "{delay:?} within {bound:?}"
            );
        }
    }

    #[test]
    fn delays_double_up_to_the_cap_with_jitter_and_reset() {
        let mut backoff = WatchBackoff::with_seed(42);
        let seen = delays(&mut backoff, MAX_DELAY, 8);
        within(&seen, &[500, 1000, 2000, 4000, 4000, 4000, 4000, 4000]);
        let distinct: std::collections::BTreeSet<_> = seen[3..].iter().collect();
        assert!(distinct.len() > 1, "jittered: {seen:?}");
        backoff.reset();
        assert!(backoff.next_delay(MAX_DELAY) <= FIRST_DELAY);
        let other = delays(&mut WatchBackoff::with_seed(7), MAX_DELAY, 8);
        assert_ne!(seen, other, "nodes do not retry in step");
    }

    #[test]
    fn refusals_climb_to_the_longer_cap_and_a_transient_error_then_comes_back_to_its_own() {
        let mut backoff = WatchBackoff::with_seed(9);
        let seen = delays(&mut backoff, MAX_REFUSED_DELAY, 9);
        within(
            &seen,
            &[500, 1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000],
        );
        within(&delays(&mut backoff, MAX_DELAY, 2), &[4000, 4000]);
    }
}
