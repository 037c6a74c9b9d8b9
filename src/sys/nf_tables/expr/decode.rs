//! Rules read back from the kernel, decoded into [`ExprRef`]s that borrow the dump: what
//! iptables-nft writes for our iptables rules, native expressions for what it translates
//! (addresses, protocols, ports, marks) and `match` / `target` for the rest, whose info is the
//! xtables extension's own struct. Counters are left out: their values are the kernel's, not the
//! rule's.

use super::{Data, Expr, ExprRef, SetRef, Verdict};
use crate::sys::nf_tables::read::attributes;
use crate::sys::nf_tables::wire::{
    LOOKUP_INVERTED, NFTA_DATA_VALUE, NFTA_DATA_VERDICT, NFTA_EXPR_DATA, NFTA_EXPR_NAME,
    NFTA_RULE_EXPRESSIONS, NFTA_VERDICT_CHAIN, NFTA_VERDICT_CODE, REG_VERDICT,
};

/// Hands each expression of one rule (its NFTA_RULE_* attributes) to `each`, counters left
/// out.
pub fn rule_expressions<'a>(rule: &'a [u8], mut each: impl FnMut(ExprRef<'a>)) {
    for (kind, list) in attributes(rule) {
        if kind != NFTA_RULE_EXPRESSIONS {
            continue;
        }
        for (_, element) in attributes(list) {
            let mut name: &[u8] = &[];
            let mut data: &[u8] = &[];
            for (kind, value) in attributes(element) {
                match kind {
                    NFTA_EXPR_NAME => name = until_nul(value),
                    NFTA_EXPR_DATA => data = value,
                    _ => {}
                }
            }
            if name != b"counter" {
                each(decode_expression(name, data));
            }
        }
    }
}

/// The expressions of one rule, owned (for tests and diagnosis).
pub fn decode_rule(rule: &[u8]) -> Vec<Expr> {
    let mut out = Vec::new();
    rule_expressions(rule, |expression| out.push(expression.to_owned_expr()));
    out
}

/// A string attribute's bytes, up to its NUL.
fn until_nul(value: &[u8]) -> &[u8] {
    value.split(|b| *b == 0).next().unwrap_or_default()
}

/// One expression from its name and NFTA_EXPR_DATA; what this module does not know (or a
/// known expression with attributes it does not expect) stays [`Expr::Other`].
fn decode_expression<'a>(name: &'a [u8], data: &'a [u8]) -> ExprRef<'a> {
    known_expression(name, data).unwrap_or(Expr::Other { name, data })
}

fn known_expression<'a>(name: &'a [u8], data: &'a [u8]) -> Option<ExprRef<'a>> {
    let fields = Fields::new(data);
    match name {
        b"meta" if fields.has(1) => Some(Expr::MetaLoad {
            key: fields.u32(2),
            dreg: fields.u32(1),
        }),
        b"meta" if fields.only(&[2, 3]) => Some(Expr::MetaSet {
            key: fields.u32(2),
            sreg: fields.u32(3),
        }),
        b"payload" if fields.only(&[1, 2, 3, 4]) => Some(Expr::Payload {
            dreg: fields.u32(1),
            base: fields.u32(2),
            offset: fields.u32(3),
            len: fields.u32(4),
        }),
        b"cmp" if fields.only(&[1, 2, 3]) => Some(Expr::Cmp {
            sreg: fields.u32(1),
            op: fields.u32(2),
            data: fields.data_value(3),
        }),
        // Only the boolean operation (0): the kernel always dumps it; nft sends it for mark
        // arithmetic only.
        b"bitwise" if fields.only(&[1, 2, 3, 4, 5, 6]) && fields.flag(6) == 0 => {
            Some(Expr::Bitwise {
                sreg: fields.u32(1),
                dreg: fields.u32(2),
                mask: fields.data_value(4),
                xor: fields.data_value(5),
                boolean_op: fields.has(6),
            })
        }
        b"range" if fields.only(&[1, 2, 3, 4]) => Some(Expr::Range {
            sreg: fields.u32(1),
            op: fields.u32(2),
            from: fields.data_value(3),
            to: fields.data_value(4),
        }),
        b"immediate" if fields.u32(1) == REG_VERDICT => fields.verdict(2),
        b"immediate" if fields.only(&[1, 2]) => Some(Expr::Immediate {
            dreg: fields.u32(1),
            data: Data::Value(fields.data_value(2)),
        }),
        b"match" if fields.only(&[1, 2, 3]) => Some(Expr::Match {
            name: text(until_nul(fields.raw(1)))?,
            revision: fields.u32(2),
            info: fields.raw(3),
        }),
        b"target" if fields.only(&[1, 2, 3]) => Some(Expr::Target {
            name: text(until_nul(fields.raw(1)))?,
            revision: fields.u32(2),
            info: fields.raw(3),
        }),
        _ => nftables_expression(name, &fields),
    }
}

