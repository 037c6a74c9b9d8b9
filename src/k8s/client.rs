//! Building the API client the way upstream does: a kubeconfig (from the config file's
//! `clientConnection.kubeconfig` or `--kubeconfig`), `--master` overriding its server, else in-cluster.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file could not be read or parsed.
    #[error("failed to load kubeconfig {path}: {reason}")]
    Kubeconfig { path: String, reason: String },
    /// `--master` is not a URL.
    #[error("invalid --master {master:?}: {reason}")]
    Master { master: String, reason: String },
    /// Neither a kubeconfig, `--master` nor the in-cluster environment was usable.
    #[error("no kubeconfig or --master given and not running in a cluster: {0}")]
    InCluster(String),
    /// The client itself could not be built (TLS settings, ...).
    #[error("failed to build the API client: {0}")]
    Build(String),
}

/// Builds the client.
pub async fn build_client(
    kubeconfig: Option<&Path>,
    master: Option<&str>,
) -> Result<Client, ClientError> {
    let mut config = match kubeconfig {
        Some(path) => {
            let shown = path.display().to_string();
            let file = Kubeconfig::read_from(path).map_err(|err| ClientError::Kubeconfig {
                path: shown.clone(),
                reason: err.to_string(),
            })?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|err| ClientError::Kubeconfig {
                    path: shown,
                    reason: err.to_string(),
                })?
        }
        None if master.is_some() => Config::new(parse_master(master.unwrap_or_default())?),
        None => {
            tracing::warn!(
                "Neither --kubeconfig nor --master was specified. Using the inClusterConfig."
            );
            Config::incluster().map_err(|err| ClientError::InCluster(err.to_string()))?
        }
    };
    if let Some(master) = master {
        config.cluster_url = parse_master(master)?;
    }
    Client::try_from(config).map_err(|err| ClientError::Build(err.to_string()))
}

fn parse_master(master: &str) -> Result<http::Uri, ClientError> {
    master
        .parse()
        .map_err(|err: http::uri::InvalidUri| ClientError::Master {
            master: master.to_string(),
            reason: err.to_string(),
        })
}
