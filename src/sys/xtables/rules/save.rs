//! A rule's text as `iptables-legacy-save` prints the rule the kernel holds for it (iptables
//! 1.8.9: iptables.c's header options, then each match with `-m` and its extension's save
//! function, then the target), so that a chain read back from a legacy table can be compared
//! with what we would write. Header options come first in a fixed order (`-s`, `-d`, `-i`, `-o`,
//! `-p`), addresses carry their prefix length, and each extension prints its options in its own
//! order and form.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::parse::{
    ADDRESS_TYPES, AddressMatch, MatchOptions, RuleOptions, Target, Untranslatable, read_rule,
};
use crate::sys::nf_tables::wire::{NF_ACCEPT, NF_DROP, NFT_GOTO, NFT_RETURN};

/// The text iptables-legacy-save prints for `spec` (the text after `-A <chain>`), without the
/// `-A <chain>` and the leading space.
pub fn save_text(ipv6: bool, spec: &str) -> Result<String, Untranslatable> {
    saved_form(ipv6, &read_rule(ipv6, spec)?)
}

/// The text iptables-legacy-save prints for a rule with these options.
pub fn saved_form(ipv6: bool, parsed: &RuleOptions) -> Result<String, Untranslatable> {
    let mut out = String::new();
    for (option, matched) in [("-s", &parsed.source), ("-d", &parsed.destination)] {
        if let Some(matched) = matched {
            let _ = write!(
                out,
                "{} {option} {}",
                bang(matched.inverted),
                address(matched)
            );
        }
    }
    for (option, interface) in [("-i", &parsed.in_interface), ("-o", &parsed.out_interface)] {
        if let Some((name, inverted)) = interface {
            let _ = write!(out, "{} {option} {name}", bang(*inverted));
        }
    }
    if let Some((protocol, inverted)) = parsed.protocol {
        let _ = write!(out, "{} -p {}", bang(inverted), protocol_name(protocol)?);
    }
    for matched in &parsed.matches {
        save_match(ipv6, matched, &mut out);
    }
    if let Some(target) = &parsed.target {
        save_target(ipv6, target, &mut out);
    }
    Ok(out.trim_start().to_string())
}

/// `" !"` before an inverted option.
fn bang(inverted: bool) -> &'static str {
    if inverted { " !" } else { "" }
}

fn protocol_name(protocol: u8) -> Result<&'static str, Untranslatable> {
    match protocol {
        6 => Ok("tcp"),
        17 => Ok("udp"),
        132 => Ok("sctp"),
        other => Err(Untranslatable(format!("protocol {other}"))),
    }
}

/// `10.0.0.0/8`, `172.30.0.41/32`, `fd00:10::/64`.
fn address(matched: &AddressMatch) -> String {
    let prefix: u32 = matched.mask.iter().map(|b| b.count_ones()).sum();
    let address = match <[u8; 4]>::try_from(matched.address.as_slice()) {
        Ok(v4) => IpAddr::V4(Ipv4Addr::from(v4)),
        Err(_) => {
            let mut v6 = [0u8; 16];
            for (to, from) in v6.iter_mut().zip(&matched.address) {
                *to = *from;
            }
            IpAddr::V6(Ipv6Addr::from(v6))
        }
    };
    format!("{address}/{prefix}")
}

