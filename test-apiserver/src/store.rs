//! The objects the server holds, their resource versions, and the event history watches replay.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde_json::{Value, json};

/// A kind of object the server serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    Services,
    EndpointSlices,
    Nodes,
    ConfigMaps,
    Events,
    /// events.k8s.io/v1 Events (what kube-proxy posts since 1.20).
    EventsV1,
    ServiceCidrs,
}

impl Resource {
    /// Every served resource.
    pub const ALL: [Resource; 7] = [
        Resource::Services,
        Resource::EndpointSlices,
        Resource::Nodes,
        Resource::ConfigMaps,
        Resource::Events,
        Resource::EventsV1,
        Resource::ServiceCidrs,
    ];

    /// The URL plural.
    pub fn plural(self) -> &'static str {
        match self {
            Resource::Services => "services",
            Resource::EndpointSlices => "endpointslices",
            Resource::Nodes => "nodes",
            Resource::ConfigMaps => "configmaps",
            Resource::Events | Resource::EventsV1 => "events",
            Resource::ServiceCidrs => "servicecidrs",
        }
    }

    /// The object kind.
    pub fn kind(self) -> &'static str {
        match self {
            Resource::Services => "Service",
            Resource::EndpointSlices => "EndpointSlice",
            Resource::Nodes => "Node",
            Resource::ConfigMaps => "ConfigMap",
            Resource::Events | Resource::EventsV1 => "Event",
            Resource::ServiceCidrs => "ServiceCIDR",
        }
    }

    /// The apiVersion of the group/version it is served under.
    pub fn api_version(self) -> &'static str {
        match self {
            Resource::EndpointSlices => "discovery.k8s.io/v1",
            Resource::ServiceCidrs => "networking.k8s.io/v1",
            Resource::EventsV1 => "events.k8s.io/v1",
            _ => "v1",
        }
    }

    /// Whether objects live in namespaces.
    pub fn namespaced(self) -> bool {
        !matches!(self, Resource::Nodes | Resource::ServiceCidrs)
    }

    /// The resource for a kind name.
    pub fn from_kind(kind: &str) -> Option<Resource> {
        Resource::ALL.into_iter().find(|r| r.kind() == kind)
    }

    /// The resource served at `api_version` + `plural`.
    pub fn from_path(api_version: &str, plural: &str) -> Option<Resource> {
        Resource::ALL
            .into_iter()
            .find(|r| r.api_version() == api_version && r.plural() == plural)
    }
}

/// What happened to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    /// The watch protocol's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, kept for watches to replay.
#[derive(Debug)]
pub struct StoredEvent {
    pub resource_version: u64,
    pub resource: Resource,
    pub event_type: EventType,
    /// The object before the change (for selector transitions), absent on add.
    pub old: Option<Value>,
    /// The object after the change (for delete: as it was when deleted).
    pub object: Value,
}

/// An object's key within its resource.
pub type ObjectKey = (String, String);

/// Why a write was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum WriteError {
    NotFound,
    AlreadyExists,
    Invalid(String),
}

/// Objects, versions and history.
#[derive(Debug)]
pub struct Store {
    pub resource_version: u64,
    objects: BTreeMap<Resource, BTreeMap<ObjectKey, Value>>,
    history: VecDeque<Arc<StoredEvent>>,
    history_limit: usize,
    /// Events at or below this version are gone: a watch from an older version gets 410 Gone.
    pub compacted: u64,
    next_uid: u64,
}

impl Store {
    /// An empty store keeping up to `history_limit` events.
    pub fn new(history_limit: usize) -> Self {
        Store {
            resource_version: 1,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            history_limit,
            compacted: 0,
            next_uid: 1,
        }
    }

    /// The key an object is stored under, from its metadata.
    pub fn key_of(resource: Resource, object: &Value) -> Result<ObjectKey, WriteError> {
        let name = object["metadata"]["name"]
            .as_str()
            .filter(|n| !n.is_empty());
        let name = name.ok_or_else(|| WriteError::Invalid("metadata.name is required".into()))?;
        let namespace = if resource.namespaced() {
            object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_string()
        } else {
            String::new()
        };
        Ok((namespace, name.to_string()))
    }

