//! The one place that knows every mode: a mode's proxier as the daemon runs it, the sysctls
//! `--init-only` sets for it, its text for `kube-proxy-rs render` and its reader for
//! `kube-proxy-rs explain`, by [`ProxyMode`].

use std::collections::BTreeSet;
use std::sync::Arc;

use tracing::warn;

use super::explanation::{
    Checked, Comparison, Explain, ExplainError, Explanation, Flow, Wanted, cluster_ip_flows,
    compare, loopback_listener, policy_name, tracked,
};
use super::ipvs::IpvsUnsupported;
use super::nftables::support::NftablesUnsupported;
use super::{Proxier, SyncError, iptables, ipvs, nftables};
use crate::config::{KubeProxyConfiguration, ProxyMode};
use crate::model::{IpFamily, Protocol, ProxyState, ServicePortName};
use crate::sys::xtables::Backend;

/// What the command line adds to the configuration for setting a mode up.
#[derive(Clone, Copy, Debug, Default)]
pub struct SetupOptions {
    /// When IPVS mode cannot run, use iptables instead of exiting.
    pub ipvs_fallback: bool,
    /// nftables mode offloads connections to ClusterIPs past this many packets (0: off).
    pub offload_packet_threshold: u32,
}

/// Why no proxier runs.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// IPVS mode cannot run here and falling back was switched off (`--ipvs-fallback=false`).
    #[error("can't use the IPVS proxier: {0}")]
    Ipvs(IpvsUnsupported),
    /// nftables mode cannot run on this node (as upstream, no fallback).
    #[error("can't use the nftables proxier: {0}")]
    Nftables(NftablesUnsupported),
}

/// The proxier of `mode` on this node and the mode it runs. IPVS mode first checks that the
/// node can run it; if not, it falls back to iptables (the seeds' behaviour) or, without
/// `ipvs_fallback`, fails as upstream has since 1.26. `wake` asks the daemon for a sync.
pub fn setup(
    mode: ProxyMode,
    config: &KubeProxyConfiguration,
    options: SetupOptions,
    wake: Arc<dyn Fn() + Send + Sync>,
) -> Result<(ProxyMode, Box<dyn Proxier>), SetupError> {
    let SetupOptions {
        ipvs_fallback,
        offload_packet_threshold,
    } = options;
    if mode == ProxyMode::Nftables {
        let proxier = nftables::setup::setup(config, offload_packet_threshold, wake)
            .map_err(SetupError::Nftables)?;
        return Ok((mode, proxier));
    }
    if offload_packet_threshold > 0 {
        warn!(
            threshold = offload_packet_threshold,
            "--offload-packet-threshold applies to nftables mode only; ignored"
        );
    }
    let backend = Backend::detect();
    if mode == ProxyMode::Ipvs {
        match ipvs::setup::setup(config, backend) {
            Ok(proxier) => return Ok((mode, proxier)),
            Err(reason) if !ipvs_fallback => return Err(SetupError::Ipvs(reason)),
            Err(reason) => {
                warn!(reason = %reason, "Can't use the IPVS proxier");
                warn!("Can't use ipvs proxier, trying iptables proxier");
            }
        }
    }
    let proxier = iptables::setup::setup(config, backend, wake);
    Ok((ProxyMode::Iptables, proxier))
}

/// The sysctls `--init-only` sets for `mode`, as upstream's init phase does.
pub fn init_sysctls(
    mode: ProxyMode,
    config: &KubeProxyConfiguration,
) -> Vec<(&'static str, &'static str)> {
    match mode {
        ProxyMode::Iptables => iptables::setup::init_sysctls(config),
        ProxyMode::Ipvs => ipvs::setup::init_sysctls(config),
        ProxyMode::Nftables => Vec::new(),
    }
}

/// What `mode` would program for `state` on an empty node, as its tools' input.
pub fn preview(
    mode: ProxyMode,
    config: &KubeProxyConfiguration,
    state: &ProxyState,
) -> Result<String, SyncError> {
    match mode {
        ProxyMode::Iptables => iptables::preview::preview(config, state),
        ProxyMode::Ipvs => Ok(ipvs::preview::preview(config, state)),
        ProxyMode::Nftables => nftables::preview::preview(config, state),
    }
}

/// One packet's path through what `mode` programmed in this network namespace, read from the
/// kernel (`kube-proxy-rs explain`).
/// Connections conntrack already tracks for the flow come with it.
pub fn explain(mode: ProxyMode, flow: &Flow) -> Result<Explanation, ExplainError> {
    let mut explanation = match mode {
        ProxyMode::Nftables => nftables::explain::explain(flow)?,
        ProxyMode::Iptables => iptables::explain::explain(flow)?,
        ProxyMode::Ipvs => ipvs::explain::explain(flow)?,
    };
    if flow.protocol == Protocol::Tcp && flow.destination.ip().is_loopback() {
        loopback_listener(&mut explanation)?;
    }
    explanation.conntrack = tracked(flow, &explanation.outcome)?;
    explanation
        .reads
        .push("the conntrack entries to this destination".into());
    Ok(explanation)
}

/// Checks every service port the daemon `wanted` against the kernel (`explain --all`): a flow
/// to each port's ClusterIP, read with one session (each endpoint map read once).
pub fn explain_all(mode: ProxyMode, wanted: &[Wanted]) -> Result<Vec<Checked>, ExplainError> {
    let flows = cluster_ip_flows(wanted);
    let mut session: Box<dyn Explain> = match mode {
        ProxyMode::Nftables => Box::new(nftables::explain::Session::open()?),
        ProxyMode::Iptables => {
            let mut session = iptables::explain::Session::open();
            let families: BTreeSet<IpFamily> = flows
                .iter()
                .map(|(_, _, flow)| IpFamily::of(&flow.destination.ip()))
                .collect();
            for family in families {
                session.read_reachable(family)?;
            }
            Box::new(session)
        }
        ProxyMode::Ipvs => Box::new(ipvs::explain::Session::open()?),
    };
    let mut checked = Vec::new();
    for (service, port, flow) in flows {
        let comparison = match session.explain(&flow) {
            Ok(mut explanation) => {
                // A mode whose kernel objects carry no Service names (IPVS): the port asked.
                if explanation.service.is_none() {
                    let named = format!("{}:{}", service.service, port.name);
                    explanation.service = ServicePortName::parse(&named, flow.protocol);
                    explanation.policy = Some(policy_name(port.internal_local));
                }
                compare(&explanation, service)
            }
            Err(err) => Comparison::Unknown {
                why: err.to_string(),
            },
        };
        checked.push(Checked {
            service_port: format!("{}:{}", service.service, port.name),
            flow,
            comparison,
        });
    }
    Ok(checked)
}

/// The mode whose objects this network namespace holds: nftables mode's table, else IPVS
/// mode's link (kube-ipvs0), else iptables mode's chains.
pub fn detect() -> ProxyMode {
    use crate::sys::nf_tables::read::table_exists;
    let nftables = [IpFamily::V4, IpFamily::V6]
        .into_iter()
        .any(|family| table_exists(family, nftables::render::TABLE).unwrap_or(false));
    let ipvs = || {
        crate::sys::host::link::Links::open()
            .and_then(|mut links| links.index_of(ipvs::DUMMY_LINK))
            .is_ok_and(|index| index.is_some())
    };
    if nftables {
        ProxyMode::Nftables
    } else if ipvs() {
        ProxyMode::Ipvs
    } else {
        ProxyMode::Iptables
    }
}
