//! `kube-proxy-rs render`: what this node would program for Services and EndpointSlices read
//! from files, without root or a cluster. The state goes through the same conversion, tracker
//! and renderers as the daemon's; iptables and nftables modes even run the real proxier, against
//! the in-memory kernel, and print the input of its first (full) sync.

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::config::{KubeProxyConfiguration, ProxyMode, feature_gates};
use crate::k8s::files::{FilesError, read_objects};
use crate::proxier::SyncError;
use crate::proxier::modes;

/// Why nothing could be rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error(transparent)]
    Files(#[from] FilesError),
    #[error("rendering failed: {0}")]
    Sync(#[from] SyncError),
}

/// The rendered text and what in the input could not be used.
#[derive(Debug)]
pub struct Rendered {
    pub text: String,
    pub problems: Vec<String>,
}

/// Renders what `node_name` would program in the configured mode for the objects in `files`.
pub fn render(
    config: &KubeProxyConfiguration,
    node_name: &str,
    files: &[PathBuf],
) -> Result<Rendered, RenderError> {
    let external_ips = feature_gates::enabled(
        &config.feature_gates,
        feature_gates::ALLOW_SERVICE_EXTERNAL_IPS,
    );
    let objects = read_objects(files, node_name, external_ips)?;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "# kube-proxy-rs render: node {node_name}, mode {}, {} services, {} skipped objects of other kinds",
        config.proxy_mode().map_or("iptables", |m| m.as_str()),
        objects.state.services.len(),
        objects.skipped
    );
    if !objects.node_found {
        let _ = writeln!(
            text,
            "# no Node named {node_name:?} in the input: node addresses unknown, IPv4 only, NodePorts on every address"
        );
    }
    let mode = config.proxy_mode().unwrap_or(ProxyMode::Iptables);
    text.push_str(&modes::preview(mode, config, &objects.state)?);
    Ok(Rendered {
        text,
        problems: objects.problems,
    })
}
