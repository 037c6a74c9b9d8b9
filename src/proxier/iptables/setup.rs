//! iptables mode as the daemon runs it on this node: the back end the node uses, upstream's
//! nfacct counters, and the kernel's change events where the back end has them.

use std::sync::Arc;

use tracing::{error, info, warn};

use super::{IptablesProxier, IptablesSettings, NfacctCounters};
use crate::config::KubeProxyConfiguration;
use crate::model::IpFamily;
use crate::proxier::Proxier;
use crate::proxier::local::NodePortSelection;
use crate::sys::host::net::{ProcSysctl, SystemAddresses};
use crate::sys::nf_tables::events::{NfEvents, Scope};
use crate::sys::nfacct::NetlinkNfacct;
use crate::sys::xtables::{Backend, SystemIptables};

/// The proxier on `backend`; `wake` asks the daemon for a sync.
pub fn setup(
    config: &KubeProxyConfiguration,
    backend: Backend,
    wake: Arc<dyn Fn() + Send + Sync>,
) -> Box<dyn Proxier> {
    info!(backend = backend.as_str(), "Using iptables back end");
    info!("Using iptables Proxier");
    let mut settings = IptablesSettings::from_config(config);
    settings.nfacct = match NetlinkNfacct::open() {
        Ok(mut nfacct) => NfacctCounters::ensure(&mut nfacct),
        Err(err) => {
            error!(error = %err, "Failed to create nfacct runner, nfacct based metrics won't be available");
            NfacctCounters::default()
        }
    };
    let proxier = IptablesProxier::new(
        SystemIptables::new(backend),
        settings,
        Box::new(SystemAddresses),
        Box::new(ProcSysctl::default()),
    )
    .with_wake(wake.clone())
    .with_walk_notice(backend);
    // On nft the kernel says when another program changes our chains: each change asks for a
    // sync, which repairs it. (Legacy has no such events: see docs/iptables.md.)
    if backend == Backend::Nft {
        match NfEvents::start(Scope::IptablesTables, Box::new(move || wake())) {
            Ok(events) => return Box::new(proxier.with_change_events(Box::new(events))),
            Err(err) => {
                warn!(error = %err, "Cannot listen for nf_tables changes; drift in our rules is repaired only by full syncs")
            }
        }
    }
    Box::new(proxier)
}

/// The sysctls `--init-only` sets for this mode: route_localnet, when the kernel serves
/// NodePorts on 127.0.0.1 (every address is, when nodePortAddresses is empty or says `all`);
/// not when the userspace proxy serves them.
pub fn init_sysctls(config: &KubeProxyConfiguration) -> Vec<(&'static str, &'static str)> {
    let loopback = IpFamily::V4.loopback();
    let served = NodePortSelection::new(&config.node_port_addresses)
        .select(None, || vec![loopback])
        .is_none_or(|ips| ips.contains(&loopback));
    if IptablesSettings::from_config(config).localhost_node_ports && served {
        vec![("net/ipv4/conf/all/route_localnet", "1")]
    } else {
        Vec::new()
    }
}
