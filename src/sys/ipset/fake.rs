//! A stateful fake of ipset for tests: sets with their type, family and entries, changed by the
//! restore language this program writes (`create`, `add`, `del`, `flush`, `destroy`) with
//! `-exist`, as the kernel takes it: lines in order, up to the first refused one (a set that
//! does not exist, an entry of the wrong form or family, a net of every address, a set created
//! again with another type), which ipset names by its line. Entries are kept as `ipset save`
//! prints them (a one-address net without its prefix length). Not modelled: a set an iptables
//! rule still names is destroyed all the same.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use super::netlink::Entry;
use super::{IpsetError, IpsetLookups, Ipsets};
use crate::sys::host::process::{Ended, ToolError};
use crate::sys::netlink::NetlinkError;
use crate::sys::nf_tables::write::protocol_name;

/// One set: its `create` line's type and options, and its entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FakeSet {
    pub create: String,
    pub entries: BTreeSet<String>,
}

#[derive(Clone, Debug, Default)]
pub struct FakeIpset {
    pub sets: BTreeMap<String, FakeSet>,
    /// Lines of restores applied (entries added or deleted, sets created or destroyed).
    pub writes: usize,
    /// Entries holding one of these are refused, as a kernel refuses what it cannot take.
    pub refuse_containing: Vec<String>,
}

fn refused(line: usize, reason: &str) -> IpsetError {
    IpsetError::Tool(ToolError::Failed {
        command: "ipset restore -exist".into(),
        ended: Ended::Exited(1),
        stderr: format!("ipset v7.17: Error in line {line}: {reason}"),
    })
}

/// Whether `entry` has the form the set's type takes, in its family.
fn well_formed(create: &str, entry: &str) -> bool {
    let v6 = create.contains("family inet6");
    let address = |text: &str| text.parse::<IpAddr>().is_ok_and(|ip| ip.is_ipv6() == v6);
    // A net of every address (/0) is refused, as the kernel refuses it.
    let net = |text: &str| {
        let net = text
            .parse::<IpNet>()
            .or_else(|_| text.parse::<IpAddr>().map(IpNet::from));
        net.is_ok_and(|n| n.addr().is_ipv6() == v6 && n.prefix_len() > 0)
    };
    let port = |text: &str| {
        text.split_once(':').is_some_and(|(proto, port)| {
            matches!(proto, "tcp" | "udp" | "sctp") && port.parse::<u16>().is_ok()
        })
    };
    let parts: Vec<&str> = entry.split(',').collect();
    match (create.split_whitespace().next(), parts.as_slice()) {
        (Some("hash:ip"), [ip]) => address(ip),
        (Some("hash:ip,port"), [ip, p]) => address(ip) && port(p),
        (Some("hash:ip,port,ip"), [ip, p, other]) => address(ip) && port(p) && address(other),
        (Some("hash:ip,port,net"), [ip, p, n]) => address(ip) && port(p) && net(n),
        (Some("bitmap:port"), [p]) => p.parse::<u16>().is_ok(),
        _ => false,
    }
}

/// An entry as `ipset save` prints it: a net of one address without its prefix length.
fn saved_form(entry: &str) -> String {
    let parts: Vec<String> = entry
        .split(',')
        .map(|part| match part.parse::<IpNet>() {
            Ok(net) if net.prefix_len() == net.max_prefix_len() => net.addr().to_string(),
            _ => part.to_string(),
        })
        .collect();
    parts.join(",")
}

impl FakeIpset {
    /// The entries of set `name`.
    pub fn entries(&self, name: &str) -> BTreeSet<String> {
        self.sets
            .get(name)
            .map(|s| s.entries.clone())
            .unwrap_or_default()
    }

