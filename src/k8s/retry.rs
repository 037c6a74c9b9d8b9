//! What a failing watch does: how long it waits before the next try ([`WatchBackoff`]), what it
//! logs, and what it reports.
//!
//! kube-runtime's own backoff wrapper starts over at its first delay on every item the watcher
//! yields, and a watcher whose list fails yields `Init` before each new try: a list the API
//! server keeps refusing was retried about 2.5 times a second for ever. Here only progress (an
//! object listed or changed, a list completed) resets the delay.
//!
//! A refusal that retrying soon will not change (404: the resource is not served; 403: RBAC
//! forbids it) is logged once with what to do, then at most every [`REFUSAL_LOG_INTERVAL`], and
//! reported until the watch works again. Other errors are logged as they come.

use std::time::{Duration, Instant};

use kube::core::Status;
use kube::runtime::watcher;
use tracing::{info, warn};

use super::backoff::{MAX_DELAY, MAX_REFUSED_DELAY, WatchBackoff};

/// How often a refusal that lasts is logged again.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(300);

/// A refusal of a list or watch that retrying soon will not change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// 404: the API server does not serve the resource (an older release, a disabled API).
    NotServed,
    /// 403: RBAC does not let this client list or watch it.
    Forbidden,
}

impl Refusal {
    pub const ALL: [Refusal; 2] = [Refusal::NotServed, Refusal::Forbidden];

    /// As the metric's `reason` label says it.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::NotServed => "not_found",
            Refusal::Forbidden => "forbidden",
        }
    }

    /// The refusal an error is, if it is one.
    pub fn of(error: &watcher::Error) -> Option<Refusal> {
        let status: &Status = match error {
            watcher::Error::InitialListFailed(kube::Error::Api(status))
            | watcher::Error::WatchStartFailed(kube::Error::Api(status))
            | watcher::Error::WatchFailed(kube::Error::Api(status))
            | watcher::Error::WatchError(status) => status,
            _ => return None,
        };
        // By code: a body that is not a Status (a path the server has no route for answers
        // "404 page not found") keeps only the code.
        match status.code {
            404 => Some(Refusal::NotServed),
            403 => Some(Refusal::Forbidden),
            _ => None,
        }
    }
}

/// What a watch of one kind says of a refusal.
#[derive(Clone, Copy, Debug)]
pub struct Subject {
    /// The kind, as logs name it (`ServiceCIDR`).
    pub kind: &'static str,
    /// The resource as RBAC names it (`servicecidrs.networking.k8s.io`).
    pub resource: &'static str,
    /// The API it belongs to (`networking.k8s.io/v1`).
    pub api_version: &'static str,
    /// What this node does without it, when the API server does not serve it.
    pub without_it: &'static str,
}

/// A watch's retries: its backoff and the refusal in force.
pub struct Retry {
    subject: Subject,
    backoff: WatchBackoff,
    refused: Option<Refused>,
}

struct Refused {
    refusal: Refusal,
    /// Tries refused since it was last logged.
    tries: u64,
    logged_at: Instant,
}

/// What a failure changed of the watch's reported state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reported {
    /// As it was.
    Unchanged,
    /// Now refused for this reason, or (`None`) no longer refused.
    Refusal(Option<Refusal>),
}

impl Retry {
    pub fn new(subject: Subject) -> Retry {
        Retry {
            subject,
            backoff: WatchBackoff::new(),
            refused: None,
        }
    }

    /// A try failed: logs it (a refusal once, then at most every [`REFUSAL_LOG_INTERVAL`]) and
    /// answers how long to wait before the next one, and whether the refusal reported changed.
    pub fn failed(&mut self, error: &watcher::Error) -> (Duration, Reported) {
        let Some(refusal) = Refusal::of(error) else {
            log_error(self.subject.kind, error);
            let reported = match self.refused.take() {
                Some(_) => Reported::Refusal(None),
                None => Reported::Unchanged,
            };
            return (self.backoff.next_delay(MAX_DELAY), reported);
        };
        let delay = self.backoff.next_delay(MAX_REFUSED_DELAY);
        let now = Instant::now();
        match &mut self.refused {
            Some(refused) if refused.refusal == refusal => {
                refused.tries += 1;
                if now.duration_since(refused.logged_at) >= REFUSAL_LOG_INTERVAL {
                    log_refusal(&self.subject, refusal, error, Some(refused.tries));
                    refused.tries = 0;
                    refused.logged_at = now;
                }
                (delay, Reported::Unchanged)
            }
            _ => {
                log_refusal(&self.subject, refusal, error, None);
                self.refused = Some(Refused {
                    refusal,
                    tries: 0,
                    logged_at: now,
                });
                (delay, Reported::Refusal(Some(refusal)))
            }
        }
    }

