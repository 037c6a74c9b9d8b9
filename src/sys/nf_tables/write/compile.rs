//! Our transaction text, compiled to the nf_tables messages `nft -f` would send for it. Only
//! the part of nft's language this program writes is understood (see the `render` and
//! `transaction` modules of the nftables proxier); anything else is an error, and the caller
//! hands that transaction to `nft` instead.

use std::collections::HashMap;
use std::net::IpAddr;

use super::rule;
use super::values::{self, Bound, KeyType, Unsupported, parse_verdict, unquote};
use crate::sys::nf_tables::expr::{Data, Expr, SetRef};
use crate::sys::nf_tables::wire::{
    Attributes, Message, NFT_MSG_DELCHAIN, NFT_MSG_DELOBJ, NFT_MSG_DELRULE, NFT_MSG_DELSET,
    NFT_MSG_DELSETELEM, NFT_MSG_DELTABLE, NFT_MSG_NEWCHAIN, NFT_MSG_NEWOBJ, NFT_MSG_NEWRULE,
    NFT_MSG_NEWSET, NFT_MSG_NEWSETELEM, NFT_MSG_NEWTABLE, NFT_OBJECT_COUNTER, NFTA_COUNTER_BYTES,
    NFTA_COUNTER_PACKETS, NFTA_OBJ_DATA, NFTA_OBJ_NAME, NFTA_OBJ_TYPE, NLM_F_APPEND, NLM_F_CREATE,
    UserData,
};
use crate::sys::nf_tables::wire::{
    DATA_VERDICT, ELEM_INTERVAL_END, SET_ANONYMOUS, SET_CONSTANT, SET_EVAL, SET_INTERVAL, SET_MAP,
    SET_TIMEOUT,
};
use crate::sys::nf_tables::wire::{
    NFT_MSG_DELFLOWTABLE, NFT_MSG_NEWFLOWTABLE, NFTA_DEVICE_NAME, NFTA_FLOWTABLE_FLAGS,
    NFTA_FLOWTABLE_HOOK, NFTA_FLOWTABLE_HOOK_DEVS, NFTA_FLOWTABLE_HOOK_NUM,
    NFTA_FLOWTABLE_HOOK_PRIORITY, NFTA_FLOWTABLE_NAME,
};

/// The family numbers of nfgenmsg.
use crate::sys::nf_tables::wire::{NFPROTO_IPV4, NFPROTO_IPV6};
/// nft's data type numbers (for set key types), and the bits a concatenation shifts each by.
const TYPE_INTEGER: u32 = 4;
const TYPE_IPADDR: u32 = KeyType::Ipv4.number();
const TYPE_IP6ADDR: u32 = KeyType::Ipv6.number();
const TYPE_INET_SERVICE: u32 = KeyType::Port.number();
const TYPE_BITS: u32 = 6;
/// libnftnl's user data record types.
use crate::sys::nf_tables::wire::NFTNL_UDATA_COMMENT as UDATA_COMMENT;
const UDATA_SET_KEYBYTEORDER: u8 = 0;
const UDATA_SET_DATABYTEORDER: u8 = 1;
const UDATA_SET_MERGE_ELEMENTS: u8 = 2;
const UDATA_SET_KEY_TYPEOF: u8 = 3;
const UDATA_SET_DATA_TYPEOF: u8 = 4;
const UDATA_SET_DATA_INTERVAL: u8 = 6;
const UDATA_SET_COMMENT: u8 = 7;
const UDATA_ELEM_FLAGS: u8 = 1;
/// The element flag of an interval without an end.
const ELEM_F_INTERVAL_OPEN: u32 = 1;
/// nft's byte orders.
const BYTEORDER_HOST: u32 = 1;
const BYTEORDER_BIG: u32 = 2;

mod anonymous;
mod sets;

use sets::{Element, SetSpec, destination_typeof, draw_interval, encode_elements, numgen_typeof};

/// The messages of one transaction, with the input line each came from (1-based).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Compiled {
    pub messages: Vec<Message>,
    pub lines: Vec<usize>,
}

