//! A rule iptables-nft wrote, read back into its options: the inverse of nft.rs for the forms it
//! writes (every rule our renderer writes), so that the nft back end's rules, read over netlink,
//! are read as `iptables-legacy-save`'s text is (`kube-proxy-rs explain`). Anything else is
//! refused, never guessed.

use super::parse::{AddressMatch, MatchOptions, RuleOptions, Target, Untranslatable, refuse};
use crate::sys::nf_tables::expr::{Data, Expr};
use crate::sys::nf_tables::wire::{
    BASE_NETWORK, BASE_TRANSPORT, CMP_EQ, CMP_GT, CMP_LTE, CMP_NEQ, META_IIFNAME, META_L4PROTO,
    META_MARK, META_OIFNAME,
};

/// The options of the rule whose expressions (counters included or not) are `expressions`.
pub fn rule_options(ipv6: bool, expressions: &[Expr]) -> Result<RuleOptions, Untranslatable> {
    let mut options = RuleOptions::default();
    let mut rest = expressions
        .iter()
        .filter(|e| !matches!(e, Expr::Counter))
        .peekable();
    let (source_offset, destination_offset, width) = if ipv6 { (8, 24, 16) } else { (12, 16, 4) };
    while let Some(expression) = rest.next() {
        match expression {
            Expr::MetaLoad {
                key: key @ (META_IIFNAME | META_OIFNAME),
                ..
            } => {
                // `+` alone (any interface) loads the name and compares nothing.
                if !matches!(rest.peek(), Some(Expr::Cmp { .. })) {
                    continue;
                }
                let Compare::Cmp(op, name, _) = compare(&mut rest)? else {
                    return refuse("an interface range");
                };
                let interface = match name.strip_suffix(&[0]) {
                    Some(exact) => String::from_utf8_lossy(exact).into_owned(),
                    None => format!("{}+", String::from_utf8_lossy(&name)),
                };
                let slot = if *key == META_IIFNAME {
                    &mut options.in_interface
                } else {
                    &mut options.out_interface
                };
                *slot = Some((interface, op == CMP_NEQ));
            }
            Expr::MetaLoad {
                key: META_L4PROTO, ..
            } => match compare(&mut rest)? {
                Compare::Cmp(op, value, None) if value.len() == 1 => {
                    options.protocol = Some((value[0], op == CMP_NEQ));
                }
                _ => return refuse("a protocol match"),
            },
            Expr::MetaLoad { key: META_MARK, .. } => {
                let Compare::Cmp(op, value, mask) = compare(&mut rest)? else {
                    return refuse("a mark range");
                };
                options.matches.push(MatchOptions::Mark {
                    mark: ne_u32(&value, 0)?,
                    mask: mask.map_or(Ok(u32::MAX), |m| ne_u32(&m, 0))?,
                    inverted: op == CMP_NEQ,
                });
            }
            Expr::Payload {
                base: BASE_NETWORK,
                offset,
                len,
                ..
            } if *offset == source_offset || *offset == destination_offset => {
                let Compare::Cmp(op, value, mask) = compare(&mut rest)? else {
                    return refuse("an address range");
                };
                let mut address = value;
                address.resize(width, 0);
                let mask = mask.unwrap_or_else(|| {
                    let mut whole = vec![0xff; *len as usize];
                    whole.resize(width, 0);
                    whole
                });
                let matched = AddressMatch {
                    address,
                    mask,
                    inverted: op == CMP_NEQ,
                };
                if *offset == source_offset {
                    options.source = Some(matched);
                } else {
                    options.destination = Some(matched);
                }
            }
            Expr::Payload {
                base: BASE_TRANSPORT,
                offset,
                len,
                ..
            } => {
                let ranges = port_ranges(*offset, *len, compare(&mut rest)?)?;
                let tcp = options.protocol.is_some_and(|(p, _)| p == 6);
                let ports = ports_match(&mut options, tcp);
                if let MatchOptions::Ports {
                    source,
                    destination,
                    ..
                } = ports
                {
                    for (is_source, range) in ranges {
                        *(if is_source {
                            &mut *source
                        } else {
                            &mut *destination
                        }) = Some(range);
                    }
                }
            }
            Expr::Match {
                name,
                revision,
                info,
            } if name == "set" => options.matches.push(set_match(*revision, info)?),
            Expr::Match { name, info, .. } => options.matches.push(xt_match(name, info)?),
            Expr::Immediate {
                data: Data::Verdict(verdict),
                ..
            } => {
                options.target = Some(match &verdict.chain {
                    Some(chain) => Target::Jump(chain.clone(), verdict.code),
                    None => Target::Verdict(verdict.code),
                })
            }
            Expr::Target { name, info, .. } => options.target = Some(xt_target(ipv6, name, info)?),
            other => return refuse(format!("expression {other:?}")),
        }
    }
    Ok(options)
}

