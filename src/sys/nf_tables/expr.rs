//! nf_tables rule expressions: one model for what we write (the nftables mode's rules, compiled
//! from nft's language) and what we read back (the rules iptables-nft wrote for the iptables
//! mode). Byte strings are `B` and names `S`: owned for rules we build, borrowed from the dump for
//! rules we read, so that fingerprinting half a gigabyte of rules allocates nothing. Both forms
//! hash alike ([`Hash`] of `Vec<u8>` and `&[u8]`, of `String` and `&str`, agree), which is how a
//! rule we would write is compared with the rule the kernel holds.

mod decode;
mod encode;

pub use decode::{decode_rule, rule_expressions};

/// The 32-bit register holding bytes `offset..offset + 4` of register 1 onwards.
pub fn reg32(offset: usize) -> u32 {
    8 + (offset / 4) as u32
}

/// A verdict: its code and, for jump and goto, the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Verdict<S = String> {
    pub code: i32,
    pub chain: Option<S>,
}

/// Data: raw bytes (NFTA_DATA_VALUE) or a verdict (NFTA_DATA_VERDICT).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Data<B = Vec<u8>, S = String> {
    Value(B),
    Verdict(Verdict<S>),
}

/// A set a rule refers to: by name, and by its id when the same batch creates it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SetRef<S = String> {
    pub name: S,
    pub id: Option<u32>,
}

/// One expression. Counters are left out of rules read back: their values are the kernel's.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Expr<B = Vec<u8>, S = String> {
    Payload {
        dreg: u32,
        base: u32,
        offset: u32,
        len: u32,
    },
    Cmp {
        sreg: u32,
        op: u32,
        data: B,
    },
    /// `(sreg & mask) ^ xor` into `dreg`; `boolean_op` is the operation attribute, which nft
    /// sends for meta mark arithmetic but not for masks of payloads and conntrack state (and
    /// the kernel always dumps).
    Bitwise {
        sreg: u32,
        dreg: u32,
        mask: B,
        xor: B,
        boolean_op: bool,
    },
    /// A range of values (iptables-nft's port ranges): from and to, network order.
    Range {
        sreg: u32,
        op: u32,
        from: B,
        to: B,
    },
    MetaLoad {
        key: u32,
        dreg: u32,
    },
    MetaSet {
        key: u32,
        sreg: u32,
    },
    Ct {
        key: u32,
        dreg: u32,
    },
    /// A conntrack key of the original direction (`ct original ip daddr`).
    CtOriginal {
        key: u32,
        dreg: u32,
    },
    Immediate {
        dreg: u32,
        data: Data<B, S>,
    },
    Lookup {
        sreg: u32,
        dreg: Option<u32>,
        set: SetRef<S>,
        inverted: bool,
    },
    Numgen {
        dreg: u32,
        modulus: u32,
        offset: u32,
    },
    /// A 32-bit register from host to network order (nft's step before an interval lookup of
    /// a host-order integer: interval sets compare keys as big-endian bytes).
    HostToNetwork32 {
        reg: u32,
    },
    /// A 64-bit register pair from host to network order (nft's step before comparing a
    /// host-order counter such as `ct packets`).
    HostToNetwork64 {
        reg: u32,
    },
    Dnat {
        family: u8,
        addr: u32,
        port: u32,
    },
    /// DNAT to the address and port a map lookup left in these registers (nft sends no range
    /// flags for it).
    DnatRange {
        family: u8,
        addr: u32,
        port: u32,
    },
    /// Masquerade with these NAT range flags.
    Masq {
        flags: u32,
    },
    /// ICMP(v6) unreachable with this code.
    Reject {
        code: u8,
    },
    /// The address type of the source or destination (`fib saddr type`).
    FibAddressType {
        dreg: u32,
        source: bool,
    },
    /// `update @set { key }`.
    DynsetUpdate {
        sreg: u32,
        set: SetRef<S>,
    },
    /// `counter`, from zero (nft sends no attribute for a zero count).
    Counter,
    /// `flow add @flowtable`: the connection is offloaded to this flowtable.
    FlowOffload {
        flowtable: S,
    },
    /// A named stateful object of this kind (`counter name "x"`: kind 1).
    ObjRef {
        kind: u32,
        name: S,
    },
    /// An xtables match and its info struct (iptables-nft's form of what it does not translate).
    Match {
        name: S,
        revision: u32,
        info: B,
    },
    /// An xtables target and its info struct.
    Target {
        name: S,
        revision: u32,
        info: B,
    },
    /// An expression read back that this model does not know, as the kernel dumped it.
    Other {
        name: B,
        data: B,
    },
}