/// A line this compiler does not understand.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct CompileError {
    pub line: usize,
    pub reason: String,
}

/// How a rule's anonymous sets and maps are named.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AnonymousNames {
    /// After the rule's chain and its place in it (`__map` + a hash): the kernel takes the name
    /// as it is. Given `__map%d`, it scans every set of the table for a free number instead, for
    /// each anonymous set: at 10,000 services that scan made each transaction of a full sync
    /// slower than the last.
    #[default]
    ByRule,
    /// `__map%d` / `__set%d`, as nft sends them (for comparing with nft's messages).
    AsNft,
}

/// Compiles `text` (one command per line; blank lines and `#` comments skipped).
pub fn compile(text: &str) -> Result<Compiled, CompileError> {
    compile_with(text, AnonymousNames::ByRule)
}

/// Compiles `text`, naming anonymous sets as `names` says. A chain's rules that carry anonymous
/// sets must be added to an empty chain (a new or a flushed one) for names by rule to be unique;
/// this program's transactions always do that.
pub fn compile_with(text: &str, names: AnonymousNames) -> Result<Compiled, CompileError> {
    let mut compiler = Compiler {
        names,
        ..Compiler::default()
    };
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let failed = |reason| CompileError {
            line: index + 1,
            reason,
        };
        if compiler.merge_draws(line).map_err(failed)? {
            continue;
        }
        compiler.flush_draws();
        let first = compiler.out.messages.len();
        compiler.command(line).map_err(failed)?;
        let added = compiler.out.messages.len() - first;
        compiler
            .out
            .lines
            .extend(std::iter::repeat_n(index + 1, added));
        if added == 1 {
            compiler.start_draws(line, index + 1);
        }
    }
    compiler.flush_draws();
    Ok(compiler.out)
}

/// At most this many elements (an interval is two) go in one message: the element list is one
/// attribute, whose length must fit in 16 bits (an IPv6 interval takes about 100 bytes).
const MAX_ELEMENTS_PER_MESSAGE: usize = 512;

/// Consecutive lines that add (or delete) intervals of draws in one map, sent as one message
/// (up to [`MAX_ELEMENTS_PER_MESSAGE`]): the kernel looks a set up by name by walking every
/// set of the table, once per message.
struct DrawLines {
    /// The line's words before the element: `add element ip kube-proxy NAME`.
    head: String,
    ipv6: bool,
    add: bool,
    elements: Vec<Element>,
    line: usize,
}

/// `VERB element FAMILY TABLE SET { FIRST-LAST ... }`: the head and the body, for lines of
/// intervals of draws.
fn draw_line(line: &str) -> Option<(&str, &str)> {
    let open = line.find(" { ")?;
    let (head, body) = (&line[..open], &line[open + 3..]);
    let words: Vec<&str> = head.split(' ').collect();
    let ["add" | "delete", "element", _, _, _] = words.as_slice() else {
        return None;
    };
    let first = body.split(' ').next()?;
    draw_interval(first)?;
    Some((head, body.strip_suffix(" }")?))
}

/// Splits a line into words; a double-quoted string is one word, quotes included.
pub fn words(line: &str) -> Result<Vec<&str>, Unsupported> {
    let mut words = Vec::new();
    let mut rest = line.trim_start();
    while !rest.is_empty() {
        let end = if let Some(quoted) = rest.strip_prefix('"') {
            match quoted.find('"') {
                Some(close) => close + 2,
                None => return Err("unterminated string".into()),
            }
        } else {
            rest.find(' ').unwrap_or(rest.len())
        };
        words.push(&rest[..end]);
        rest = rest[end..].trim_start();
    }
    Ok(words)
}

/// The family keyword's nfgenmsg family.
fn family(word: &str) -> Result<u8, Unsupported> {
    match word {
        "ip" => Ok(NFPROTO_IPV4),
        "ip6" => Ok(NFPROTO_IPV6),
        other => Err(format!("unsupported family {other:?}")),
    }
}

/// A comment as a user data record of type 0 (tables, chains, rules, elements).
fn comment_udata(comment: &str) -> UserData {
    UserData::new().text(UDATA_COMMENT, comment)
}

