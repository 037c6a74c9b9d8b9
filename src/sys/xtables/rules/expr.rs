//! The nf_tables expressions iptables-nft writes for our rules, as the kernel dumps them: native
//! ones for what iptables-nft translates (addresses, protocols, ports, marks) and `match` /
//! `target` for the rest, whose info is the xtables extension's own struct. Counters are left
//! out: their values are the kernel's, not the rule's.

use crate::sys::nf_tables::read::attributes;

pub use crate::sys::nf_tables::wire::{
    BASE_NETWORK, BASE_TRANSPORT, CMP_EQ, CMP_GT, CMP_LTE, CMP_NEQ, META_IIFNAME, META_L4PROTO,
    META_MARK, META_OIFNAME, NF_ACCEPT, NF_DROP, NFT_GOTO, NFT_JUMP, NFT_RETURN, REG_1,
    REG_VERDICT,
};

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

/// An expression as borrowed bytes: what fingerprints hash, on both sides, so that reading
/// the kernel's rules allocates nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Key<'a> {
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
        value: &'a [u8],
    },
    Bitwise {
        sreg: u32,
        dreg: u32,
        mask: &'a [u8],
        xor: &'a [u8],
    },
    Range {
        sreg: u32,
        op: u32,
        from: &'a [u8],
        to: &'a [u8],
    },
    Verdict {
        code: i32,
        chain: Option<&'a [u8]>,
    },
    Match {
        name: &'a [u8],
        revision: u32,
        info: &'a [u8],
    },
    Target {
        name: &'a [u8],
        revision: u32,
        info: &'a [u8],
    },
    Other {
        name: &'a [u8],
        data: &'a [u8],
    },
}

impl XtExpr {
    /// This expression as a [`Key`].
    pub fn key(&self) -> Key<'_> {
        match self {
            XtExpr::Meta { key, dreg } => Key::Meta {
                key: *key,
                dreg: *dreg,
            },
            XtExpr::Payload {
                base,
                offset,
                len,
                dreg,
            } => Key::Payload {
                base: *base,
                offset: *offset,
                len: *len,
                dreg: *dreg,
            },
            XtExpr::Cmp { sreg, op, value } => Key::Cmp {
                sreg: *sreg,
                op: *op,
                value,
            },
            XtExpr::Bitwise {
                sreg,
                dreg,
                mask,
                xor,
            } => Key::Bitwise {
                sreg: *sreg,
                dreg: *dreg,
                mask,
                xor,
            },
            XtExpr::Range { sreg, op, from, to } => Key::Range {
                sreg: *sreg,
                op: *op,
                from,
                to,
            },
            XtExpr::Verdict { code, chain } => Key::Verdict {
                code: *code,
                chain: chain.as_deref().map(str::as_bytes),
            },
            XtExpr::Match {
                name,
                revision,
                info,
            } => Key::Match {
                name: name.as_bytes(),
                revision: *revision,
                info,
            },
            XtExpr::Target {
                name,
                revision,
                info,
            } => Key::Target {
                name: name.as_bytes(),
                revision: *revision,
                info,
            },
            XtExpr::Other { name, data } => Key::Other {
                name: name.as_bytes(),
                data,
            },
        }
    }
}

impl From<Key<'_>> for XtExpr {
    fn from(key: Key<'_>) -> Self {
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        match key {
            Key::Meta { key, dreg } => XtExpr::Meta { key, dreg },
            Key::Payload {
                base,
                offset,
                len,
                dreg,
            } => XtExpr::Payload {
                base,
                offset,
                len,
                dreg,
            },
            Key::Cmp { sreg, op, value } => XtExpr::Cmp {
                sreg,
                op,
                value: value.to_vec(),
            },
            Key::Bitwise {
                sreg,
                dreg,
                mask,
                xor,
            } => XtExpr::Bitwise {
                sreg,
                dreg,
                mask: mask.to_vec(),
                xor: xor.to_vec(),
            },
            Key::Range { sreg, op, from, to } => XtExpr::Range {
                sreg,
                op,
                from: from.to_vec(),
                to: to.to_vec(),
            },
            Key::Verdict { code, chain } => XtExpr::Verdict {
                code,
                chain: chain.map(text),
            },
            Key::Match {
                name,
                revision,
                info,
            } => XtExpr::Match {
                name: text(name),
                revision,
                info: info.to_vec(),
            },
            Key::Target {
                name,
                revision,
                info,
            } => XtExpr::Target {
                name: text(name),
                revision,
                info: info.to_vec(),
            },
            Key::Other { name, data } => XtExpr::Other {
                name: text(name),
                data: data.to_vec(),
            },
        }
    }
}