/// A load's mask, if one follows it, and the compare that ends the match.
fn compare<'a>(
    rest: &mut std::iter::Peekable<impl Iterator<Item = &'a Expr>>,
) -> Result<Compare, Untranslatable> {
    let mask = match rest.peek() {
        Some(Expr::Bitwise { mask, .. }) => {
            let mask = mask.clone();
            rest.next();
            Some(mask)
        }
        _ => None,
    };
    match rest.next() {
        Some(Expr::Cmp { op, data, .. }) => Ok(Compare::Cmp(*op, data.clone(), mask)),
        Some(Expr::Range { op, from, to, .. }) => {
            Ok(Compare::Range(*op != 0, from.clone(), to.clone()))
        }
        other => refuse(format!("a load followed by {other:?}")),
    }
}

/// How a match's loaded value is compared: an operator, the value and the mask applied before;
/// or a range, inverted or not.
enum Compare {
    Cmp(u32, Vec<u8>, Option<Vec<u8>>),
    Range(bool, Vec<u8>, Vec<u8>),
}

/// A transport header load's compare as port ranges: `(is the source's, (range, inverted))`.
type PortRange = ([u16; 2], bool);

fn port_ranges(
    offset: u32,
    len: u32,
    compare: Compare,
) -> Result<Vec<(bool, PortRange)>, Untranslatable> {
    let port = |bytes: &[u8], at: usize| -> Result<u16, Untranslatable> {
        bytes
            .get(at..at + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
            .ok_or_else(|| Untranslatable("a short port".into()))
    };
    match (offset, len, compare) {
        // Both ports in one compare: source in the first two bytes.
        (0, 4, Compare::Cmp(op @ (CMP_EQ | CMP_NEQ), value, None)) => {
            let inverted = op == CMP_NEQ;
            let (source, destination) = (port(&value, 0)?, port(&value, 2)?);
            Ok(vec![
                (true, ([source, source], inverted)),
                (false, ([destination, destination], inverted)),
            ])
        }
        (0 | 2, 2, compare) => {
            let range = match compare {
                Compare::Cmp(op @ (CMP_EQ | CMP_NEQ), value, None) => {
                    let p = port(&value, 0)?;
                    ([p, p], op == CMP_NEQ)
                }
                Compare::Cmp(CMP_LTE, value, None) => ([0, port(&value, 0)?], false),
                Compare::Cmp(CMP_GT, value, None) => ([0, port(&value, 0)?], true),
                Compare::Range(inverted, from, to) => ([port(&from, 0)?, port(&to, 0)?], inverted),
                _ => return refuse("a port compare"),
            };
            Ok(vec![(offset == 0, range)])
        }
        _ => refuse(format!("a transport header load at {offset}")),
    }
}

/// The rule's `-m tcp`/`-m udp` match, made when the ports come first.
fn ports_match(options: &mut RuleOptions, tcp: bool) -> &mut MatchOptions {
    let at = options
        .matches
        .iter()
        .position(|m| matches!(m, MatchOptions::Ports { .. }));
    let at = at.unwrap_or_else(|| {
        options.matches.push(MatchOptions::Ports {
            tcp,
            source: None,
            destination: None,
        });
        options.matches.len() - 1
    });
    &mut options.matches[at]
}

fn ne_u16(info: &[u8], at: usize) -> Result<u16, Untranslatable> {
    info.get(at..at + 2)
        .map(|b| u16::from_ne_bytes([b[0], b[1]]))
        .ok_or_else(|| Untranslatable(format!("an info struct shorter than {}", at + 2)))
}

fn ne_u32(info: &[u8], at: usize) -> Result<u32, Untranslatable> {
    info.get(at..at + 4)
        .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or_else(|| Untranslatable(format!("an info struct shorter than {}", at + 4)))
}

/// A NUL-terminated string field of `size` bytes at `at`.
fn text(info: &[u8], at: usize, size: usize) -> Result<String, Untranslatable> {
    let field = info
        .get(at..at + size)
        .ok_or_else(|| Untranslatable("a short string field".into()))?;
    let end = field.iter().position(|b| *b == 0).unwrap_or(size);
    Ok(String::from_utf8_lossy(&field[..end]).into_owned())
}

/// An xtables match's info struct (the layouts of xt.rs).
fn xt_match(name: &str, info: &[u8]) -> Result<MatchOptions, Untranslatable> {
    Ok(match name {
        "comment" => MatchOptions::Comment(text(info, 0, 256)?),
        "tcp" | "udp" => MatchOptions::Ports {
            tcp: name == "tcp",
            source: None,
            destination: None,
        },
        "sctp" => {
            // Destination then source range; the flags after the chunk map and flag info.
            const FLAGS: usize = 8 + 256 + 4 + 12 + 4;
            let flags = ne_u32(info, FLAGS)?;
            let range = |at| -> Result<[u16; 2], Untranslatable> {
                Ok([ne_u16(info, at)?, ne_u16(info, at + 2)?])
            };
            MatchOptions::Sctp {
                destination: (flags & 2 != 0).then(|| range(0)).transpose()?,
                source: (flags & 1 != 0).then(|| range(4)).transpose()?,
            }
        }
        "addrtype" => MatchOptions::Addrtype {
            source: ne_u16(info, 0)?,
            destination: ne_u16(info, 2)?,
            flags: ne_u32(info, 4)?,
        },
        "conntrack" => {
            // After eight addresses and masks, the expiry range, protocol and ports.
            const FLAGS: usize = 8 * 16 + 2 * 4 + 2 + 4 * 2;
            MatchOptions::Conntrack {
                states: ne_u16(info, FLAGS + 4)?,
                inverted: ne_u16(info, FLAGS + 2)? & 1 != 0,
            }
        }
        "statistic" => {
            if ne_u16(info, 0)? != 0 {
                return refuse("a statistic match not in random mode");
            }
            MatchOptions::Statistic {
                probability: ne_u32(info, 4)?,
                inverted: ne_u16(info, 2)? & 1 != 0,
            }
        }
        "recent" => MatchOptions::Recent {
            seconds: ne_u32(info, 0)?,
            hit_count: ne_u32(info, 4)?,
            check_set: *info.get(8).unwrap_or(&0),
            name: text(info, 10, 200)?,
            side: *info.get(210).unwrap_or(&0),
        },
        "nfacct" => MatchOptions::Nfacct(text(info, 0, 32)?),
        // xt_physdev_info: four 16-byte names and masks, then the inverted and given options;
        // only `[!] --physdev-is-in` is ours.
        "physdev" => {
            const IS_IN: u8 = 0x08;
            match info.get(64..66) {
                Some(&[inverted, IS_IN]) => MatchOptions::Physdev {
                    is_in: Some(inverted & IS_IN == 0),
                },
                _ => return refuse("a physdev match other than --physdev-is-in"),
            }
        }
        other => return refuse(format!("match {other}")),
    })
}

/// The set match's info struct: `xt_set_info` first in revisions 1-4 (the set's index, its
/// dimensions, a bit per dimension that takes the source, bit 0 inverted, bit 7 return-nomatch),
/// then in 3 and 4 two counter conditions (`--packets-gt` ...), whose operators we refuse.
fn set_match(revision: u32, info: &[u8]) -> Result<MatchOptions, Untranslatable> {
    const RETURN_NOMATCH: u8 = 1 << 7;
    let index = ne_u16(info, 0)?;
    let (dimensions, flags) = match (revision, info.get(2..4)) {
        (1..=4, Some(&[dimensions, flags])) if (1..=6).contains(&dimensions) => (dimensions, flags),
        _ => return refuse(format!("set match revision {revision}")),
    };
    // Revision 3's counters are (op, value), revision 4's (value, op), each 16 bytes from 8.
    let operators = match revision {
        3 => [8, 24],
        4 => [16, 32],
        _ => [0, 0],
    };
    let counted = revision >= 3
        && operators
            .iter()
            .any(|at| info.get(*at).is_none_or(|op| *op != 0));
    if flags & RETURN_NOMATCH != 0 || counted {
        return refuse("a set match with --return-nomatch or counter conditions");
    }
    Ok(MatchOptions::Set {
        name: String::new(),
        flags: (1..=dimensions)
            .map(|d| if flags & (1 << d) != 0 { "src" } else { "dst" })
            .collect::<Vec<_>>()
            .join(","),
        inverted: flags & 1 != 0,
        index: Some(index),
    })
}

/// An xtables target's info struct.
fn xt_target(ipv6: bool, name: &str, info: &[u8]) -> Result<Target, Untranslatable> {
    Ok(match name {
        "REJECT" => Target::Reject,
        "DNAT" => {
            const MAP_IPS: u32 = 1;
            const PROTO_SPECIFIED: u32 = 2;
            let flags = ne_u32(info, 0)?;
            if flags & MAP_IPS == 0 {
                return Ok(Target::Dnat(None));
            }
            let address = info
                .get(4..20)
                .ok_or_else(|| Untranslatable("a short DNAT range".into()))?;
            let address = if ipv6 {
                let octets: [u8; 16] = address.try_into().unwrap_or_default();
                std::net::IpAddr::from(octets)
            } else {
                std::net::IpAddr::from([address[0], address[1], address[2], address[3]])
            };
            let port = match info.get(36..38) {
                Some(b) if flags & PROTO_SPECIFIED != 0 => Some(u16::from_be_bytes([b[0], b[1]])),
                _ => None,
            };
            Target::Dnat(Some((address, port)))
        }
        "MARK" => Target::Mark {
            mark: ne_u32(info, 0)?,
            mask: ne_u32(info, 4)?,
        },
        "MASQUERADE" => Target::Masquerade(ne_u32(info, if ipv6 { 0 } else { 4 })?),
        other => return refuse(format!("target {other}")),
    })
}

#[cfg(test)]
mod tests {
    use super::super::nft::nft_expressions;
    use super::super::parse::read_rule;
    use super::*;

    /// Our rule text, through iptables-nft's expressions and back, reads as the text does.
    #[test]
    fn every_form_we_write_reads_back_as_its_text() {
        for (ipv6, spec) in [
            (
                false,
                "-m comment --comment \"ns/svc:p cluster IP\" -m tcp -p tcp -d 10.96.0.10/32 --dport 80 -j KUBE-SVC-ABC",
            ),
            (
                false,
                "! -s 10.244.0.0/16 -d 10.96.0.10/32 -p udp -m udp --dport 53 -j KUBE-MARK-MASQ",
            ),
            (
                false,
                "-s 10.0.0.0/9 -p tcp -m tcp --sport 1:1000 --dport 8000:8080 -j RETURN",
            ),
            (
                false,
                "-m statistic --mode random --probability 0.3333333333 -j KUBE-SEP-A",
            ),
            (
                false,
                "-m recent --name KUBE-SEP-A --rcheck --seconds 10800 --reap -j KUBE-SEP-A",
            ),
            (
                false,
                "-p tcp -m recent --name KUBE-SEP-A --set -m tcp -j DNAT --to-destination 10.244.1.5:8080",
            ),
            (
                false,
                "-m addrtype ! --dst-type LOCAL -m conntrack --ctstate NEW -j REJECT",
            ),
            (
                false,
                "-m mark --mark 0x4000/0x4000 -j MASQUERADE --random-fully",
            ),
            (false, "-i eth0 -o veth+ -j MARK --or-mark 0x4000"),
            (false, "-p sctp -m sctp --dport 9000 -j ACCEPT"),
            (
                true,
                "-d fd00::10/128 -p tcp -m tcp --dport 80 -j KUBE-SVC-ABC",
            ),
            (
                true,
                "-p tcp -m tcp -j DNAT --to-destination [fd00::5]:8080",
            ),
            (true, "-s fd00:1::/48 -j MASQUERADE"),
        ] {
            let expressions = nft_expressions(ipv6, spec).expect(spec);
            let decoded = rule_options(ipv6, &expressions).expect(spec);
            let read = read_rule(ipv6, spec).expect(spec);
            assert_eq!(format!("{decoded:?}"), format!("{read:?}"), "{spec}");
        }
    }

    #[test]
    fn set_and_physdev_matches_read_as_their_options() {
        // Revision 4: index 3, three dimensions, the first a source, inverted.
        let mut info = vec![0u8; 48];
        info[..4].copy_from_slice(&[3, 0, 3, 0b0000_0011]);
        assert_eq!(
            set_match(4, &info).unwrap(),
            MatchOptions::Set {
                name: String::new(),
                flags: "src,dst,dst".into(),
                inverted: true,
                index: Some(u16::from_ne_bytes([3, 0])),
            }
        );
        let mut counted = info.clone();
        counted[16] = 1;
        assert!(set_match(4, &counted).is_err(), "a counter condition");
        let mut nomatch = info.clone();
        nomatch[3] |= 1 << 7;
        assert!(set_match(4, &nomatch).is_err(), "return-nomatch");
        assert!(set_match(0, &info).is_err(), "revision 0's layout");
        assert!(set_match(1, &info[..4]).is_ok());

        let mut physdev = vec![0u8; 66];
        physdev[65] = 0x08;
        assert_eq!(
            xt_match("physdev", &physdev).unwrap(),
            MatchOptions::Physdev { is_in: Some(true) }
        );
        physdev[64] = 0x08;
        assert_eq!(
            xt_match("physdev", &physdev).unwrap(),
            MatchOptions::Physdev { is_in: Some(false) }
        );
        physdev[65] = 0x01;
        assert!(xt_match("physdev", &physdev).is_err(), "--physdev-in");
    }

    #[test]
    fn an_unknown_expression_is_refused() {
        let expressions = vec![Expr::Numgen {
            dreg: 1,
            modulus: 2,
            offset: 0,
        }];
        assert!(rule_options(false, &expressions).is_err());
    }
}
