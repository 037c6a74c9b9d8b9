//! One object can never fail a node's sync. When the kernel refuses a sync's input and the line
//! it names belongs to one service, that service goes into quarantine: it is skipped (its last
//! rules that the kernel accepted stay) with a warning naming it, and the rest is programmed in
//! the same sync. It gets another try when it changes, and at each hourly full sync.
//!
//! That is for modes whose input goes to the kernel in transactions, where one refused line
//! fails the whole of one. A mode that applies objects one at a time (IPVS: each virtual server,
//! real server and address is its own netlink request) loses only the refused object, so it
//! keeps [`Refusals`] instead: nothing to skip or re-run, only the object to report.

use std::collections::BTreeMap;

use tracing::{info, warn};

use crate::model::{ChangeSummary, NamespacedName};
use crate::proxier::SyncError;

/// How many services one sync may quarantine before it gives up and fails.
pub const MAX_PER_SYNC: usize = 8;

/// Services whose input the kernel refused, with the reason.
#[derive(Debug, Default)]
pub struct Quarantine {
    services: BTreeMap<NamespacedName, String>,
}

impl Quarantine {
    /// Whether `service` is being skipped.
    pub fn contains(&self, service: &NamespacedName) -> bool {
        self.services.contains_key(service)
    }

    /// Skips `service` from now on; false if it already was.
    pub fn add(&mut self, service: NamespacedName, reason: String) -> bool {
        if self.services.contains_key(&service) {
            return false;
        }
        warn!(service = %service, reason = %reason, "Skipping a Service whose rules the kernel refused; the other services are programmed");
        self.services.insert(service, reason);
        true
    }

    /// Services that changed get another try.
    pub fn release_changed(&mut self, changes: &ChangeSummary) {
        for service in &changes.changed_services {
            if self.services.remove(service).is_some() {
                info!(service = %service, "Trying a skipped Service again: it changed");
            }
        }
    }

    /// Every service gets another try (the hourly full sync).
    pub fn release_all(&mut self) {
        if !self.services.is_empty() {
            info!(
                count = self.services.len(),
                "Trying the skipped Services again"
            );
            self.services.clear();
        }
    }

    /// How many services are skipped.
    pub fn len(&self) -> usize {
        self.services.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }
}

/// Objects the kernel refused one by one (by what names them: a virtual server's key, an
/// address, a set entry), with why: each is logged once and counted among the skipped until an
/// operation on it succeeds.
#[derive(Debug, Default)]
pub struct Refusals {
    subjects: BTreeMap<String, String>,
}

impl Refusals {
    /// Records that `subject` was refused; true the first time (when to log it).
    pub fn refused(&mut self, subject: String, reason: String) -> bool {
        self.subjects.insert(subject, reason).is_none()
    }

    /// `subject` was taken: no longer refused.
    pub fn accepted(&mut self, subject: &str) {
        self.subjects.remove(subject);
    }

    /// How many objects stand refused.
    pub fn len(&self) -> usize {
        self.subjects.len()
    }

    /// Whether none does.
    pub fn is_empty(&self) -> bool {
        self.subjects.is_empty()
    }
}

/// A sync that failed, and the service whose input the kernel refused, when the line it named
/// belongs to one.
pub struct Failure {
    pub error: SyncError,
    pub culprit: Option<NamespacedName>,
}

impl From<SyncError> for Failure {
    fn from(error: SyncError) -> Failure {
        Failure {
            error,
            culprit: None,
        }
    }
}

impl Failure {
    /// A failure no service can be blamed for.
    pub fn unattributed(error: impl Into<SyncError>) -> Failure {
        Failure {
            error: error.into(),
            culprit: None,
        }
    }

    /// A failed apply of `input`, whose line `line` (1-based, when the tool named one) `owner`
    /// attributes to a service; `what` says what of the service it was (`rules`, `objects`).
    pub fn at_line(
        error: impl Into<SyncError>,
        input: &str,
        line: Option<usize>,
        what: &'static str,
        owner: impl Fn(&str) -> Option<NamespacedName>,
    ) -> Failure {
        let culprit = line
            .and_then(|line| input.lines().nth(line.saturating_sub(1)))
            .and_then(owner);
        let error = error.into();
        let error = match &culprit {
            Some(service) => SyncError::Refused {
                source: Box::new(error),
                what,
                service: Box::new(service.clone()),
            },
            None => error,
        };
        Failure { error, culprit }
    }
}

/// The service a comment names: upstream's comments start with `ns/name` or `ns/name:port`.
pub fn service_in_comment(comment: &str) -> Option<NamespacedName> {
    let first = comment.split_whitespace().next()?;
    let service = first.split(':').next()?;
    let (namespace, name) = service.split_once('/')?;
    (!namespace.is_empty() && !name.is_empty()).then(|| NamespacedName::new(namespace, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_leave_quarantine_when_they_change() {
        let mut quarantine = Quarantine::default();
        let bad = NamespacedName::new("ns", "bad");
        assert!(quarantine.add(bad.clone(), "refused".into()));
        assert!(!quarantine.add(bad.clone(), "again".into()));
        assert!(quarantine.contains(&bad));
        quarantine.release_changed(&ChangeSummary::default());
        assert_eq!(quarantine.len(), 1);
        quarantine.release_changed(&ChangeSummary {
            changed_services: [bad.clone()].into(),
            ..ChangeSummary::default()
        });
        assert!(quarantine.is_empty());
    }

    #[test]
    fn a_refused_object_is_logged_once_and_counted_until_taken() {
        let mut refusals = Refusals::default();
        assert!(refusals.refused("TCP/10.96.0.1:80".into(), "EINVAL".into()));
        assert!(!refusals.refused("TCP/10.96.0.1:80".into(), "EINVAL".into()));
        assert!(refusals.refused("10.96.0.2".into(), "EEXIST".into()));
        assert_eq!(refusals.len(), 2);
        refusals.accepted("TCP/10.96.0.1:80");
        refusals.accepted("10.96.0.2");
        assert!(refusals.is_empty());
    }

    #[test]
    fn comments_name_their_service() {
        assert_eq!(
            service_in_comment("ns1/svc1:p80 has no endpoints"),
            Some(NamespacedName::new("ns1", "svc1"))
        );
        assert_eq!(
            service_in_comment("ns1/svc1 cluster IP"),
            Some(NamespacedName::new("ns1", "svc1"))
        );
        assert_eq!(service_in_comment("kubernetes service portals"), None);
    }
}
