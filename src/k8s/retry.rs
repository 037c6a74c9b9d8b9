//! What a failing watch does: how long it waits before the next try ([`WatchBackoff`]), what it
//! logs, and what it reports.
//!
//! kube-runtime's own backoff wrapper starts over at its first delay on every item the watcher
//! yields, and a watcher whose list fails yields `Init` before each new try, so it would retry a
//! list the API server keeps refusing about 2.5 times a second. Here only progress (a list
//! completed, an object changed) starts the delays over.
//!
//! A refusal that retrying soon will not change (404: the resource is not served; 403: RBAC
//! forbids it) is retried as an outage is for [`REFUSAL_GRACE`] (an API server that is starting
//! may refuse for a few seconds before its RBAC cache is ready), then less often, up to once a
//! minute; it is then logged once with what to do, again at most every
//! [`REFUSAL_LOG_INTERVAL`], and reported until the watch makes progress. Other errors are
//! logged as they come, and a server's Retry-After is honoured.

use std::time::{Duration, Instant};

use kube::core::Status;
use kube::runtime::watcher;
use tracing::{info, warn};

use super::backoff::{MAX_DELAY, MAX_REFUSED_DELAY, WatchBackoff};

/// How long a refusal is retried as an outage is, before it counts as lasting.
pub const REFUSAL_GRACE: Duration = Duration::from_secs(10);

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
        // By code: a body that is not a Status (a path the server has no route for answers
        // "404 page not found") keeps only the code.
        match status_of(error)?.code {
            404 => Some(Refusal::NotServed),
            403 => Some(Refusal::Forbidden),
            _ => None,
        }
    }
}

/// The API server's answer an error carries, if it does.
fn status_of(error: &watcher::Error) -> Option<&Status> {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status))
        | watcher::Error::WatchError(status) => Some(status),
        _ => None,
    }
}

/// How long the API server asked the client to wait (API Priority and Fairness' 429s carry it).
pub fn retry_after(status: &Status) -> Duration {
    let seconds = status
        .details
        .as_ref()
        .map_or(0, |details| details.retry_after_seconds);
    Duration::from_secs(u64::from(seconds))
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
    /// When the API server began refusing (this or another refusal).
    since: Instant,
    /// When it was last logged; `None` until it has lasted [`REFUSAL_GRACE`].
    logged_at: Option<Instant>,
    /// Tries refused since it was last logged.
    tries: u64,
}

/// What a failure changed of the watch's reported state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reported {
    /// As it was.
    Unchanged,
    /// Now refused for this reason.
    Refused(Refusal),
}

impl Retry {
    pub fn new(subject: Subject) -> Retry {
        Retry {
            subject,
            backoff: WatchBackoff::new(),
            refused: None,
        }
    }

    /// A try failed: logs it and answers how long to wait before the next one, and whether
    /// the refusal reported changed.
    pub fn failed(&mut self, error: &watcher::Error) -> (Duration, Reported) {
        self.failed_at(error, Instant::now())
    }

    fn failed_at(&mut self, error: &watcher::Error, now: Instant) -> (Duration, Reported) {
        let asked = status_of(error).map_or(Duration::ZERO, retry_after);
        let Some(refusal) = Refusal::of(error) else {
            // An outage between refusals leaves the refusal standing: only progress ends it.
            log_error(self.subject.kind, error);
            return (
                self.backoff.next_delay(MAX_DELAY).max(asked),
                Reported::Unchanged,
            );
        };
        let since = self.refused.as_ref().map_or(now, |refused| refused.since);
        let refused = match self.refused.take() {
            Some(refused) if refused.refusal == refusal => refused,
            _ => Refused {
                refusal,
                since,
                logged_at: None,
                tries: 0,
            },
        };
        let refused = self.refused.insert(refused);
        refused.tries += 1;
        let lasting = now.duration_since(refused.since) >= REFUSAL_GRACE;
        let cap = if lasting {
            MAX_REFUSED_DELAY
        } else {
            MAX_DELAY
        };
        let delay = self.backoff.next_delay(cap).max(asked);
        let reported = match refused.logged_at {
            None if !lasting => {
                log_error(self.subject.kind, error);
                return (delay, Reported::Unchanged);
            }
            None => {
                log_refusal(&self.subject, refusal, error, None);
                Reported::Refused(refusal)
            }
            Some(at) if now.duration_since(at) >= REFUSAL_LOG_INTERVAL => {
                log_refusal(&self.subject, refusal, error, Some(refused.tries));
                Reported::Unchanged
            }
            Some(_) => return (delay, Reported::Unchanged),
        };
        refused.logged_at = Some(now);
        refused.tries = 0;
        (delay, reported)
    }

