//! nf_tables over netlink, read only: the names of one table's chains (or sets), without a
//! single rule or element.
//! The iptables nft back end keeps its tables (`nat`, `filter`, ...) in nf_tables, and this is
//! how stale chains of ours are found on a node whose tables hold hundreds of thousands of rules:
//! `iptables-nft-save` would read (and, at that size, crash on) every rule.

use super::expr::{Expr, decode_rule};
use std::collections::{BTreeMap, BTreeSet};

use netlink_packet_core::{
    DecodeError, NetlinkDeserializable, NetlinkHeader, NetlinkSerializable, NlaBuffer, NlasIterator,
};
use netlink_sys::protocols::NETLINK_NETFILTER;

use crate::model::IpFamily;
pub(crate) use crate::sys::netlink::RawMessage;
pub use crate::sys::netlink::attributes;
use crate::sys::netlink::{Connection, NetlinkError};

use super::wire::{
    Attributes, NFNL_SUBSYS_NFTABLES, NFPROTO_IPV4, NFPROTO_IPV6, NFT_MSG_GETCHAIN, NFT_MSG_GETOBJ,
    NFT_MSG_GETRULE, NFT_MSG_GETSET, NFT_MSG_GETTABLE, NFT_MSG_NEWCHAIN, NFT_MSG_NEWOBJ,
    NFT_MSG_NEWRULE, NFT_MSG_NEWSET, NFT_OBJECT_COUNTER, NFTA_CHAIN_NAME, NFTA_COUNTER_PACKETS,
    NFTA_OBJ_DATA, NFTA_OBJ_NAME, NFTA_OBJ_TYPE, NFTA_RULE_CHAIN, NFTA_RULE_USERDATA,
    NFTA_SET_NAME, NFTA_TABLE_NAME, NFTNL_UDATA_COMMENT,
};
use super::wire::{
    NFT_MSG_GETFLOWTABLE, NFT_MSG_NEWFLOWTABLE, NFTA_DEVICE_NAME, NFTA_FLOWTABLE_HOOK,
    NFTA_FLOWTABLE_HOOK_DEVS, NFTA_FLOWTABLE_NAME,
};

/// A dump the ruleset's changes interrupt is read again, this many times at most.
const DUMP_ATTEMPTS: usize = 5;

/// One nf_tables chain or set message: the nfgenmsg family and the attributes this module reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainMessage {
    pub message_type: u16,
    pub family: u8,
    pub table: Option<String>,
    pub name: Option<String>,
}

impl ChainMessage {
    /// The request for every chain of `table` in `family`.
    pub fn dump_request(family: IpFamily, table: &str) -> Self {
        ChainMessage {
            message_type: NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_GETCHAIN,
            family: nfproto(family),
            table: Some(table.to_string()),
            name: None,
        }
    }

    /// The request for every set and map of `table` in `family`.
    pub fn set_dump_request(family: IpFamily, table: &str) -> Self {
        ChainMessage {
            message_type: NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_GETSET,
            ..Self::dump_request(family, table)
        }
    }

    /// The name attribute's number in messages of this type.
    fn name_attribute(&self) -> u16 {
        match self.message_type & 0xff {
            NFT_MSG_NEWSET | NFT_MSG_GETSET => NFTA_SET_NAME,
            _ => NFTA_CHAIN_NAME,
        }
    }

    fn attributes(&self) -> impl Iterator<Item = (u16, &String)> {
        [
            (NFTA_TABLE_NAME, &self.table),
            (self.name_attribute(), &self.name),
        ]
        .into_iter()
        .filter_map(|(kind, value)| value.as_ref().map(|v| (kind, v)))
    }
}

pub(crate) fn nfproto(family: IpFamily) -> u8 {
    match family {
        IpFamily::V4 => NFPROTO_IPV4,
        IpFamily::V6 => NFPROTO_IPV6,
    }
}

/// A string attribute's length on the wire: header, text, NUL, padding to four bytes.
fn string_attribute_len(value: &str) -> usize {
    (4 + value.len() + 1 + 3) & !3
}

impl NetlinkSerializable for ChainMessage {
    fn message_type(&self) -> u16 {
        self.message_type
    }

