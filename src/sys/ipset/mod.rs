//! ipset through `ipset restore`: one batched restore per sync that creates missing sets and adds
//! and deletes only the entries that differ, never a process per entry (upstream's per-entry exec
//! made nodes with thousands of services time out); reads of our sets only, never `ipset save` of
//! every set.

pub mod fake;
pub mod netlink;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::host::process::{Tool, ToolError};
use crate::model::IpFamily;

/// Why an ipset operation failed.
#[derive(Debug, thiserror::Error)]
pub enum IpsetError {
    /// The tool could not be run, or failed.
    #[error(transparent)]
    Tool(#[from] ToolError),
}

/// The set types IPVS mode uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetType {
    HashIp,
    HashIpPort,
    HashIpPortIp,
    HashIpPortNet,
    BitmapPort,
}

impl SetType {
    /// As ipset spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            SetType::HashIp => "hash:ip",
            SetType::HashIpPort => "hash:ip,port",
            SetType::HashIpPortIp => "hash:ip,port,ip",
            SetType::HashIpPortNet => "hash:ip,port,net",
            SetType::BitmapPort => "bitmap:port",
        }
    }
}

/// One set: its name, type and family.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SetSpec {
    pub name: String,
    pub set_type: SetType,
    pub family: IpFamily,
}

impl SetSpec {
    /// The `create` line, as upstream creates them (hashsize 1024, maxelem 65536, ports 0-65535).
    fn create_line(&self) -> String {
        match self.set_type {
            SetType::BitmapPort => format!("create {} bitmap:port range 0-65535", self.name),
            other => {
                let family = if self.family == IpFamily::V4 {
                    "inet"
                } else {
                    "inet6"
                };
                format!(
                    "create {} {} family {family} hashsize 1024 maxelem 65536",
                    self.name,
                    other.as_str()
                )
            }
        }
    }
}

/// The entries of each set, as `ipset save` shows them.
pub type SetEntries = BTreeMap<String, BTreeSet<String>>;

/// Reads `ipset save` output: set names (created ones, even when empty) and their entries.
pub fn parse_save(text: &str) -> SetEntries {
    let mut sets = SetEntries::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some("create"), Some(name), _) => {
                sets.entry(name.to_string()).or_default();
            }
            (Some("add"), Some(name), Some(entry)) => {
                sets.entry(name.to_string())
                    .or_default()
                    .insert(entry.to_string());
            }
            _ => {}
        }
    }
    sets
}

/// The restore input that takes the sets from `current` to `desired` (only the sets in `desired`
/// are touched); `None` when nothing differs.
pub fn sync_input(
    desired: &BTreeMap<SetSpec, BTreeSet<String>>,
    current: &SetEntries,
) -> Option<String> {
    let mut out = String::new();
    let empty = BTreeSet::new();
    for (spec, entries) in desired {
        let existing = current.get(&spec.name);
        if existing.is_none() {
            out.push_str(&spec.create_line());
            out.push('\n');
        }
        let existing = existing.unwrap_or(&empty);
        for gone in existing.difference(entries) {
            out.push_str(&format!("del {} {gone}\n", spec.name));
        }
        for new in entries.difference(existing) {
            out.push_str(&format!("add {} {new}\n", spec.name));
        }
    }
    (!out.is_empty()).then_some(out)
}

/// The ipset operations IPVS mode makes, on its own sets only.
pub trait Ipsets: Send {
    /// `ipset save` of these sets only (the ones that exist).
    fn save_sets(&self, names: &[String]) -> Result<String, IpsetError>;
    /// `ipset restore -exist` of `input`: its lines in order, up to the first one refused.
    fn restore(&mut self, input: &str) -> Result<(), IpsetError>;
    /// Destroys sets by name; missing ones are fine. Returns how many there were.
    fn destroy(&mut self, names: &[String]) -> Result<usize, IpsetError>;
}

impl Ipsets for SystemIpset {
    fn save_sets(&self, names: &[String]) -> Result<String, IpsetError> {
        SystemIpset::save_sets(self, names)
    }

    fn restore(&mut self, input: &str) -> Result<(), IpsetError> {
        SystemIpset::restore(self, input)
    }

    fn destroy(&mut self, names: &[String]) -> Result<usize, IpsetError> {
        SystemIpset::destroy(self, names)
    }
}

/// Lookups of single entries (`explain`'s reads): whether each entry is in its set,
/// `Some(member)`, or `None` when there is no such set.
pub trait IpsetLookups: Send {
    fn test(
        &mut self,
        tests: &[(&str, netlink::Entry)],
    ) -> Result<Vec<Option<bool>>, crate::sys::netlink::NetlinkError>;
}

impl IpsetLookups for netlink::IpsetNetlink {
    fn test(
        &mut self,
        tests: &[(&str, netlink::Entry)],
    ) -> Result<Vec<Option<bool>>, crate::sys::netlink::NetlinkError> {
        netlink::IpsetNetlink::test(self, tests)
    }
}

/// The real tool, in this thread's network namespace.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemIpset;

/// How long one ipset command may run.
const IPSET_LIMIT: Duration = Duration::from_secs(120);

