//! Keeps a sync that fails again and again visible without flooding the log: a new reason is
//! logged at once, the same reason again after 2, 4, 8, ... failures and at least every five
//! minutes, with how many times it happened since when; the first success after failures says
//! how many there were.

use std::time::Duration;

use tokio::time::Instant;

/// The same reason is logged again at least this often.
const REPEAT_EVERY: Duration = Duration::from_secs(300);

/// What to log about one sync's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Log this failure: `repeats` failures with this reason so far (1 the first time),
    /// the first of them `since` ago.
    Log { repeats: u64, since: Duration },
    /// A repeat of the last failure that need not be logged.
    Quiet,
    /// The sync succeeded after `failures` failures in a row.
    Recovered { failures: u64 },
    /// The sync succeeded, as the last one did.
    Fine,
}

#[derive(Debug)]
struct Streak {
    reason: String,
    first: Instant,
    repeats: u64,
    logged_at: Instant,
    total: u64,
}

/// The failures since the last successful sync.
#[derive(Debug, Default)]
pub struct FailureLog {
    streak: Option<Streak>,
}

impl FailureLog {
    /// No sync has failed since the last success.
    pub fn is_clear(&self) -> bool {
        self.streak.is_none()
    }

    /// A sync failed with `reason` at `now`.
    pub fn failed(&mut self, reason: &str, now: Instant) -> Verdict {
        let total = self.streak.as_ref().map_or(0, |s| s.total) + 1;
        match self.streak.as_mut() {
            Some(streak) if streak.reason == reason => {
                streak.repeats += 1;
                streak.total = total;
                let due = streak.repeats.is_power_of_two()
                    || now.duration_since(streak.logged_at) >= REPEAT_EVERY;
                if !due {
                    return Verdict::Quiet;
                }
                streak.logged_at = now;
                Verdict::Log {
                    repeats: streak.repeats,
                    since: now.duration_since(streak.first),
                }
            }
            _ => {
                self.streak = Some(Streak {
                    reason: reason.to_string(),
                    first: now,
                    repeats: 1,
                    logged_at: now,
                    total,
                });
                Verdict::Log {
                    repeats: 1,
                    since: Duration::ZERO,
                }
            }
        }
    }

    /// A sync succeeded.
    pub fn succeeded(&mut self) -> Verdict {
        match self.streak.take() {
            Some(streak) => Verdict::Recovered {
                failures: streak.total,
            },
            None => Verdict::Fine,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_are_summarised_and_new_reasons_logged_at_once() {
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let mut log = FailureLog::default();
        assert_eq!(log.succeeded(), Verdict::Fine);
        let logged: Vec<u64> = (1..=20)
            .filter(|i| matches!(log.failed("restore failed", at(*i)), Verdict::Log { .. }))
            .collect();
        assert_eq!(logged, [1, 2, 4, 8, 16], "powers of two of the repeats");
        assert_eq!(
            log.failed("restore failed", at(400)),
            Verdict::Log {
                repeats: 21,
                since: Duration::from_secs(399)
            },
            "and at least every five minutes"
        );
        assert_eq!(log.failed("restore failed", at(401)), Verdict::Quiet);
        assert_eq!(
            log.failed("another reason", at(402)),
            Verdict::Log {
                repeats: 1,
                since: Duration::ZERO
            }
        );
        assert_eq!(log.succeeded(), Verdict::Recovered { failures: 23 });
        assert_eq!(log.succeeded(), Verdict::Fine);
    }
}
