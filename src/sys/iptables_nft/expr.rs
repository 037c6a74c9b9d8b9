//! The nf_tables expressions iptables-nft writes for our rules, as the kernel dumps them: native
//! ones for what iptables-nft translates (addresses, protocols, ports, marks) and `match` /
//! `target` for the rest, whose info is the xtables extension's own struct. Counters are left
//! out: their values are the kernel's, not the rule's.

use crate::sys::nf_tables::{attributes, nul_terminated};

/// Registers as the kernel dumps them: the verdict register and the first 16-byte register.
pub const REG_VERDICT: u32 = 0;
pub const REG_1: u32 = 1;
/// Meta keys.
pub const META_MARK: u32 = 3;
pub const META_IIFNAME: u32 = 6;
pub const META_OIFNAME: u32 = 7;
pub const META_L4PROTO: u32 = 16;
/// Payload bases.
pub const BASE_NETWORK: u32 = 1;
pub const BASE_TRANSPORT: u32 = 2;
/// Comparison operators.
pub const CMP_EQ: u32 = 0;
pub const CMP_NEQ: u32 = 1;
pub const CMP_LTE: u32 = 3;
pub const CMP_GT: u32 = 4;
/// Verdict codes.
pub const NF_DROP: i32 = 0;
pub const NF_ACCEPT: i32 = 1;
pub const NFT_JUMP: i32 = -3;
pub const NFT_GOTO: i32 = -4;
pub const NFT_RETURN: i32 = -5;

/// One expression of a rule.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum XtExpr {
    Meta {
        key: u32,
        dreg: u32,
    },
    Payload {
        base: u32,
        offset: u32,
        len: u32,
        dreg: u32,
    },
    Cmp {
        sreg: u32,
        op: u32,
        value: Vec<u8>,
    },
    /// `(sreg & mask) ^ xor` into `dreg`.
    Bitwise {
        sreg: u32,
        dreg: u32,
        mask: Vec<u8>,
        xor: Vec<u8>,
    },
    /// A port range (`range` expression): from and to, network order.
    Range {
        sreg: u32,
        op: u32,
        from: Vec<u8>,
        to: Vec<u8>,
    },
    /// The rule's verdict: accept, drop, return, or a jump/goto to `chain`.
    Verdict {
        code: i32,
        chain: Option<String>,
    },
    /// An xtables match and its info struct.
    Match {
        name: String,
        revision: u32,
        info: Vec<u8>,
    },
    /// An xtables target and its info struct.
    Target {
        name: String,
        revision: u32,
        info: Vec<u8>,
    },
    /// Anything else, as the kernel dumped it.
    Other {
        name: String,
        data: Vec<u8>,
    },
}

/// The expressions of one rule from its NFTA_RULE_* attributes, counters left out.
pub fn decode_rule(rule: &[u8]) -> Vec<XtExpr> {
    const NFTA_RULE_EXPRESSIONS: u16 = 4;
    const NFTA_EXPR_NAME: u16 = 1;
    const NFTA_EXPR_DATA: u16 = 2;
    let mut out = Vec::new();
    for (kind, list) in attributes(rule) {
        if kind != NFTA_RULE_EXPRESSIONS {
            continue;
        }
        for (_, element) in attributes(list) {
            let mut name = None;
            let mut data: &[u8] = &[];
            for (kind, value) in attributes(element) {
                match kind {
                    NFTA_EXPR_NAME => name = Some(nul_terminated(value)),
                    NFTA_EXPR_DATA => data = value,
                    _ => {}
                }
            }
            let name = name.unwrap_or_default();
            if name != "counter" {
                out.push(decode_expression(name, data));
            }
        }
    }
    out
}