    fn buffer_len(&self) -> usize {
        4 + self
            .attributes()
            .map(|(_, value)| string_attribute_len(value))
            .sum::<usize>()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        buffer.fill(0);
        // nfgenmsg: family, version 0, resource id 0.
        buffer[0] = self.family;
        let mut offset = 4;
        for (kind, value) in self.attributes() {
            let length = 4 + value.len() + 1;
            buffer[offset..offset + 2].copy_from_slice(&(length as u16).to_ne_bytes());
            buffer[offset + 2..offset + 4].copy_from_slice(&kind.to_ne_bytes());
            buffer[offset + 4..offset + 4 + value.len()].copy_from_slice(value.as_bytes());
            offset += string_attribute_len(value);
        }
    }
}

impl NetlinkDeserializable for ChainMessage {
    type Error = DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, DecodeError> {
        let Some((nfgenmsg, attributes)) = payload.split_first_chunk::<4>() else {
            return Err(DecodeError::from("nf_tables message shorter than nfgenmsg"));
        };
        let mut message = ChainMessage {
            message_type: header.message_type,
            family: nfgenmsg[0],
            table: None,
            name: None,
        };
        let name_attribute = message.name_attribute();
        for attribute in NlasIterator::new(attributes) {
            let attribute: NlaBuffer<&[u8]> = attribute?;
            let text = || nul_terminated(attribute.value());
            match attribute.kind() {
                NFTA_TABLE_NAME => message.table = Some(text()),
                kind if kind == name_attribute => message.name = Some(text()),
                _ => {}
            }
        }
        Ok(message)
    }
}

/// The names of every chain in `table` of `family` (an absent table has none).
pub fn chain_names(family: IpFamily, table: &str) -> Result<BTreeSet<String>, NetlinkError> {
    dump_names(ChainMessage::dump_request(family, table), NFT_MSG_NEWCHAIN)
}

/// Whether `chain` exists in `table` of `family`: one lookup by name, where listing a table's
/// chains walks every chain of the family (at 10,000 services, half a second for filter's few
/// because nat holds 120,000).
pub fn chain_exists(family: IpFamily, table: &str, chain: &str) -> Result<bool, NetlinkError> {
    answered(ChainMessage {
        name: Some(chain.to_string()),
        ..ChainMessage::dump_request(family, table)
    })
}

/// Whether `table` of `family` exists: one lookup by name (a listing of its chains would walk
/// every chain of the family: at 10,000 services in iptables mode, 0.3 s).
pub fn table_exists(family: IpFamily, table: &str) -> Result<bool, NetlinkError> {
    answered(RawMessage::request(
        NFT_MSG_GETTABLE,
        family,
        &[(NFTA_TABLE_NAME, table)],
    ))
}

/// Whether the kernel finds what a lookup by name (not a dump) asks for: ENOENT is "no".
fn answered<I>(request: I) -> Result<bool, NetlinkError>
where
    I: NetlinkSerializable + NetlinkDeserializable + std::fmt::Debug,
    <I as NetlinkDeserializable>::Error: std::fmt::Display,
{
    let mut connection = Connection::open(NETLINK_NETFILTER)?;
    match connection.request(request, false) {
        Ok(_) => Ok(true),
        Err(err) if err.errno() == Some(nix::libc::ENOENT) => Ok(false),
        Err(err) => Err(err),
    }
}

/// The names of every named set and map in `table` of `family` (anonymous ones, which rules
/// own, are left out).
pub fn set_names(family: IpFamily, table: &str) -> Result<BTreeSet<String>, NetlinkError> {
    let mut names = dump_names(
        ChainMessage::set_dump_request(family, table),
        NFT_MSG_NEWSET,
    )?;
    names.retain(|name| !name.starts_with("__"));
    Ok(names)
}

