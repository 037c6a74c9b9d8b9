//! API objects read from YAML files instead of watched: what `kubectl get svc,endpointslices
//! -A -o yaml` (a List) or a stream of `---` documents holds. Objects go through the same
//! conversion and the same change tracker as watched ones, so `render` shows exactly what the
//! daemon would program for them.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice as ApiEndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_yaml_ng::Value;

use super::convert::{self, PROXY_EXCLUDING_LABELS, object_key};
use crate::model::{ChangeTracker, NodeInfo, ProxyState};

/// A file that cannot be used at all.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: document {document}: not YAML: {source}")]
    Yaml {
        path: PathBuf,
        document: usize,
        source: serde_yaml_ng::Error,
    },
}

/// The cluster state the files describe, and what in them could not be used.
#[derive(Debug, Default)]
pub struct FileObjects {
    pub state: ProxyState,
    /// Objects refused (each names the file, the object and the field), or entries dropped.
    pub problems: Vec<String>,
    /// Whether a Node named like this node was among the objects.
    pub node_found: bool,
    /// Objects of other kinds, skipped.
    pub skipped: usize,
}

/// Reads every file and builds the state this node would program (`node_name` picks the Node;
/// without `external_ips`, Services' externalIPs are dropped).
pub fn read_objects(
    paths: &[PathBuf],
    node_name: &str,
    external_ips: bool,
) -> Result<FileObjects, FilesError> {
    let mut out = FileObjects::default();
    let mut tracker = ChangeTracker::new(external_ips);
    for path in paths {
        let text = read_text(path).map_err(|source| FilesError::Read {
            path: path.clone(),
            source,
        })?;
        for (index, document) in serde_yaml_ng::Deserializer::from_str(&text).enumerate() {
            let value = Value::deserialize(document).map_err(|source| FilesError::Yaml {
                path: path.clone(),
                document: index + 1,
                source,
            })?;
            let place = format!("{}: document {}", path.display(), index + 1);
            match value.get("kind").and_then(Value::as_str) {
                Some(kind) if kind.ends_with("List") => {
                    let items = value.get("items").and_then(Value::as_sequence);
                    for (item_index, item) in items.into_iter().flatten().enumerate() {
                        let place = format!("{place}, item {}", item_index + 1);
                        out.add(&mut tracker, item.clone(), &place, node_name);
                    }
                }
                // An empty document (a trailing `---`).
                None if value.is_null() => {}
                _ => out.add(&mut tracker, value, &place, node_name),
            }
        }
    }
    out.state.apply(tracker.take_changes());
    if out.state.node.name.is_empty() {
        out.state.node = NodeInfo {
            name: node_name.to_string(),
            ..NodeInfo::default()
        };
    }
    Ok(out)
}

impl FileObjects {
    fn add(&mut self, tracker: &mut ChangeTracker, value: Value, place: &str, node_name: &str) {
        let kind = value
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        match kind.as_str() {
            "Service" => {
                let Some(service) = self.decode::<Service>(value, place, &kind) else {
                    return;
                };
                if ignored(&service.metadata) {
                    return;
                }
                let described = describe(&kind, &service.metadata);
                match convert::service_ports(&service) {
                    Ok(converted) => {
                        self.note(place, &described, converted.warnings);
                        if let Ok(key) = object_key(&service.metadata) {
                            tracker.service_updated(&key, Some(converted.value));
                        }
                    }
                    Err(err) => self.problems.push(format!("{place} ({described}): {err}")),
                }
            }
            "EndpointSlice" => {
                let Some(slice) = self.decode::<ApiEndpointSlice>(value, place, &kind) else {
                    return;
                };
                if ignored(&slice.metadata) {
                    return;
                }
                let described = describe(&kind, &slice.metadata);
                match convert::endpoint_slice(&slice) {
                    Ok(converted) => {
                        self.note(place, &described, converted.warnings);
                        if let (Ok(key), Some(slice)) =
                            (object_key(&slice.metadata), converted.value)
                        {
                            tracker.slice_updated(&key, Some(slice));
                        }
                    }
                    Err(err) => self.problems.push(format!("{place} ({described}): {err}")),
                }
            }
            "Node" => {
                let Some(node) = self.decode::<Node>(value, place, &kind) else {
                    return;
                };
                if node.metadata.name.as_deref() == Some(node_name) {
                    let converted = convert::node_info(&node);
                    self.note(place, &describe(&kind, &node.metadata), converted.warnings);
                    tracker.node_updated(Some(converted.value));
                    self.node_found = true;
                }
            }
            _ => self.skipped += 1,
        }
    }

    /// The typed object, or `None` with a problem naming the field that does not fit.
    fn decode<T: serde::de::DeserializeOwned>(
        &mut self,
        value: Value,
        place: &str,
        kind: &str,
    ) -> Option<T> {
        let name = ObjectMeta::deserialize(value.get("metadata").cloned().unwrap_or(Value::Null))
            .map(|meta| describe(kind, &meta))
            .unwrap_or_else(|_| kind.to_string());
        match serde_path_to_error::deserialize::<_, T>(value) {
            Ok(object) => Some(object),
            Err(err) => {
                self.problems
                    .push(format!("{place} ({name}): {}: {}", err.path(), err.inner()));
                None
            }
        }
    }

    fn note(&mut self, place: &str, described: &str, warnings: Vec<String>) {
        self.problems.extend(
            warnings
                .into_iter()
                .map(|warning| format!("{place} ({described}): {warning}")),
        );
    }
}

/// Whether the watches' label selector would leave this object out.
fn ignored(meta: &ObjectMeta) -> bool {
    meta.labels.as_ref().is_some_and(|labels| {
        PROXY_EXCLUDING_LABELS
            .iter()
            .any(|l| labels.contains_key(*l))
    })
}

/// `Service default/web`, as messages name objects.
fn describe(kind: &str, meta: &ObjectMeta) -> String {
    let name = meta.name.as_deref().unwrap_or("<no name>");
    match meta.namespace.as_deref() {
        Some(namespace) => format!("{kind} {namespace}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// A file's text; `-` is standard input (`kubectl get ... -o yaml | kube-proxy-rs render -`).
fn read_text(path: &Path) -> std::io::Result<String> {
    if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(path)
    }
}
