//! How each expression is put on the wire. Attribute order within each expression is `nft`'s
//! (libnftnl's), so our messages equal nft's byte for byte.

use super::{Data, Expr, Verdict};
use crate::sys::nf_tables::wire::{Attributes, LOOKUP_INVERTED};

impl<S: AsRef<str>> Verdict<S> {
    pub fn encode(&self, out: &mut Attributes) {
        // NFTA_DATA_VERDICT { NFTA_VERDICT_CODE, NFTA_VERDICT_CHAIN }.
        out.nested(2, |verdict| {
            verdict.u32(1, self.code as u32);
            if let Some(chain) = &self.chain {
                verdict.string(2, chain.as_ref());
            }
        });
    }
}

impl<B: AsRef<[u8]>, S: AsRef<str>> Data<B, S> {
    pub fn encode(&self, kind: u16, out: &mut Attributes) {
        out.nested(kind, |data| match self {
            Data::Value(bytes) => {
                data.raw(1, bytes.as_ref());
            }
            Data::Verdict(verdict) => verdict.encode(data),
        });
    }
}

/// NFTA_DATA_VALUE inside data attribute `kind`.
fn value(kind: u16, bytes: &[u8], out: &mut Attributes) {
    out.nested(kind, |data| {
        data.raw(1, bytes);
    });
}

impl<B: AsRef<[u8]>, S: AsRef<str>> Expr<B, S> {
    fn name(&self) -> &str {
        match self {
            Expr::Payload { .. } => "payload",
            Expr::Cmp { .. } => "cmp",
            Expr::Bitwise { .. } => "bitwise",
            Expr::Range { .. } => "range",
            Expr::MetaLoad { .. } | Expr::MetaSet { .. } => "meta",
            Expr::Ct { .. } | Expr::CtOriginal { .. } => "ct",
            Expr::Immediate { .. } => "immediate",
            Expr::Lookup { .. } => "lookup",
            Expr::Numgen { .. } => "numgen",
            Expr::HostToNetwork32 { .. } | Expr::HostToNetwork64 { .. } => "byteorder",
            Expr::FlowOffload { .. } => "flow_offload",
            Expr::Dnat { .. } | Expr::DnatRange { .. } => "nat",
            Expr::Masq { .. } => "masq",
            Expr::Reject { .. } => "reject",
            Expr::FibAddressType { .. } => "fib",
            Expr::DynsetUpdate { .. } => "dynset",
            Expr::Counter => "counter",
            Expr::ObjRef { .. } => "objref",
            Expr::Match { .. } => "match",
            Expr::Target { .. } => "target",
            Expr::Other { name, .. } => std::str::from_utf8(name.as_ref()).unwrap_or_default(),
        }
    }

    /// NFTA_EXPR_NAME and NFTA_EXPR_DATA.
    pub fn encode(&self, out: &mut Attributes) {
        out.string(1, self.name());
        if let Expr::Other { data, .. } = self {
            out.raw(2, data.as_ref());
        } else {
            out.nested(2, |data| self.encode_data(data));
        }
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
                value(3, data.as_ref(), out);
            }
            Expr::Bitwise {
                sreg,
                dreg,
                mask,
                xor,
                boolean_op,
            } => {
                out.u32(1, *sreg).u32(2, *dreg);
                if *boolean_op {
                    out.u32(6, 0);
                }
                out.u32(3, mask.as_ref().len() as u32);
                value(4, mask.as_ref(), out);
                value(5, xor.as_ref(), out);
            }
            Expr::Range { sreg, op, from, to } => {
                out.u32(1, *sreg).u32(2, *op);
                value(3, from.as_ref(), out);
                value(4, to.as_ref(), out);
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
            Expr::CtOriginal { key, dreg } => {
                // Direction original (0), one byte.
                out.u32(2, *key).u32(1, *dreg).raw(3, &[0]);
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
                out.string(1, set.name.as_ref());
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
            Expr::HostToNetwork64 { reg } => {
                out.u32(1, *reg).u32(2, *reg).u32(3, 1).u32(4, 8).u32(5, 8);
            }
            Expr::FlowOffload { flowtable } => {
                out.string(1, flowtable.as_ref());
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
                out.u32(4, *sreg).u32(3, 1).string(1, set.name.as_ref());
                if let Some(id) = set.id {
                    out.u32(2, id);
                }
            }
            Expr::Match {
                name,
                revision,
                info,
            }
            | Expr::Target {
                name,
                revision,
                info,
            } => {
                out.string(1, name.as_ref())
                    .u32(2, *revision)
                    .raw(3, info.as_ref());
            }
            Expr::ObjRef { kind, name } => {
                // nft sends this name without its NUL.
                out.u32(1, *kind).raw(2, name.as_ref().as_bytes());
            }
            Expr::Counter | Expr::Other { .. } => {}
        }
    }
}