/// libxtables' xtables_save_string: bare when only `[A-Za-z0-9_-]`, else quoted with `"`, `\`
/// and `'` escaped.
fn save_string(value: &str, out: &mut String) {
    let bare = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        let _ = write!(out, " {value}");
        return;
    }
    out.push_str(" \"");
    for c in value.chars() {
        if matches!(c, '"' | '\\' | '\'') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

fn port_range([lo, hi]: [u16; 2]) -> String {
    if lo == hi {
        lo.to_string()
    } else {
        format!("{lo}:{hi}")
    }
}

fn save_match(ipv6: bool, matched: &MatchOptions, out: &mut String) {
    match matched {
        MatchOptions::Comment(text) => {
            out.push_str(" -m comment --comment");
            save_string(text, out);
        }
        MatchOptions::Ports {
            tcp,
            source,
            destination,
        } => {
            out.push_str(if *tcp { " -m tcp" } else { " -m udp" });
            for (option, range) in [("--sport", source), ("--dport", destination)] {
                if let Some((range, inverted)) = range
                    && *range != [0, 0xffff]
                {
                    let _ = write!(out, "{} {option} {}", bang(*inverted), port_range(*range));
                }
            }
        }
        MatchOptions::Sctp {
            source,
            destination,
        } => {
            out.push_str(" -m sctp");
            for (option, range) in [("--sport", source), ("--dport", destination)] {
                if let Some(range) = range {
                    let _ = write!(out, " {option} {}", port_range(*range));
                }
            }
        }
        MatchOptions::Addrtype {
            source,
            destination,
            flags,
        } => {
            out.push_str(" -m addrtype");
            for (option, types, invert) in [
                ("--src-type", source, flags & 1 != 0),
                ("--dst-type", destination, flags & 2 != 0),
            ] {
                if *types != 0 {
                    let _ = write!(out, "{} {option} {}", bang(invert), address_types(*types));
                }
            }
        }
        MatchOptions::Conntrack { states, inverted } => {
            const ORDER: [(u16, &str); 7] = [
                (1, "INVALID"),
                (8, "NEW"),
                (4, "RELATED"),
                (2, "ESTABLISHED"),
                (256, "UNTRACKED"),
                (64, "SNAT"),
                (128, "DNAT"),
            ];
            let names: Vec<&str> = ORDER
                .iter()
                .filter(|(bit, _)| states & bit != 0)
                .map(|(_, name)| *name)
                .collect();
            let _ = write!(
                out,
                " -m conntrack{} --ctstate {}",
                bang(*inverted),
                names.join(",")
            );
        }
        MatchOptions::Mark {
            mark,
            mask,
            inverted,
        } => {
            let _ = write!(out, " -m mark{} --mark {mark:#x}", bang(*inverted));
            if *mask != u32::MAX {
                let _ = write!(out, "/{mask:#x}");
            }
        }
        MatchOptions::Statistic {
            probability,
            inverted,
        } => {
            let _ = write!(
                out,
                " -m statistic --mode random{} --probability {:.11}",
                bang(*inverted),
                f64::from(*probability) / 2_147_483_648.0
            );
        }
        MatchOptions::Recent {
            name,
            check_set,
            seconds,
            hit_count,
            side,
        } => {
            out.push_str(" -m recent");
            for (bit, flag) in [
                (2, "--set"),
                (1, "--rcheck"),
                (4, "--update"),
                (8, "--remove"),
            ] {
                if check_set & bit != 0 {
                    let _ = write!(out, " {flag}");
                }
            }
            if *seconds != 0 {
                let _ = write!(out, " --seconds {seconds}");
            }
            if check_set & 32 != 0 {
                out.push_str(" --reap");
            }
            if *hit_count != 0 {
                let _ = write!(out, " --hitcount {hit_count}");
            }
            if check_set & 16 != 0 {
                out.push_str(" --rttl");
            }
            let mask = if ipv6 {
                "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
            } else {
                "255.255.255.255"
            };
            let _ = write!(out, " --name {name} --mask {mask}");
            out.push_str(if *side == 1 { " --rdest" } else { " --rsource" });
        }
        // libxt_nfacct prints its option with a trailing space before the saved string.
        MatchOptions::Nfacct(name) => {
            out.push_str(" -m nfacct --nfacct-name ");
            save_string(name, out);
        }
        MatchOptions::Set {
            name,
            flags,
            inverted,
            ..
        } => {
            let not = if *inverted { " !" } else { "" };
            let _ = write!(out, " -m set{not} --match-set {name} {flags}");
        }
        MatchOptions::Physdev { is_in } => {
            out.push_str(" -m physdev");
            match is_in {
                Some(true) => out.push_str(" --physdev-is-in"),
                Some(false) => out.push_str(" ! --physdev-is-in"),
                None => {}
            }
        }
    }
}

/// addrtype's types, comma-separated in their bit order.
fn address_types(types: u16) -> String {
    ADDRESS_TYPES
        .iter()
        .enumerate()
        .filter(|(bit, _)| types & (1 << bit) != 0)
        .map(|(_, name)| *name)
        .collect::<Vec<_>>()
        .join(",")
}

fn save_target(ipv6: bool, target: &Target, out: &mut String) {
    match target {
        Target::Verdict(code) => {
            let name = match *code {
                NF_ACCEPT => "ACCEPT",
                NF_DROP => "DROP",
                NFT_RETURN => "RETURN",
                _ => "?",
            };
            let _ = write!(out, " -j {name}");
        }
        Target::Jump(chain, code) => {
            let option = if *code == NFT_GOTO { "-g" } else { "-j" };
            let _ = write!(out, " {option} {chain}");
        }
        Target::Reject => {
            let with = if ipv6 {
                "icmp6-port-unreachable"
            } else {
                "icmp-port-unreachable"
            };
            let _ = write!(out, " -j REJECT --reject-with {with}");
        }
        Target::Dnat(to) => {
            out.push_str(" -j DNAT");
            match to {
                Some((IpAddr::V6(address), Some(port))) => {
                    let _ = write!(out, " --to-destination [{address}]:{port}");
                }
                Some((address, Some(port))) => {
                    let _ = write!(out, " --to-destination {address}:{port}");
                }
                Some((address, None)) => {
                    let _ = write!(out, " --to-destination {address}");
                }
                None => {}
            }
        }
        Target::Mark { mark, mask } => {
            let _ = write!(out, " -j MARK --set-xmark {mark:#x}/{mask:#x}");
        }
        Target::Masquerade(flags) => {
            out.push_str(" -j MASQUERADE");
            if flags & 0x4 != 0 {
                out.push_str(" --random");
            }
            if flags & 0x10 != 0 {
                out.push_str(" --random-fully");
            }
        }
    }
}