/// The expressions only nftables mode's rules hold (iptables-nft writes none of them), as
/// the kernel dumps them: it adds attributes of its own (a lookup's and a dynset's flags, a
/// NAT's flags and range maxima), and keeps no trace of the difference between a DNAT to
/// immediate registers and one to a map's, so both read back as [`Expr::DnatRange`].
fn nftables_expression<'a>(name: &'a [u8], fields: &Fields<'a>) -> Option<ExprRef<'a>> {
    const NUMGEN_RANDOM: u32 = 1;
    const BYTEORDER_HTON: u32 = 1;
    const NAT_DNAT: u32 = 1;
    const REJECT_ICMP_UNREACH: u32 = 0;
    const FIB_ADDRESS_TYPE: u32 = 3;
    const DYNSET_UPDATE: u32 = 1;
    match name {
        b"ct" if fields.only(&[1, 2]) => Some(Expr::Ct {
            key: fields.u32(2),
            dreg: fields.u32(1),
        }),
        b"ct" if fields.only(&[1, 2, 3]) && fields.raw(3) == [0] => Some(Expr::CtOriginal {
            key: fields.u32(2),
            dreg: fields.u32(1),
        }),
        b"flow_offload" if fields.only(&[1]) => Some(Expr::FlowOffload {
            flowtable: text(until_nul(fields.raw(1)))?,
        }),
        b"lookup" if fields.has(1) && fields.has(2) => Some(Expr::Lookup {
            sreg: fields.u32(2),
            dreg: fields.has(3).then(|| fields.u32(3)),
            set: SetRef {
                name: text(until_nul(fields.raw(1)))?,
                id: None,
            },
            inverted: fields.flag(5) & LOOKUP_INVERTED != 0,
        }),
        b"numgen" if fields.u32(3) == NUMGEN_RANDOM => Some(Expr::Numgen {
            dreg: fields.u32(1),
            modulus: fields.u32(2),
            offset: fields.flag(4),
        }),
        b"byteorder"
            if fields.u32(3) == BYTEORDER_HTON
                && fields.u32(1) == fields.u32(2)
                && (fields.u32(4), fields.u32(5)) == (4, 4) =>
        {
            Some(Expr::HostToNetwork32 { reg: fields.u32(1) })
        }
        b"byteorder"
            if fields.u32(3) == BYTEORDER_HTON
                && fields.u32(1) == fields.u32(2)
                && (fields.u32(4), fields.u32(5)) == (8, 8) =>
        {
            Some(Expr::HostToNetwork64 { reg: fields.u32(1) })
        }
        b"nat" if fields.u32(1) == NAT_DNAT && fields.has(3) && fields.has(5) => {
            Some(Expr::DnatRange {
                family: u8::try_from(fields.u32(2)).ok()?,
                addr: fields.u32(3),
                port: fields.u32(5),
            })
        }
        b"masq" => Some(Expr::Masq {
            flags: fields.flag(1),
        }),
        b"reject" if fields.u32(1) == REJECT_ICMP_UNREACH => Some(Expr::Reject {
            code: *fields.raw(2).first()?,
        }),
        b"fib" if fields.u32(2) == FIB_ADDRESS_TYPE && matches!(fields.u32(3), 1 | 2) => {
            Some(Expr::FibAddressType {
                dreg: fields.u32(1),
                source: fields.u32(3) == 1,
            })
        }
        b"objref" if fields.only(&[1, 2]) => Some(Expr::ObjRef {
            kind: fields.u32(1),
            name: text(until_nul(fields.raw(2)))?,
        }),
        b"dynset" if fields.u32(3) == DYNSET_UPDATE => Some(Expr::DynsetUpdate {
            sreg: fields.u32(4),
            set: SetRef {
                name: text(until_nul(fields.raw(1)))?,
                id: None,
            },
        }),
        _ => None,
    }
}

