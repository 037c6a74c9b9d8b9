//! The Events kube-proxy posts about its node, as upstream does: events.k8s.io/v1, regarding
//! the Node (`v1`, `Node`, its name), reporting controller `kube-proxy`, instance
//! `kube-proxy-<hostname>`, through kube-rs's recorder. Each is posted in the background: an API
//! server that refuses or is slow never holds the daemon up, and a failure is a warning.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tracing::warn;

use super::retry::retry_after;

/// How many times an Event is tried.
const POST_ATTEMPTS: u32 = 3;

/// The action upstream names its start events with.
const START: &str = "StartKubeProxy";

/// What upstream posts when the ipvs proxier is chosen (kubernetes#134539).
pub const IPVS_DEPRECATION: &str = "The ipvs proxier is now deprecated and may be removed in a future release. Please use 'nftables' instead.";

/// An event about this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeEvent {
    /// Normal, reason `Starting`: the proxier runs (upstream's "birth cry").
    Starting,
    /// Warning, reason `IPVSDeprecation`: the ipvs proxier was chosen.
    IpvsDeprecation,
    /// Warning, reason `FailedToStartProxierHealthcheck`: the health server could not listen
    /// (the error).
    HealthServerFailed(String),
    /// Warning, reason `FailedToStartMetricServer`: the metrics server could not listen.
    MetricsServerFailed(String),
}

impl NodeEvent {
    fn event(self) -> Event {
        let (type_, reason, note) = match self {
            NodeEvent::Starting => (EventType::Normal, "Starting", None),
            NodeEvent::IpvsDeprecation => (
                EventType::Warning,
                "IPVSDeprecation",
                Some(IPVS_DEPRECATION.to_string()),
            ),
            NodeEvent::HealthServerFailed(error) => (
                EventType::Warning,
                "FailedToStartProxierHealthcheck",
                Some(error),
            ),
            NodeEvent::MetricsServerFailed(error) => {
                (EventType::Warning, "FailedToStartMetricServer", Some(error))
            }
        };
        Event {
            type_,
            reason: reason.into(),
            note,
            action: START.into(),
            secondary: None,
        }
    }
}

/// Posts events regarding one Node.
#[derive(Clone)]
pub struct NodeEvents {
    recorder: Recorder,
    node: ObjectReference,
}

impl NodeEvents {
    pub fn new(client: Client, node_name: &str, hostname: &str) -> NodeEvents {
        let reporter = Reporter {
            controller: "kube-proxy".into(),
            instance: Some(format!("kube-proxy-{hostname}")),
        };
        NodeEvents {
            recorder: Recorder::new(client, reporter),
            node: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node_name.into()),
                ..ObjectReference::default()
            },
        }
    }

    /// Posts `event` in the background, trying again a few times when the API server says it
    /// is overloaded or unavailable (after what it asks, or 1, then 2 s).
    pub fn post(&self, event: NodeEvent) {
        let (recorder, node) = (self.recorder.clone(), self.node.clone());
        tokio::spawn(async move {
            let reason = format!("{event:?}");
            let event = event.event();
            let mut wait = Duration::from_secs(1);
            for attempt in 1..=POST_ATTEMPTS {
                let error = match recorder.publish(&event, &node).await {
                    Ok(()) => return,
                    Err(error) => error,
                };
                let passing = match &error {
                    kube::Error::Api(status) if [429, 500, 503, 504].contains(&status.code) => {
                        Some(retry_after(status).max(wait))
                    }
                    _ => None,
                };
                match passing {
                    Some(delay) if attempt < POST_ATTEMPTS => tokio::time::sleep(delay).await,
                    _ => {
                        warn!(event = %reason, %error, "Cannot post an event");
                        return;
                    }
                }
                wait *= 2;
            }
        });
    }
}
