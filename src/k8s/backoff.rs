//! How a watch retries while the API server is away: 0.5 s, doubling to at most 4 s, each delay
//! half fixed and half random. A node therefore reflects the API server's state within a few
//! seconds of its return (client-go's 30 s cap left nodes stale for up to a minute), while a
//! fleet of thousands of nodes spreads its retries over each window instead of arriving in step:
//! at most one attempt per watch every 2-4 s per node, and each attempt that reaches a recovering
//! server is a list served from its watch cache (resourceVersion 0).

use std::time::{Duration, SystemTime};

use kube::runtime::utils::Backoff;

/// The first delay after a failure.
pub const FIRST_DELAY: Duration = Duration::from_millis(500);
/// The longest delay.
pub const MAX_DELAY: Duration = Duration::from_secs(4);

/// Exponential backoff with equal jitter.
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

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let delay = self.next;
        self.next = (delay * 2).min(MAX_DELAY);
        let half = delay / 2;
        let spread = half.as_millis() as u64;
        let jitter = if spread == 0 {
            0
        } else {
            self.random() % (spread + 1)
        };
        Some(half + Duration::from_millis(jitter))
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = FIRST_DELAY;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_with_jitter_and_reset() {
        let mut backoff = WatchBackoff::with_seed(42);
        let delays: Vec<Duration> = backoff.by_ref().take(8).collect();
        let bounds = [500, 1000, 2000, 4000, 4000, 4000, 4000, 4000];
        for (delay, bound) in delays.iter().zip(bounds) {
            let bound = Duration::from_millis(bound);
            assert!(
                *delay >= bound / 2 && *delay <= bound,
                "{delay:?} within {bound:?}"
            );
        }
        let distinct: std::collections::BTreeSet<_> = delays[3..].iter().collect();
        assert!(distinct.len() > 1, "jittered: {delays:?}");
        backoff.reset();
        assert!(backoff.next().unwrap() <= FIRST_DELAY);
        let other: Vec<Duration> = WatchBackoff::with_seed(7).take(8).collect();
        assert_ne!(delays, other, "nodes do not retry in step");
    }
}
