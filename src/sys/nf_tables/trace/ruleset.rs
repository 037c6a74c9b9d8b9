//! The ruleset a trace runs over, at the level the kernel holds it: base chains with their hook
//! and priority, rules as expressions, sets and maps as byte keys and data. Built from the
//! messages that create it, which are the same whether our compiler wrote them (the fake's
//! state, compiled) or the kernel dumped them (a live table, read back).

use std::collections::BTreeMap;

use super::TraceError;
use crate::model::IpFamily;
use crate::sys::netlink::{Connection, attributes};
use crate::sys::nf_tables::expr::{Data, Expr, Verdict, decode_rule};
use crate::sys::nf_tables::fake::FakeNftables;
use crate::sys::nf_tables::read::{RawMessage, dump, nfproto, nul_terminated};
use crate::sys::nf_tables::wire::{
    ELEM_INTERVAL_END, Message, NFT_MSG_GETCHAIN, NFT_MSG_GETRULE, NFT_MSG_GETSET,
    NFT_MSG_GETSETELEM, NFT_MSG_NEWCHAIN, NFT_MSG_NEWFLOWTABLE, NFT_MSG_NEWOBJ, NFT_MSG_NEWRULE,
    NFT_MSG_NEWSET, NFT_MSG_NEWSETELEM, NFT_MSG_NEWTABLE, NFTA_CHAIN_NAME, NFTA_DATA_VALUE,
    NFTA_DATA_VERDICT, NFTA_RULE_CHAIN, NFTA_SET_ELEM_DATA, NFTA_SET_ELEM_FLAGS, NFTA_SET_ELEM_KEY,
    NFTA_SET_ELEM_LIST_ELEMENTS, NFTA_SET_ELEM_LIST_SET, NFTA_SET_NAME, NFTA_TABLE_NAME,
    NFTA_VERDICT_CHAIN, NFTA_VERDICT_CODE,
};
use crate::sys::nf_tables::write::compile;

/// The attributes the wire module does not name: a chain's table, hook, policy and type, a
/// hook's number and priority, a set's fields, and the set id and last key of elements. Every
/// message's table is its first attribute (NFTA_TABLE_NAME, NFTA_TABLE, ...).
const TABLE: u16 = NFTA_TABLE_NAME;
const CHAIN_HOOK: u16 = 4;
const CHAIN_POLICY: u16 = 5;
const CHAIN_TYPE: u16 = 7;
const HOOK_NUMBER: u16 = 1;
const HOOK_PRIORITY: u16 = 2;
const SET_FLAGS: u16 = 3;
const SET_KEY_LEN: u16 = 5;
const SET_DATA_LEN: u16 = 7;
const SET_ID: u16 = 10;
const LIST_SET_ID: u16 = 4;
const ELEM_KEY_END: u16 = 10;

/// A base chain's place: the hook it is attached to, its priority and its type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hook {
    /// NF_INET_PRE_ROUTING (0) to NF_INET_POST_ROUTING (4).
    pub number: u32,
    pub priority: i32,
    /// `filter`, `nat` or `route`.
    pub kind: String,
    /// The policy is accept (a chain without one accepts).
    pub accepts: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    pub hook: Option<Hook>,
    pub rules: Vec<Vec<Expr>>,
}

/// One element: a key, for an interval set a start or the end after the last value, for a
/// concatenation of ranges a first and a last key; and a map's data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Element {
    pub key: Vec<u8>,
    pub key_end: Option<Vec<u8>>,
    pub interval_end: bool,
    pub data: Option<Data>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Set {
    /// NFT_SET_* flags (interval, map, ...).
    pub flags: u32,
    pub key_len: usize,
    pub data_len: usize,
    pub elements: Vec<Element>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    pub chains: BTreeMap<String, Chain>,
    pub sets: BTreeMap<String, Set>,
}

/// Tables by nfgenmsg family and name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ruleset {
    pub tables: BTreeMap<(u8, String), Table>,
    /// Set ids of the batch, to the set's name (elements may name their set by id).
    set_ids: BTreeMap<u32, String>,
}

fn be32(value: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(value.get(..4)?.try_into().ok()?))
}

fn find(attrs: &[u8], kind: u16) -> Option<&[u8]> {
    attributes(attrs).find(|(k, _)| *k == kind).map(|(_, v)| v)
}

fn text(attrs: &[u8], kind: u16) -> Option<String> {
    find(attrs, kind).map(nul_terminated)
}

fn malformed(what: &str) -> TraceError {
    TraceError::Malformed(what.to_string())
}

