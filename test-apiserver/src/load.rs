//! Reading objects from YAML or JSON as `kubectl get -o yaml` prints them: a single object, a
//! `List`, or a multi-document stream.

use serde::Deserialize;
use serde_json::Value;

/// Every object in `text`, with Lists flattened.
pub fn objects_from_yaml(text: &str) -> Result<Vec<Value>, String> {
    let mut objects = Vec::new();
    for (index, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value =
            Value::deserialize(document).map_err(|err| format!("document {}: {err}", index + 1))?;
        match value {
            Value::Null => {}
            Value::Object(ref map)
                if map
                    .get("kind")
                    .and_then(Value::as_str)
                    .is_some_and(|k| k.ends_with("List")) =>
            {
                objects.extend(
                    map.get("items")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default(),
                );
            }
            Value::Object(_) => objects.push(value),
            other => {
                return Err(format!(
                    "document {}: expected an object, got {other}",
                    index + 1
                ));
            }
        }
    }
    Ok(objects)
}