/// An expression read back, borrowing the dump's bytes.
pub type ExprRef<'a> = Expr<&'a [u8], &'a str>;

impl ExprRef<'_> {
    /// This expression with its bytes copied.
    pub fn to_owned_expr(&self) -> Expr {
        let verdict = |v: &Verdict<&str>| Verdict {
            code: v.code,
            chain: v.chain.map(str::to_string),
        };
        let owned_set = |s: &SetRef<&str>| SetRef {
            name: s.name.to_string(),
            id: s.id,
        };
        match *self {
            Expr::Payload {
                dreg,
                base,
                offset,
                len,
            } => Expr::Payload {
                dreg,
                base,
                offset,
                len,
            },
            Expr::Cmp { sreg, op, data } => Expr::Cmp {
                sreg,
                op,
                data: data.to_vec(),
            },
            Expr::Bitwise {
                sreg,
                dreg,
                mask,
                xor,
                boolean_op,
            } => Expr::Bitwise {
                sreg,
                dreg,
                mask: mask.to_vec(),
                xor: xor.to_vec(),
                boolean_op,
            },
            Expr::Range { sreg, op, from, to } => Expr::Range {
                sreg,
                op,
                from: from.to_vec(),
                to: to.to_vec(),
            },
            Expr::MetaLoad { key, dreg } => Expr::MetaLoad { key, dreg },
            Expr::MetaSet { key, sreg } => Expr::MetaSet { key, sreg },
            Expr::Ct { key, dreg } => Expr::Ct { key, dreg },
            Expr::CtOriginal { key, dreg } => Expr::CtOriginal { key, dreg },
            Expr::Immediate { dreg, ref data } => Expr::Immediate {
                dreg,
                data: match data {
                    Data::Value(bytes) => Data::Value(bytes.to_vec()),
                    Data::Verdict(v) => Data::Verdict(verdict(v)),
                },
            },
            Expr::Lookup {
                sreg,
                dreg,
                ref set,
                inverted,
            } => Expr::Lookup {
                sreg,
                dreg,
                set: owned_set(set),
                inverted,
            },
            Expr::Numgen {
                dreg,
                modulus,
                offset,
            } => Expr::Numgen {
                dreg,
                modulus,
                offset,
            },
            Expr::HostToNetwork32 { reg } => Expr::HostToNetwork32 { reg },
            Expr::HostToNetwork64 { reg } => Expr::HostToNetwork64 { reg },
            Expr::FlowOffload { flowtable } => Expr::FlowOffload {
                flowtable: flowtable.to_string(),
            },
            Expr::Dnat { family, addr, port } => Expr::Dnat { family, addr, port },
            Expr::DnatRange { family, addr, port } => Expr::DnatRange { family, addr, port },
            Expr::Masq { flags } => Expr::Masq { flags },
            Expr::Reject { code } => Expr::Reject { code },
            Expr::FibAddressType { dreg, source } => Expr::FibAddressType { dreg, source },
            Expr::DynsetUpdate { sreg, ref set } => Expr::DynsetUpdate {
                sreg,
                set: owned_set(set),
            },
            Expr::Counter => Expr::Counter,
            Expr::ObjRef { kind, name } => Expr::ObjRef {
                kind,
                name: name.to_string(),
            },
            Expr::Match {
                name,
                revision,
                info,
            } => Expr::Match {
                name: name.to_string(),
                revision,
                info: info.to_vec(),
            },
            Expr::Target {
                name,
                revision,
                info,
            } => Expr::Target {
                name: name.to_string(),
                revision,
                info: info.to_vec(),
            },
            Expr::Other { name, data } => Expr::Other {
                name: name.to_vec(),
                data: data.to_vec(),
            },
        }
    }
}

#[cfg(test)]
mod tests;
