//! Configuration: the KubeProxyConfiguration file, the flags, and how they combine.

mod duration;
mod flags;
mod load;
mod types;
mod validate;

use std::path::PathBuf;

pub use duration::{DurationError, GoDuration};
pub use flags::{Command, Flags};
pub use load::{API_VERSION, Decoded, KIND, LoadError, decode_config, read_config_file};
pub use types::*;
pub use validate::{FieldError, IPVS_SCHEDULERS, validate};

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
    pub ignored_flags: Vec<&'static str>,
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
/// `--hostname-override`, `--master` and the logging flags.
pub fn resolve(flags: &Flags, sources: &NodeNameSources) -> Result<Settings, ConfigError> {
    let (mut config, unknown_fields, ignored_flags) = match &flags.config {
        Some(path) => {
            let decoded = read_config_file(path)?;
            (
                decoded.config,
                decoded.unknown_fields,
                flags.overridden_by_config_file(),
            )
        }
        None => (config_from_flags(flags), Vec::new(), Vec::new()),
    };
    if let Some(verbosity) = flags.verbosity {
        config.logging.verbosity = verbosity;
    }
    if let Some(format) = &flags.logging_format {
        config.logging.format = format.clone();
    }
    config.apply_defaults();
    let errors = validate(&config);
    if !errors.is_empty() {
        return Err(ConfigError::Invalid(errors));
    }

    let node_name = [
        flags.hostname_override.as_deref(),
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
        .or_else(|| flags.kubeconfig.clone());
    Ok(Settings {
        config,
        config_file: flags.config.clone(),
        node_name,
        kubeconfig,
        master: flags.master.clone().filter(|m| !m.is_empty()),
        unknown_fields,
        ignored_flags,
    })
}

/// The configuration that flags alone describe (no --config).
fn config_from_flags(flags: &Flags) -> KubeProxyConfiguration {
    let mut config = KubeProxyConfiguration::default();
    let text = |value: &Option<String>| value.clone().unwrap_or_default();
    config.mode = text(&flags.proxy_mode);
    config.cluster_cidr = text(&flags.cluster_cidr);
    config.healthz_bind_address = text(&flags.healthz_bind_address);
    config.metrics_bind_address = text(&flags.metrics_bind_address);
    config.bind_address = text(&flags.bind_address);
    config.iptables.masquerade_all = flags.masquerade_all.unwrap_or(false);
    config.ipvs.scheduler = text(&flags.ipvs_scheduler);
    config.node_port_addresses = flags.nodeport_addresses.clone().unwrap_or_default();
    config
}

#[cfg(test)]
mod tests;