/// The packets each named counter of `table` in `family` has counted, by name (an absent table
/// has none). One dump of the table's counters (the kernel filters by table and type).
pub fn counters(family: IpFamily, table: &str) -> Result<BTreeMap<String, u64>, NetlinkError> {
    let mut request = RawMessage::request(NFT_MSG_GETOBJ, family, &[(NFTA_TABLE_NAME, table)]);
    let mut kind = Attributes::new();
    kind.u32(NFTA_OBJ_TYPE, NFT_OBJECT_COUNTER);
    request.payload.extend(kind.into_bytes());
    let replies = dump_of_table(request)?;
    let mut counted = BTreeMap::new();
    for reply in &replies {
        let Some(found) = reply.attributes_of(NFT_MSG_NEWOBJ) else {
            continue;
        };
        let (mut name, mut of_table, mut packets) = (None, false, None);
        for (kind, value) in attributes(found) {
            match kind {
                NFTA_TABLE_NAME => of_table = nul_terminated(value) == table,
                NFTA_OBJ_NAME => name = Some(nul_terminated(value)),
                NFTA_OBJ_DATA => {
                    packets = attributes(value)
                        .find(|(kind, _)| *kind == NFTA_COUNTER_PACKETS)
                        .and_then(|(_, bytes)| bytes.try_into().ok())
                        .map(u64::from_be_bytes);
                }
                _ => {}
            }
        }
        if let (Some(name), true, Some(packets)) = (name, of_table, packets) {
            counted.insert(name, packets);
        }
    }
    Ok(counted)
}

/// The flowtables of `table` in `family` and the devices each has (an absent table has none).
/// One dump of the table's flowtables (the kernel filters by table).
pub fn flowtables(
    family: IpFamily,
    table: &str,
) -> Result<BTreeMap<String, BTreeSet<String>>, NetlinkError> {
    let request = RawMessage::request(NFT_MSG_GETFLOWTABLE, family, &[(NFTA_TABLE_NAME, table)]);
    let mut found = BTreeMap::new();
    for reply in &dump_of_table(request)? {
        let Some(flowtable) = reply.attributes_of(NFT_MSG_NEWFLOWTABLE) else {
            continue;
        };
        let (mut name, mut of_table, mut devices) = (None, false, BTreeSet::new());
        for (kind, value) in attributes(flowtable) {
            match kind {
                NFTA_TABLE_NAME => of_table = nul_terminated(value) == table,
                NFTA_FLOWTABLE_NAME => name = Some(nul_terminated(value)),
                NFTA_FLOWTABLE_HOOK => {
                    let listed = attributes(value)
                        .filter(|(kind, _)| *kind == NFTA_FLOWTABLE_HOOK_DEVS)
                        .flat_map(|(_, list)| attributes(list))
                        .filter(|(kind, _)| *kind == NFTA_DEVICE_NAME)
                        .map(|(_, device)| nul_terminated(device));
                    devices.extend(listed);
                }
                _ => {}
            }
        }
        if let (Some(name), true) = (name, of_table) {
            found.insert(name, devices);
        }
    }
    Ok(found)
}

/// How many threads read rules back (one netlink socket each: a socket runs one dump at a time).
const RULE_READERS: usize = 2;

/// Per chain of `chains` in `table` of `family`: how many rules it holds, and the comments they
/// carry.
pub fn rule_comments(
    family: IpFamily,
    table: &str,
    chains: &BTreeSet<String>,
) -> Result<BTreeMap<String, (usize, Vec<String>)>, NetlinkError> {
    let chains: Vec<&str> = chains.iter().map(String::as_str).collect();
    let found = rules_per_chain(
        family,
        table,
        &chains,
        |found: &mut (usize, Vec<String>), rule| {
            found.0 += 1;
            found.1.extend(
                attributes(rule)
                    .find(|(kind, _)| *kind == NFTA_RULE_USERDATA)
                    .and_then(|(_, userdata)| udata_comment(userdata)),
            );
        },
    )?;
    Ok(chains.into_iter().map(str::to_string).zip(found).collect())
}

/// The expressions of each rule of each of `chains` in `table` of `family` (in that order), as
/// the kernel holds them, counters left out: one dump per chain, never the whole table.
pub fn chain_rules(
    family: IpFamily,
    table: &str,
    chains: &[&str],
) -> Result<Vec<Vec<Vec<Expr>>>, NetlinkError> {
    rules_per_chain(family, table, chains, |rules: &mut Vec<_>, rule| {
        rules.push(decode_rule(rule));
    })
}