    fn line(&mut self, line: &str) -> Result<(), &'static str> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let missing = "The set with the given name does not exist";
        match words.as_slice() {
            ["create", name, rest @ ..] => {
                let create = rest.join(" ");
                match self.sets.get(*name) {
                    Some(set) if set.create != create => {
                        return Err("Set cannot be created: set with the same name already exists");
                    }
                    Some(_) => return Ok(()),
                    None => {
                        self.sets.insert(
                            name.to_string(),
                            FakeSet {
                                create,
                                entries: BTreeSet::new(),
                            },
                        );
                    }
                }
            }
            [verb @ ("add" | "del"), name, entry] => {
                if self
                    .refuse_containing
                    .iter()
                    .any(|r| entry.contains(r.as_str()))
                {
                    return Err("Kernel error received: Invalid argument");
                }
                let set = self.sets.get_mut(*name).ok_or(missing)?;
                if !well_formed(&set.create, entry) {
                    return Err("Syntax error: cannot parse the entry");
                }
                let entry = saved_form(entry);
                let changed = if *verb == "add" {
                    set.entries.insert(entry)
                } else {
                    set.entries.remove(&entry)
                };
                if !changed {
                    // -exist: adding a present entry or deleting a missing one is no error.
                    return Ok(());
                }
            }
            ["flush", name] => self.sets.get_mut(*name).ok_or(missing)?.entries.clear(),
            ["destroy", name] => {
                self.sets.remove(*name).ok_or(missing)?;
            }
            _ => return Err("Syntax error: unknown command"),
        }
        self.writes += 1;
        Ok(())
    }
}

impl Ipsets for FakeIpset {
    fn save_sets(&self, names: &[String]) -> Result<String, IpsetError> {
        let mut out = String::new();
        for name in names {
            if let Some(set) = self.sets.get(name) {
                out.push_str(&format!("create {name} {}\n", set.create));
                for entry in &set.entries {
                    out.push_str(&format!("add {name} {entry}\n"));
                }
            }
        }
        Ok(out)
    }

    fn restore(&mut self, input: &str) -> Result<(), IpsetError> {
        for (index, line) in input.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            self.line(line.trim())
                .map_err(|reason| refused(index + 1, reason))?;
        }
        Ok(())
    }

    fn destroy(&mut self, names: &[String]) -> Result<usize, IpsetError> {
        let present = names
            .iter()
            .filter(|n| self.sets.remove(*n).is_some())
            .count();
        self.writes += present;
        Ok(present)
    }
}

/// Whether `entry` (an entry as saved: `10.0.0.1,tcp:80`) holds what `wanted` asks for.
fn holds(create: &str, entry: &str, wanted: &Entry) -> bool {
    let parts: Vec<&str> = entry.split(',').collect();
    let address = |text: &str, want: Option<IpAddr>| text.parse::<IpAddr>().ok() == want;
    let within = |text: &str, want: Option<IpAddr>| {
        let net = text
            .parse::<IpNet>()
            .or_else(|_| text.parse::<IpAddr>().map(IpNet::from));
        matches!((net, want), (Ok(net), Some(ip)) if net.contains(&ip))
    };
    let proto_port = |text: &str| {
        let (name, number) = text.split_once(':').unwrap_or(("", text));
        Some(name) == wanted.protocol.and_then(protocol_name)
            && number.parse::<u16>().ok() == wanted.port
    };
    match (create.split_whitespace().next(), parts.as_slice()) {
        (Some("hash:ip"), [ip]) => address(ip, wanted.address),
        (Some("hash:ip,port"), [ip, p]) => address(ip, wanted.address) && proto_port(p),
        (Some("hash:ip,port,ip"), [ip, p, other]) => {
            address(ip, wanted.address) && proto_port(p) && address(other, wanted.address2)
        }
        (Some("hash:ip,port,net"), [ip, p, net]) => {
            address(ip, wanted.address) && proto_port(p) && within(net, wanted.address2)
        }
        (Some("bitmap:port"), [p]) => p.parse::<u16>().ok() == wanted.port,
        _ => false,
    }
}

impl IpsetLookups for FakeIpset {
    fn test(&mut self, tests: &[(&str, Entry)]) -> Result<Vec<Option<bool>>, NetlinkError> {
        Ok(tests
            .iter()
            .map(|(name, wanted)| {
                let set = self.sets.get(*name)?;
                Some(set.entries.iter().any(|e| holds(&set.create, e, wanted)))
            })
            .collect())
    }
}