    /// Every object of a resource, in key order.
    pub fn list(&self, resource: Resource) -> impl Iterator<Item = (&ObjectKey, &Value)> {
        self.list_after(resource, None)
    }

    /// The objects of a resource after `after` (all of them without it), in key order.
    pub fn list_after<'a>(
        &'a self,
        resource: Resource,
        after: Option<&ObjectKey>,
    ) -> impl Iterator<Item = (&'a ObjectKey, &'a Value)> {
        use std::ops::Bound;
        let start = match after {
            Some(key) => Bound::Excluded(key.clone()),
            None => Bound::Unbounded,
        };
        self.objects
            .get(&resource)
            .into_iter()
            .flat_map(move |objects| objects.range((start.clone(), Bound::Unbounded)))
    }

    /// One object.
    pub fn get(&self, resource: Resource, key: &ObjectKey) -> Option<&Value> {
        self.objects.get(&resource)?.get(key)
    }

    /// Creates (`must_exist` false, `may_exist` false), replaces (`must_exist` true) or upserts.
    pub fn write(
        &mut self,
        resource: Resource,
        mut object: Value,
        must_exist: bool,
        may_exist: bool,
    ) -> Result<(Value, Arc<StoredEvent>), WriteError> {
        let key = Self::key_of(resource, &object)?;
        let old = self.get(resource, &key).cloned();
        match (&old, must_exist, may_exist) {
            (None, true, _) => return Err(WriteError::NotFound),
            (Some(_), false, false) => return Err(WriteError::AlreadyExists),
            _ => {}
        }
        self.resource_version += 1;
        let meta = object
            .as_object_mut()
            .ok_or_else(|| WriteError::Invalid("object must be a JSON object".into()))?
            .entry("metadata")
            .or_insert_with(|| json!({}));
        meta["resourceVersion"] = json!(self.resource_version.to_string());
        if resource.namespaced() {
            meta["namespace"] = json!(key.0);
        }
        let uid = match old.as_ref().and_then(|o| o["metadata"]["uid"].as_str()) {
            Some(uid) => uid.to_string(),
            None => {
                self.next_uid += 1;
                format!("00000000-0000-4000-8000-{:012}", self.next_uid)
            }
        };
        meta["uid"] = json!(uid);
        if meta.get("creationTimestamp").is_none_or(Value::is_null) {
            meta["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        object["kind"] = json!(resource.kind());
        object["apiVersion"] = json!(resource.api_version());
        self.objects
            .entry(resource)
            .or_default()
            .insert(key, object.clone());
        let event_type = if old.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        let event = self.record(resource, event_type, old, object.clone());
        Ok((object, event))
    }

    /// Deletes an object.
    pub fn delete(
        &mut self,
        resource: Resource,
        key: &ObjectKey,
    ) -> Result<(Value, Arc<StoredEvent>), WriteError> {
        let mut object = self
            .objects
            .get_mut(&resource)
            .and_then(|m| m.remove(key))
            .ok_or(WriteError::NotFound)?;
        self.resource_version += 1;
        object["metadata"]["resourceVersion"] = json!(self.resource_version.to_string());
        let event = self.record(
            resource,
            EventType::Deleted,
            Some(object.clone()),
            object.clone(),
        );
        Ok((object, event))
    }

    fn record(
        &mut self,
        resource: Resource,
        event_type: EventType,
        old: Option<Value>,
        object: Value,
    ) -> Arc<StoredEvent> {
        let event = Arc::new(StoredEvent {
            resource_version: self.resource_version,
            resource,
            event_type,
            old,
            object,
        });
        self.history.push_back(event.clone());
        while self.history.len() > self.history_limit {
            if let Some(evicted) = self.history.pop_front() {
                self.compacted = evicted.resource_version;
            }
        }
        event
    }

    /// Events after `resource_version`, or `None` when some of them were compacted away.
    pub fn events_since(&self, resource_version: u64) -> Option<Vec<Arc<StoredEvent>>> {
        if resource_version < self.compacted {
            return None;
        }
        Some(
            self.history
                .iter()
                .filter(|e| e.resource_version > resource_version)
                .cloned()
                .collect(),
        )
    }

    /// Forgets all history: every watch from an older version must relist.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.resource_version;
    }
}
