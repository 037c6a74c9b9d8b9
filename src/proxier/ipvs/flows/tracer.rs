//! IPVS mode's path for the first packet of a connection, on the fakes a sync left: nat's
//! PREROUTING (arriving) or OUTPUT (sent by the node), which only mark for masquerade; filter's
//! INPUT, FORWARD or OUTPUT (the firewall, the access filter); then, for a destination on the
//! node, the virtual server on it, which sends the packet to a real server (rr: each real
//! server with weight in turn; wrr: in proportion to the weights; kube-proxy gives each
//! endpoint 1, a terminating one 0) or, with none, answers port unreachable; then nat's
//! POSTROUTING, which masquerades. A connection the node opens to one of its own addresses that
//! no virtual server takes comes back in over the loopback, through filter's INPUT. It reads
//! only the fakes' state: the rules as iptables holds them, the sets' entries, the virtual
//! servers.

use std::cell::RefCell;
use std::net::{IpAddr, SocketAddr};

use super::Node;
use crate::model::IpFamily;
use crate::proxier::flows::{Case, Fate, Traced};
use crate::proxier::xtables::tracer::{Facts, Packet, Path, walk};
use crate::sys::ipset::IpsetLookups;
use crate::sys::ipset::fake::FakeIpset;
use crate::sys::ipset::netlink::Entry;
use crate::sys::ipvs::{Ipvs, VirtualServer};
use crate::sys::xtables::fake::Table;

/// The entry of set `name` a packet makes, its parts taken as `dirs` says.
fn entry(ipset: &FakeIpset, name: &str, dirs: &str, packet: &Packet) -> Entry {
    let kind = ipset
        .sets
        .get(name)
        .and_then(|s| s.create.split_whitespace().next().map(str::to_string))
        .unwrap_or_default();
    let dims: Vec<&str> = match kind.as_str() {
        "bitmap:port" => vec!["port"],
        "hash:ip" => vec!["ip"],
        "hash:ip,port" => vec!["ip", "port"],
        _ => vec!["ip", "port", "ip2"],
    };
    let mut entry = Entry::default();
    for (dim, dir) in dims.iter().zip(dirs.split(',')) {
        let address = if dir == "src" { packet.src } else { packet.dst };
        match *dim {
            "ip" => entry.address = Some(address),
            "ip2" => entry.address2 = Some(address),
            _ => {
                entry.port = (dir == "dst").then_some(packet.dport);
                entry.protocol = Some(packet.protocol.number());
            }
        }
    }
    entry
}

/// Every way `case` goes through the node.
pub fn trace(
    node: &Node,
    ipset: &RefCell<FakeIpset>,
    family: IpFamily,
    case: &Case,
) -> Vec<Traced> {
    let packet = Packet::of(case);
    let is_local = |ip: &IpAddr| ip.is_loopback() || node.local.contains(ip);
    let in_set = |name: &str, dirs: &str, packet: &Packet| {
        let asked = entry(&ipset.borrow(), name, dirs, packet);
        let answer = ipset.borrow_mut().test(&[(name, asked)]);
        matches!(answer.as_deref(), Ok([Some(true)]))
    };
    let facts = Facts {
        is_local: &is_local,
        in_set: &in_set,
    };
    let nat = node.iptables.table(family, "nat");
    let filter = node.iptables.table(family, "filter");
    let start = if packet.from_node {
        "OUTPUT"
    } else {
        "PREROUTING"
    };
    let local = is_local(&packet.dst);
    let filtering = match (packet.from_node, local) {
        (true, _) => "OUTPUT",
        (false, true) => "INPUT",
        (false, false) => "FORWARD",
    };
    let mut out = Vec::new();
    for marked in walk(&nat, start, &packet, Path::default(), &facts, 0) {
        let start = Path {
            mark: marked.mark,
            ..Path::default()
        };
        for filtered in walk(&filter, filtering, &packet, start, &facts, 0) {
            let ended = |fate| Traced {
                weight: 1.0,
                fate,
                endpoint: None,
                masquerade: false,
            };
            match filtered.verdict {
                Some("DROP") => out.push(ended(Fate::Dropped)),
                Some("REJECT") => out.push(ended(Fate::Rejected)),
                _ if packet.from_node || local => {
                    match scheduled(node, &nat, &packet, filtered.mark, &facts) {
                        Some(paths) => out.extend(paths),
                        // No virtual server: the node's own sockets take it (the node's own
                        // connection after the loopback and filter's INPUT).
                        None if local && packet.from_node => {
                            out.push(looped_back(&filter, &packet, &facts))
                        }
                        None if local => out.push(ended(Fate::Accepted)),
                        None => out.push(Traced {
                            masquerade: postrouting(&nat, &packet, filtered.mark, &facts),
                            ..ended(Fate::Accepted)
                        }),
                    }
                }
                _ => out.push(Traced {
                    masquerade: postrouting(&nat, &packet, filtered.mark, &facts),
                    ..ended(Fate::Accepted)
                }),
            }
        }
    }
    out
}