/// One expression from its name and NFTA_EXPR_DATA; what this module does not know (or a
/// known expression with attributes it does not expect) stays [`XtExpr::Other`].
fn decode_expression(name: String, data: &[u8]) -> XtExpr {
    let fields = Fields::new(data);
    let known = match name.as_str() {
        "meta" if fields.has(1) => Some(XtExpr::Meta {
            key: fields.u32(2),
            dreg: fields.u32(1),
        }),
        "payload" if fields.only(&[1, 2, 3, 4]) => Some(XtExpr::Payload {
            dreg: fields.u32(1),
            base: fields.u32(2),
            offset: fields.u32(3),
            len: fields.u32(4),
        }),
        "cmp" if fields.only(&[1, 2, 3]) => Some(XtExpr::Cmp {
            sreg: fields.u32(1),
            op: fields.u32(2),
            value: fields.data_value(3),
        }),
        // Only the boolean operation (0) is iptables-nft's.
        "bitwise" if fields.only(&[1, 2, 3, 4, 5, 6]) && fields.u32(6) == 0 => {
            Some(XtExpr::Bitwise {
                sreg: fields.u32(1),
                dreg: fields.u32(2),
                mask: fields.data_value(4),
                xor: fields.data_value(5),
            })
        }
        "range" if fields.only(&[1, 2, 3, 4]) => Some(XtExpr::Range {
            sreg: fields.u32(1),
            op: fields.u32(2),
            from: fields.data_value(3),
            to: fields.data_value(4),
        }),
        "immediate" if fields.u32(1) == REG_VERDICT => fields.verdict(2),
        "match" if fields.only(&[1, 2, 3]) => Some(XtExpr::Match {
            name: fields.string(1),
            revision: fields.u32(2),
            info: fields.raw(3).to_vec(),
        }),
        "target" if fields.only(&[1, 2, 3]) => Some(XtExpr::Target {
            name: fields.string(1),
            revision: fields.u32(2),
            info: fields.raw(3).to_vec(),
        }),
        _ => None,
    };
    known.unwrap_or_else(|| XtExpr::Other {
        name,
        data: data.to_vec(),
    })
}

/// An expression's attributes, by type.
struct Fields<'a>(Vec<(u16, &'a [u8])>);

impl<'a> Fields<'a> {
    fn new(data: &'a [u8]) -> Self {
        Fields(attributes(data).collect())
    }

    fn has(&self, kind: u16) -> bool {
        self.0.iter().any(|(k, _)| *k == kind)
    }

    /// True when every attribute is one of `kinds`.
    fn only(&self, kinds: &[u16]) -> bool {
        self.0.iter().all(|(k, _)| kinds.contains(k))
    }

    fn raw(&self, kind: u16) -> &'a [u8] {
        self.0
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, v)| *v)
            .unwrap_or_default()
    }

    fn u32(&self, kind: u16) -> u32 {
        self.raw(kind)
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_be_bytes)
            .unwrap_or(u32::MAX)
    }

    fn string(&self, kind: u16) -> String {
        nul_terminated(self.raw(kind))
    }

    /// The NFTA_DATA_VALUE inside data attribute `kind`.
    fn data_value(&self, kind: u16) -> Vec<u8> {
        const NFTA_DATA_VALUE: u16 = 1;
        attributes(self.raw(kind))
            .find(|(k, _)| *k == NFTA_DATA_VALUE)
            .map(|(_, v)| v.to_vec())
            .unwrap_or_default()
    }

    /// The NFTA_DATA_VERDICT inside data attribute `kind`.
    fn verdict(&self, kind: u16) -> Option<XtExpr> {
        const NFTA_DATA_VERDICT: u16 = 2;
        const NFTA_VERDICT_CODE: u16 = 1;
        const NFTA_VERDICT_CHAIN: u16 = 2;
        let (_, verdict) = attributes(self.raw(kind)).find(|(k, _)| *k == NFTA_DATA_VERDICT)?;
        let mut code = None;
        let mut chain = None;
        for (kind, value) in attributes(verdict) {
            match kind {
                NFTA_VERDICT_CODE => {
                    code = Some(i32::from_be_bytes(value.get(..4)?.try_into().ok()?))
                }
                NFTA_VERDICT_CHAIN => chain = Some(nul_terminated(value)),
                _ => {}
            }
        }
        Some(XtExpr::Verdict { code: code?, chain })
    }
}