/// A name read back, when it is text.
fn text(bytes: &[u8]) -> Option<&str> {
    std::str::from_utf8(bytes).ok()
}

/// An expression's attributes, by type (an expression has at most eight).
struct Fields<'a> {
    values: [&'a [u8]; 8],
    present: u8,
    /// Set when an attribute's type is beyond the table: never one of the known layouts.
    unknown: bool,
}

impl<'a> Fields<'a> {
    fn new(data: &'a [u8]) -> Self {
        let mut fields = Fields {
            values: [&[]; 8],
            present: 0,
            unknown: false,
        };
        for (kind, value) in attributes(data) {
            match fields.values.get_mut(usize::from(kind)) {
                Some(slot) if kind > 0 => {
                    *slot = value;
                    fields.present |= 1 << kind;
                }
                _ => fields.unknown = true,
            }
        }
        fields
    }

    fn has(&self, kind: u16) -> bool {
        self.present & (1 << kind) != 0
    }

    /// True when every attribute is one of `kinds`.
    fn only(&self, kinds: &[u16]) -> bool {
        let allowed = kinds.iter().fold(0u8, |mask, kind| mask | 1 << kind);
        !self.unknown && self.present & !allowed == 0
    }

    fn raw(&self, kind: u16) -> &'a [u8] {
        self.values
            .get(usize::from(kind))
            .copied()
            .unwrap_or_default()
    }

    /// A number the kernel leaves out when it is zero (flags, an offset).
    fn flag(&self, kind: u16) -> u32 {
        if self.has(kind) { self.u32(kind) } else { 0 }
    }

    fn u32(&self, kind: u16) -> u32 {
        self.raw(kind)
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_be_bytes)
            .unwrap_or(u32::MAX)
    }

    /// The NFTA_DATA_VALUE inside data attribute `kind`.
    fn data_value(&self, kind: u16) -> &'a [u8] {
        attributes(self.raw(kind))
            .find(|(k, _)| *k == NFTA_DATA_VALUE)
            .map(|(_, v)| v)
            .unwrap_or_default()
    }

    /// The NFTA_DATA_VERDICT inside data attribute `kind`.
    fn verdict(&self, kind: u16) -> Option<ExprRef<'a>> {
        let (_, verdict) = attributes(self.raw(kind)).find(|(k, _)| *k == NFTA_DATA_VERDICT)?;
        let mut code = None;
        let mut chain = None;
        for (kind, value) in attributes(verdict) {
            match kind {
                NFTA_VERDICT_CODE => {
                    code = Some(i32::from_be_bytes(value.get(..4)?.try_into().ok()?))
                }
                NFTA_VERDICT_CHAIN => chain = Some(text(until_nul(value))?),
                _ => {}
            }
        }
        Some(Expr::Immediate {
            dreg: REG_VERDICT,
            data: Data::Verdict(Verdict { code: code?, chain }),
        })
    }
}
