//! Rules read back from the kernel, decoded into [`ExprRef`]s that borrow the dump: what
//! iptables-nft writes for our iptables rules, native expressions for what it translates
//! (addresses, protocols, ports, marks) and `match` / `target` for the rest, whose info is the
//! xtables extension's own struct. Counters are left out: their values are the kernel's, not the
//! rule's.

use super::{Data, Expr, ExprRef, Verdict};
use crate::sys::nf_tables::read::attributes;
use crate::sys::nf_tables::wire::{
    NFTA_DATA_VALUE, NFTA_DATA_VERDICT, NFTA_EXPR_DATA, NFTA_EXPR_NAME, NFTA_RULE_EXPRESSIONS,
    NFTA_VERDICT_CHAIN, NFTA_VERDICT_CODE, REG_VERDICT,
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
        // Only the boolean operation (0) is iptables-nft's.
        b"bitwise" if fields.only(&[1, 2, 3, 4, 5, 6]) && fields.u32(6) == 0 => {
            Some(Expr::Bitwise {
                sreg: fields.u32(1),
                dreg: fields.u32(2),
                mask: fields.data_value(4),
                xor: fields.data_value(5),
                boolean_op: true,
            })
        }
        b"range" if fields.only(&[1, 2, 3, 4]) => Some(Expr::Range {
            sreg: fields.u32(1),
            op: fields.u32(2),
            from: fields.data_value(3),
            to: fields.data_value(4),
        }),
        b"immediate" if fields.u32(1) == REG_VERDICT => fields.verdict(2),
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
