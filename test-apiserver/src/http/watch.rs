//! Watches: the initial events, bookmarks, and the stream of changes until the client goes or
//! the history it asks for is compacted.

use super::list::{Selectors, in_namespace, visible};
use super::*;

pub(super) fn bookmark(resource: Resource, version: u64, initial_events_end: bool) -> Value {
    let mut metadata = json!({"resourceVersion": version.to_string()});
    if initial_events_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({"type": "BOOKMARK", "object": {"kind": resource.kind(), "apiVersion": resource.api_version(), "metadata": metadata}})
}

pub(super) fn line(value: &Value) -> Bytes {
    let mut text = value.to_string();
    text.push('\n');
    Bytes::from(text)
}

pub(super) fn watch(
    shared: &Arc<Shared>,
    resource: Resource,
    namespace: Option<String>,
    selectors: Selectors,
    query: &HashMap<String, String>,
) -> Response<Body> {
    let from = query
        .get("resourceVersion")
        .filter(|v| !v.is_empty() && *v != "0")
        .and_then(|v| v.parse::<u64>().ok());
    let bookmarks = query
        .get("allowWatchBookmarks")
        .is_some_and(|v| v == "true");
    let initial_events_end = query.get("sendInitialEvents").is_some_and(|v| v == "true");
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .map(Duration::from_secs);
    let mut epoch = shared.watch_epoch.subscribe();
    epoch.mark_unchanged();

    let (mut lines, mut last_version, mut live) = {
        let store = shared.store();
        let live = shared.events.subscribe();
        let mut lines = Vec::new();
        match from {
            Some(version) if !initial_events_end => match store.events_since(version) {
                Some(events) => {
                    for event in &events {
                        lines.extend(visible(event, resource, namespace.as_deref(), &selectors));
                    }
                    let last = events.last().map_or(version, |e| e.resource_version);
                    (lines, last, live)
                }
                None => {
                    let gone = gone_event(version, store.compacted);
                    return stream_response(
                        futures::stream::iter([Ok(Frame::data(line(&gone)))]).boxed(),
                    );
                }
            },
            _ => {
                initial_objects(
                    &store,
                    resource,
                    namespace.as_deref(),
                    &selectors,
                    &mut lines,
                );
                if initial_events_end {
                    lines.push(bookmark(resource, store.resource_version, true));
                }
                (lines, store.resource_version, live)
            }
        }
    };

    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let bookmark_interval = shared.bookmark_interval;
    tokio::spawn(async move {
        for value in lines.drain(..) {
            if tx.send(line(&value)).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::sleep(timeout.unwrap_or(Duration::from_secs(24 * 3600)));
        tokio::pin!(deadline);
        let mut ticks = tokio::time::interval_at(
            tokio::time::Instant::now() + bookmark_interval,
            bookmark_interval,
        );
        loop {
            // Biased: once watches are closed, no later event may slip out on this stream.
            let out = tokio::select! {
                biased;
                _ = epoch.changed() => return,
                _ = &mut deadline => return,
                _ = tx.closed() => return,
                _ = ticks.tick(), if bookmarks => bookmark(resource, last_version, false),
                received = live.recv() => match received {
                    Ok(event) if event.resource_version <= last_version => continue,
                    Ok(event) => {
                        last_version = event.resource_version;
                        match visible(&event, resource, namespace.as_deref(), &selectors) {
                            Some(value) => value,
                            None => continue,
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let _ = tx.send(line(&gone_event(last_version, last_version))).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            };
            if tx.send(line(&out)).await.is_err() {
                return;
            }
        }
    });
    let frames = ReceiverStream::new(rx).map(|bytes| Ok(Frame::data(bytes)));
    stream_response(frames.boxed())
}

pub(super) fn initial_objects(
    store: &Store,
    resource: Resource,
    namespace: Option<&str>,
    selectors: &Selectors,
    lines: &mut Vec<Value>,
) {
    for (_, object) in store.list(resource) {
        if in_namespace(object, namespace) && selectors.matches(object) {
            lines.push(json!({"type": "ADDED", "object": object}));
        }
    }
}

pub(super) fn gone_event(version: u64, compacted: u64) -> Value {
    json!({"type": "ERROR", "object": status_body(410, "Expired", &format!("too old resource version: {version} ({compacted})"))})
}

pub(super) fn stream_response(
    frames: futures::stream::BoxStream<'static, Result<Frame<Bytes>, Infallible>>,
) -> Response<Body> {
    let mut response = Response::new(BodyExt::boxed_unsync(StreamBody::new(frames)));
    response.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}
