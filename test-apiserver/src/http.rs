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

mod discovery;
mod list;
mod watch;

use crate::Shared;
use crate::selector::{Selector, field_of, label_of};
use crate::store::{EventType, ObjectKey, Resource, Store, StoredEvent, WriteError};
use discovery::{GROUPS, group, resource_list};
use list::{list, selectors};
use watch::watch;

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
    record(&shared, &request);
    wait_while_stalled(&shared).await;
    if let Some(response) = injected_failure(&shared, &request) {
        return response;
    }
    let Some(target) = route(&path) else {
        return status(
            404,
            "NotFound",
            &format!("the server could not find the requested resource ({path})"),
        );
    };
    if let Some(response) = refusal(&shared, &target, request.method(), &query) {
        return response;
    }
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

/// Logs the request's method, path and query for the tests to read.
fn record(shared: &Shared, request: &Request<Incoming>) {
    let path = request.uri().path();
    let line = match request.uri().query() {
        Some(q) => format!("{} {path}?{q}", request.method()),
        None => format!("{} {path}", request.method()),
    };
    shared
        .requests
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(line);
}

/// Holds the request while the tests have the server stalled.
async fn wait_while_stalled(shared: &Shared) {
    let mut stalled = shared.stalled.subscribe();
    while *stalled.borrow_and_update() {
        if stalled.changed().await.is_err() {
            break;
        }
    }
}

/// The next failure the tests queued for this kind of request (lists have their own queue),
/// as the response it makes.
fn injected_failure(shared: &Shared, request: &Request<Incoming>) -> Option<Response<Body>> {
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
    let code = list_failure.or_else(|| {
        shared
            .failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    })?;
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
    Some(response)
}

/// The answer for a resource the tests told the server to refuse.
fn refusal(
    shared: &Shared,
    target: &Target,
    method: &Method,
    query: &HashMap<String, String>,
) -> Option<Response<Body>> {
    let resource = match target {
        Target::Collection { resource, .. } | Target::Object { resource, .. } => *resource,
        _ => return None,
    };
    let later_page = query.get("continue").is_some_and(|token| !token.is_empty());
    let code = shared.refused.code(resource).or_else(|| {
        later_page
            .then(|| shared.refused_later_pages.code(resource))
            .flatten()
    })?;
    Some(match code {
        404 => {
            let mut response = bytes_response(404, b"404 page not found\n".to_vec());
            response.headers_mut().insert(
                "content-type",
                hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            response
        }
        403 => {
            let verb = if *method == Method::GET {
                "list"
            } else {
                "write"
            };
            let message = format!(
                "{plural} is forbidden: User \"system:serviceaccount:kube-system:kube-proxy\" cannot {verb} resource \"{plural}\" at the cluster scope",
                plural = resource.plural()
            );
            status(403, "Forbidden", &message)
        }
        other => status(other, "InternalError", "refused by the test"),
    })
}

fn route(path: &str) -> Option<Target> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (api_version, rest): (&'static str, &[&str]) = match segments.as_slice() {
        ["version"] => return Some(Target::Version),
        ["api"] => return Some(Target::CoreVersions),
        ["apis"] => return Some(Target::Groups),
        ["apis", "discovery.k8s.io"] => return Some(Target::Group("discovery.k8s.io")),
        ["apis", "networking.k8s.io"] => return Some(Target::Group("networking.k8s.io")),
        ["apis", "events.k8s.io"] => return Some(Target::Group("events.k8s.io")),
        ["api", "v1"] => return Some(Target::Resources("v1")),
        ["apis", "discovery.k8s.io", "v1"] => {
            return Some(Target::Resources("discovery.k8s.io/v1"));
        }
        ["apis", "networking.k8s.io", "v1"] => {
            return Some(Target::Resources("networking.k8s.io/v1"));
        }
        ["apis", "events.k8s.io", "v1"] => {
            return Some(Target::Resources("events.k8s.io/v1"));
        }
        ["api", "v1", rest @ ..] => ("v1", rest),
        ["apis", "discovery.k8s.io", "v1", rest @ ..] => ("discovery.k8s.io/v1", rest),
        ["apis", "networking.k8s.io", "v1", rest @ ..] => ("networking.k8s.io/v1", rest),
        ["apis", "events.k8s.io", "v1", rest @ ..] => ("events.k8s.io/v1", rest),
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
