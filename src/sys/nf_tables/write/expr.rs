//! nf_tables rule expressions and how each is put on the wire. Attribute order within each
//! expression is `nft`'s (libnftnl's), so our messages equal nft's byte for byte.

use crate::sys::nf_tables::wire::Attributes;

pub use crate::sys::nf_tables::wire::{
    BASE_NETWORK, BASE_TRANSPORT, CMP_EQ, CMP_NEQ, CT_STATE, CT_STATUS, META_IIFNAME, META_L4PROTO,
    META_MARK, NF_DROP, NFT_GOTO, NFT_JUMP, NFT_RETURN, REG_1, REG_2, REG_VERDICT,
};

/// The 32-bit register holding bytes `offset..offset + 4` of register 1 onwards.
pub fn reg32(offset: usize) -> u32 {
    8 + (offset / 4) as u32
}

/// A verdict map's data type.
pub const DATA_VERDICT: u32 = 0xffff_ff00;
/// Set flags.
pub const SET_ANONYMOUS: u32 = 0x1;
pub const SET_CONSTANT: u32 = 0x2;
pub const SET_INTERVAL: u32 = 0x4;
pub const SET_MAP: u32 = 0x8;
pub const SET_TIMEOUT: u32 = 0x10;
pub const SET_EVAL: u32 = 0x20;
/// An element that ends an interval.
pub const ELEM_INTERVAL_END: u32 = 0x1;
/// Lookup flag: match when the key is not in the set.
pub const LOOKUP_INVERTED: u32 = 0x1;

/// A verdict: its code and, for jump and goto, the chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub code: i32,
    pub chain: Option<String>,
}

impl Verdict {
    pub fn encode(&self, out: &mut Attributes) {
        // NFTA_DATA_VERDICT { NFTA_VERDICT_CODE, NFTA_VERDICT_CHAIN }.
        out.nested(2, |verdict| {
            verdict.u32(1, self.code as u32);
            if let Some(chain) = &self.chain {
                verdict.string(2, chain);
            }
        });
    }
}

/// Data: raw bytes (NFTA_DATA_VALUE) or a verdict (NFTA_DATA_VERDICT).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Data {
    Value(Vec<u8>),
    Verdict(Verdict),
}

impl Data {
    pub fn encode(&self, kind: u16, out: &mut Attributes) {
        out.nested(kind, |data| match self {
            Data::Value(bytes) => {
                data.raw(1, bytes);
            }
            Data::Verdict(verdict) => verdict.encode(data),
        });
    }
}

/// A set a rule refers to: by name, and by its id when the same batch creates it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetRef {
    pub name: String,
    pub id: Option<u32>,
}

/// One expression.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expr {
    Payload {
        dreg: u32,
        base: u32,
        offset: u32,
        len: u32,
    },
    Cmp {
        sreg: u32,
        op: u32,
        data: Vec<u8>,
    },
    /// `(reg & mask) ^ xor`; `boolean_op` adds the operation attribute, which nft sends
    /// for meta mark arithmetic but not for masks of payloads and conntrack state.
    Bitwise {
        reg: u32,
        mask: Vec<u8>,
        xor: Vec<u8>,
        boolean_op: bool,
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
    Immediate {
        dreg: u32,
        data: Data,
    },
    Lookup {
        sreg: u32,
        dreg: Option<u32>,
        set: SetRef,
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
        set: SetRef,
    },
    /// `counter`, from zero (nft sends no attribute for a zero count).
    Counter,
}