#[derive(Default)]
struct Compiler {
    out: Compiled,
    names: AnonymousNames,
    /// Rules added so far per (family, table, chain): a rule's place in its chain.
    rules_added: HashMap<(u8, String, String), u32>,
    /// The rule being compiled: its chain and place, for naming its anonymous sets.
    current_rule: (String, u32),
    /// Anonymous sets of the current rule so far.
    anonymous_in_rule: usize,
    /// Every set this batch declares gets the next id; references to it carry it.
    last_set_id: u32,
    declared_sets: HashMap<(u8, String, String), u32>,
    /// Interval lines gathered into one message.
    draws: Option<DrawLines>,
}

/// Where a command applies: family and table.
#[derive(Clone, Copy)]
struct Scope<'a> {
    family: u8,
    table: &'a str,
}

impl Scope<'_> {
    fn is_ipv6(&self) -> bool {
        self.family == NFPROTO_IPV6
    }
}

impl Compiler {
    /// Adds `line` to the run of interval lines being gathered if it continues it.
    fn merge_draws(&mut self, line: &str) -> Result<bool, Unsupported> {
        let Some(run) = &mut self.draws else {
            return Ok(false);
        };
        let Some((head, body)) = draw_line(line) else {
            return Ok(false);
        };
        if head != run.head || run.elements.len() >= MAX_ELEMENTS_PER_MESSAGE {
            return Ok(false);
        }
        let words: Vec<&str> = body.split(' ').collect();
        run.elements
            .extend(Element::parse(&words, run.add, run.ipv6)?);
        Ok(true)
    }

    /// After an interval line was compiled to its own message: takes that message back to
    /// gather the lines that follow it.
    fn start_draws(&mut self, line: &str, number: usize) {
        let Some((head, body)) = draw_line(line) else {
            return;
        };
        let add = head.starts_with("add ");
        let ipv6 = head.split(' ').nth(2) == Some("ip6");
        let words: Vec<&str> = body.split(' ').collect();
        let Ok(elements) = Element::parse(&words, add, ipv6) else {
            return;
        };
        self.out.messages.pop();
        self.out.lines.pop();
        self.draws = Some(DrawLines {
            head: head.to_string(),
            ipv6,
            add,
            elements,
            line: number,
        });
    }

    /// Sends the gathered interval lines as one message.
    fn flush_draws(&mut self) {
        let Some(run) = self.draws.take() else {
            return;
        };
        let words: Vec<&str> = run.head.split(' ').collect();
        let [_, _, family_word, table, set] = words.as_slice() else {
            return;
        };
        let Ok(family) = family(family_word) else {
            return;
        };
        self.push_elements(Scope { family, table }, set, run.add, &run.elements);
        self.out.lines.push(run.line);
    }

    fn push(&mut self, kind: u16, flags: u16, scope: Scope<'_>, attributes: Attributes) {
        self.out.messages.push(Message {
            kind,
            flags,
            family: scope.family,
            attributes: attributes.into_bytes(),
        });
    }

