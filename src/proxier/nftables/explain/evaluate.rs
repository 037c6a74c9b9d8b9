//! Whether a rule's matches hold for the flow asked about: the loads and comparisons our rules
//! use (addresses, the protocol, the destination port, a prefix's mask, whether an address is
//! the node's), evaluated on a packet made of what the flow says. What the flow does not say
//! (its source, when not given) and what a match needs besides the packet (a set's contents, an
//! interface) leave the answer open.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::model::address::octets;
use crate::proxier::explanation::Flow;
use crate::sys::nf_tables::expr::Expr;
use crate::sys::nf_tables::wire::{
    BASE_NETWORK, BASE_TRANSPORT, CMP_EQ, CMP_GT, CMP_LTE, CMP_NEQ, META_L4PROTO,
};

/// What a match needs besides the packet: whether an address is one of the node's, and
/// whether a value is in a set (`None`: not read).
pub(super) struct Context<'a> {
    pub local: &'a dyn Fn(IpAddr) -> bool,
    pub member: &'a dyn Fn(&str, &[u8]) -> Option<bool>,
}

/// `Some(true)` when every match of `rule` holds, `Some(false)` when one does not, `None`
/// when one cannot be told.
pub(super) fn evaluate(rule: &[Expr], flow: &Flow, context: &Context<'_>) -> Option<bool> {
    let local = context.local;
    let mut registers: BTreeMap<u32, Option<Vec<u8>>> = BTreeMap::new();
    let mut open = false;
    for expr in rule {
        match expr {
            Expr::Payload {
                dreg,
                base,
                offset,
                len,
            } => {
                registers.insert(*dreg, load(flow, *base, *offset, *len));
            }
            Expr::MetaLoad { key, dreg } => {
                let value = (*key == META_L4PROTO).then(|| vec![flow.protocol.number()]);
                registers.insert(*dreg, value);
            }
            Expr::FibAddressType { dreg, source } => {
                let address = if *source {
                    flow.source
                } else {
                    Some(flow.destination.ip())
                };
                // RTN_LOCAL (2) or RTN_UNICAST (1), in host order.
                let kind = address.map(|a| if local(a) { 2u32 } else { 1 });
                registers.insert(*dreg, kind.map(|k| k.to_ne_bytes().to_vec()));
            }
            Expr::Ct { dreg, .. } => {
                registers.insert(*dreg, None);
            }
            Expr::Bitwise {
                sreg,
                dreg,
                mask,
                xor,
                ..
            } => {
                let value = registers.get(sreg).cloned().flatten().map(|value| {
                    value
                        .iter()
                        .zip(mask.iter().zip(xor))
                        .map(|(v, (m, x))| (v & m) ^ x)
                        .collect()
                });
                registers.insert(*dreg, value);
            }
            Expr::Cmp { sreg, op, data } => match registers.get(sreg).cloned().flatten() {
                Some(value) => {
                    if !compare(&value, *op, data)? {
                        return Some(false);
                    }
                }
                None => open = true,
            },
            Expr::Lookup {
                sreg,
                dreg: None,
                set,
                inverted,
            } => {
                let value = registers.get(sreg).cloned().flatten();
                match value.and_then(|value| (context.member)(&set.name, &value)) {
                    Some(member) if member == *inverted => return Some(false),
                    Some(_) => {}
                    None => open = true,
                }
            }
            Expr::Range { .. } => open = true,
            // The rule's statements start: its matches are all seen.
            _ => break,
        }
    }
    (!open).then_some(true)
}

/// Bytes `offset..offset + len` of the packet's network or transport header, as far as the
/// flow tells them: the addresses, and the destination port.
fn load(flow: &Flow, base: u32, offset: u32, len: u32) -> Option<Vec<u8>> {
    let (offset, len) = (offset as usize, len as usize);
    let field = |start: usize, bytes: Option<Vec<u8>>| {
        let end = start + bytes.as_ref()?.len();
        (offset >= start && offset + len <= end)
            .then(|| bytes.map(|b| b[offset - start..offset - start + len].to_vec()))
            .flatten()
    };
    let (source_at, destination_at) = if flow.destination.is_ipv4() {
        (12, 16)
    } else {
        (8, 24)
    };
    match base {
        BASE_NETWORK => field(source_at, flow.source.map(octets))
            .or_else(|| field(destination_at, Some(octets(flow.destination.ip())))),
        BASE_TRANSPORT => field(2, Some(flow.destination.port().to_be_bytes().to_vec())),
        _ => None,
    }
}

/// `value op data`, bytes compared in order (network order); `None` for an operator this
/// reader does not know.
fn compare(value: &[u8], op: u32, data: &[u8]) -> Option<bool> {
    let value = value.get(..data.len())?;
    Some(match op {
        CMP_EQ => value == data,
        CMP_NEQ => value != data,
        CMP_LTE => value <= data,
        CMP_GT => value > data,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::nf_tables::wire::REG_1;

    fn flow(from: Option<&str>) -> Flow {
        Flow::parse("10.96.0.10:80/tcp", from).unwrap()
    }

    /// `ip daddr 10.96.0.10 ip saddr != 10.244.0.0/16`: the local detector's masquerade match.
    fn not_from_pods() -> Vec<Expr> {
        vec![
            Expr::Payload {
                dreg: REG_1,
                base: BASE_NETWORK,
                offset: 16,
                len: 4,
            },
            Expr::Cmp {
                sreg: REG_1,
                op: CMP_EQ,
                data: vec![10, 96, 0, 10],
            },
            Expr::Payload {
                dreg: REG_1,
                base: BASE_NETWORK,
                offset: 12,
                len: 2,
            },
            Expr::Cmp {
                sreg: REG_1,
                op: CMP_NEQ,
                data: vec![10, 244],
            },
            Expr::MetaSet {
                key: 3,
                sreg: REG_1,
            },
        ]
    }

    fn context<'a>(local: &'a dyn Fn(IpAddr) -> bool) -> Context<'a> {
        Context {
            local,
            member: &|_, _| None,
        }
    }

    #[test]
    fn matches_hold_or_not_or_stay_open() {
        let never = |_| false;
        let never = &context(&never);
        assert_eq!(
            evaluate(&not_from_pods(), &flow(Some("192.168.1.1")), never),
            Some(true)
        );
        assert_eq!(
            evaluate(&not_from_pods(), &flow(Some("10.244.1.5")), never),
            Some(false)
        );
        assert_eq!(evaluate(&not_from_pods(), &flow(None), never), None);
        let from_node = [
            Expr::FibAddressType {
                dreg: REG_1,
                source: true,
            },
            Expr::Cmp {
                sreg: REG_1,
                op: CMP_EQ,
                data: 2u32.to_ne_bytes().to_vec(),
            },
        ];
        let node = |a: IpAddr| a == "192.168.0.2".parse::<IpAddr>().unwrap();
        let node = &context(&node);
        assert_eq!(
            evaluate(&from_node, &flow(Some("192.168.0.2")), node),
            Some(true)
        );
        assert_eq!(
            evaluate(&from_node, &flow(Some("192.168.0.3")), node),
            Some(false)
        );
    }
}
