//! IPVS mode as the daemon runs it on this node: the node checked first (the IPVS netlink
//! family, a dummy link, ipset, the scheduler), on the iptables back end the node uses.

use tracing::{info, warn};

use super::support::{IpvsUnsupported, check_support};
use super::{IpvsProxier, IpvsSettings};
use crate::config::KubeProxyConfiguration;
use crate::proxier::Proxier;
use crate::proxier::local::{localhost_proxy_families, loopback_nets};
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
    if loopback_nets(&config.node_port_addresses).next().is_some()
        && localhost_proxy_families(config).is_empty()
    {
        warn!(
            "NodePorts on localhost addresses are not served by IPVS (as upstream): nodePortAddresses' loopback addresses are left out; the KubeProxyNFTablesLocalhostNodePorts feature gate serves them through a userspace proxy"
        );
    }
    Ok(Box::new(proxier))
}

/// The sysctls `--init-only` sets for this mode.
pub fn init_sysctls(config: &KubeProxyConfiguration) -> Vec<(&'static str, &'static str)> {
    super::sysctls(config.ipvs.strict_arp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_named_by_keyword_or_loopback_cidr() {
        let named = |entries: &[&str]| {
            let entries: Vec<String> = entries.iter().map(|e| e.to_string()).collect();
            loopback_nets(&entries).next().is_some()
        };
        assert!(named(&["primary", "localhost"]));
        assert!(named(&["127.0.0.0/8"]) && named(&["::1/128"]));
        assert!(!named(&["0.0.0.0/0", "all", "primary"]));
        assert!(!named(&[]));
    }
}