    /// The watch made progress: the next failure starts at the first delay. Answers whether a
    /// refusal ended.
    pub fn progressed(&mut self) -> bool {
        self.backoff.reset();
        self.refused.take().is_some()
    }
}

fn log_refusal(
    subject: &Subject,
    refusal: Refusal,
    error: &watcher::Error,
    tries_since: Option<u64>,
) {
    let Subject {
        kind,
        resource,
        api_version,
        without_it,
    } = *subject;
    let retrying = MAX_REFUSED_DELAY.as_secs();
    let what = match refusal {
        Refusal::NotServed => format!(
            "The API server does not serve {kind}s ({api_version}): {without_it}; retrying at most every {retrying} s"
        ),
        Refusal::Forbidden => format!(
            "The API server forbids this client to list and watch {kind}s: grant get, list and watch on {resource} to kube-proxy's ServiceAccount (deploy/clusterrole.yaml); retrying at most every {retrying} s"
        ),
    };
    let error = shortened(error);
    match tries_since {
        None => warn!(kind, reason = refusal.as_str(), %error, "{what}"),
        Some(tries) => {
            warn!(kind, reason = refusal.as_str(), tries_since_last_logged = tries, %error, "Still refused: {what}")
        }
    }
}

fn log_error(kind: &str, error: &watcher::Error) {
    let text = shortened(error);
    match error {
        watcher::Error::WatchError(status) if status.code == 410 => {
            info!(kind, "Watch of {kind} expired (410 Gone); listing again");
        }
        watcher::Error::WatchFailed(_) => {
            info!(kind, error = %text, "Watch of {kind} ended; reconnecting");
        }
        watcher::Error::InitialListFailed(_) => {
            warn!(kind, error = %text, "Failed to list {kind}; retrying with backoff, keeping the last state");
        }
        watcher::Error::WatchStartFailed(_) => {
            warn!(kind, error = %text, "Failed to watch {kind}; retrying with backoff, keeping the last state");
        }
        _ => warn!(kind, error = %text, "Watch of {kind} failed; retrying with backoff"),
    }
}

/// At most this much of an error's text is logged: a failed list must not dump its body.
const ERROR_TEXT_LIMIT: usize = 400;

fn shortened(error: &dyn std::fmt::Display) -> String {
    let text = error.to_string();
    let count = text.chars().count();
    if count <= ERROR_TEXT_LIMIT {
        return text;
    }
    let cut: String = text.chars().take(ERROR_TEXT_LIMIT).collect();
    format!("{cut}... ({} characters more)", count - ERROR_TEXT_LIMIT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> watcher::Error {
        let status = Status::failure("refused", "Whatever").with_code(code);
        watcher::Error::InitialListFailed(kube::Error::Api(status.boxed()))
    }

    fn subject() -> Subject {
        Subject {
            kind: "ServiceCIDR",
            resource: "servicecidrs.networking.k8s.io",
            api_version: "networking.k8s.io/v1",
            without_it: "nothing",
        }
    }

    #[test]
    fn refusals_are_told_by_their_code_whatever_the_body() {
        assert_eq!(Refusal::of(&api_error(404)), Some(Refusal::NotServed));
        assert_eq!(Refusal::of(&api_error(403)), Some(Refusal::Forbidden));
        assert_eq!(Refusal::of(&api_error(500)), None);
        assert_eq!(Refusal::of(&api_error(429)), None);
        assert_eq!(Refusal::of(&watcher::Error::NoResourceVersion), None);
    }

    #[test]
    fn a_refusal_is_reported_once_and_waits_longer_than_an_outage() {
        let mut retry = Retry::new(subject());
        let (_, first) = retry.failed(&api_error(404));
        assert_eq!(first, Reported::Refusal(Some(Refusal::NotServed)));
        let mut longest = Duration::ZERO;
        for _ in 0..10 {
            let (delay, reported) = retry.failed(&api_error(404));
            assert_eq!(reported, Reported::Unchanged);
            longest = longest.max(delay);
        }
        assert!(longest > MAX_DELAY, "{longest:?}");
        assert!(longest <= MAX_REFUSED_DELAY, "{longest:?}");
        let (_, changed) = retry.failed(&api_error(403));
        assert_eq!(changed, Reported::Refusal(Some(Refusal::Forbidden)));
        let (delay, outage) = retry.failed(&api_error(503));
        assert_eq!(outage, Reported::Refusal(None));
        assert!(delay <= MAX_DELAY, "{delay:?}");
        assert!(!retry.progressed());
        retry.failed(&api_error(403));
        assert!(retry.progressed(), "a refusal ends with progress");
    }
}
