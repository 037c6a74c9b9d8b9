//! A rule's text as iptables-nft 1.8.9 writes it into nf_tables: the interfaces, protocol and
//! addresses first (iptables/nft-ipv4.c, nft-ipv6.c), then each match in the order the rule
//! names them (native expressions for tcp/udp ports and marks, an xtables `match` for the rest:
//! nft.c add_match), and last the target (a verdict, or an xtables `target`: add_action).
//! Only the options our renderer writes are known; anything else is refused, so that a rule this
//! module cannot vouch for is rewritten rather than wrongly kept.

use std::net::IpAddr;

use ipnet::IpNet;

use super::expr::*;
use super::xt;
use crate::sys::iptables::tokenize;

/// Why a rule's kernel form cannot be told.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct Untranslatable(String);

fn refuse<T>(what: impl Into<String>) -> Result<T, Untranslatable> {
    Err(Untranslatable(what.into()))
}

/// One xtables match of a rule, as its options fill it.
enum MatchOptions {
    Comment(String),
    /// `-m tcp` / `-m udp`: source and destination port ranges, each possibly inverted.
    Ports {
        tcp: bool,
        source: Option<([u16; 2], bool)>,
        destination: Option<([u16; 2], bool)>,
    },
    Sctp {
        source: Option<[u16; 2]>,
        destination: Option<[u16; 2]>,
    },
    Addrtype {
        source: u16,
        destination: u16,
        flags: u32,
    },
    Conntrack {
        states: u16,
        inverted: bool,
    },
    Mark {
        mark: u32,
        mask: u32,
        inverted: bool,
    },
    Statistic {
        probability: u32,
        inverted: bool,
    },
    Recent {
        name: String,
        check_set: u8,
        seconds: u32,
        hit_count: u32,
        side: u8,
    },
    Nfacct(String),
}

/// The rule's target.
enum Target {
    Verdict(i32),
    Jump(String, i32),
    Reject,
    Dnat(Option<(IpAddr, Option<u16>)>),
    Mark { mark: u32, mask: u32 },
    Masquerade(u32),
}

/// An address match: the address (masked), its mask and whether it is inverted.
struct AddressMatch {
    address: Vec<u8>,
    mask: Vec<u8>,
    inverted: bool,
}

/// Everything one rule's options say.
#[derive(Default)]
struct Parsed {
    in_interface: Option<(String, bool)>,
    out_interface: Option<(String, bool)>,
    protocol: Option<(u8, bool)>,
    source: Option<AddressMatch>,
    destination: Option<AddressMatch>,
    matches: Vec<MatchOptions>,
    target: Option<Target>,
}

