//! Configuration: the KubeProxyConfiguration file, the flags, and how they combine.

mod canonical;
mod duration;
pub mod feature_gates;
mod flags;
mod load;
mod types;
mod validate;
mod write;

use std::path::PathBuf;

pub use canonical::canonical_addresses;
pub use duration::{DurationError, GoDuration};
pub use flags::{
    FlagError, Flags, Kind, Role, SUBCOMMANDS, Spec, VersionRequest, retired_flags, specs, usage,
};
pub use load::{API_VERSION, Decoded, KIND, LoadError, decode_config, read_config_file};
pub use types::*;
pub use validate::{FieldError, IPVS_SCHEDULERS, validate};
pub use write::{config_yaml, configz_json};

/// The Kubernetes release whose kube-proxy this program stands in for (its flags, feature
/// gates, configuration and metrics).
pub const KUBERNETES_VERSION: &str = "v1.37.0";

/// [`KUBERNETES_VERSION`]'s major and minor numbers ("1", "37"), as `version.Info` and
/// `kubernetes_build_info` give them.
pub fn kubernetes_major_minor() -> (&'static str, &'static str) {
    let mut parts = KUBERNETES_VERSION.trim_start_matches('v').split('.');
    (parts.next().unwrap_or(""), parts.next().unwrap_or(""))
}

/// Why the configuration cannot be used; each says the field and the value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read or decoded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// One or more fields hold values upstream would refuse.
    #[error("invalid configuration: {}", join(.0))]
    Invalid(Vec<FieldError>),
    /// No node name could be found.
    #[error("cannot determine this node's name: set --hostname-override or NODE_NAME")]
    NoNodeName,
    /// `--hostname-override` held only blanks.
    #[error("empty hostname-override is invalid")]
    EmptyHostnameOverride,
    /// A feature gate upstream does not know, or one locked to its default.
    #[error(transparent)]
    FeatureGate(#[from] feature_gates::GateError),
}

fn join(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Everything the daemon needs to start, after flags and file are combined.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The defaulted, validated configuration.
    pub config: KubeProxyConfiguration,
    /// The file it came from, if any (watched for changes by the daemon).
    pub config_file: Option<PathBuf>,
    /// This node's name.
    pub node_name: String,
    /// Where the kubeconfig is, if anywhere (else in-cluster).
    pub kubeconfig: Option<PathBuf>,
    /// The API server address that overrides the kubeconfig's.
    pub master: Option<String>,
    /// Fields the file held that this version does not know.
    pub unknown_fields: Vec<String>,
    /// Flags that were given but that the file overrides.
    pub ignored_flags: Vec<String>,
    /// What deserves a warning in the log: deprecated, retired or ineffective flags, GA and
    /// deprecated feature gates that were set.
    pub warnings: Vec<String>,
    /// The version to report instead of ours (`--version=vX.Y.Z`).
    pub reported_version: Option<String>,
}

/// Where a node name can come from besides the flags and the file.
#[derive(Clone, Debug, Default)]
pub struct NodeNameSources {
    /// The NODE_NAME environment variable (from the downward API in the DaemonSet).
    pub env_node_name: Option<String>,
    /// The machine's hostname.
    pub hostname: Option<String>,
}

/// Combines flags and file as upstream does: with `--config` the file wins, except for
/// `--hostname-override`, `--master` and the logging flags; without it, the flags alone make
/// the configuration.
pub fn resolve(flags: &Flags, sources: &NodeNameSources) -> Result<Settings, ConfigError> {
    let config_file = flags.config();
    let (mut config, unknown_fields, ignored_flags) = match &config_file {
        Some(path) => {
            let mut decoded = read_config_file(path)?;
            flags.apply_logging_to(&mut decoded.config);
            (
                decoded.config,
                decoded.unknown_fields,
                flags.overridden_by_config_file(),
            )
        }
        None => {
            let mut config = KubeProxyConfiguration::default();
            flags.apply_to(&mut config);
            (config, Vec::new(), Vec::new())
        }
    };
    // The deprecated port flags, which upstream folds in only without a file: port 0 turns the
    // server off; another port goes to an address given without one.
    let mut disabled = Vec::new();
    if config_file.is_none() && flags.write_config_to().is_none() {
        for (flag, address) in [
            ("healthz-port", &mut config.healthz_bind_address),
            ("metrics-port", &mut config.metrics_bind_address),
        ] {
            match flags.deprecated_port(flag) {
                Some(0) => disabled.push(flag),
                Some(port) if !address.is_empty() && !has_port(address) => {
                    *address = if address.contains(':') {
                        format!("[{address}]:{port}")
                    } else {
                        format!("{address}:{port}")
                    };
                }
                _ => {}
            }
        }
    }
    config.apply_defaults();
    if disabled.contains(&"healthz-port") {
        config.healthz_bind_address.clear();
    }
    if disabled.contains(&"metrics-port") {
        config.metrics_bind_address.clear();
    }
    let mut warnings = flags.warnings();
    warnings.extend(feature_gates::check(&config.feature_gates)?);
    canonical_addresses(&mut config);
    let errors = validate(&config);
    if !errors.is_empty() {
        return Err(ConfigError::Invalid(errors));
    }

    // Upstream trims and lower-cases --hostname-override, and refuses one of blanks only.
    let override_flag = match flags.hostname_override() {
        Some(name) if !name.is_empty() && name.trim().is_empty() => {
            return Err(ConfigError::EmptyHostnameOverride);
        }
        other => other,
    };
    let node_name = [
        override_flag.as_deref(),
        Some(config.hostname_override.as_str()),
        sources.env_node_name.as_deref(),
        sources.hostname.as_deref(),
    ]
    .into_iter()
    .flatten()
    .map(|name| name.trim().to_lowercase())
    .find(|name| !name.is_empty())
    .ok_or(ConfigError::NoNodeName)?;

    let kubeconfig = Some(config.client_connection.kubeconfig.clone())
        .filter(|path| !path.is_empty())
        .map(PathBuf::from)
        .or_else(|| flags.kubeconfig());
    Ok(Settings {
        config,
        config_file,
        node_name,
        kubeconfig,
        master: flags.master(),
        unknown_fields,
        ignored_flags,
        warnings,
        reported_version: None,
    })
}

/// Whether an `ip` / `ip:port` / `[ipv6]:port` value carries a port.
fn has_port(address: &str) -> bool {
    if address.starts_with('[') {
        return address.contains("]:");
    }
    address.parse::<std::net::IpAddr>().is_err() && address.contains(':')
}

#[cfg(test)]
mod tests;