/// Hands each expression of one rule (its NFTA_RULE_* attributes) to `each`, counters left
/// out.
pub fn rule_keys<'a>(rule: &'a [u8], mut each: impl FnMut(Key<'a>)) {
    use crate::sys::nf_tables::wire::{NFTA_EXPR_DATA, NFTA_EXPR_NAME, NFTA_RULE_EXPRESSIONS};
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
pub fn decode_rule(rule: &[u8]) -> Vec<XtExpr> {
    let mut out = Vec::new();
    rule_keys(rule, |key| out.push(XtExpr::from(key)));
    out
}

/// A string attribute's bytes, up to its NUL.
fn until_nul(value: &[u8]) -> &[u8] {
    value.split(|b| *b == 0).next().unwrap_or_default()
}

/// One expression from its name and NFTA_EXPR_DATA; what this module does not know (or a
/// known expression with attributes it does not expect) stays [`Key::Other`].
fn decode_expression<'a>(name: &'a [u8], data: &'a [u8]) -> Key<'a> {
    let fields = Fields::new(data);
    let known = match name {
        b"meta" if fields.has(1) => Some(Key::Meta {
            key: fields.u32(2),
            dreg: fields.u32(1),
        }),
        b"payload" if fields.only(&[1, 2, 3, 4]) => Some(Key::Payload {
            dreg: fields.u32(1),
            base: fields.u32(2),
            offset: fields.u32(3),
            len: fields.u32(4),
        }),
        b"cmp" if fields.only(&[1, 2, 3]) => Some(Key::Cmp {
            sreg: fields.u32(1),
            op: fields.u32(2),
            value: fields.data_value(3),
        }),
        // Only the boolean operation (0) is iptables-nft's.
        b"bitwise" if fields.only(&[1, 2, 3, 4, 5, 6]) && fields.u32(6) == 0 => {
            Some(Key::Bitwise {
                sreg: fields.u32(1),
                dreg: fields.u32(2),
                mask: fields.data_value(4),
                xor: fields.data_value(5),
            })
        }
        b"range" if fields.only(&[1, 2, 3, 4]) => Some(Key::Range {
            sreg: fields.u32(1),
            op: fields.u32(2),
            from: fields.data_value(3),
            to: fields.data_value(4),
        }),
        b"immediate" if fields.u32(1) == REG_VERDICT => fields.verdict(2),
        b"match" if fields.only(&[1, 2, 3]) => Some(Key::Match {
            name: until_nul(fields.raw(1)),
            revision: fields.u32(2),
            info: fields.raw(3),
        }),
        b"target" if fields.only(&[1, 2, 3]) => Some(Key::Target {
            name: until_nul(fields.raw(1)),
            revision: fields.u32(2),
            info: fields.raw(3),
        }),
        _ => None,
    };
    known.unwrap_or(Key::Other { name, data })
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
        const NFTA_DATA_VALUE: u16 = 1;
        attributes(self.raw(kind))
            .find(|(k, _)| *k == NFTA_DATA_VALUE)
            .map(|(_, v)| v)
            .unwrap_or_default()
    }

    /// The NFTA_DATA_VERDICT inside data attribute `kind`.
    fn verdict(&self, kind: u16) -> Option<Key<'a>> {
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
                NFTA_VERDICT_CHAIN => chain = Some(until_nul(value)),
                _ => {}
            }
        }
        Some(Key::Verdict { code: code?, chain })
    }
}