    fn command(&mut self, line: &str) -> Result<(), Unsupported> {
        let words = words(line)?;
        let [verb, object, family_word, table, rest @ ..] = words.as_slice() else {
            return Err("too few words".into());
        };
        let scope = Scope {
            family: family(family_word)?,
            table,
        };
        match (*verb, *object) {
            ("add", "table") => self.add_table(scope, rest),
            ("delete", "table") if rest.is_empty() => {
                let mut a = Attributes::new();
                a.string(1, table);
                self.push(NFT_MSG_DELTABLE, 0, scope, a);
                Ok(())
            }
            ("add", "chain") => self.add_chain(scope, rest),
            ("flush", "chain") | ("delete", "chain") => {
                let [name] = rest else {
                    return Err("expected a chain name".into());
                };
                let mut a = Attributes::new();
                a.string(1, table)
                    .string(if *verb == "flush" { 2 } else { 3 }, name);
                let kind = if *verb == "flush" {
                    NFT_MSG_DELRULE
                } else {
                    NFT_MSG_DELCHAIN
                };
                self.push(kind, 0, scope, a);
                Ok(())
            }
            ("add", "rule") => self.add_rule(scope, rest),
            ("add", "set" | "map") => self.add_set(scope, *object == "map", rest),
            ("flush", "set" | "map") | ("delete", "set" | "map") => {
                let [name] = rest else {
                    return Err("expected a set name".into());
                };
                // nft names the set before the table when it flushes one.
                let mut a = Attributes::new();
                let kind = if *verb == "flush" {
                    a.string(2, name).string(1, table);
                    NFT_MSG_DELSETELEM
                } else {
                    a.string(1, table).string(2, name);
                    NFT_MSG_DELSET
                };
                self.push(kind, 0, scope, a);
                Ok(())
            }
            ("add" | "delete", "counter") => {
                let [name] = rest else {
                    return Err("expected a counter name".into());
                };
                let mut a = Attributes::new();
                a.string(1, table)
                    .string(NFTA_OBJ_NAME, name)
                    .u32(NFTA_OBJ_TYPE, NFT_OBJECT_COUNTER);
                if *verb == "add" {
                    a.nested(NFTA_OBJ_DATA, |data| {
                        data.u64(NFTA_COUNTER_BYTES, 0).u64(NFTA_COUNTER_PACKETS, 0);
                    });
                    self.push(NFT_MSG_NEWOBJ, NLM_F_CREATE, scope, a);
                } else {
                    // nft sends an empty data attribute.
                    a.nested(NFTA_OBJ_DATA, |_| {});
                    self.push(NFT_MSG_DELOBJ, 0, scope, a);
                }
                Ok(())
            }
            ("add", "flowtable") => self.add_flowtable(scope, rest),
            ("delete", "flowtable") => {
                let [name] = rest else {
                    return Err("expected a flowtable name".into());
                };
                let mut a = Attributes::new();
                a.string(1, table).string(NFTA_FLOWTABLE_NAME, name);
                self.push(NFT_MSG_DELFLOWTABLE, 0, scope, a);
                Ok(())
            }
            ("add", "element") => self.element(scope, true, rest),
            ("delete", "element") => self.element(scope, false, rest),
            _ => Err(format!("unsupported command {verb} {object}")),
        }
    }

    fn add_table(&mut self, scope: Scope<'_>, rest: &[&str]) -> Result<(), Unsupported> {
        let mut a = Attributes::new();
        a.string(1, scope.table).u32(2, 0);
        match rest {
            [] => {}
            ["{", "comment", comment, ";", "}"] => {
                a.raw(6, comment_udata(unquote(comment)?).bytes());
            }
            _ => return Err("unsupported table spec".into()),
        }
        self.push(NFT_MSG_NEWTABLE, NLM_F_CREATE, scope, a);
        Ok(())
    }

    fn add_chain(&mut self, scope: Scope<'_>, rest: &[&str]) -> Result<(), Unsupported> {
        let [name, spec @ ..] = rest else {
            return Err("expected a chain name".into());
        };
        let mut a = Attributes::new();
        a.string(1, scope.table).string(3, name);
        match spec {
            [] => {}
            [
                "{",
                "type",
                kind,
                "hook",
                hook,
                "priority",
                priority,
                ";",
                "}",
            ] => {
                let hook = match *hook {
                    "prerouting" => 0,
                    "input" => 1,
                    "forward" => 2,
                    "output" => 3,
                    "postrouting" => 4,
                    other => return Err(format!("unknown hook {other:?}")),
                };
                if !["filter", "nat"].contains(kind) {
                    return Err(format!("unknown chain type {kind:?}"));
                }
                let priority: i32 = priority
                    .parse()
                    .map_err(|_| format!("not a priority: {priority:?}"))?;
                a.string(7, kind).nested(4, |h| {
                    h.u32(1, hook).u32(2, priority as u32);
                });
            }
            ["{", "comment", comment, ";", "}"] => {
                a.raw(12, comment_udata(unquote(comment)?).bytes());
            }
            _ => return Err("unsupported chain spec".into()),
        }
        self.push(NFT_MSG_NEWCHAIN, NLM_F_CREATE, scope, a);
        Ok(())
    }

