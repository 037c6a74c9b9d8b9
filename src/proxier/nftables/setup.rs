//! nftables mode as the daemon runs it on this node: the kernel and `nft` checked first, and
//! the kernel's change events for our table.

use std::sync::Arc;

use tracing::{info, warn};

use super::render::TABLE;
use super::support::{self, NftablesUnsupported, SKIP_KERNEL_CHECK_ENV};
use super::{NftablesProxier, NftablesSettings};
use crate::config::KubeProxyConfiguration;
use crate::proxier::Proxier;
use crate::proxier::local::unserved_loopback;
use crate::sys::host::net::SystemAddresses;
use crate::sys::nf_tables::SystemNftables;
use crate::sys::nf_tables::events::{NfEvents, Scope};

/// The proxier, or why this node cannot run it (as upstream, no fallback); `wake` asks the
/// daemon for a sync.
pub fn setup(
    config: &KubeProxyConfiguration,
    wake: Arc<dyn Fn() + Send + Sync>,
) -> Result<Box<dyn Proxier>, NftablesUnsupported> {
    let skip_kernel_check = std::env::var_os(SKIP_KERNEL_CHECK_ENV).is_some();
    support::check_support(&support::kernel_release(), skip_kernel_check)?;
    info!("Using nftables Proxier");
    let settings = NftablesSettings::from_config(config);
    let said = unserved_loopback(
        &settings.node_port_addresses,
        &settings.localhost_proxy,
        "nftables rules",
    );
    if let Some(said) = said {
        warn!("{said}");
    }
    let proxier = NftablesProxier::new(
        SystemNftables::default(),
        settings,
        Box::new(SystemAddresses),
    )
    .with_wake(wake.clone());
    // The kernel says when another program changes our table: each change asks for a sync,
    // which rewrites what changed.
    Ok(
        match NfEvents::start(Scope::NftTable(TABLE), Box::new(move || wake())) {
            Ok(events) => Box::new(proxier.with_change_events(Box::new(events))),
            Err(err) => {
                warn!(error = %err, "Cannot listen for nf_tables changes; drift in our table is repaired only by full syncs");
                Box::new(proxier)
            }
        },
    )
}