/// The expressions iptables-nft writes for `spec` (the text after `-A <chain>`), counters left
/// out, in the order the kernel keeps them.
pub fn translate(ipv6: bool, spec: &str) -> Result<Vec<XtExpr>, Untranslatable> {
    let words = tokenize(spec).map_err(Untranslatable)?;
    let parsed = parse(ipv6, &words)?;
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
        out.push(XtExpr::Meta {
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

fn cmp(inverted: bool, value: Vec<u8>) -> XtExpr {
    XtExpr::Cmp {
        sreg: REG_1,
        op: if inverted { CMP_NEQ } else { CMP_EQ },
        value,
    }
}

/// nft-shared.c add_iniface / add_outiface: `eth0` compares the name and its NUL, `veth+` the
/// prefix alone.
fn interface_match(key: u32, name: &str, inverted: bool, out: &mut Vec<XtExpr>) {
    out.push(XtExpr::Meta { key, dreg: REG_1 });
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
fn address_match(matched: &AddressMatch, offset: u32, out: &mut Vec<XtExpr>) {
    let mask = &matched.mask;
    let first_partial = mask.iter().position(|b| *b != 0xff).unwrap_or(mask.len());
    let bitwise = first_partial < mask.len()
        && (mask[first_partial] != 0 || mask[first_partial + 1..].iter().any(|b| *b != 0));
    let len = if bitwise { mask.len() } else { first_partial };
    out.push(XtExpr::Payload {
        base: BASE_NETWORK,
        offset,
        len: len as u32,
        dreg: REG_1,
    });
    if bitwise {
        out.push(XtExpr::Bitwise {
            sreg: REG_1,
            dreg: REG_1,
            mask: mask.clone(),
            xor: vec![0; len],
        });
    }
    out.push(cmp(matched.inverted, matched.address[..len].to_vec()));
}

fn xt_match(name: &str, revision: u32, info: Vec<u8>) -> XtExpr {
    XtExpr::Match {
        name: name.to_string(),
        revision,
        info,
    }
}

fn match_expressions(
    matched: &MatchOptions,
    protocol: Option<(u8, bool)>,
    out: &mut Vec<XtExpr>,
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
            out.push(XtExpr::Meta {
                key: META_MARK,
                dreg: REG_1,
            });
            if *mask != u32::MAX {
                out.push(XtExpr::Bitwise {
                    sreg: REG_1,
                    dreg: REG_1,
                    mask: mask.to_ne_bytes().to_vec(),
                    xor: vec![0; 4],
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
    }
    Ok(())
}

/// nft.c add_nft_tcpudp: both single ports, inverted alike, in one 4-byte compare; else each
/// given range on its own.
fn port_matches(
    source: Option<([u16; 2], bool)>,
    destination: Option<([u16; 2], bool)>,
    out: &mut Vec<XtExpr>,
) {
    let single =
        |range: Option<([u16; 2], bool)>| range.filter(|([lo, hi], _)| *lo != 0 && lo == hi);
    if let (Some(([sport, _], sinv)), Some(([dport, _], dinv))) =
        (single(source), single(destination))
        && sinv == dinv
    {
        out.push(XtExpr::Payload {
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
        out.push(XtExpr::Payload {
            base: BASE_TRANSPORT,
            offset,
            len: 2,
            dreg: REG_1,
        });
        out.push(if lo == hi {
            cmp(inverted, lo.to_be_bytes().to_vec())
        } else if lo == 0 {
            XtExpr::Cmp {
                sreg: REG_1,
                op: if inverted { CMP_GT } else { CMP_LTE },
                value: hi.to_be_bytes().to_vec(),
            }
        } else {
            XtExpr::Range {
                sreg: REG_1,
                op: u32::from(inverted),
                from: lo.to_be_bytes().to_vec(),
                to: hi.to_be_bytes().to_vec(),
            }
        });
    }
}

fn target_expression(ipv6: bool, target: &Target) -> XtExpr {
    let xt_target = |name: &str, revision, info| XtExpr::Target {
        name: name.to_string(),
        revision,
        info,
    };
    match target {
        Target::Verdict(code) => XtExpr::Verdict {
            code: *code,
            chain: None,
        },
        Target::Jump(chain, code) => XtExpr::Verdict {
            code: *code,
            chain: Some(chain.clone()),
        },
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

/// Reads the options as iptables does: header options anywhere, `!` before the option it
/// inverts, an extension's options after its `-m` (or the target's after `-j`).
fn parse(ipv6: bool, words: &[String]) -> Result<Parsed, Untranslatable> {
    let mut parsed = Parsed::default();
    let mut inverted = false;
    let mut index = 0;
    let next = |index: &mut usize| -> Result<&str, Untranslatable> {
        *index += 1;
        words
            .get(*index)
            .map(String::as_str)
            .ok_or_else(|| Untranslatable(format!("{} needs a value", words[*index - 1])))
    };
    while index < words.len() {
        let word = words[index].as_str();
        match word {
            "!" => {
                inverted = true;
                index += 1;
                continue;
            }
            "-s" | "--source" | "--src" | "-d" | "--destination" | "--dst" => {
                let value = next(&mut index)?;
                let matched = address(ipv6, value, inverted)?;
                let slot = if word.starts_with("-s") || word.starts_with("--s") {
                    &mut parsed.source
                } else {
                    &mut parsed.destination
                };
                if slot.replace(matched).is_some() {
                    return refuse(format!("{word} given twice"));
                }
            }
            "-i" | "--in-interface" => {
                parsed.in_interface = Some((next(&mut index)?.to_string(), inverted));
            }
            "-o" | "--out-interface" => {
                parsed.out_interface = Some((next(&mut index)?.to_string(), inverted));
            }
            "-p" | "--protocol" => {
                let protocol = match next(&mut index)? {
                    "tcp" => 6,
                    "udp" => 17,
                    "sctp" => 132,
                    other => return refuse(format!("protocol {other}")),
                };
                parsed.protocol = Some((protocol, inverted));
            }
            "-m" | "--match" => {
                let matched = match next(&mut index)? {
                    "comment" => MatchOptions::Comment(String::new()),
                    name @ ("tcp" | "udp") => MatchOptions::Ports {
                        tcp: name == "tcp",
                        source: None,
                        destination: None,
                    },
                    "sctp" => MatchOptions::Sctp {
                        source: None,
                        destination: None,
                    },
                    "addrtype" => MatchOptions::Addrtype {
                        source: 0,
                        destination: 0,
                        flags: 0,
                    },
                    "conntrack" => MatchOptions::Conntrack {
                        states: 0,
                        inverted: false,
                    },
                    "mark" => MatchOptions::Mark {
                        mark: 0,
                        mask: u32::MAX,
                        inverted: false,
                    },
                    "statistic" => MatchOptions::Statistic {
                        probability: 0,
                        inverted: false,
                    },
                    "recent" => MatchOptions::Recent {
                        name: "DEFAULT".into(),
                        check_set: 0,
                        seconds: 0,
                        hit_count: 0,
                        side: 0,
                    },
                    "nfacct" => MatchOptions::Nfacct(String::new()),
                    other => return refuse(format!("match {other}")),
                };
                parsed.matches.push(matched);
            }
            "-j" | "--jump" | "-g" | "--goto" => {
                let goto = word.starts_with("-g") || word == "--goto";
                let target = match next(&mut index)? {
                    "ACCEPT" => Target::Verdict(NF_ACCEPT),
                    "DROP" => Target::Verdict(NF_DROP),
                    "RETURN" => Target::Verdict(NFT_RETURN),
                    "REJECT" => Target::Reject,
                    "DNAT" => Target::Dnat(None),
                    "MARK" => Target::Mark { mark: 0, mask: 0 },
                    "MASQUERADE" => Target::Masquerade(0),
                    chain if chain.starts_with("KUBE-") => {
                        Target::Jump(chain.to_string(), if goto { NFT_GOTO } else { NFT_JUMP })
                    }
                    other => return refuse(format!("target {other}")),
                };
                parsed.target = Some(target);
            }
            option if option.starts_with("--") => {
                extension_option(&mut parsed, option, inverted, words, &mut index)?;
            }
            other => return refuse(format!("unexpected {other:?}")),
        }
        inverted = false;
        index += 1;
    }
    if inverted {
        return refuse("a trailing !");
    }
    Ok(parsed)
}

/// An extension's option: the target's if it takes it, else the first match's that does.
fn extension_option(
    parsed: &mut Parsed,
    option: &str,
    inverted: bool,
    words: &[String],
    index: &mut usize,
) -> Result<(), Untranslatable> {
    let mut value = || -> Result<String, Untranslatable> {
        *index += 1;
        words
            .get(*index)
            .cloned()
            .ok_or_else(|| Untranslatable(format!("{option} needs a value")))
    };
    if let Some(target) = parsed.target.as_mut() {
        match (target, option) {
            (Target::Reject, "--reject-with") => {
                let with = value()?;
                return if ["icmp-port-unreachable", "icmp6-port-unreachable"]
                    .contains(&with.as_str())
                {
                    Ok(())
                } else {
                    refuse(format!("--reject-with {with}"))
                };
            }
            (Target::Dnat(to), "--to-destination") => {
                *to = Some(nat_destination(&value()?)?);
                return Ok(());
            }
            (Target::Mark { mark, mask }, _) if option.ends_with("-mark") => {
                let number = number(&value()?)?;
                (*mark, *mask) = match option {
                    "--or-mark" => (number, number),
                    "--xor-mark" => (number, 0),
                    "--and-mark" => (0, !number),
                    _ => return refuse(format!("MARK {option}")),
                };
                return Ok(());
            }
            (Target::Masquerade(flags), "--random-fully") => {
                *flags |= 0x10;
                return Ok(());
            }
            (Target::Masquerade(flags), "--random") => {
                *flags |= 0x4;
                return Ok(());
            }
            _ => {}
        }
    }
    for matched in parsed.matches.iter_mut() {
        match (matched, option) {
            (MatchOptions::Comment(text), "--comment") => {
                *text = value()?;
            }
            (
                MatchOptions::Ports {
                    source,
                    destination,
                    ..
                },
                "--dport" | "--destination-port" | "--sport" | "--source-port",
            ) => {
                let range = Some((port_range(&value()?)?, inverted));
                if option.contains('d') && !option.contains("source") {
                    *destination = range;
                } else {
                    *source = range;
                }
            }
            (
                MatchOptions::Sctp {
                    source,
                    destination,
                },
                "--dport" | "--destination-port" | "--sport" | "--source-port",
            ) if !inverted => {
                let range = Some(port_range(&value()?)?);
                if option.contains('d') && !option.contains("source") {
                    *destination = range;
                } else {
                    *source = range;
                }
            }
            (
                MatchOptions::Addrtype {
                    source,
                    destination,
                    flags,
                },
                "--src-type" | "--dst-type",
            ) => {
                let types = address_types(&value()?)?;
                if option == "--src-type" {
                    *source = types;
                    *flags |= u32::from(inverted);
                } else {
                    *destination = types;
                    *flags |= u32::from(inverted) << 1;
                }
            }
            (
                MatchOptions::Conntrack {
                    states,
                    inverted: inv,
                },
                "--ctstate",
            ) => {
                *states = conntrack_states(&value()?)?;
                *inv = inverted;
            }
            (
                MatchOptions::Mark {
                    mark,
                    mask,
                    inverted: inv,
                },
                "--mark",
            ) => {
                let text = value()?;
                let (value, mask_text) = match text.split_once('/') {
                    Some((value, mask)) => (value, Some(mask)),
                    None => (text.as_str(), None),
                };
                *mark = number(value)?;
                *mask = mask_text.map(number).transpose()?.unwrap_or(u32::MAX);
                *inv = inverted;
            }
            (MatchOptions::Statistic { .. }, "--mode") => {
                let mode = value()?;
                if mode != "random" {
                    return refuse(format!("statistic mode {mode}"));
                }
            }
            (
                MatchOptions::Statistic {
                    probability,
                    inverted: inv,
                },
                "--probability",
            ) => {
                let text = value()?;
                let p: f64 = text
                    .parse()
                    .map_err(|_| Untranslatable(format!("probability {text}")))?;
                if !(0.0..=1.0).contains(&p) {
                    return refuse(format!("probability {text}"));
                }
                // libxt_statistic: lround(0x80000000 * p).
                *probability = (2_147_483_648.0 * p).round() as u32;
                *inv = inverted;
            }
            (MatchOptions::Recent { .. }, _) if inverted => {
                return refuse(format!("! {option}"));
            }
            (MatchOptions::Recent { name, .. }, "--name") => *name = value()?,
            (MatchOptions::Recent { seconds, .. }, "--seconds") => *seconds = number(&value()?)?,
            (MatchOptions::Recent { hit_count, .. }, "--hitcount") => {
                *hit_count = number(&value()?)?
            }
            (MatchOptions::Recent { side, .. }, "--rsource") => *side = 0,
            (MatchOptions::Recent { side, .. }, "--rdest") => *side = 1,
            (MatchOptions::Recent { check_set, .. }, flag) => {
                *check_set |= match flag {
                    "--rcheck" => 1,
                    "--set" => 2,
                    "--update" => 4,
                    "--remove" => 8,
                    "--rttl" => 16,
                    "--reap" => 32,
                    _ => continue,
                };
            }
            (MatchOptions::Nfacct(name), "--nfacct-name") => *name = value()?,
            _ => continue,
        }
        return Ok(());
    }
    refuse(format!("option {option}"))
}

/// An address or network: `10.0.0.1`, `10.0.0.0/8`, `fd00::/64`; the address is masked, as
/// iptables masks it.
fn address(ipv6: bool, text: &str, inverted: bool) -> Result<AddressMatch, Untranslatable> {
    let net: IpNet = match text.parse::<IpNet>() {
        Ok(net) => net,
        Err(_) => text
            .parse::<IpAddr>()
            .map(IpNet::from)
            .map_err(|_| Untranslatable(format!("address {text}")))?,
    };
    if net.addr().is_ipv6() != ipv6 {
        return refuse(format!("address {text} of the other family"));
    }
    let bytes = |address: IpAddr| match address {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    Ok(AddressMatch {
        address: bytes(net.network()),
        mask: bytes(net.netmask()),
        inverted,
    })
}

/// `80` or `8000:8080`.
fn port_range(text: &str) -> Result<[u16; 2], Untranslatable> {
    let port = |t: &str| {
        t.parse::<u16>()
            .map_err(|_| Untranslatable(format!("port {text}")))
    };
    match text.split_once(':') {
        Some((lo, hi)) => Ok([port(lo)?, port(hi)?]),
        None => {
            let p = port(text)?;
            Ok([p, p])
        }
    }
}

/// A number as strtoul with base 0 reads it: `0x4000`, `16384`.
fn number(text: &str) -> Result<u32, Untranslatable> {
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.map_err(|_| Untranslatable(format!("number {text}")))
}

/// addrtype's types (`LOCAL`, `UNICAST,LOCAL`): bit `1 << RTN_*`.
fn address_types(text: &str) -> Result<u16, Untranslatable> {
    const TYPES: [&str; 12] = [
        "UNSPEC",
        "UNICAST",
        "LOCAL",
        "BROADCAST",
        "ANYCAST",
        "MULTICAST",
        "BLACKHOLE",
        "UNREACHABLE",
        "PROHIBIT",
        "THROW",
        "NAT",
        "XRESOLVE",
    ];
    text.split(',').try_fold(0u16, |mask, name| {
        let bit = TYPES
            .iter()
            .position(|t| t.eq_ignore_ascii_case(name))
            .ok_or_else(|| Untranslatable(format!("address type {name}")))?;
        Ok(mask | 1 << bit)
    })
}

/// conntrack's states: INVALID 1, ESTABLISHED 2, RELATED 4, NEW 8, SNAT 64, DNAT 128,
/// UNTRACKED 256 (linux/netfilter/xt_conntrack.h).
fn conntrack_states(text: &str) -> Result<u16, Untranslatable> {
    text.split(',').try_fold(0u16, |mask, name| {
        let bit = match name.to_ascii_uppercase().as_str() {
            "INVALID" => 1,
            "ESTABLISHED" => 2,
            "RELATED" => 4,
            "NEW" => 8,
            "SNAT" => 64,
            "DNAT" => 128,
            "UNTRACKED" => 256,
            _ => return refuse(format!("conntrack state {name}")),
        };
        Ok(mask | bit)
    })
}

/// DNAT's `--to-destination`: `10.0.0.1`, `10.0.0.1:80`, `[fd00::1]:80`, `fd00::1`.
fn nat_destination(text: &str) -> Result<(IpAddr, Option<u16>), Untranslatable> {
    let bad = || Untranslatable(format!("--to-destination {text}"));
    let (address, port) = if let Some(rest) = text.strip_prefix('[') {
        let (address, after) = rest.split_once(']').ok_or_else(bad)?;
        let port = match after.strip_prefix(':') {
            Some(port) => Some(port),
            None if after.is_empty() => None,
            None => return Err(bad()),
        };
        (address, port)
    } else if text.matches(':').count() == 1 {
        let (address, port) = text.split_once(':').ok_or_else(bad)?;
        (address, Some(port))
    } else {
        (text, None)
    };
    let address: IpAddr = address.parse().map_err(|_| bad())?;
    let port = port
        .map(|p| p.parse::<u16>().map_err(|_| bad()))
        .transpose()?;
    Ok((address, port))
}
