//! The HTTP side: routing, discovery, list, watch and writes.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use crate::Shared;
use crate::selector::{Selector, field_of, label_of};
use crate::store::{EventType, ObjectKey, Resource, Store, StoredEvent, WriteError};

type Body = UnsyncBoxBody<Bytes, Infallible>;

pub(crate) async fn serve_connection(shared: Arc<Shared>, stream: TcpStream) {
    let service = hyper::service::service_fn(move |request| {
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(handle(shared, request).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

/// What a request names, once its path is read.
enum Target {
    Version,
    CoreVersions,
    Groups,
    Group(&'static str),
    Resources(&'static str),
    Collection {
        resource: Resource,
        namespace: Option<String>,
    },
    Object {
        resource: Resource,
        key: ObjectKey,
    },
}

async fn handle(shared: Arc<Shared>, request: Request<Incoming>) -> Response<Body> {
    let path = request.uri().path().to_string();
    let query: HashMap<String, String> = request
        .uri()
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let line = match request.uri().query() {
        Some(q) => format!("{} {path}?{q}", request.method()),
        None => format!("{} {path}", request.method()),
    };
    shared
        .requests
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(line);

    let mut stalled = shared.stalled.subscribe();
    while *stalled.borrow_and_update() {
        if stalled.changed().await.is_err() {
            break;
        }
    }
    let is_list = request.method() == hyper::Method::GET
        && !request
            .uri()
            .query()
            .is_some_and(|q| q.contains("watch=true") || q.contains("watch=1"));
    let list_failure = if is_list {
        shared
            .list_failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    } else {
        None
    };
    let failure = list_failure.or_else(|| {
        shared
            .failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    });
    if let Some(code) = failure {
        let reason = if code == 429 {
            "TooManyRequests"
        } else {
            "InternalError"
        };
        let mut response = status(code, reason, "injected failure");
        if code == 429 {
            response
                .headers_mut()
                .insert("retry-after", hyper::header::HeaderValue::from_static("1"));
        }
        return response;
    }

    let Some(target) = route(&path) else {
        return status(
            404,
            "NotFound",
            &format!("the server could not find the requested resource ({path})"),
        );
    };
    let method = request.method().clone();
    match (method, target) {
        (Method::GET, Target::Version) => json_response(
            200,
            json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0", "platform": "linux/amd64"}),
        ),
        (Method::GET, Target::CoreVersions) => json_response(
            200,
            json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}),
        ),
        (Method::GET, Target::Groups) => json_response(
            200,
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": GROUPS.iter().map(|g| group(g)).collect::<Vec<_>>()}),
        ),
        (Method::GET, Target::Group(name)) => json_response(200, group(name)),
        (Method::GET, Target::Resources(api_version)) => {
            json_response(200, resource_list(api_version))
        }
        (
            Method::GET,
            Target::Collection {
                resource,
                namespace,
            },
        ) => {
            let selectors = match selectors(&query) {
                Ok(s) => s,
                Err(message) => return status(400, "BadRequest", &message),
            };
            if matches!(query.get("watch").map(String::as_str), Some("true" | "1")) {
                watch(&shared, resource, namespace, selectors, &query)
            } else {
                list(&shared, resource, namespace.as_deref(), &selectors, &query)
            }
        }
        (Method::GET, Target::Object { resource, key }) => match shared.store().get(resource, &key)
        {
            Some(object) => json_response(200, object.clone()),
            None => not_found(resource, &key),
        },
        (
            Method::POST,
            Target::Collection {
                resource,
                namespace,
            },
        ) => {
            let mut object = match read_json(request).await {
                Ok(object) => object,
                Err(response) => return response,
            };
            if let Some(namespace) = namespace {
                object["metadata"]["namespace"] = json!(namespace);
            }
            written(resource, shared.write(resource, object, false, false), 201)
        }
        (Method::PUT, Target::Object { resource, key }) => {
            let mut object = match read_json(request).await {
                Ok(object) => object,
                Err(response) => return response,
            };
            object["metadata"]["name"] = json!(key.1);
            object["metadata"]["namespace"] = json!(key.0);
            written(resource, shared.write(resource, object, false, true), 200)
        }
        (Method::PATCH, Target::Object { resource, key }) => {
            let patch = match read_json(request).await {
                Ok(patch) => patch,
                Err(response) => return response,
            };
            let Some(mut object) = shared.store().get(resource, &key).cloned() else {
                return not_found(resource, &key);
            };
            merge_patch(&mut object, &patch);
            written(resource, shared.write(resource, object, true, true), 200)
        }
        (Method::DELETE, Target::Object { resource, key }) => match shared.delete(resource, &key) {
            Ok(object) => json_response(200, object),
            Err(_) => not_found(resource, &key),
        },
        _ => status(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        ),
    }
}

fn route(path: &str) -> Option<Target> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (api_version, rest): (&'static str, &[&str]) = match segments.as_slice() {
        ["version"] => return Some(Target::Version),
        ["api"] => return Some(Target::CoreVersions),
        ["apis"] => return Some(Target::Groups),
        ["apis", "discovery.k8s.io"] => return Some(Target::Group("discovery.k8s.io")),
        ["apis", "networking.k8s.io"] => return Some(Target::Group("networking.k8s.io")),
        ["api", "v1"] => return Some(Target::Resources("v1")),
        ["apis", "discovery.k8s.io", "v1"] => {
            return Some(Target::Resources("discovery.k8s.io/v1"));
        }
        ["apis", "networking.k8s.io", "v1"] => {
            return Some(Target::Resources("networking.k8s.io/v1"));
        }
        ["api", "v1", rest @ ..] => ("v1", rest),
        ["apis", "discovery.k8s.io", "v1", rest @ ..] => ("discovery.k8s.io/v1", rest),
        ["apis", "networking.k8s.io", "v1", rest @ ..] => ("networking.k8s.io/v1", rest),
        _ => return None,
    };
    let found = |plural: &str| Resource::from_path(api_version, plural);
    match rest {
        [plural] => Some(Target::Collection {
            resource: found(plural)?,
            namespace: None,
        }),
        [plural, name] => {
            let resource = found(plural).filter(|r| !r.namespaced())?;
            Some(Target::Object {
                resource,
                key: (String::new(), name.to_string()),
            })
        }
        ["namespaces", namespace, plural] => {
            let resource = found(plural).filter(|r| r.namespaced())?;
            Some(Target::Collection {
                resource,
                namespace: Some(namespace.to_string()),
            })
        }
        ["namespaces", namespace, plural, name] => {
            let resource = found(plural).filter(|r| r.namespaced())?;
            Some(Target::Object {
                resource,
                key: (namespace.to_string(), name.to_string()),
            })
        }
        _ => None,
    }
}

struct Selectors {
    labels: Selector,
    fields: Selector,
}

impl Selectors {
    fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    fn matches(&self, object: &Value) -> bool {
        self.labels.matches(|k| label_of(object, k)) && self.fields.matches(|k| field_of(object, k))
    }
}

fn selectors(query: &HashMap<String, String>) -> Result<Selectors, String> {
    let parse = |name: &str| Selector::parse(query.get(name).map(String::as_str).unwrap_or(""));
    Ok(Selectors {
        labels: parse("labelSelector")?,
        fields: parse("fieldSelector")?,
    })
}

fn in_namespace(object: &Value, namespace: Option<&str>) -> bool {
    namespace.is_none_or(|ns| object["metadata"]["namespace"].as_str() == Some(ns))
}

fn list(
    shared: &Shared,
    resource: Resource,
    namespace: Option<&str>,
    selectors: &Selectors,
    query: &HashMap<String, String>,
) -> Response<Body> {
    let store = shared.store();
    let limit: usize = query.get("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
    let (list_version, after) = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => match parse_continue(token) {
            Some((version, _)) if version < store.compacted => {
                return status(
                    410,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent list result.",
                );
            }
            Some((version, key)) => (version, Some(key)),
            None => return status(400, "BadRequest", "invalid continue token"),
        },
        None => (store.resource_version, None),
    };
    let mut matching = store
        .list_after(resource, after.as_ref())
        .filter(|(_, object)| in_namespace(object, namespace) && selectors.matches(object));
    let page = if limit > 0 { limit } else { usize::MAX };
    let items: Vec<(&ObjectKey, &Value)> = matching.by_ref().take(page).collect();
    // As upstream: `remainingItemCount` only for lists without selectors (counting the rest of
    // a selection would read it all for every page).
    let remaining = selectors.is_empty().then(|| matching.by_ref().count());
    let more = remaining.map_or_else(|| matching.next().is_some(), |count| count > 0);
    let mut metadata = json!({"resourceVersion": list_version.to_string()});
    if more && let Some((last, _)) = items.last() {
        metadata["continue"] = json!(format!("{list_version}/{}/{}", last.0, last.1));
        if let Some(count) = remaining {
            metadata["remainingItemCount"] = json!(count);
        }
    }
    // Written from the stored objects as they are (no copy of them first).
    let page = ListPage {
        kind: format!("{}List", resource.kind()),
        api_version: resource.api_version(),
        metadata,
        items: items.into_iter().map(|(_, object)| object).collect(),
    };
    match serde_json::to_vec(&page) {
        Ok(body) => bytes_response(200, body),
        Err(_) => status(500, "InternalError", "a list page could not be written"),
    }
}

/// One page of a list, as the API server writes it.
#[derive(serde::Serialize)]
struct ListPage<'a> {
    kind: String,
    #[serde(rename = "apiVersion")]
    api_version: &'a str,
    metadata: Value,
    items: Vec<&'a Value>,
}

fn parse_continue(token: &str) -> Option<(u64, ObjectKey)> {
    let mut parts = token.splitn(3, '/');
    let version = parts.next()?.parse().ok()?;
    Some((
        version,
        (parts.next()?.to_string(), parts.next()?.to_string()),
    ))
}

/// The watch event a stream with these filters shows for a stored event, if any. A label change
/// that moves an object into or out of the selection shows as ADDED or DELETED, as upstream.
fn visible(
    event: &StoredEvent,
    resource: Resource,
    namespace: Option<&str>,
    selectors: &Selectors,
) -> Option<Value> {
    if event.resource != resource || !in_namespace(&event.object, namespace) {
        return None;
    }
    let now = selectors.matches(&event.object);
    let before = event.old.as_ref().is_some_and(|old| selectors.matches(old));
    let shown = match (event.event_type, before, now) {
        (EventType::Added, _, true) => EventType::Added,
        (EventType::Modified, true, true) => EventType::Modified,
        (EventType::Modified, false, true) => EventType::Added,
        (EventType::Modified, true, false) => EventType::Deleted,
        (EventType::Deleted, true, _) => EventType::Deleted,
        _ => return None,
    };
    Some(json!({"type": shown.as_str(), "object": event.object}))
}

fn bookmark(resource: Resource, version: u64, initial_events_end: bool) -> Value {
    let mut metadata = json!({"resourceVersion": version.to_string()});
    if initial_events_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({"type": "BOOKMARK", "object": {"kind": resource.kind(), "apiVersion": resource.api_version(), "metadata": metadata}})
}

fn line(value: &Value) -> Bytes {
    let mut text = value.to_string();
    text.push('\n');
    Bytes::from(text)
}

fn watch(
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

fn initial_objects(
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

fn gone_event(version: u64, compacted: u64) -> Value {
    json!({"type": "ERROR", "object": status_body(410, "Expired", &format!("too old resource version: {version} ({compacted})"))})
}

fn stream_response(
    frames: futures::stream::BoxStream<'static, Result<Frame<Bytes>, Infallible>>,
) -> Response<Body> {
    let mut response = Response::new(BodyExt::boxed_unsync(StreamBody::new(frames)));
    response.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

async fn read_json(request: Request<Incoming>) -> Result<Value, Response<Body>> {
    let bytes = match request.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) => return Err(status(400, "BadRequest", &format!("reading body: {err}"))),
    };
    serde_json::from_slice(&bytes)
        .map_err(|err| status(400, "BadRequest", &format!("body is not JSON: {err}")))
}

fn written(resource: Resource, result: Result<Value, WriteError>, code: u16) -> Response<Body> {
    match result {
        Ok(object) => json_response(code, object),
        Err(WriteError::AlreadyExists) => status(
            409,
            "AlreadyExists",
            &format!("{} already exists", resource.plural()),
        ),
        Err(WriteError::NotFound) => {
            status(404, "NotFound", &format!("{} not found", resource.plural()))
        }
        Err(WriteError::Invalid(message)) => status(422, "Invalid", &message),
    }
}

/// RFC 7386 JSON merge patch.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Value::Object(target) = target {
        for (key, value) in patch {
            if value.is_null() {
                target.remove(key);
            } else {
                merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

fn not_found(resource: Resource, key: &ObjectKey) -> Response<Body> {
    status(
        404,
        "NotFound",
        &format!("{} \"{}\" not found", resource.plural(), key.1),
    )
}

fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code})
}

fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    json_response(code, status_body(code, reason, message))
}

fn json_response(code: u16, value: Value) -> Response<Body> {
    bytes_response(code, value.to_string().into_bytes())
}

/// A response with a JSON `body`.
fn bytes_response(code: u16, body: Vec<u8>) -> Response<Body> {
    let mut response = Response::new(BodyExt::boxed_unsync(Full::new(Bytes::from(body))));
    *response.status_mut() =
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

/// The API groups served besides the core group.
const GROUPS: [&str; 2] = ["discovery.k8s.io", "networking.k8s.io"];

fn group(name: &str) -> Value {
    let version = format!("{name}/v1");
    json!({
        "kind": "APIGroup", "apiVersion": "v1", "name": name,
        "versions": [{"groupVersion": version, "version": "v1"}],
        "preferredVersion": {"groupVersion": version, "version": "v1"}
    })
}

fn resource_list(api_version: &str) -> Value {
    let resources: Vec<Value> = Resource::ALL
        .into_iter()
        .filter(|r| r.api_version() == api_version)
        .map(|r| {
            json!({
                "name": r.plural(), "singularName": r.kind().to_lowercase(), "namespaced": r.namespaced(),
                "kind": r.kind(), "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]
            })
        })
        .collect();
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": api_version, "resources": resources})
}