/// NFTA_DATA_* nested in a key or data attribute.
fn data(nested: &[u8]) -> Result<Data, TraceError> {
    if let Some(value) = find(nested, NFTA_DATA_VALUE) {
        return Ok(Data::Value(value.to_vec()));
    }
    let verdict = find(nested, NFTA_DATA_VERDICT).ok_or_else(|| malformed("data"))?;
    let code = find(verdict, NFTA_VERDICT_CODE)
        .and_then(be32)
        .ok_or_else(|| malformed("verdict code"))? as i32;
    Ok(Data::Verdict(Verdict {
        code,
        chain: text(verdict, NFTA_VERDICT_CHAIN),
    }))
}

impl Ruleset {
    /// The ruleset `messages` create, in order; only additions are taken (what a compiled
    /// state and a dump both are).
    pub fn from_messages<'a>(
        messages: impl IntoIterator<Item = (u16, u8, &'a [u8])>,
    ) -> Result<Ruleset, TraceError> {
        let mut ruleset = Ruleset::default();
        for (kind, family, attrs) in messages {
            ruleset.add(kind, family, attrs)?;
        }
        Ok(ruleset)
    }

    /// The fake's tables of `family`, through the compiler that writes to the kernel.
    pub fn from_fake(fake: &FakeNftables, family: IpFamily) -> Result<Ruleset, TraceError> {
        let text = fake_commands(fake, family);
        let compiled = compile(&text).map_err(|e| TraceError::Malformed(e.to_string()))?;
        let messages = compiled
            .messages
            .iter()
            .map(|m: &Message| (m.kind, m.family, m.attributes.as_slice()));
        Ruleset::from_messages(messages)
    }

    /// `table` of `family` as the kernel holds it (the whole table: for tests, not for syncs).
    pub fn read(family: IpFamily, table: &str) -> Result<Ruleset, TraceError> {
        let mut connection = Connection::open(netlink_sys::protocols::NETLINK_NETFILTER)?;
        let mut replies = Vec::new();
        for (request, reply) in [
            (NFT_MSG_GETCHAIN, NFT_MSG_NEWCHAIN),
            (NFT_MSG_GETSET, NFT_MSG_NEWSET),
            (NFT_MSG_GETRULE, NFT_MSG_NEWRULE),
        ] {
            let message = RawMessage::request(request, family, &[(TABLE, table)]);
            for answer in dump(&mut connection, message)? {
                if let Some(attrs) = answer.attributes_of(reply) {
                    replies.push((reply, attrs.to_vec()));
                }
            }
        }
        let sets: Vec<String> = replies
            .iter()
            .filter(|(kind, _)| *kind == NFT_MSG_NEWSET)
            .filter_map(|(_, attrs)| text(attrs, NFTA_SET_NAME))
            .collect();
        for set in &sets {
            let message = RawMessage::request(
                NFT_MSG_GETSETELEM,
                family,
                &[(TABLE, table), (NFTA_SET_ELEM_LIST_SET, set)],
            );
            for answer in dump(&mut connection, message)? {
                if let Some(attrs) = answer.attributes_of(NFT_MSG_NEWSETELEM) {
                    replies.push((NFT_MSG_NEWSETELEM, attrs.to_vec()));
                }
            }
        }
        let family = nfproto(family);
        Ruleset::from_messages(
            replies
                .iter()
                .map(|(kind, attrs)| (*kind, family, attrs.as_slice())),
        )
    }

    fn table(&mut self, family: u8, attrs: &[u8], kind: u16) -> Result<&mut Table, TraceError> {
        let name = text(attrs, kind).ok_or_else(|| malformed("table name"))?;
        Ok(self.tables.entry((family, name)).or_default())
    }

