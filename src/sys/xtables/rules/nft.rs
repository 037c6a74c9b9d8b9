//! A rule's text as iptables-nft 1.8.9 writes it into nf_tables: the interfaces, protocol and
//! addresses first (iptables/nft-ipv4.c, nft-ipv6.c), then each match in the order the rule
//! names them (native expressions for tcp/udp ports and marks, an xtables `match` for the rest:
//! nft.c add_match), and last the target (a verdict, or an xtables `target`: add_action).
//! Only the options our renderer writes are known; anything else is refused, so that a rule this
//! module cannot vouch for is rewritten rather than wrongly kept.

use super::parse::{AddressMatch, MatchOptions, Target, Untranslatable, read_rule, refuse};
use super::xt;
use crate::sys::nf_tables::expr::{Data, Expr, Verdict};
use crate::sys::nf_tables::wire::{
    BASE_NETWORK, BASE_TRANSPORT, CMP_EQ, CMP_GT, CMP_LTE, CMP_NEQ, META_IIFNAME, META_L4PROTO,
    META_MARK, META_OIFNAME, REG_1, REG_VERDICT,
};

/// The expressions iptables-nft writes for `spec` (the text after `-A <chain>`), counters left
/// out, in the order the kernel keeps them.
pub fn nft_expressions(ipv6: bool, spec: &str) -> Result<Vec<Expr>, Untranslatable> {
    let parsed = read_rule(ipv6, spec)?;
    let mut out = Vec::new();
    for (interface, key) in [
        (&parsed.in_interface, META_IIFNAME),
        (&parsed.out_interface, META_OIFNAME),
    ] {
        if let Some((name, inverted)) = interface {
            interface_match(key, name, *inverted, &mut out);
        }
    }
    if let Some((protocol, inverted)) = parsed.protocol {
        out.push(Expr::MetaLoad {
            key: META_L4PROTO,
            dreg: REG_1,
        });
        out.push(cmp(inverted, vec![protocol]));
    }
    let (source_offset, destination_offset) = if ipv6 { (8, 24) } else { (12, 16) };
    for (matched, offset) in [
        (&parsed.source, source_offset),
        (&parsed.destination, destination_offset),
    ] {
        if let Some(matched) = matched {
            address_match(matched, offset, &mut out);
        }
    }
    for matched in &parsed.matches {
        match_expressions(matched, parsed.protocol, &mut out)?;
    }
    if let Some(target) = &parsed.target {
        out.push(target_expression(ipv6, target));
    }
    Ok(out)
}

fn cmp(inverted: bool, value: Vec<u8>) -> Expr {
    Expr::Cmp {
        sreg: REG_1,
        op: if inverted { CMP_NEQ } else { CMP_EQ },
        data: value,
    }
}

/// nft-shared.c add_iniface / add_outiface: `eth0` compares the name and its NUL, `veth+` the
/// prefix alone.
fn interface_match(key: u32, name: &str, inverted: bool, out: &mut Vec<Expr>) {
    out.push(Expr::MetaLoad { key, dreg: REG_1 });
    match name.strip_suffix('+') {
        Some("") if inverted => out.push(cmp(false, b"INVAL/D\0".to_vec())),
        Some("") => {}
        Some(prefix) => out.push(cmp(inverted, prefix.as_bytes().to_vec())),
        None => {
            let mut value = name.as_bytes().to_vec();
            value.push(0);
            out.push(cmp(inverted, value));
        }
    }
}

/// nft-shared.c add_addr: a mask of whole bytes loads only those bytes; any other mask loads the
/// whole address and masks it.
fn address_match(matched: &AddressMatch, offset: u32, out: &mut Vec<Expr>) {
    let mask = &matched.mask;
    let first_partial = mask.iter().position(|b| *b != 0xff).unwrap_or(mask.len());
    let bitwise = first_partial < mask.len()
        && (mask[first_partial] != 0 || mask[first_partial + 1..].iter().any(|b| *b != 0));
    let len = if bitwise { mask.len() } else { first_partial };
    out.push(Expr::Payload {
        base: BASE_NETWORK,
        offset,
        len: len as u32,
        dreg: REG_1,
    });
    if bitwise {
        out.push(Expr::Bitwise {
            sreg: REG_1,
            dreg: REG_1,
            mask: mask.clone(),
            xor: vec![0; len],
            boolean_op: true,
        });
    }
    out.push(cmp(matched.inverted, matched.address[..len].to_vec()));
}

fn xt_match(name: &str, revision: u32, info: Vec<u8>) -> Expr {
    Expr::Match {
        name: name.to_string(),
        revision,
        info,
    }
}

