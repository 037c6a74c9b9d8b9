//! Lists: label and field selectors, namespaces, pages and their continue tokens.

use super::*;

pub(super) struct Selectors {
    labels: Selector,
    fields: Selector,
}

impl Selectors {
    pub(super) fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    pub(super) fn matches(&self, object: &Value) -> bool {
        self.labels.matches(|k| label_of(object, k)) && self.fields.matches(|k| field_of(object, k))
    }
}

pub(super) fn selectors(query: &HashMap<String, String>) -> Result<Selectors, String> {
    let parse = |name: &str| Selector::parse(query.get(name).map(String::as_str).unwrap_or(""));
    Ok(Selectors {
        labels: parse("labelSelector")?,
        fields: parse("fieldSelector")?,
    })
}

pub(super) fn in_namespace(object: &Value, namespace: Option<&str>) -> bool {
    namespace.is_none_or(|ns| object["metadata"]["namespace"].as_str() == Some(ns))
}

pub(super) fn list(
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
pub(super) struct ListPage<'a> {
    kind: String,
    #[serde(rename = "apiVersion")]
    api_version: &'a str,
    metadata: Value,
    items: Vec<&'a Value>,
}

pub(super) fn parse_continue(token: &str) -> Option<(u64, ObjectKey)> {
    let mut parts = token.splitn(3, '/');
    let version = parts.next()?.parse().ok()?;
    Some((
        version,
        (parts.next()?.to_string(), parts.next()?.to_string()),
    ))
}

/// The watch event a stream with these filters shows for a stored event, if any. A label change
/// that moves an object into or out of the selection shows as ADDED or DELETED, as upstream.
pub(super) fn visible(
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
