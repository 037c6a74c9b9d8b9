//! iptables mode's part of `kube-proxy-rs render`: the real proxier's first sync against the
//! in-memory tools, and the restore input it wrote.

use std::fmt::Write as _;

use super::{IptablesProxier, IptablesSettings};
use crate::config::KubeProxyConfiguration;
use crate::model::{IpFamily, ProxyState};
use crate::proxier::{Proxier, SyncError};
use crate::sys::host::net::{FakeSysctl, FixedAddresses};
use crate::sys::xtables::fake::FakeIptables;

/// The restore input of a first sync on this node, per family.
pub fn preview(config: &KubeProxyConfiguration, state: &ProxyState) -> Result<String, SyncError> {
    let mut proxier = IptablesProxier::new(
        FakeIptables::default(),
        IptablesSettings::from_config(config),
        Box::new(FixedAddresses(state.node.addresses.clone())),
        Box::new(FakeSysctl::default()),
    );
    proxier.record_transactions = true;
    proxier.sync(state, &Default::default())?;
    let mut text = String::new();
    for (family, restore) in &proxier.last_transactions {
        let tool = match family {
            IpFamily::V4 => "iptables-restore",
            IpFamily::V6 => "ip6tables-restore",
        };
        let _ = writeln!(text, "# {tool} --noflush input ({})", family.name());
        text.push_str(restore);
    }
    Ok(text)
}