fn match_expressions(
    matched: &MatchOptions,
    protocol: Option<(u8, bool)>,
    out: &mut Vec<Expr>,
) -> Result<(), Untranslatable> {
    match matched {
        MatchOptions::Comment(text) => out.push(xt_match(
            "comment",
            0,
            xt::comment(text).ok_or_else(|| Untranslatable("comment too long".into()))?,
        )),
        MatchOptions::Ports {
            tcp,
            source,
            destination,
        } => {
            let name = if *tcp { "tcp" } else { "udp" };
            if source.is_none() && destination.is_none() {
                out.push(xt_match(name, 0, xt::tcp_udp_any(*tcp)));
                return Ok(());
            }
            let wanted = if *tcp { 6 } else { 17 };
            if protocol != Some((wanted, false)) {
                return refuse(format!("-m {name} with ports needs -p {name}"));
            }
            port_matches(*source, *destination, out);
        }
        MatchOptions::Sctp {
            source,
            destination,
        } => {
            let flags = u32::from(source.is_some()) | u32::from(destination.is_some()) << 1;
            out.push(xt_match(
                "sctp",
                0,
                xt::sctp(
                    destination.unwrap_or_default(),
                    source.unwrap_or_default(),
                    flags,
                    0,
                ),
            ));
        }
        MatchOptions::Addrtype {
            source,
            destination,
            flags,
        } => out.push(xt_match(
            "addrtype",
            1,
            xt::addrtype_v1(*source, *destination, *flags),
        )),
        MatchOptions::Conntrack { states, inverted } => {
            const XT_CONNTRACK_STATE: u16 = 1;
            let invert = if *inverted { XT_CONNTRACK_STATE } else { 0 };
            out.push(xt_match(
                "conntrack",
                3,
                xt::conntrack_v3(XT_CONNTRACK_STATE, invert, *states),
            ));
        }
        // nft.c add_nft_mark.
        MatchOptions::Mark {
            mark,
            mask,
            inverted,
        } => {
            out.push(Expr::MetaLoad {
                key: META_MARK,
                dreg: REG_1,
            });
            if *mask != u32::MAX {
                out.push(Expr::Bitwise {
                    sreg: REG_1,
                    dreg: REG_1,
                    mask: mask.to_ne_bytes().to_vec(),
                    xor: vec![0; 4],
                    boolean_op: true,
                });
            }
            out.push(cmp(*inverted, mark.to_ne_bytes().to_vec()));
        }
        MatchOptions::Statistic {
            probability,
            inverted,
        } => out.push(xt_match(
            "statistic",
            0,
            xt::statistic_random(*probability, *inverted),
        )),
        MatchOptions::Recent {
            name,
            check_set,
            seconds,
            hit_count,
            side,
        } => out.push(xt_match(
            "recent",
            1,
            xt::recent_v1(*seconds, *hit_count, *check_set, name, *side)
                .ok_or_else(|| Untranslatable("recent list name too long".into()))?,
        )),
        MatchOptions::Nfacct(name) => out.push(xt_match(
            "nfacct",
            1,
            xt::nfacct_v1(name).ok_or_else(|| Untranslatable("nfacct name too long".into()))?,
        )),
        // The kernel's set match holds the set's index, which only ipset can tell.
        MatchOptions::Set { .. } => return refuse("match set"),
        MatchOptions::Physdev { .. } => return refuse("match physdev"),
    }
    Ok(())
}

/// nft.c add_nft_tcpudp: both single ports, inverted alike, in one 4-byte compare; else each
/// given range on its own.
fn port_matches(
    source: Option<([u16; 2], bool)>,
    destination: Option<([u16; 2], bool)>,
    out: &mut Vec<Expr>,
) {
    let single =
        |range: Option<([u16; 2], bool)>| range.filter(|([lo, hi], _)| *lo != 0 && lo == hi);
    if let (Some(([sport, _], sinv)), Some(([dport, _], dinv))) =
        (single(source), single(destination))
        && sinv == dinv
    {
        out.push(Expr::Payload {
            base: BASE_TRANSPORT,
            offset: 0,
            len: 4,
            dreg: REG_1,
        });
        let combined = u32::from(dport) | u32::from(sport) << 16;
        out.push(cmp(sinv, combined.to_be_bytes().to_vec()));
        return;
    }
    for (range, offset) in [(source, 0), (destination, 2)] {
        let Some(([lo, hi], inverted)) = range else {
            continue;
        };
        if lo == 0 && hi == 0xffff {
            continue;
        }
        out.push(Expr::Payload {
            base: BASE_TRANSPORT,
            offset,
            len: 2,
            dreg: REG_1,
        });
        out.push(if lo == hi {
            cmp(inverted, lo.to_be_bytes().to_vec())
        } else if lo == 0 {
            Expr::Cmp {
                sreg: REG_1,
                op: if inverted { CMP_GT } else { CMP_LTE },
                data: hi.to_be_bytes().to_vec(),
            }
        } else {
            Expr::Range {
                sreg: REG_1,
                op: u32::from(inverted),
                from: lo.to_be_bytes().to_vec(),
                to: hi.to_be_bytes().to_vec(),
            }
        });
    }
}

fn target_expression(ipv6: bool, target: &Target) -> Expr {
    let xt_target = |name: &str, revision, info| Expr::Target {
        name: name.to_string(),
        revision,
        info,
    };
    match target {
        Target::Verdict(code) => verdict(*code, None),
        Target::Jump(chain, code) => verdict(*code, Some(chain.clone())),
        // icmp-port-unreachable / icmp6-port-unreachable, the extensions' defaults.
        Target::Reject => xt_target("REJECT", 0, xt::reject(if ipv6 { 4 } else { 3 })),
        Target::Dnat(to) => {
            const MAP_IPS: u32 = 1;
            const PROTO_SPECIFIED: u32 = 2;
            let flags = to.map_or(0, |(_, port)| {
                MAP_IPS | if port.is_some() { PROTO_SPECIFIED } else { 0 }
            });
            xt_target(
                "DNAT",
                2,
                xt::nat_range2(flags, to.map(|(a, _)| a), to.and_then(|(_, p)| p)),
            )
        }
        Target::Mark { mark, mask } => xt_target("MARK", 2, xt::mark_v2(*mark, *mask)),
        Target::Masquerade(flags) => xt_target("MASQUERADE", 0, xt::masquerade(ipv6, *flags)),
    }
}

fn verdict(code: i32, chain: Option<String>) -> Expr {
    Expr::Immediate {
        dreg: REG_VERDICT,
        data: Data::Verdict(Verdict { code, chain }),
    }
}