impl SystemIpset {
    /// The names of every set (`ipset list -n`: names only, no entries).
    pub fn names(&self) -> Result<BTreeSet<String>, IpsetError> {
        let out = Tool::new("ipset", &["list", "-n"])
            .limit(IPSET_LIMIT)
            .run()?;
        Ok(String::from_utf8_lossy(&out)
            .lines()
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .map(str::to_string)
            .collect())
    }

    /// `ipset save` of these sets only (the ones that exist), in one process: other programs'
    /// sets, however large, are not read.
    pub fn save_sets(&self, names: &[String]) -> Result<String, IpsetError> {
        let existing = self.names()?;
        let input: String = names
            .iter()
            .filter(|name| existing.contains(*name))
            .map(|name| format!("save {name}\n"))
            .collect();
        if input.is_empty() {
            return Ok(String::new());
        }
        let out = Tool::new("ipset", &["restore"])
            .input(input.as_bytes())
            .limit(IPSET_LIMIT)
            .run()?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// `ipset save` of one set (one process); `None` when there is no such set.
    pub fn save_set(&self, set: &str) -> Result<Option<String>, IpsetError> {
        match Tool::new("ipset", &["save", set]).limit(IPSET_LIMIT).run() {
            Ok(out) => Ok(Some(String::from_utf8_lossy(&out).into_owned())),
            Err(failure)
                if failure
                    .stderr()
                    .is_some_and(|why| why.contains("does not exist")) =>
            {
                Ok(None)
            }
            Err(failure) => Err(failure.into()),
        }
    }

    /// Whether `entry` is in `set` (`ipset test`: the kernel looks that one entry up); `None`
    /// when there is no such set.
    pub fn test(&self, set: &str, entry: &str) -> Result<Option<bool>, IpsetError> {
        match Tool::new("ipset", &["test", set, entry])
            .limit(IPSET_LIMIT)
            .run()
        {
            Ok(_) => Ok(Some(true)),
            Err(failure) => match failure.stderr() {
                Some(why) if why.contains("is NOT in set") => Ok(Some(false)),
                Some(why) if why.contains("does not exist") => Ok(None),
                _ => Err(failure.into()),
            },
        }
    }

    /// `ipset restore -exist`, fed on stdin.
    pub fn restore(&self, input: &str) -> Result<(), IpsetError> {
        Tool::new("ipset", &["restore", "-exist"])
            .input(input.as_bytes())
            .limit(IPSET_LIMIT)
            .run()?;
        Ok(())
    }

    /// Destroys sets by name; missing ones are fine. Returns how many there were.
    pub fn destroy(&self, names: &[String]) -> Result<usize, IpsetError> {
        let existing = self.names()?;
        let present: Vec<&String> = names.iter().filter(|n| existing.contains(*n)).collect();
        if !present.is_empty() {
            let input: String = present.iter().map(|n| format!("destroy {n}\n")).collect();
            self.restore(&input)?;
        }
        Ok(present.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, set_type: SetType) -> SetSpec {
        SetSpec {
            name: name.into(),
            set_type,
            family: IpFamily::V4,
        }
    }

    #[test]
    fn save_output_parses_and_diffs_minimally() {
        let save = "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x1\n\
                    add KUBE-CLUSTER-IP 10.96.0.1,tcp:443\nadd KUBE-CLUSTER-IP 10.96.0.9,tcp:80\n\
                    create KUBE-NODE-PORT-TCP bitmap:port range 0-65535\ncreate OTHER hash:ip family inet\nadd OTHER 1.2.3.4\n";
        let current = parse_save(save);
        assert_eq!(current["KUBE-CLUSTER-IP"].len(), 2);
        assert!(current["KUBE-NODE-PORT-TCP"].is_empty());
        let desired = BTreeMap::from([
            (
                spec("KUBE-CLUSTER-IP", SetType::HashIpPort),
                BTreeSet::from([
                    "10.96.0.1,tcp:443".to_string(),
                    "10.96.0.10,udp:53".to_string(),
                ]),
            ),
            (
                spec("KUBE-NODE-PORT-TCP", SetType::BitmapPort),
                BTreeSet::from(["30080".to_string()]),
            ),
            (
                spec("KUBE-LOOP-BACK", SetType::HashIpPortIp),
                BTreeSet::new(),
            ),
        ]);
        let input = sync_input(&desired, &current).unwrap();
        assert_eq!(
            input,
            "del KUBE-CLUSTER-IP 10.96.0.9,tcp:80\nadd KUBE-CLUSTER-IP 10.96.0.10,udp:53\n\
             create KUBE-LOOP-BACK hash:ip,port,ip family inet hashsize 1024 maxelem 65536\n\
             add KUBE-NODE-PORT-TCP 30080\n"
        );
        assert!(
            !input.contains("OTHER"),
            "sets that are not ours are never touched"
        );
        let mut after = current.clone();
        after.insert("KUBE-LOOP-BACK".into(), BTreeSet::new());
        after.insert(
            "KUBE-CLUSTER-IP".into(),
            desired[&spec("KUBE-CLUSTER-IP", SetType::HashIpPort)].clone(),
        );
        after.insert(
            "KUBE-NODE-PORT-TCP".into(),
            BTreeSet::from(["30080".to_string()]),
        );
        assert_eq!(sync_input(&desired, &after), None);
    }
}
