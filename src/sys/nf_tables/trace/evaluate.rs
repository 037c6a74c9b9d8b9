//! Rules and chains evaluated on one packet's state, as nft_do_chain does: each rule's
//! expressions in order until one breaks (no match) or sets a verdict; a chain's rules in order
//! until a verdict ends it. A lookup of a random draw forks the state, one fork per share.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::lookup::{Draw, lookup};
use super::ruleset::Table;
use super::{Packet, TraceError};
use crate::sys::nf_tables::expr::{Data, Expr, Verdict};
use crate::sys::nf_tables::wire::{
    BASE_NETWORK, BASE_TRANSPORT, CMP_EQ, CMP_GT, CMP_LTE, CMP_NEQ, CT_DST_IP, CT_DST_IP6,
    CT_PACKETS, CT_STATE, CT_STATUS, META_L4PROTO, META_MARK, NF_ACCEPT, NF_DROP, NFT_GOTO,
    NFT_JUMP, NFT_RETURN, REG_VERDICT,
};

/// NFT_CONTINUE; NFT_BREAK never reaches a register (a failed match stops the rule).
const NFT_CONTINUE: i32 = -1;
/// The comparison operators the wire module does not name.
const CMP_LT: u32 = 2;
const CMP_GTE: u32 = 5;
/// meta nfproto; ct state new; ct status dnat; fib's RTN_UNICAST and RTN_LOCAL.
const META_NFPROTO: u32 = 15;
const CT_STATE_NEW: u32 = 8;
const CT_STATUS_DST_NAT: u32 = 0x20;
const RTN_UNICAST: u32 = 1;
const RTN_LOCAL: u32 = 2;
/// How deep jumps may nest (the kernel allows 16 levels; ours use three).
pub const MAX_DEPTH: usize = 16;

/// One packet's state on one path.
#[derive(Clone, Debug)]
pub struct State {
    pub packet: Packet,
    /// The destination the connection was opened to (`ct original ip daddr`), DNAT aside.
    pub original_dst: IpAddr,
    /// The packets the connection has seen, this one included (`ct packets`).
    pub packets: u64,
    /// The flowtable a `flow add` gave the connection to.
    pub offload: Option<String>,
    pub mark: u32,
    pub weight: f64,
    pub dnat: Option<SocketAddr>,
    pub masquerade: bool,
    pub chains: Vec<String>,
    /// The hook of the base chain being run, and whether that chain is a NAT chain: the
    /// kernel takes NAT expressions in NAT chains of their hooks only.
    pub hook: Option<(u32, bool)>,
    /// The data registers, bytes 0..64 (NFT_REG_1..4 and NFT_REG32_00..15 alias them).
    pub(super) registers: [u8; 64],
    /// A register (by 32-bit index) that holds a draw rather than bytes.
    pub(super) draws: [Option<Draw>; 16],
}

impl State {
    pub fn new(packet: Packet, packets: u64) -> Self {
        State {
            original_dst: packet.dst,
            packets,
            offload: None,
            packet,
            mark: 0,
            weight: 1.0,
            dnat: None,
            masquerade: false,
            chains: Vec::new(),
            hook: None,
            registers: [0; 64],
            draws: [None; 16],
        }
    }
}

/// How a chain was left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Fell off its end or returned: the caller goes on (a base chain's policy applies).
    Fallthrough,
    Accept,
    Drop,
    Reject,
}

/// How a rule ended.
pub(super) enum RuleEnd {
    /// A match failed.
    Break,
    /// Every expression ran, no verdict.
    Next,
    Verdict(Verdict),
    Reject,
}

/// Bytes `register` starts at.
pub(super) fn offset(register: u32) -> Result<usize, TraceError> {
    match register {
        1..=4 => Ok((register as usize - 1) * 16),
        8..=23 => Ok((register as usize - 8) * 4),
        other => Err(TraceError::Unsupported(format!("register {other}"))),
    }
}

pub(super) fn bytes(state: &State, register: u32, len: usize) -> Result<&[u8], TraceError> {
    let start = offset(register)?;
    if state.draws[start / 4..(start + len).div_ceil(4)]
        .iter()
        .any(Option::is_some)
    {
        return Err(TraceError::Unsupported(
            "a random draw used other than as a lookup's key".into(),
        ));
    }
    state
        .registers
        .get(start..start + len)
        .ok_or_else(|| TraceError::Unsupported(format!("{len} bytes from register {register}")))
}

