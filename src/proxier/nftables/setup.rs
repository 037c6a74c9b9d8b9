//! nftables mode as the daemon runs it on this node: the kernel and `nft` checked first, and
//! the kernel's change events for our table.

use std::sync::Arc;

use tracing::{info, warn};

use super::flowtable::{self, FlowtableDevices};
use super::render::{FLOWTABLE, TABLE};
use super::support::{self, NftablesUnsupported, SKIP_KERNEL_CHECK_ENV};
use super::{NftablesProxier, NftablesSettings};
use crate::config::KubeProxyConfiguration;
use crate::proxier::Proxier;
use crate::proxier::local::unserved_loopback;
use crate::sys::host::link::Links;
use crate::sys::host::link::events::LinkEvents;
use crate::sys::host::net::SystemAddresses;
use crate::sys::nf_tables::SystemNftables;
use crate::sys::nf_tables::events::{NfEvents, Scope};

/// The proxier, or why this node cannot run it (as upstream, no fallback); connections to
/// ClusterIPs are offloaded past `offload_packet_threshold` packets (0: off) where the kernel
/// has flowtables; `wake` asks the daemon for a sync.
pub fn setup(
    config: &KubeProxyConfiguration,
    offload_packet_threshold: u32,
    wake: Arc<dyn Fn() + Send + Sync>,
) -> Result<Box<dyn Proxier>, NftablesUnsupported> {
    let skip_kernel_check = std::env::var_os(SKIP_KERNEL_CHECK_ENV).is_some();
    support::check_support(&support::kernel_release(), skip_kernel_check)?;
    info!("Using nftables Proxier");
    let mut settings = NftablesSettings::from_config(config);
    let mut nft = SystemNftables::default();
    settings.offload_after_packets = offload(&mut nft, offload_packet_threshold);
    let said = unserved_loopback(
        &settings.node_port_addresses,
        &settings.localhost_proxy,
        "nftables rules",
    );
    if let Some(said) = said {
        warn!("{said}");
    }
    let offloading = settings.offload_after_packets.is_some();
    let mut proxier =
        NftablesProxier::new(nft, settings, Box::new(SystemAddresses)).with_wake(wake.clone());
    if offloading {
        proxier = with_flowtable_devices(proxier, wake.clone());
    }
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

/// The threshold the table offloads at, if asked for and the kernel has flowtables; said
/// either way.
fn offload(nft: &mut SystemNftables, threshold: u32) -> Option<u32> {
    if threshold == 0 {
        return None;
    }
    match flowtable::probe(nft) {
        Ok(()) => {
            info!(
                threshold,
                flowtable = FLOWTABLE,
                "Offloading connections to ClusterIPs to the flowtable fast path past the packet threshold (--offload-packet-threshold)"
            );
            Some(threshold)
        }
        Err(err) => {
            warn!(
                threshold,
                error = %err,
                "--offload-packet-threshold asks for the flowtable fast path, but the kernel refused a flowtable (a kernel without flowtables, NF_FLOW_TABLE and module nf_flow_table_inet, refuses it): connections stay on the normal path; the rest of the table is written"
            );
            None
        }
    }
}

/// The proxier keeping its flowtable over the node's links, woken as links appear.
fn with_flowtable_devices(
    proxier: NftablesProxier<SystemNftables>,
    wake: Arc<dyn Fn() + Send + Sync>,
) -> NftablesProxier<SystemNftables> {
    let links = match Links::open() {
        Ok(links) => links,
        Err(err) => {
            warn!(error = %err, "Cannot list the node's links: the flowtable gets no device, and no connection takes the fast path");
            return proxier;
        }
    };
    let mut devices = FlowtableDevices::new(Box::new(links));
    match LinkEvents::start(Box::new(move || wake())) {
        Ok(events) => devices = devices.woken_by(events),
        Err(err) => {
            warn!(error = %err, "Cannot listen for new links; the flowtable takes them at the next sync")
        }
    }
    proxier.with_flowtable_devices(devices)
}
