//! The proxy's health, as upstream's ProxierHealthServer keeps it: healthy unless an update
//! has been queued for longer than 2 x syncPeriod without a sync applying it.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use hyper::StatusCode;
use tokio::time::Instant;

use super::http::Reply;

#[derive(Debug, Default)]
struct State {
    /// Wall-clock time of the last successful sync.
    last_updated: Option<SystemTime>,
    /// When the oldest update not yet applied was queued.
    oldest_queued: Option<Instant>,
}

/// Shared between the watches (queued), the sync loop (updated) and the servers (read).
#[derive(Debug)]
pub struct ProxyHealth {
    state: Mutex<State>,
    timeout: Duration,
}

/// One reading of the health.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// No update has waited longer than the timeout.
    pub healthy: bool,
    /// At least one sync has succeeded.
    pub synced: bool,
    pub last_updated: Option<SystemTime>,
}

impl ProxyHealth {
    /// Health for a proxier syncing every `sync_period`.
    pub fn new(sync_period: Duration) -> ProxyHealth {
        ProxyHealth {
            state: Mutex::new(State::default()),
            timeout: sync_period * 2,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An update arrived that a sync must apply.
    pub fn queued(&self) {
        self.lock().oldest_queued.get_or_insert_with(Instant::now);
    }

    /// A sync applied everything queued before it started.
    pub fn updated(&self) {
        let mut state = self.lock();
        state.oldest_queued = None;
        state.last_updated = Some(SystemTime::now());
    }

    pub fn status(&self) -> Status {
        let state = self.lock();
        Status {
            healthy: state
                .oldest_queued
                .is_none_or(|queued| queued.elapsed() <= self.timeout),
            synced: state.last_updated.is_some(),
            last_updated: state.last_updated,
        }
    }

    /// The JSON answer; `readiness` also requires a first successful sync.
    pub fn reply(&self, readiness: bool) -> Reply {
        let status = self.status();
        let healthy = status.healthy && (status.synced || !readiness);
        let time = |t: SystemTime| chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339();
        let body = serde_json::json!({
            "lastUpdated": status.last_updated.map(time).unwrap_or_default(),
            "currentTime": time(SystemTime::now()),
            "nodeEligible": true,
            "healthy": healthy,
        });
        let code = if healthy {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        Reply::json(code, body.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn stale_updates_make_it_unhealthy_until_a_sync() {
        let health = ProxyHealth::new(Duration::from_secs(30));
        assert_eq!(health.reply(false).status, StatusCode::OK, "alive at start");
        assert_eq!(
            health.reply(true).status,
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready before the first sync"
        );
        health.updated();
        assert_eq!(health.reply(true).status, StatusCode::OK);
        health.queued();
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(health.status().healthy, "within 2 x syncPeriod");
        health.queued();
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(!health.status().healthy, "the oldest update counts");
        let reply = health.reply(false);
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
        let body: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(body["healthy"], false);
        assert!(body["lastUpdated"].as_str().unwrap().contains('T'));
        health.updated();
        assert_eq!(health.reply(true).status, StatusCode::OK);
    }
}