/// Folds the rules of each of `chains` in `table` of `family` into a `T` per chain (in the
/// order of `chains`), each chain's rules in their order: `fold` gets each rule's attributes
/// (NFTA_RULE_*). A chain that does not exist gets nothing folded in. Each chain is dumped on
/// its own: the kernel finds it by name, where a dump of the whole table walks every rule
/// before the point it had reached for each batch it sends (at 380,000 rules, 16 s against 1).
/// The chains are shared among a few threads, each with its own socket.
pub(crate) fn rules_per_chain<T, F>(
    family: IpFamily,
    table: &str,
    chains: &[&str],
    fold: F,
) -> Result<Vec<T>, NetlinkError>
where
    T: Default + Send,
    F: Fn(&mut T, &[u8]) + Sync,
{
    let share = chains.len().div_ceil(RULE_READERS).max(1);
    let fold = &fold;
    std::thread::scope(|scope| {
        // A share whose thread cannot be had is read here, when its turn comes.
        let readers: Vec<_> = chains
            .chunks(share)
            .map(|part| {
                let read = move || read_chains(family, table, part, fold);
                let thread = std::thread::Builder::new()
                    .name("nf-rules".into())
                    .spawn_scoped(scope, read);
                thread.map_err(|_| read)
            })
            .collect();
        let mut all = Vec::with_capacity(chains.len());
        for reader in readers {
            let part = match reader {
                Ok(thread) => thread
                    .join()
                    .map_err(|_| NetlinkError::Decode("a rule reader panicked".into()))??,
                Err(read) => read()?,
            };
            all.extend(part);
        }
        Ok(all)
    })
}

/// The rules of `chains`, one dump per chain, on one socket.
fn read_chains<T: Default, F: Fn(&mut T, &[u8])>(
    family: IpFamily,
    table: &str,
    chains: &[&str],
    fold: &F,
) -> Result<Vec<T>, NetlinkError> {
    let mut connection = Connection::open(NETLINK_NETFILTER)?;
    let mut found = Vec::with_capacity(chains.len());
    let rule_type = NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWRULE;
    for chain in chains {
        let mut attempt = 1;
        let folded = loop {
            let request = RawMessage::request(
                NFT_MSG_GETRULE,
                family,
                &[(NFTA_TABLE_NAME, table), (NFTA_RULE_CHAIN, chain)],
            );
            let mut folded = T::default();
            let result = connection.dump_each(request, |kind, payload| {
                let Some(rule) = payload.get(4..).filter(|_| kind == rule_type) else {
                    return;
                };
                let named = |kind, name: &str| {
                    attributes(rule)
                        .find(|(k, _)| *k == kind)
                        .is_some_and(|(_, value)| {
                            value.split(|b| *b == 0).next() == Some(name.as_bytes())
                        })
                };
                if named(NFTA_TABLE_NAME, table) && named(NFTA_RULE_CHAIN, chain) {
                    fold(&mut folded, rule);
                }
            });
            match result {
                Ok(()) => break folded,
                Err(NetlinkError::DumpInterrupted) if attempt < DUMP_ATTEMPTS => attempt += 1,
                // The table is gone: the chain holds nothing.
                Err(err) if err.errno() == Some(nix::libc::ENOENT) => break T::default(),
                Err(err) => return Err(err),
            }
        };
        found.push(folded);
    }
    Ok(found)
}

/// nf_tables requests built from string attributes.
impl RawMessage {
    /// A request of nf_tables message type `message` for `family` with these attributes.
    pub fn request(message: u16, family: IpFamily, strings: &[(u16, &str)]) -> Self {
        let mut payload = vec![nfproto(family), 0, 0, 0];
        for (kind, value) in strings {
            let length = 4 + value.len() + 1;
            payload.extend((length as u16).to_ne_bytes());
            payload.extend(kind.to_ne_bytes());
            payload.extend(value.as_bytes());
            payload.push(0);
            payload.resize(payload.len().div_ceil(4) * 4, 0);
        }
        RawMessage {
            message_type: NFNL_SUBSYS_NFTABLES << 8 | message,
            payload,
        }
    }

    /// The attributes after nfgenmsg, if this is an nf_tables message of type `message`.
    pub fn attributes_of(&self, message: u16) -> Option<&[u8]> {
        (self.message_type == NFNL_SUBSYS_NFTABLES << 8 | message)
            .then(|| self.payload.get(4..))
            .flatten()
    }
}