/// A connection of the node's to its own address, back in over the loopback: filter's INPUT,
/// then its sockets.
fn looped_back(filter: &Table, packet: &Packet, facts: &Facts<'_>) -> Traced {
    let arriving = Packet {
        from_node: false,
        ..packet.clone()
    };
    let verdicts: Vec<Option<&str>> = walk(filter, "INPUT", &arriving, Path::default(), facts, 0)
        .iter()
        .map(|p| p.verdict)
        .collect();
    let fate = if verdicts.contains(&Some("REJECT")) {
        Fate::Rejected
    } else if verdicts.contains(&Some("DROP")) {
        Fate::Dropped
    } else {
        Fate::Accepted
    };
    Traced {
        weight: 1.0,
        fate,
        endpoint: None,
        masquerade: false,
    }
}

/// Whether nat's POSTROUTING masquerades `packet`, marked or not.
fn postrouting(nat: &Table, packet: &Packet, mark: bool, facts: &Facts<'_>) -> bool {
    let start = Path {
        mark,
        ..Path::default()
    };
    walk(nat, "POSTROUTING", packet, start, facts, 0)
        .iter()
        .any(|p| p.masqueraded)
}

/// The virtual server on the packet's destination and postrouting after it; `None` without
/// a virtual server there.
fn scheduled(
    node: &Node,
    nat: &Table,
    packet: &Packet,
    mark: bool,
    facts: &Facts<'_>,
) -> Option<Vec<Traced>> {
    let asked = VirtualServer {
        address: packet.dst,
        protocol: packet.protocol,
        port: packet.dport,
        scheduler: String::new(),
        flags: 0,
        timeout: 0,
    };
    let found = node.ipvs.clone().service(&asked).ok().flatten();
    let vs = found?;
    let reals = node.ipvs.clone().destinations(&vs).unwrap_or_default();
    let usable: Vec<_> = reals.iter().filter(|r| r.weight > 0).collect();
    if usable.is_empty() {
        return Some(vec![Traced {
            weight: 1.0,
            fate: Fate::Rejected,
            endpoint: None,
            masquerade: false,
        }]);
    }
    // rr gives each real server with weight a turn; wrr turns in proportion to the weights.
    let share = |weight: u32| {
        if vs.scheduler == "wrr" {
            f64::from(weight) / f64::from(usable.iter().map(|r| r.weight).sum::<u32>())
        } else {
            1.0 / usable.len() as f64
        }
    };
    Some(
        usable
            .iter()
            .map(|real| {
                let after = Packet {
                    dst: real.address,
                    dport: real.port,
                    ..packet.clone()
                };
                Traced {
                    weight: share(real.weight),
                    fate: Fate::Accepted,
                    endpoint: Some(SocketAddr::new(real.address, real.port)),
                    masquerade: postrouting(nat, &after, mark, facts),
                }
            })
            .collect(),
    )
}
