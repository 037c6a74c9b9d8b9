//! Decoding one object at a time. kube-rs decodes a whole list (or watch event) into typed
//! objects, so one object with a wrongly typed field (a string where a number belongs) would
//! fail the list, and with it every object and the watch. Wrapped in [`Lenient`], each object
//! decodes on its own: an undecodable one arrives as such, with the metadata that could be read
//! and the field that could not, and everything else goes on.

use std::borrow::Cow;
use std::fmt::Debug;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

/// An object of kind `K` as the API server sent it.
#[derive(Clone, Debug)]
pub enum Lenient<K> {
    /// It decoded.
    Decoded(K),
    /// It did not: its metadata as far as it could be read, and why.
    Undecodable {
        metadata: Box<ObjectMeta>,
        error: String,
    },
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Lenient<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        // The path of what failed is tracked only on a second pass, for an object that fails:
        // tracking it costs a third of the decoding of every object of a list.
        if let Ok(object) = K::deserialize(&value) {
            return Ok(Lenient::Decoded(object));
        }
        match serde_path_to_error::deserialize::<_, K>(&value) {
            Ok(object) => Ok(Lenient::Decoded(object)),
            Err(err) => {
                let metadata = Box::new(
                    value
                        .get("metadata")
                        .and_then(|m| ObjectMeta::deserialize(m).ok())
                        .unwrap_or_default(),
                );
                let error = format!("{}: {}", err.path(), err.inner());
                Ok(Lenient::Undecodable { metadata, error })
            }
        }
    }
}

impl<K: Resource<DynamicType = ()>> Resource for Lenient<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        match self {
            Lenient::Decoded(object) => object.meta(),
            Lenient::Undecodable { metadata, .. } => metadata,
        }
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Lenient::Decoded(object) => object.meta_mut(),
            Lenient::Undecodable { metadata, .. } => metadata,
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Service;
    use kube::core::ObjectList;

    use super::*;

    #[test]
    fn one_bad_object_does_not_fail_the_list() {
        let list = r#"{"apiVersion": "v1", "kind": "ServiceList", "metadata": {"resourceVersion": "7"},
            "items": [
              {"metadata": {"name": "good", "namespace": "a"}, "spec": {"ports": [{"port": 80}]}},
              {"metadata": {"name": "bad", "namespace": "a"}, "spec": {"ports": [{"port": "eighty"}]}},
              {"metadata": 17, "spec": {}}
            ]}"#;
        let list: ObjectList<Lenient<Service>> = serde_json::from_str(list).unwrap();
        assert_eq!(list.items.len(), 3);
        assert!(
            matches!(&list.items[0], Lenient::Decoded(s) if s.meta().name.as_deref() == Some("good"))
        );
        match &list.items[1] {
            Lenient::Undecodable { metadata, error } => {
                assert_eq!(metadata.name.as_deref(), Some("bad"));
                assert!(
                    error.starts_with("spec.ports[0].port: invalid type"),
                    "{error}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(&list.items[2], Lenient::Undecodable { metadata, .. } if metadata.name.is_none())
        );
        assert_eq!(Lenient::<Service>::plural(&()), "services");
    }
}