/// The comment in a rule's or an element's user data (libnftnl's type-length-value records,
/// type and length a byte each; the comment is type 0 in both).
pub(crate) fn udata_comment(userdata: &[u8]) -> Option<String> {
    let mut rest = userdata;
    while let [kind, length, tail @ ..] = rest {
        let length = usize::from(*length);
        let value = tail.get(..length)?;
        if *kind == NFTNL_UDATA_COMMENT {
            return Some(nul_terminated(value));
        }
        rest = &tail[length..];
    }
    None
}

/// A string attribute's text, up to its NUL.
pub(crate) fn nul_terminated(value: &[u8]) -> String {
    let end = value.iter().position(|b| *b == 0).unwrap_or(value.len());
    String::from_utf8_lossy(&value[..end]).into_owned()
}

/// The replies to a dump request, asked again when the ruleset's changes interrupt it.
pub(crate) fn dump<I>(connection: &mut Connection, request: I) -> Result<Vec<I>, NetlinkError>
where
    I: Clone + NetlinkSerializable + NetlinkDeserializable + std::fmt::Debug,
    <I as NetlinkDeserializable>::Error: std::fmt::Display,
{
    let mut attempt = 1;
    loop {
        match connection.request(request.clone(), true) {
            Err(NetlinkError::DumpInterrupted) if attempt < DUMP_ATTEMPTS => attempt += 1,
            result => return result,
        }
    }
}

fn dump_names(request: ChainMessage, reply_type: u16) -> Result<BTreeSet<String>, NetlinkError> {
    let table = request.table.clone().unwrap_or_default();
    Ok(names_in(&table, reply_type, dump_of_table(request)?))
}

/// The replies to a dump of one table's objects, on a socket of its own; none when the table
/// is missing (some dumps, sets' and objects', answer that with ENOENT).
fn dump_of_table<I>(request: I) -> Result<Vec<I>, NetlinkError>
where
    I: Clone + NetlinkSerializable + NetlinkDeserializable + std::fmt::Debug,
    <I as NetlinkDeserializable>::Error: std::fmt::Display,
{
    let mut connection = Connection::open(NETLINK_NETFILTER)?;
    match dump(&mut connection, request) {
        Err(err) if err.errno() == Some(nix::libc::ENOENT) => Ok(Vec::new()),
        result => result,
    }
}

/// The names the dump's replies give for `table` (the kernel may answer for every table).
fn names_in(table: &str, reply_type: u16, replies: Vec<ChainMessage>) -> BTreeSet<String> {
    replies
        .into_iter()
        .filter(|reply| reply.message_type & 0xff == reply_type)
        .filter(|reply| reply.table.as_deref() == Some(table))
        .filter_map(|reply| reply.name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_bytes_are_nfgenmsg_and_the_table_attribute() {
        let request = ChainMessage::dump_request(IpFamily::V6, "nat");
        assert_eq!(request.message_type(), 0x0a04);
        let mut buffer = vec![0xff; request.buffer_len()];
        request.serialize(&mut buffer);
        assert_eq!(
            buffer,
            [10, 0, 0, 0, 8, 0, 1, 0, b'n', b'a', b't', 0],
            "family ip6, NFTA_CHAIN_TABLE \"nat\\0\" padded to 4"
        );
    }

    #[test]
    fn replies_decode_and_only_the_asked_table_counts() {
        // A NEWCHAIN reply as the kernel sends it: nfgenmsg, then table, handle, name.
        let mut payload = vec![2, 0, 0, 0];
        payload.extend([8, 0, 1, 0, b'n', b'a', b't', 0]);
        payload.extend([12, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 7]);
        payload.extend([18, 0, 3, 0]);
        payload.extend(b"KUBE-SERVICES\0\0\0");
        let mut header = NetlinkHeader::default();
        header.message_type = 0x0a03;
        let reply = ChainMessage::deserialize(&header, &payload).unwrap();
        assert_eq!(reply.table.as_deref(), Some("nat"));
        assert_eq!(reply.name.as_deref(), Some("KUBE-SERVICES"));
        let other = ChainMessage {
            table: Some("filter".into()),
            name: Some("KUBE-FORWARD".into()),
            ..reply.clone()
        };
        assert_eq!(
            names_in("nat", NFT_MSG_NEWCHAIN, vec![reply, other]),
            BTreeSet::from(["KUBE-SERVICES".to_string()])
        );
        assert!(ChainMessage::deserialize(&header, &[2, 0]).is_err());
    }
}
