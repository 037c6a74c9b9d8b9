//! nftables mode's part of `kube-proxy-rs render`: the real proxier's first sync against the
//! in-memory kernel, and the transactions it wrote.

use std::fmt::Write as _;

use super::{NftablesProxier, NftablesSettings};
use crate::config::KubeProxyConfiguration;
use crate::model::ProxyState;
use crate::proxier::{Proxier, SyncError};
use crate::sys::host::net::FixedAddresses;
use crate::sys::nf_tables::fake::FakeNftables;

/// The `nft -f` input of a first sync on this node, per family.
pub fn preview(config: &KubeProxyConfiguration, state: &ProxyState) -> Result<String, SyncError> {
    let mut proxier = NftablesProxier::new(
        FakeNftables::default(),
        NftablesSettings::from_config(config),
        Box::new(FixedAddresses(state.node.addresses.clone())),
    );
    proxier.record_transactions = true;
    proxier.sync(state, &Default::default())?;
    let mut text = String::new();
    for (family, commands) in &proxier.last_transactions {
        let _ = writeln!(text, "# nft -f input ({})", family.name());
        text.push_str(commands);
    }
    Ok(text)
}
