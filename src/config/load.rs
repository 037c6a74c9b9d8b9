//! Reading a KubeProxyConfiguration file: YAML (or JSON) to a JSON tree, as upstream's sigs.k8s.io/yaml
//! does, then a strict decode that names every field it does not know. Unknown fields do not stop the
//! program (upstream retries leniently); the caller logs them.

use std::path::Path;

use serde::de::IntoDeserializer;

use super::types::KubeProxyConfiguration;

/// The only group/version we read, as kubeadm writes it.
pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
/// The only kind we read.
pub const KIND: &str = "KubeProxyConfiguration";

/// Why a config file could not be read or decoded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("failed to read config file {path}: {reason}")]
    Read { path: String, reason: String },
    /// The file is not YAML.
    #[error("config file {path} is not valid YAML: {reason}")]
    Syntax { path: String, reason: String },
    /// The file is empty or not a mapping.
    #[error("config file {path} does not hold a KubeProxyConfiguration object")]
    NotAnObject { path: String },
    /// `apiVersion` or `kind` names something else.
    #[error("config file {path}: {field} {value:?} is not supported (want {want:?})")]
    WrongType {
        path: String,
        field: &'static str,
        value: String,
        want: &'static str,
    },
    /// A field holds a value of the wrong type or form.
    #[error("config file {path}: field {field}: {reason}")]
    Field {
        path: String,
        field: String,
        reason: String,
    },
}

/// A decoded file plus the fields it had that this version does not know (dotted paths).
#[derive(Debug)]
pub struct Decoded {
    pub config: KubeProxyConfiguration,
    pub unknown_fields: Vec<String>,
}

/// Reads and decodes the file at `path` (no defaults applied, no validation).
pub fn read_config_file(path: &Path) -> Result<Decoded, LoadError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|err| LoadError::Read {
        path: shown.clone(),
        reason: err.to_string(),
    })?;
    decode_config(&text, &shown)
}

/// Decodes config text; `origin` names it in errors.
pub fn decode_config(text: &str, origin: &str) -> Result<Decoded, LoadError> {
    let mut tree: serde_json::Value =
        serde_yaml_ng::from_str(text).map_err(|err| LoadError::Syntax {
            path: origin.into(),
            reason: err.to_string(),
        })?;
    let serde_json::Value::Object(object) = &tree else {
        return Err(LoadError::NotAnObject {
            path: origin.into(),
        });
    };
    for (field, want) in [("apiVersion", API_VERSION), ("kind", KIND)] {
        match object.get(field) {
            Some(serde_json::Value::String(value)) if value == want => {}
            Some(serde_json::Value::Null) | None => {}
            Some(other) => {
                let value = other
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| other.to_string());
                return Err(LoadError::WrongType {
                    path: origin.into(),
                    field,
                    value,
                    want,
                });
            }
        }
    }
    drop_nulls(&mut tree);

    let mut unknown_fields = Vec::new();
    let mut track = serde_path_to_error::Track::new();
    let deserializer = serde_path_to_error::Deserializer::new(tree.into_deserializer(), &mut track);
    let result =
        serde_ignored::deserialize(deserializer, |path| unknown_fields.push(path.to_string()));
    match result {
        Ok(config) => Ok(Decoded {
            config,
            unknown_fields,
        }),
        Err(err) => Err(LoadError::Field {
            path: origin.into(),
            field: track.path().to_string(),
            reason: err.to_string(),
        }),
    }
}

/// Go's decoder leaves a field untouched when the document says `null`; removing such keys gives
/// serde's `#[serde(default)]` the same meaning.
fn drop_nulls(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(drop_nulls);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}