    /// `add flowtable F T NAME { hook ingress priority filter ; [devices = { a, b } ;] }`:
    /// created, or given the devices it does not have yet.
    fn add_flowtable(&mut self, scope: Scope<'_>, rest: &[&str]) -> Result<(), Unsupported> {
        const NF_NETDEV_INGRESS: u32 = 0;
        let [
            name,
            "{",
            "hook",
            "ingress",
            "priority",
            "filter",
            ";",
            devices @ ..,
            "}",
        ] = rest
        else {
            return Err("unsupported flowtable spec".into());
        };
        let devices: Vec<&str> = match devices {
            [] => Vec::new(),
            ["devices", "=", "{", listed @ .., "}", ";"] => listed
                .iter()
                .map(|device| {
                    let device = device.trim_end_matches(',');
                    unquote(device).unwrap_or(device)
                })
                // A quoted name is one word, and the comma after it another.
                .filter(|device| !device.is_empty())
                .collect(),
            _ => return Err("unsupported flowtable devices".into()),
        };
        let mut a = Attributes::new();
        a.string(1, scope.table)
            .string(NFTA_FLOWTABLE_NAME, name)
            .nested(NFTA_FLOWTABLE_HOOK, |hook| {
                hook.u32(NFTA_FLOWTABLE_HOOK_NUM, NF_NETDEV_INGRESS)
                    .u32(NFTA_FLOWTABLE_HOOK_PRIORITY, 0);
                if !devices.is_empty() {
                    // nft lists the devices last to first.
                    hook.nested(NFTA_FLOWTABLE_HOOK_DEVS, |list| {
                        for device in devices.iter().rev() {
                            list.string(NFTA_DEVICE_NAME, device);
                        }
                    });
                }
            })
            .u32(NFTA_FLOWTABLE_FLAGS, 0);
        self.push(NFT_MSG_NEWFLOWTABLE, NLM_F_CREATE, scope, a);
        Ok(())
    }

    fn add_rule(&mut self, scope: Scope<'_>, rest: &[&str]) -> Result<(), Unsupported> {
        let [chain, statements @ ..] = rest else {
            return Err("expected a chain name".into());
        };
        let counter = self
            .rules_added
            .entry((scope.family, scope.table.to_string(), chain.to_string()))
            .or_default();
        *counter += 1;
        self.current_rule = (chain.to_string(), *counter);
        self.anonymous_in_rule = 0;
        let compiled = rule::compile(statements, scope.is_ipv6())?;
        let mut exprs = Vec::with_capacity(compiled.exprs.len());
        for expr in compiled.exprs {
            exprs.push(match expr {
                rule::Part::Expr(expr) => self.resolve(scope, expr),
                rule::Part::AnonymousSet(set) => self.anonymous_set(scope, set)?,
            });
        }
        let mut a = Attributes::new();
        a.string(1, scope.table).string(2, chain).nested(4, |list| {
            for expr in &exprs {
                list.nested(1, |element| expr.encode(element));
            }
        });
        if let Some(comment) = compiled.comment {
            a.raw(7, comment_udata(comment).bytes());
        }
        self.push(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, scope, a);
        Ok(())
    }

    /// Gives references to sets this batch declared their id.
    fn resolve(&self, scope: Scope<'_>, mut expr: Expr) -> Expr {
        if let Expr::Lookup { set, .. } | Expr::DynsetUpdate { set, .. } = &mut expr {
            set.id = self.set_id(scope, &set.name);
        }
        expr
    }

    fn set_id(&self, scope: Scope<'_>, name: &str) -> Option<u32> {
        self.declared_sets
            .get(&(scope.family, scope.table.to_string(), name.to_string()))
            .copied()
    }