    fn add(&mut self, kind: u16, family: u8, attrs: &[u8]) -> Result<(), TraceError> {
        match kind {
            NFT_MSG_NEWTABLE => {
                self.table(family, attrs, TABLE)?;
            }
            NFT_MSG_NEWCHAIN => {
                let name = text(attrs, NFTA_CHAIN_NAME).ok_or_else(|| malformed("chain name"))?;
                let hook = match find(attrs, CHAIN_HOOK) {
                    Some(hook) => Some(Hook {
                        number: find(hook, HOOK_NUMBER)
                            .and_then(be32)
                            .ok_or_else(|| malformed("hook number"))?,
                        priority: find(hook, HOOK_PRIORITY)
                            .and_then(be32)
                            .ok_or_else(|| malformed("hook priority"))?
                            as i32,
                        kind: text(attrs, CHAIN_TYPE).unwrap_or_else(|| "filter".into()),
                        accepts: find(attrs, CHAIN_POLICY).and_then(be32).unwrap_or(1) == 1,
                    }),
                    None => None,
                };
                let table = self.table(family, attrs, TABLE)?;
                let chain = table.chains.entry(name).or_default();
                if hook.is_some() {
                    chain.hook = hook;
                }
            }
            NFT_MSG_NEWRULE => {
                let chain = text(attrs, NFTA_RULE_CHAIN).ok_or_else(|| malformed("rule chain"))?;
                let rule = decode_rule(attrs);
                let table = self.table(family, attrs, TABLE)?;
                let chain = table.chains.get_mut(&chain).ok_or(TraceError::Missing {
                    kind: "chain",
                    name: chain,
                })?;
                chain.rules.push(rule);
            }
            NFT_MSG_NEWSET => {
                let name = text(attrs, NFTA_SET_NAME).ok_or_else(|| malformed("set name"))?;
                let number = |kind| find(attrs, kind).and_then(be32).unwrap_or(0);
                let set = Set {
                    flags: number(SET_FLAGS),
                    key_len: number(SET_KEY_LEN) as usize,
                    data_len: number(SET_DATA_LEN) as usize,
                    elements: Vec::new(),
                };
                if let Some(id) = find(attrs, SET_ID).and_then(be32) {
                    self.set_ids.insert(id, name.clone());
                }
                self.table(family, attrs, TABLE)?
                    .sets
                    .entry(name)
                    .or_insert(set);
            }
            NFT_MSG_NEWSETELEM => {
                let name = match text(attrs, NFTA_SET_ELEM_LIST_SET) {
                    Some(name) => name,
                    None => find(attrs, LIST_SET_ID)
                        .and_then(be32)
                        .and_then(|id| self.set_ids.get(&id).cloned())
                        .ok_or_else(|| malformed("element's set"))?,
                };
                let mut elements = Vec::new();
                for (_, element) in
                    attributes(find(attrs, NFTA_SET_ELEM_LIST_ELEMENTS).unwrap_or_default())
                {
                    elements.push(decode_element(element)?);
                }
                let table = self.table(family, attrs, TABLE)?;
                let set = table
                    .sets
                    .get_mut(&name)
                    .ok_or(TraceError::Missing { kind: "set", name })?;
                set.elements.extend(elements);
            }
            // Named counters count, and a flowtable takes connections a rule gives it (which
            // the trace notes on the path): neither changes where a packet goes.
            NFT_MSG_NEWOBJ | NFT_MSG_NEWFLOWTABLE => {}
            other => {
                return Err(TraceError::Malformed(format!(
                    "message type {other} does not build a ruleset"
                )));
            }
        }
        Ok(())
    }
}

fn decode_element(element: &[u8]) -> Result<Element, TraceError> {
    let key = |kind| -> Result<Option<Vec<u8>>, TraceError> {
        match find(element, kind) {
            Some(nested) => match data(nested)? {
                Data::Value(bytes) => Ok(Some(bytes)),
                Data::Verdict(_) => Err(malformed("a verdict as a key")),
            },
            None => Ok(None),
        }
    };
    Ok(Element {
        key: key(NFTA_SET_ELEM_KEY)?.ok_or_else(|| malformed("element key"))?,
        key_end: key(ELEM_KEY_END)?,
        interval_end: find(element, NFTA_SET_ELEM_FLAGS)
            .and_then(be32)
            .is_some_and(|flags| flags & ELEM_INTERVAL_END != 0),
        data: find(element, NFTA_SET_ELEM_DATA).map(data).transpose()?,
    })
}

/// The commands that build the fake's tables of `family` from nothing: sets and chains before
/// the rules and elements that name them.
fn fake_commands(fake: &FakeNftables, family: IpFamily) -> String {
    let keyword = crate::sys::nf_tables::family_keyword(family);
    let mut out = String::new();
    for ((table_family, name), table) in &fake.tables {
        if table_family != keyword {
            continue;
        }
        let head = format!("{keyword} {name}");
        out.push_str(&format!("add table {head}\n"));
        for (set, contents) in &table.sets {
            out.push_str(&format!(
                "add {} {head} {set} {}\n",
                contents.kind, contents.spec
            ));
        }
        for counter in &table.counters {
            out.push_str(&format!("add counter {head} {counter}\n"));
        }
        for flowtable in table.flowtables.keys() {
            out.push_str(&format!(
                "add flowtable {head} {flowtable} {{ hook ingress priority filter ; }}\n"
            ));
        }
        for (chain, (spec, _)) in &table.chains {
            out.push_str(&format!("add chain {head} {chain} {spec}\n"));
        }
        for (chain, (_, rules)) in &table.chains {
            for rule in rules {
                out.push_str(&format!("add rule {head} {chain} {rule}\n"));
            }
        }
        for (set, contents) in &table.sets {
            for (key, rest) in &contents.elements {
                out.push_str(&format!("add element {head} {set} {{ {key}{rest} }}\n"));
            }
        }
    }
    out
}