    /// The watch made progress: the next failure starts at the first delay. Answers whether a
    /// refusal that was reported ended.
    pub fn progressed(&mut self) -> bool {
        self.backoff.reset();
        self.refused
            .take()
            .is_some_and(|refused| refused.logged_at.is_some())
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

    /// Tries of `error` every `step` from `start` for `span`: the longest delay, and what
    /// was reported.
    fn tries(
        retry: &mut Retry,
        code: u16,
        start: Instant,
        span: Duration,
    ) -> (Duration, Vec<Reported>) {
        let (mut at, mut longest, mut reported) = (start, Duration::ZERO, Vec::new());
        while at < start + span {
            let (delay, said) = retry.failed_at(&api_error(code), at);
            longest = longest.max(delay);
            reported.extend((said != Reported::Unchanged).then_some(said));
            at += Duration::from_secs(1);
        }
        (longest, reported)
    }

    #[test]
    fn a_refusal_is_retried_as_an_outage_at_first_then_reported_once_and_slower() {
        let mut retry = Retry::new(subject());
        let start = Instant::now();
        let (longest, reported) = tries(&mut retry, 404, start, REFUSAL_GRACE);
        assert!(longest <= MAX_DELAY, "{longest:?} in the grace");
        assert!(
            reported.is_empty(),
            "not reported in the grace: {reported:?}"
        );
        let later = start + REFUSAL_GRACE;
        let (longest, reported) = tries(&mut retry, 404, later, Duration::from_secs(60));
        assert!(
            longest > MAX_DELAY && longest <= MAX_REFUSED_DELAY,
            "{longest:?}"
        );
        assert_eq!(reported, [Reported::Refused(Refusal::NotServed)]);
        // An outage between refusals does not end the refusal; a 403 after it is reported.
        let (_, outage) = retry.failed_at(&api_error(503), later + Duration::from_secs(61));
        assert_eq!(outage, Reported::Unchanged);
        let (_, again) = retry.failed_at(&api_error(404), later + Duration::from_secs(62));
        assert_eq!(
            again,
            Reported::Unchanged,
            "the same refusal, still standing"
        );
        let (_, changed) = retry.failed_at(&api_error(403), later + Duration::from_secs(63));
        assert_eq!(changed, Reported::Refused(Refusal::Forbidden));
        assert!(retry.progressed(), "progress ends a reported refusal");
        assert!(!retry.progressed());
    }

    #[test]
    fn a_refusal_that_ends_within_the_grace_is_never_reported() {
        let mut retry = Retry::new(subject());
        let (_, reported) = tries(&mut retry, 403, Instant::now(), Duration::from_secs(5));
        assert!(reported.is_empty());
        assert!(!retry.progressed(), "nothing was reported, so nothing ends");
    }

    #[test]
    fn the_servers_retry_after_is_honoured() {
        // As API Priority and Fairness answers.
        let status: Status = serde_json::from_str(
            r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"slow down","reason":"TooManyRequests","details":{"retryAfterSeconds":7},"code":429}"#,
        )
        .expect("a Status");
        let error = watcher::Error::InitialListFailed(kube::Error::Api(status.boxed()));
        let (delay, _) = Retry::new(subject()).failed(&error);
        assert!(delay >= Duration::from_secs(7), "{delay:?}");
    }
}
