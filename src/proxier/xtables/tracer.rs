//! A packet tracer over iptables rules in the fake (the test oracle of the modes that write
//! them): follows a packet through a chain and the chains it jumps to, every `statistic` branch
//! taken, and [`trace`] follows iptables mode's path (nat, then filter) and reports the
//! endpoints it can reach, whether it is masqueraded, or that it is dropped or rejected.
//! Affinity (`recent --rcheck`) is taken as a miss: a first packet. A set match (`-m set`) asks
//! the caller's [`Facts`].

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::model::{IpFamily, Protocol};
pub use crate::proxier::flows::Verdict;
use crate::sys::xtables::fake::{FakeIptables, Table};
use crate::sys::xtables::tokenize;

/// One packet.
#[derive(Clone, Debug)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub dport: u16,
    pub protocol: Protocol,
    /// Sent by a process on the node (OUTPUT) rather than arriving (PREROUTING).
    pub from_node: bool,
}

impl Packet {
    /// The first packet of a table's flow.
    pub fn of(case: &crate::proxier::flows::Case) -> Packet {
        Packet {
            src: case.src.parse().unwrap(),
            dst: case.dst.parse().unwrap(),
            dport: case.port,
            protocol: case.protocol,
            from_node: case.from_node,
        }
    }
}

/// One way through a chain: marked for masquerade, DNAT'd, and how it ended.
#[derive(Clone, Debug, Default)]
pub struct Path {
    pub mark: bool,
    pub dnat: Option<String>,
    pub verdict: Option<&'static str>,
    /// Met a MASQUERADE target (which ends nat's chains).
    pub masqueraded: bool,
}

/// What a rule's match needs besides the packet.
pub struct Facts<'a> {
    /// Whether an address is the node's.
    pub is_local: &'a dyn Fn(&IpAddr) -> bool,
    /// Whether the packet is in set `name`, its parts taken as `dirs` says (`dst,dst`).
    pub in_set: &'a dyn Fn(&str, &str, &Packet) -> bool,
}

/// Traces `packet` through the fake's tables; `local` are the node's own addresses.
pub fn trace(ipt: &FakeIptables, family: IpFamily, local: &[IpAddr], packet: &Packet) -> Verdict {
    let is_local = |ip: &IpAddr| local.contains(ip) || ip.is_loopback();
    let facts = Facts {
        is_local: &is_local,
        in_set: &|_, _, _| false,
    };
    let is_local = &facts;
    let nat = ipt.table(family, "nat");
    let start = if packet.from_node {
        "OUTPUT"
    } else {
        "PREROUTING"
    };
    let paths = walk(&nat, start, packet, Path::default(), is_local, 0);
    let filter = ipt.table(family, "filter");
    let mut endpoints = BTreeSet::new();
    let mut masquerade = false;
    for path in paths {
        let mut after = packet.clone();
        if let Some(dnat) = &path.dnat {
            let addr: std::net::SocketAddr = dnat.parse().expect("DNAT target");
            after.dst = addr.ip();
            after.dport = addr.port();
        }
        let chains: &[&str] = if packet.from_node {
            &["OUTPUT"]
        } else if path.dnat.is_none() && (facts.is_local)(&after.dst) {
            &["INPUT"]
        } else {
            &["FORWARD"]
        };
        for chain in chains {
            for filtered in walk(
                &filter,
                chain,
                &after,
                Path {
                    mark: path.mark,
                    ..Path::default()
                },
                is_local,
                0,
            ) {
                match filtered.verdict {
                    Some("DROP") => return Verdict::Drop,
                    Some("REJECT") => return Verdict::Reject,
                    _ => {}
                }
            }
        }
        if let Some(dnat) = path.dnat {
            endpoints.insert(dnat);
        }
        masquerade |= path.mark;
    }
    Verdict::Accept {
        endpoints,
        masquerade,
    }
}

/// Every way through `chain`: each returned path either ended (DNAT, ACCEPT, DROP, REJECT) or fell
/// off the end / returned.
pub fn walk(
    table: &Table,
    chain: &str,
    packet: &Packet,
    path: Path,
    is_local: &Facts<'_>,
    depth: usize,
) -> Vec<Path> {
    assert!(depth < 32, "jump loop at {chain}");
    let Some(rules) = table.chain(chain) else {
        return vec![path];
    };
    let mut live = vec![path];
    let mut done = Vec::new();
    for rule in rules {
        let words = tokenize(rule).expect("rule");
        let mut next = Vec::new();
        for current in live {
            match matches(&words, packet, &current, is_local) {
                Match::No => next.push(current),
                Match::Yes => apply(
                    table, &words, packet, current, is_local, depth, &mut next, &mut done,
                ),
                Match::Maybe => {
                    next.push(current.clone());
                    apply(
                        table, &words, packet, current, is_local, depth, &mut next, &mut done,
                    );
                }
            }
        }
        live = next;
    }
    done.extend(live);
    done
}

