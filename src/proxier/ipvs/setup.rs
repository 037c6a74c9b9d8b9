//! IPVS mode as the daemon runs it on this node: the node checked first (the IPVS netlink
//! family, a dummy link, ipset, the scheduler), on the iptables back end the node uses.

use tracing::{info, warn};

use super::support::{IpvsUnsupported, check_support};
use super::{IpvsProxier, IpvsSettings};
use crate::config::KubeProxyConfiguration;
use crate::proxier::Proxier;
use crate::proxier::local::localhost_proxy_families;
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
    if names_loopback(&config.node_port_addresses) && localhost_proxy_families(config).is_empty() {
        warn!(
            "NodePorts on localhost addresses are not served by IPVS (as upstream): nodePortAddresses' loopback addresses are left out; the KubeProxyNFTablesLocalhostNodePorts feature gate serves them through a userspace proxy"
        );
    }
    Ok(Box::new(proxier))
}

/// Whether nodePortAddresses names a loopback address (`localhost`, or a loopback CIDR).
fn names_loopback(node_port_addresses: &[String]) -> bool {
    node_port_addresses.iter().any(|entry| {
        entry == "localhost"
            || entry
                .parse::<ipnet::IpNet>()
                .is_ok_and(|net| net.addr().is_loopback())
    })
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
            names_loopback(&entries.iter().map(|e| e.to_string()).collect::<Vec<_>>())
        };
        assert!(named(&["primary", "localhost"]));
        assert!(named(&["127.0.0.0/8"]) && named(&["::1/128"]));
        assert!(!named(&["0.0.0.0/0", "all", "primary"]));
        assert!(!named(&[]));
    }
}
