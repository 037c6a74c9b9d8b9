//! Our rule text read as iptables reads its options: header options (addresses, interfaces,
//! protocol) anywhere, `!` before the option it inverts, an extension's options after its `-m`
//! (or the target's after `-j`). Only the options our renderer writes are known.

use std::borrow::Cow;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::sys::xtables::tokenize;

use crate::sys::nf_tables::wire::{NF_ACCEPT, NF_DROP, NFT_GOTO, NFT_JUMP, NFT_RETURN};

/// Why a rule's kernel form cannot be told.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct Untranslatable(pub(super) String);

pub(super) fn refuse<T>(what: impl Into<String>) -> Result<T, Untranslatable> {
    Err(Untranslatable(what.into()))
}

/// One xtables match of a rule, as its options fill it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MatchOptions {
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
    /// `-m set [!] --match-set NAME FLAGS`: whether the packet's `FLAGS` (`dst,dst`: its
    /// destination address and port) make an entry of ipset NAME. Read from iptables-nft, the
    /// kernel holds the set's index, not its name: `index` is set and `name` empty until
    /// ipset names it.
    Set {
        name: String,
        flags: String,
        inverted: bool,
        index: Option<u16>,
    },
    /// `-m physdev [!] --physdev-is-in`: whether the packet came in through a bridge port.
    Physdev {
        is_in: Option<bool>,
    },
}

/// The rule's target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Verdict(i32),
    Jump(String, i32),
    Reject,
    Dnat(Option<(IpAddr, Option<u16>)>),
    Mark { mark: u32, mask: u32 },
    Masquerade(u32),
}

/// An address match: the address (masked), its mask and whether it is inverted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddressMatch {
    pub address: Vec<u8>,
    pub mask: Vec<u8>,
    pub inverted: bool,
}

/// Everything one rule's options say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuleOptions {
    pub in_interface: Option<(String, bool)>,
    pub out_interface: Option<(String, bool)>,
    pub protocol: Option<(u8, bool)>,
    pub source: Option<AddressMatch>,
    pub destination: Option<AddressMatch>,
    pub matches: Vec<MatchOptions>,
    pub target: Option<Target>,
}

/// Reads `spec` (the text after `-A <chain>`).
pub fn read_rule(ipv6: bool, spec: &str) -> Result<RuleOptions, Untranslatable> {
    parse(ipv6, &words(spec)?)
}

/// `spec`'s words as restore splits them (`sys::xtables::tokenize`), borrowed where no quote
/// is in one: 350,000 rules are read at a restart of 10,000 services.
fn words(spec: &str) -> Result<Vec<Cow<'_, str>>, Untranslatable> {
    if spec.contains('"') {
        let words = tokenize(spec).map_err(Untranslatable)?;
        return Ok(words.into_iter().map(Cow::Owned).collect());
    }
    Ok(spec.split_whitespace().map(Cow::Borrowed).collect())
}

/// Reads the options as iptables does: header options anywhere, `!` before the option it
/// inverts, an extension's options after its `-m` (or the target's after `-j`).
fn parse(ipv6: bool, words: &[Cow<'_, str>]) -> Result<RuleOptions, Untranslatable> {
    let mut parsed = RuleOptions::default();
    let mut inverted = false;
    let mut index = 0;
    let next = |index: &mut usize| -> Result<&str, Untranslatable> {
        *index += 1;
        words
            .get(*index)
            .map(|word| word.as_ref())
            .ok_or_else(|| Untranslatable(format!("{} needs a value", words[*index - 1])))
    };
    while index < words.len() {
        let word = words[index].as_ref();
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
                    "set" => MatchOptions::Set {
                        name: String::new(),
                        flags: String::new(),
                        inverted: false,
                        index: None,
                    },
                    "physdev" => MatchOptions::Physdev { is_in: None },
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
    parsed: &mut RuleOptions,
    option: &str,
    inverted: bool,
    words: &[Cow<'_, str>],
    index: &mut usize,
) -> Result<(), Untranslatable> {
    let mut value = || -> Result<String, Untranslatable> {
        *index += 1;
        words
            .get(*index)
            .map(|word| word.to_string())
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
            // `--set-xmark VALUE/MASK` is how iptables-legacy-save prints every MARK rule.
            (Target::Mark { mark, mask }, "--set-xmark") => {
                let text = value()?;
                let (value, mask_text) = text.split_once('/').unwrap_or((&text, "0xffffffff"));
                (*mark, *mask) = (number(value)?, number(mask_text)?);
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
            // iptables-legacy-save prints the mask, all ones unless `--mask` was given.
            (MatchOptions::Recent { .. }, "--mask") => {
                let mask = value()?;
                if !["255.255.255.255", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"]
                    .contains(&mask.as_str())
                {
                    return refuse(format!("recent --mask {mask}"));
                }
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
            (
                MatchOptions::Set {
                    name,
                    flags,
                    inverted: inv,
                    ..
                },
                "--match-set",
            ) => {
                (*name, *flags, *inv) = (value()?, value()?, inverted);
            }
            (MatchOptions::Physdev { is_in }, "--physdev-is-in") => *is_in = Some(!inverted),
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
    let bytes = crate::model::address::octets;
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

/// addrtype's type names, at their bit (`1 << RTN_*`, linux/rtnetlink.h).
pub(super) const ADDRESS_TYPES: [&str; 12] = [
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

/// addrtype's types (`LOCAL`, `UNICAST,LOCAL`) as their bits.
fn address_types(text: &str) -> Result<u16, Untranslatable> {
    text.split(',').try_fold(0u16, |mask, name| {
        let bit = ADDRESS_TYPES
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