#[allow(clippy::too_many_arguments)]
fn apply(
    table: &Table,
    words: &[String],
    packet: &Packet,
    mut path: Path,
    is_local: &Facts<'_>,
    depth: usize,
    next: &mut Vec<Path>,
    done: &mut Vec<Path>,
) {
    let target = words
        .iter()
        .position(|w| w == "-j")
        .and_then(|i| words.get(i + 1))
        .map(String::as_str);
    match target {
        None => next.push(path),
        Some("DNAT") => {
            let at = words
                .iter()
                .position(|w| w == "--to-destination")
                .expect("--to-destination");
            path.dnat = Some(words[at + 1].clone());
            done.push(path);
        }
        Some("MARK") => {
            if words.iter().any(|w| w == "--or-mark") {
                path.mark = true;
            } else if words.iter().any(|w| w == "--xor-mark") {
                path.mark = !path.mark;
            }
            next.push(path);
        }
        Some("RETURN") => done.push(path),
        Some(verdict @ ("ACCEPT" | "DROP" | "REJECT")) => {
            path.verdict = Some(match verdict {
                "ACCEPT" => "ACCEPT",
                "DROP" => "DROP",
                _ => "REJECT",
            });
            done.push(path);
        }
        Some("MASQUERADE") => {
            path.masqueraded = true;
            done.push(path);
        }
        Some(chain) => {
            for result in walk(table, chain, packet, path, is_local, depth + 1) {
                if result.dnat.is_some() || result.verdict.is_some() || result.masqueraded {
                    done.push(result);
                } else {
                    next.push(result);
                }
            }
        }
    }
}

enum Match {
    Yes,
    No,
    /// A `statistic` rule: both outcomes are possible.
    Maybe,
}

fn matches(words: &[String], packet: &Packet, path: &Path, facts: &Facts<'_>) -> Match {
    let is_local = facts.is_local;
    let mut i = 0;
    let mut negate = false;
    let mut random = false;
    while i < words.len() {
        let word = words[i].as_str();
        let value = words.get(i + 1).map(String::as_str).unwrap_or_default();
        let ok = match word {
            "!" => {
                negate = true;
                i += 1;
                continue;
            }
            "-s" => in_net(&packet.src, value),
            "-d" => in_net(&packet.dst, value),
            "-p" => value == packet.protocol.lower(),
            "--dport" => value.parse() == Ok(packet.dport),
            "--src-type" => is_local(&packet.src),
            "--dst-type" => is_local(&packet.dst),
            "--ctstate" => value.split(',').any(|s| s == "NEW"),
            "--mark" => path.mark,
            "--match-set" => {
                let dirs = words.get(i + 2).map(String::as_str).unwrap_or_default();
                let holds = (facts.in_set)(value, dirs, packet);
                if holds == negate {
                    return Match::No;
                }
                negate = false;
                i += 3;
                continue;
            }
            "--rcheck" => false,
            // Through a bridge port: the nodes these tables describe have no bridge.
            "--physdev-is-in" => false,
            "--probability" => {
                random = true;
                true
            }
            "-i" => false,
            "-j" => break,
            // Words that match nothing: a module's name, a comment, the recent module's
            // bookkeeping, the statistic module's mode.
            "-m" | "--comment" | "--name" | "--mask" | "--seconds" | "--mode" => {
                i += 2;
                continue;
            }
            "--set" | "--rsource" | "--reap" => {
                i += 1;
                continue;
            }
            // Anything else would widen the match if skipped.
            other => panic!("the tracer does not model {other:?} in {words:?}"),
        };
        if ok == negate {
            return Match::No;
        }
        negate = false;
        i += if matches!(word, "--rcheck" | "--physdev-is-in") {
            1
        } else {
            2
        };
    }
    if random { Match::Maybe } else { Match::Yes }
}

fn in_net(ip: &IpAddr, text: &str) -> bool {
    match text.parse::<IpNet>() {
        Ok(net) => net.contains(ip),
        Err(_) => text.parse::<IpAddr>().is_ok_and(|other| other == *ip),
    }
}
