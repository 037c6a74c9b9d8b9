//! Discovery: the API groups and the resources each serves.

use super::*;

/// The API groups served besides the core group.
pub(super) const GROUPS: [&str; 3] = ["discovery.k8s.io", "events.k8s.io", "networking.k8s.io"];

pub(super) fn group(name: &str) -> Value {
    let version = format!("{name}/v1");
    json!({
        "kind": "APIGroup", "apiVersion": "v1", "name": name,
        "versions": [{"groupVersion": version, "version": "v1"}],
        "preferredVersion": {"groupVersion": version, "version": "v1"}
    })
}

pub(super) fn resource_list(api_version: &str) -> Value {
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