/// Stores `value` at `register`, zeroing the rest of its last 32-bit word, as the kernel does.
pub(super) fn store(state: &mut State, register: u32, value: &[u8]) -> Result<(), TraceError> {
    let start = offset(register)?;
    let end = start + value.len().div_ceil(4) * 4;
    let slot = state
        .registers
        .get_mut(start..end)
        .ok_or_else(|| TraceError::Unsupported(format!("storing at register {register}")))?;
    slot.fill(0);
    slot[..value.len()].copy_from_slice(value);
    state.draws[start / 4..end / 4].fill(None);
    Ok(())
}

/// The packet's network header and the start of its transport header.
fn headers(packet: &Packet) -> (Vec<u8>, [u8; 8]) {
    let protocol = packet.protocol.number();
    let network = match (packet.src, packet.dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            let mut header = vec![0u8; 20];
            header[0] = 0x45;
            header[9] = protocol;
            header[12..16].copy_from_slice(&src.octets());
            header[16..20].copy_from_slice(&dst.octets());
            header
        }
        (src, dst) => {
            let mut header = vec![0u8; 40];
            header[0] = 0x60;
            header[6] = protocol;
            header[8..24].copy_from_slice(&v6(src).octets());
            header[24..40].copy_from_slice(&v6(dst).octets());
            header
        }
    };
    let mut transport = [0u8; 8];
    transport[..2].copy_from_slice(&packet.sport.to_be_bytes());
    transport[2..4].copy_from_slice(&packet.dport.to_be_bytes());
    (network, transport)
}

fn v6(address: IpAddr) -> Ipv6Addr {
    match address {
        IpAddr::V6(a) => a,
        IpAddr::V4(a) => a.to_ipv6_mapped(),
    }
}

/// What a rule needs besides the packet.
pub struct Host<'a> {
    pub local: &'a dyn Fn(IpAddr) -> bool,
}

/// Runs `chain` of `table` on `state`: every way out of it.
pub fn chain(
    table: &Table,
    name: &str,
    state: State,
    host: &Host<'_>,
    depth: usize,
) -> Result<Vec<(State, Exit)>, TraceError> {
    if depth > MAX_DEPTH {
        return Err(TraceError::TooDeep(MAX_DEPTH));
    }
    let rules = &table
        .chains
        .get(name)
        .ok_or_else(|| TraceError::Missing {
            kind: "chain",
            name: name.to_string(),
        })?
        .rules;
    let mut live = vec![state];
    let mut out = Vec::new();
    for (index, rule) in rules.iter().enumerate() {
        let mut next = Vec::new();
        for mut current in live {
            current.chains.push(format!("{name}#{index}"));
            for (state, end) in expressions(table, rule, current, host)? {
                match end {
                    RuleEnd::Break | RuleEnd::Next => next.push(state),
                    RuleEnd::Reject => out.push((state, Exit::Reject)),
                    RuleEnd::Verdict(verdict) => {
                        verdict_of(table, &verdict, state, host, depth, &mut next, &mut out)?
                    }
                }
            }
        }
        live = next;
    }
    out.extend(live.into_iter().map(|s| (s, Exit::Fallthrough)));
    Ok(out)
}

fn verdict_of(
    table: &Table,
    verdict: &Verdict,
    state: State,
    host: &Host<'_>,
    depth: usize,
    next: &mut Vec<State>,
    out: &mut Vec<(State, Exit)>,
) -> Result<(), TraceError> {
    match (verdict.code, verdict.chain.as_deref()) {
        (NF_ACCEPT, _) => out.push((state, Exit::Accept)),
        (NF_DROP, _) => out.push((state, Exit::Drop)),
        (NFT_CONTINUE, _) => next.push(state),
        (NFT_RETURN, _) => out.push((state, Exit::Fallthrough)),
        (NFT_JUMP, Some(target)) => {
            for (state, exit) in chain(table, target, state, host, depth + 1)? {
                match exit {
                    Exit::Fallthrough => next.push(state),
                    other => out.push((state, other)),
                }
            }
        }
        (NFT_GOTO, Some(target)) => out.extend(chain(table, target, state, host, depth + 1)?),
        (code, chain) => {
            return Err(TraceError::Unsupported(format!(
                "verdict {code} to {chain:?}"
            )));
        }
    }
    Ok(())
}

/// Runs one rule's expressions from `state`: each fork and how its rule ended.
fn expressions(
    table: &Table,
    rule: &[Expr],
    state: State,
    host: &Host<'_>,
) -> Result<Vec<(State, RuleEnd)>, TraceError> {
    let mut live = vec![state];
    let mut out = Vec::new();
    for expr in rule {
        let mut next = Vec::new();
        for current in live {
            for (state, end) in expression(table, expr, current, host)? {
                match end {
                    RuleEnd::Next => next.push(state),
                    other => out.push((state, other)),
                }
            }
        }
        live = next;
    }
    out.extend(live.into_iter().map(|s| (s, RuleEnd::Next)));
    Ok(out)
}

