//! `kube-proxy-rs render`: what this node would program for Services and EndpointSlices read
//! from files, without root or a cluster. The state goes through the same conversion, tracker
//! and renderers as the daemon's; iptables and nftables modes even run the real proxier, against
//! the in-memory kernel, and print the input of its first (full) sync.

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::config::{KubeProxyConfiguration, ProxyMode};
use crate::k8s::files::{FilesError, read_objects};
use crate::model::{IpFamily, ProxyState};
use crate::proxier::iptables::{IptablesProxier, IptablesSettings};
use crate::proxier::ipvs::aggregate::render as render_ipvs;
use crate::proxier::ipvs::render::DesiredIpvs;
use crate::proxier::ipvs::{IPVS_JUMP_RULES, IpvsSettings};
use crate::proxier::nftables::{NftablesProxier, NftablesSettings};
use crate::proxier::{Proxier, SyncError};
use crate::sys::iptables_fake::FakeIptables;
use crate::sys::ipvs::codec::FLAG_PERSISTENT;
use crate::sys::net::{FakeSysctl, FixedAddresses};
use crate::sys::nftables_fake::FakeNftables;

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
    let objects = read_objects(files, node_name)?;
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
    let body = match config.proxy_mode().unwrap_or(ProxyMode::Iptables) {
        ProxyMode::Iptables => iptables_text(config, &objects.state)?,
        ProxyMode::Ipvs => ipvs_text(config, &objects.state),
        ProxyMode::Nftables => nftables_text(config, &objects.state)?,
    };
    text.push_str(&body);
    Ok(Rendered {
        text,
        problems: objects.problems,
    })
}

/// The restore input of a first sync on this node, per family.
fn iptables_text(config: &KubeProxyConfiguration, state: &ProxyState) -> Result<String, SyncError> {
    let mut proxier = IptablesProxier::new(
        FakeIptables::default(),
        IptablesSettings::from_config(config),
        Box::new(FixedAddresses(state.node.addresses.clone())),
        Box::new(FakeSysctl::default()),
    );
    proxier.record_restores = true;
    proxier.sync(state, &Default::default())?;
    let mut text = String::new();
    for (family, restore) in &proxier.last_restore {
        let tool = match family {
            IpFamily::V4 => "iptables-restore",
            IpFamily::V6 => "ip6tables-restore",
        };
        let _ = writeln!(text, "# {tool} --noflush input ({})", family.name());
        text.push_str(restore);
    }
    Ok(text)
}

/// The `nft -f` input of a first sync on this node, per family.
fn nftables_text(config: &KubeProxyConfiguration, state: &ProxyState) -> Result<String, SyncError> {
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

/// Per family: virtual servers as `ipvsadm -Ln` lists them, kube-ipvs0's addresses, the ipsets'
/// entries and the iptables restore input.
fn ipvs_text(config: &KubeProxyConfiguration, state: &ProxyState) -> String {
    let settings = IpvsSettings::from_config(config);
    let mut text = String::new();
    for family in state.node.families() {
        let ctx = settings.context(family, &state.node, &state.node.addresses);
        let desired = render_ipvs(state, &ctx);
        write_ipvs(&mut text, family, &desired);
    }
    text
}

fn write_ipvs(text: &mut String, family: IpFamily, desired: &DesiredIpvs) {
    let name = family.name();
    let _ = writeln!(
        text,
        "# IPVS virtual servers ({name}), as ipvsadm -Ln lists them"
    );
    let _ = writeln!(text, "Prot LocalAddress:Port Scheduler Flags");
    let _ = writeln!(
        text,
        "  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn"
    );
    for (key, (vs, reals)) in &desired.services {
        let (address, protocol) = key.rsplit_once('/').unwrap_or((key.as_str(), ""));
        let mut line = format!("{protocol:<4} {address} {}", vs.scheduler);
        if vs.flags & FLAG_PERSISTENT != 0 {
            let _ = write!(line, " persistent {}", vs.timeout);
        }
        let _ = writeln!(text, "{}", line.trim_end());
        for real in reals {
            let _ = writeln!(
                text,
                "  -> {:<28} Masq    1      0          0",
                real.to_string()
            );
        }
    }
    let _ = writeln!(text, "# addresses on kube-ipvs0 ({name})");
    for ip in &desired.bound {
        let prefix = if ip.is_ipv4() { 32 } else { 128 };
        let _ = writeln!(text, "{ip}/{prefix}");
    }
    let _ = writeln!(text, "# ipsets ({name}): name (type): entries");
    for (spec, entries) in &desired.sets {
        let mut line = format!("{} ({}):", spec.name, spec.set_type.as_str());
        for entry in entries {
            let _ = write!(line, " {entry}");
        }
        let _ = writeln!(text, "{line}");
    }
    let tool = match family {
        IpFamily::V4 => "iptables-restore",
        IpFamily::V6 => "ip6tables-restore",
    };
    let _ = writeln!(text, "# {tool} --noflush input ({name})");
    text.push_str(&desired.iptables);
    let _ = writeln!(
        text,
        "# jumps from the built-in chains, inserted first when missing ({name})"
    );
    for jump in &IPVS_JUMP_RULES {
        let _ = writeln!(
            text,
            "-t {} -I {} 1 {}",
            jump.table,
            jump.from,
            jump.rule_spec()
        );
    }
}
