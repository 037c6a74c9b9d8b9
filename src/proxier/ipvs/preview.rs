//! IPVS mode's part of `kube-proxy-rs render`: what a sync would program, as the tools list it.

use std::fmt::Write as _;

use super::aggregate::render as render_ipvs;
use super::render::DesiredIpvs;
use super::{IPVS_JUMP_RULES, IpvsSettings};
use crate::config::KubeProxyConfiguration;
use crate::model::{IpFamily, ProxyState};
use crate::sys::ipvs::codec::FLAG_PERSISTENT;

/// Per family: virtual servers as `ipvsadm -Ln` lists them, kube-ipvs0's addresses, the ipsets'
/// entries and the iptables restore input.
pub fn preview(config: &KubeProxyConfiguration, state: &ProxyState) -> String {
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