impl Expr {
    fn name(&self) -> &'static str {
        match self {
            Expr::Payload { .. } => "payload",
            Expr::Cmp { .. } => "cmp",
            Expr::Bitwise { .. } => "bitwise",
            Expr::MetaLoad { .. } | Expr::MetaSet { .. } => "meta",
            Expr::Ct { .. } => "ct",
            Expr::Immediate { .. } => "immediate",
            Expr::Lookup { .. } => "lookup",
            Expr::Numgen { .. } => "numgen",
            Expr::HostToNetwork32 { .. } => "byteorder",
            Expr::Dnat { .. } | Expr::DnatRange { .. } => "nat",
            Expr::Masq { .. } => "masq",
            Expr::Reject { .. } => "reject",
            Expr::FibAddressType { .. } => "fib",
            Expr::DynsetUpdate { .. } => "dynset",
            Expr::Counter => "counter",
        }
    }

    /// NFTA_EXPR_NAME and NFTA_EXPR_DATA.
    pub fn encode(&self, out: &mut Attributes) {
        out.string(1, self.name());
        out.nested(2, |data| self.encode_data(data));
    }

    fn encode_data(&self, out: &mut Attributes) {
        match self {
            Expr::Payload {
                dreg,
                base,
                offset,
                len,
            } => {
                out.u32(1, *dreg).u32(2, *base).u32(3, *offset).u32(4, *len);
            }
            Expr::Cmp { sreg, op, data } => {
                out.u32(1, *sreg).u32(2, *op);
                Data::Value(data.clone()).encode(3, out);
            }
            Expr::Bitwise {
                reg,
                mask,
                xor,
                boolean_op,
            } => {
                out.u32(1, *reg).u32(2, *reg);
                if *boolean_op {
                    out.u32(6, 0);
                }
                out.u32(3, mask.len() as u32);
                Data::Value(mask.clone()).encode(4, out);
                Data::Value(xor.clone()).encode(5, out);
            }
            Expr::MetaLoad { key, dreg } => {
                out.u32(2, *key).u32(1, *dreg);
            }
            Expr::MetaSet { key, sreg } => {
                out.u32(2, *key).u32(3, *sreg);
            }
            Expr::Ct { key, dreg } => {
                out.u32(2, *key).u32(1, *dreg);
            }
            Expr::Immediate { dreg, data } => {
                out.u32(1, *dreg);
                data.encode(2, out);
            }
            Expr::Lookup {
                sreg,
                dreg,
                set,
                inverted,
            } => {
                out.u32(2, *sreg);
                if let Some(dreg) = dreg {
                    out.u32(3, *dreg);
                }
                out.string(1, &set.name);
                if let Some(id) = set.id {
                    out.u32(4, id);
                }
                if *inverted {
                    out.u32(5, LOOKUP_INVERTED);
                }
            }
            Expr::Numgen {
                dreg,
                modulus,
                offset,
            } => {
                // Type random (1).
                out.u32(1, *dreg).u32(2, *modulus).u32(3, 1).u32(4, *offset);
            }
            Expr::HostToNetwork32 { reg } => {
                // Source, destination, operation hton (1), length 4, size 4.
                out.u32(1, *reg).u32(2, *reg).u32(3, 1).u32(4, 4).u32(5, 4);
            }
            Expr::Dnat { family, addr, port } => {
                // Type DNAT (1); the range flag "protocol specified" (2).
                out.u32(1, 1)
                    .u32(2, u32::from(*family))
                    .u32(3, *addr)
                    .u32(5, *port)
                    .u32(7, 2);
            }
            Expr::DnatRange { family, addr, port } => {
                // Type DNAT (1) and the registers only: the kernel sets the range flags and
                // maxima itself (it lists them as `flags 0x3`).
                out.u32(1, 1)
                    .u32(2, u32::from(*family))
                    .u32(3, *addr)
                    .u32(5, *port);
            }
            Expr::Masq { flags } => {
                out.u32(1, *flags);
            }
            Expr::Reject { code } => {
                // Type ICMP(v6) unreachable (0).
                out.u32(1, 0).raw(2, &[*code]);
            }
            Expr::FibAddressType { dreg, source } => {
                // Flags: saddr 1 / daddr 2; result: address type (3).
                out.u32(3, if *source { 1 } else { 2 })
                    .u32(2, 3)
                    .u32(1, *dreg);
            }
            Expr::DynsetUpdate { sreg, set } => {
                // Operation update (1).
                out.u32(4, *sreg).u32(3, 1).string(1, &set.name);
                if let Some(id) = set.id {
                    out.u32(2, id);
                }
            }
            Expr::Counter => {}
        }
    }
}