pub(super) fn one(state: State, end: RuleEnd) -> Result<Vec<(State, RuleEnd)>, TraceError> {
    Ok(vec![(state, end)])
}

fn matched(state: State, holds: bool) -> Result<Vec<(State, RuleEnd)>, TraceError> {
    one(state, if holds { RuleEnd::Next } else { RuleEnd::Break })
}

fn expression(
    table: &Table,
    expr: &Expr,
    mut state: State,
    host: &Host<'_>,
) -> Result<Vec<(State, RuleEnd)>, TraceError> {
    let unsupported = |what: &str| Err(TraceError::Unsupported(what.to_string()));
    match expr {
        Expr::Payload {
            dreg,
            base,
            offset,
            len,
        } => {
            let (network, transport) = headers(&state.packet);
            let header: &[u8] = match *base {
                BASE_NETWORK => &network,
                BASE_TRANSPORT => &transport,
                other => return unsupported(&format!("payload base {other}")),
            };
            let (start, len) = (*offset as usize, *len as usize);
            let Some(value) = header.get(start..start + len).map(<[u8]>::to_vec) else {
                return unsupported(&format!("payload {start}+{len}"));
            };
            store(&mut state, *dreg, &value)?;
        }
        Expr::MetaLoad { key, dreg } => {
            let value = match *key {
                META_L4PROTO => vec![state.packet.protocol.number()],
                META_NFPROTO => vec![if state.packet.dst.is_ipv4() { 2 } else { 10 }],
                META_MARK => state.mark.to_ne_bytes().to_vec(),
                other => return unsupported(&format!("meta key {other}")),
            };
            store(&mut state, *dreg, &value)?;
        }
        Expr::MetaSet { key, sreg } => {
            if *key != META_MARK {
                return unsupported(&format!("setting meta key {key}"));
            }
            let value = bytes(&state, *sreg, 4)?;
            state.mark = u32::from_ne_bytes([value[0], value[1], value[2], value[3]]);
        }
        Expr::Ct { key, dreg } => {
            let value = match *key {
                CT_STATE => CT_STATE_NEW,
                CT_STATUS if state.dnat.is_some() => CT_STATUS_DST_NAT,
                CT_STATUS => 0,
                CT_PACKETS => {
                    let packets = state.packets.to_ne_bytes();
                    store(&mut state, *dreg, &packets)?;
                    return one(state, RuleEnd::Next);
                }
                other => return unsupported(&format!("ct key {other}")),
            };
            store(&mut state, *dreg, &value.to_ne_bytes())?;
        }
        Expr::CtOriginal { key, dreg } => {
            let value = match (*key, state.original_dst) {
                (CT_DST_IP, IpAddr::V4(ip)) => ip.octets().to_vec(),
                (CT_DST_IP6, IpAddr::V6(ip)) => ip.octets().to_vec(),
                (other, _) => return unsupported(&format!("ct original key {other}")),
            };
            store(&mut state, *dreg, &value)?;
        }
        Expr::HostToNetwork64 { reg } => {
            let value: [u8; 8] = bytes(&state, *reg, 8)?
                .try_into()
                .map_err(|_| TraceError::Unsupported("a short register".into()))?;
            store(&mut state, *reg, &u64::from_ne_bytes(value).to_be_bytes())?;
        }
        Expr::FlowOffload { flowtable } => {
            // The kernel takes `flow add` in the forward hook only.
            if !matches!(state.hook, Some((2, _))) {
                return unsupported("flow add outside the forward hook");
            }
            state.offload = Some(flowtable.clone());
        }
        Expr::FibAddressType { dreg, source } => fib_type(&mut state, *dreg, *source, host)?,
        Expr::Cmp { sreg, op, data } => {
            let order = bytes(&state, *sreg, data.len())?.cmp(data.as_slice());
            let holds = match *op {
                CMP_EQ => order.is_eq(),
                CMP_NEQ => order.is_ne(),
                CMP_LT => order.is_lt(),
                CMP_LTE => order.is_le(),
                CMP_GT => order.is_gt(),
                CMP_GTE => order.is_ge(),
                other => return unsupported(&format!("cmp op {other}")),
            };
            return matched(state, holds);
        }
        Expr::Bitwise {
            sreg,
            dreg,
            mask,
            xor,
            ..
        } => {
            let source = bytes(&state, *sreg, mask.len())?;
            let value: Vec<u8> = source
                .iter()
                .zip(mask.iter().zip(xor.iter()))
                .map(|(b, (m, x))| (b & m) ^ x)
                .collect();
            store(&mut state, *dreg, &value)?;
        }
        Expr::Range { sreg, op, from, to } => {
            let value = bytes(&state, *sreg, from.len())?;
            let inside = value >= from.as_slice() && value <= to.as_slice();
            return matched(state, inside == (*op == 0));
        }
        Expr::Immediate { dreg, data } => match data {
            Data::Verdict(verdict) if *dreg == REG_VERDICT => {
                return one(state, RuleEnd::Verdict(verdict.clone()));
            }
            Data::Value(value) => store(&mut state, *dreg, value)?,
            Data::Verdict(_) => return unsupported("a verdict in a data register"),
        },
        Expr::Numgen {
            dreg,
            modulus,
            offset: first,
        } => {
            if *modulus == 0 {
                return unsupported("numgen mod 0");
            }
            store(&mut state, *dreg, &first.to_ne_bytes())?;
            let index = self::offset(*dreg)? / 4;
            state.draws[index] = Some(Draw {
                first: *first,
                last: first.wrapping_add(modulus - 1),
                network_order: false,
            });
        }
        Expr::HostToNetwork32 { reg } => {
            let index = offset(*reg)? / 4;
            if let Some(draw) = state.draws[index].as_mut() {
                draw.network_order = true;
            } else {
                let value = bytes(&state, *reg, 4)?.to_vec();
                let swapped = u32::from_ne_bytes([value[0], value[1], value[2], value[3]]);
                store(&mut state, *reg, &swapped.to_be_bytes())?;
            }
        }
        Expr::Lookup {
            sreg,
            dreg,
            set,
            inverted,
        } => {
            let found = table
                .sets
                .get(&set.name)
                .ok_or_else(|| TraceError::Missing {
                    kind: "set",
                    name: set.name.clone(),
                })?;
            return lookup(found, *sreg, *dreg, *inverted, state);
        }
        Expr::Dnat { addr, port, .. } | Expr::DnatRange { addr, port, .. } => {
            // NF_INET_PRE_ROUTING and NF_INET_LOCAL_OUT.
            if !matches!(state.hook, Some((0 | 3, true))) {
                return unsupported("dnat outside a nat chain of prerouting or output");
            }
            let len = if state.packet.dst.is_ipv4() { 4 } else { 16 };
            let address = address(bytes(&state, *addr, len)?);
            let port_bytes = bytes(&state, *port, 2)?;
            let port = u16::from_be_bytes([port_bytes[0], port_bytes[1]]);
            let target = SocketAddr::new(address, port);
            state.dnat = Some(target);
            state.packet.dst = target.ip();
            state.packet.dport = port;
            return one(state, RuleEnd::Verdict(accept()));
        }
        Expr::Masq { .. } => {
            // NF_INET_POST_ROUTING.
            if state.hook != Some((4, true)) {
                return unsupported("masquerade outside a nat chain of postrouting");
            }
            state.masquerade = true;
            return one(state, RuleEnd::Verdict(accept()));
        }
        Expr::Reject { .. } => return one(state, RuleEnd::Reject),
        Expr::DynsetUpdate { .. } | Expr::Counter | Expr::ObjRef { .. } => {}
        Expr::Match { name, .. } | Expr::Target { name, .. } => {
            return unsupported(&format!("xtables extension {name}"));
        }
        Expr::Other { name, .. } => {
            return unsupported(&format!("expression {}", String::from_utf8_lossy(name)));
        }
    }
    one(state, RuleEnd::Next)
}

fn accept() -> Verdict {
    Verdict {
        code: NF_ACCEPT,
        chain: None,
    }
}

fn address(bytes: &[u8]) -> IpAddr {
    match <[u8; 4]>::try_from(bytes) {
        Ok(v4) => Ipv4Addr::from(v4).into(),
        Err(_) => {
            let mut v6 = [0u8; 16];
            v6.copy_from_slice(&bytes[..16]);
            Ipv6Addr::from(v6).into()
        }
    }
}

/// `fib saddr/daddr type`, which needs the host's addresses.
fn fib_type(state: &mut State, dreg: u32, source: bool, host: &Host<'_>) -> Result<(), TraceError> {
    let address = if source {
        state.packet.src
    } else {
        state.packet.dst
    };
    let kind = if (host.local)(address) {
        RTN_LOCAL
    } else {
        RTN_UNICAST
    };
    store(state, dreg, &kind.to_ne_bytes())
}
