//! IPVS mode as the daemon runs it on this node: the node checked first (the IPVS netlink
//! family, a dummy link, ipset, the scheduler), on the iptables back end the node uses.

use tracing::{info, warn};

use super::support::{IpvsUnsupported, check_support};
use super::{IpvsProxier, IpvsSettings};
use crate::config::KubeProxyConfiguration;
use crate::proxier::Proxier;
use crate::proxier::local::{NodePortSelection, localhost_proxy_families, unserved_loopback};
use crate::sys::host::net::{ProcSysctl, SystemAddresses};
use crate::sys::xtables::{Backend, SystemIptables};

/// The proxier, or why this node cannot run it.
pub fn setup(
    config: &KubeProxyConfiguration,
    backend: Backend,
) -> Result<Box<dyn Proxier>, IpvsUnsupported> {
    check_support(&config.ipvs.scheduler)?;
    let proxier = IpvsProxier::new(
        IpvsSettings::from_config(config),
        Box::new(SystemIptables::new(backend)),
        Box::new(ProcSysctl::default()),
        Box::new(SystemAddresses),
    )
    .map_err(|err| IpvsUnsupported::Start(err.to_string()))?;
    info!(backend = backend.as_str(), "Using iptables back end");
    info!("Using ipvs Proxier");
    let selection = NodePortSelection::new(&config.node_port_addresses);
    if let Some(said) = unserved_loopback(&selection, &localhost_proxy_families(config), "IPVS") {
        warn!("{said}");
    }
    Ok(Box::new(proxier))
}

/// The sysctls `--init-only` sets for this mode.
pub fn init_sysctls(config: &KubeProxyConfiguration) -> Vec<(&'static str, &'static str)> {
    super::sysctls(config.ipvs.strict_arp)
}