    fn add_set(
        &mut self,
        scope: Scope<'_>,
        is_map: bool,
        rest: &[&str],
    ) -> Result<(), Unsupported> {
        let [name, "{", spec @ .., "}"] = rest else {
            return Err("expected a set name and spec".into());
        };
        let declared = SetSpec::parse(spec, is_map)?;
        let id = self.next_set_id();
        self.declared_sets.insert(
            (scope.family, scope.table.to_string(), name.to_string()),
            id,
        );
        let mut a = Attributes::new();
        a.string(1, scope.table).string(2, name);
        let mut flags = 0;
        if is_map {
            flags |= SET_MAP;
        }
        if declared.dynamic {
            flags |= SET_EVAL;
        }
        if declared.timeout_ms.is_some() || declared.timeout_flag {
            flags |= SET_TIMEOUT;
        }
        if declared.destinations.is_some() {
            flags |= SET_INTERVAL;
        }
        a.u32(3, flags)
            .u32(4, declared.key_type)
            .u32(5, declared.key_len);
        match declared.destinations {
            Some((draws, transport)) => {
                let ipv6 = scope.is_ipv6();
                let (address_type, address_len) = if ipv6 {
                    (TYPE_IP6ADDR, 16)
                } else {
                    (TYPE_IPADDR, 4)
                };
                a.u32(6, address_type << TYPE_BITS | TYPE_INET_SERVICE)
                    .u32(7, address_len + 4)
                    .u32(10, id);
                let mut udata = UserData::new()
                    .host_u32(UDATA_SET_KEYBYTEORDER, BYTEORDER_HOST)
                    .host_u32(UDATA_SET_DATABYTEORDER, 0)
                    .record(UDATA_SET_KEY_TYPEOF, &numgen_typeof(draws))
                    .record(UDATA_SET_DATA_TYPEOF, &destination_typeof(ipv6, transport))
                    .host_u32(UDATA_SET_DATA_INTERVAL, 0);
                if let Some(comment) = declared.comment {
                    udata = udata.text(UDATA_SET_COMMENT, comment);
                }
                a.raw(13, udata.bytes());
                self.push(NFT_MSG_NEWSET, NLM_F_CREATE, scope, a);
                return Ok(());
            }
            None if is_map => {
                a.u32(6, DATA_VERDICT).u32(7, 0);
            }
            None => {}
        }
        a.u32(10, id);
        if let Some(timeout) = declared.timeout_ms {
            a.u64(11, timeout);
        }
        let concatenated = declared.components > 1;
        let mut udata = UserData::new().host_u32(
            UDATA_SET_KEYBYTEORDER,
            if concatenated { 0 } else { BYTEORDER_BIG },
        );
        if is_map {
            udata = udata.host_u32(UDATA_SET_DATABYTEORDER, 0);
        }
        if concatenated {
            // What nft records for a concatenated key (ours all end in inet_service).
            udata = udata.record(UDATA_SET_KEY_TYPEOF, &[0, 4, 13, 0, 0, 0, 1, 0]);
        }
        if is_map {
            udata = udata.host_u32(UDATA_SET_DATA_INTERVAL, 0);
        }
        if let Some(comment) = declared.comment {
            udata = udata.text(UDATA_SET_COMMENT, comment);
        }
        a.raw(13, udata.bytes());
        self.push(NFT_MSG_NEWSET, NLM_F_CREATE, scope, a);
        Ok(())
    }

    fn element(&mut self, scope: Scope<'_>, add: bool, rest: &[&str]) -> Result<(), Unsupported> {
        let [set, "{", body @ .., "}"] = rest else {
            return Err("expected a set name and one element".into());
        };
        let elements = Element::parse(body, add, scope.is_ipv6())?;
        self.push_elements(scope, set, add, &elements);
        Ok(())
    }

    /// One message adding (or deleting) `elements` of `set`.
    fn push_elements(&mut self, scope: Scope<'_>, set: &str, add: bool, elements: &[Element]) {
        let mut a = Attributes::new();
        a.string(1, scope.table).string(2, set);
        if let Some(id) = self.set_id(scope, set) {
            a.u32(4, id);
        }
        encode_elements(&mut a, elements);
        let (kind, flags) = if add {
            (NFT_MSG_NEWSETELEM, NLM_F_CREATE)
        } else {
            (NFT_MSG_DELSETELEM, 0)
        };
        self.push(kind, flags, scope, a);
    }
}
