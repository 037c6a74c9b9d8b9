//! A packet tracer over nf_tables rulesets, the test oracle for nftables mode: it takes the
//! first packet of a new connection through the hooks a packet meets on a node, in each hook
//! through the base chains of every table in priority order, and evaluates the expressions as
//! the kernel does (registers, payload and meta loads, comparisons, bitwise operations, set
//! and map lookups over hashes, intervals and concatenations, verdict maps, jumps and gotos,
//! DNAT, masquerade, reject). A random draw (`numgen`) is followed into every share of the map
//! it is looked up in, each path weighted by its share, so a trace gives each endpoint's
//! probability. It reads nothing the nftables proxier writes but the ruleset itself: the
//! compiled expressions are its only input.

mod evaluate;
mod hooks;
mod lookup;
mod ruleset;

use std::net::{IpAddr, SocketAddr};

pub use hooks::{trace, trace_packet};
pub use ruleset::{Chain, Element, Hook, Ruleset, Set, Table};

use crate::model::Protocol;
use crate::sys::netlink::NetlinkError;

/// The first packet of a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub dport: u16,
    pub protocol: Protocol,
    /// Sent by a process on the node (output hook) rather than arriving (prerouting).
    pub from_node: bool,
}

/// What finally becomes of a packet on one path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fate {
    /// Delivered, to the node or forwarded.
    Accepted,
    Dropped,
    Rejected,
}

/// One way through the ruleset.
#[derive(Clone, Debug, PartialEq)]
pub struct Path {
    /// The probability of this path (the product of the shares of its draws).
    pub weight: f64,
    pub fate: Fate,
    /// The destination DNAT chose.
    pub dnat: Option<SocketAddr>,
    /// Masqueraded on the way out.
    pub masquerade: bool,
    /// The chains it went through, in order, as `hook:chain`.
    pub chains: Vec<String>,
    /// The flowtable the connection was given to (`flow add`): its later packets take the
    /// kernel's fast path.
    pub offload: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("reading the ruleset")]
    Read(#[from] NetlinkError),
    #[error("a message the tracer cannot read: {0}")]
    Malformed(String),
    #[error("{kind} {name} does not exist")]
    Missing { kind: &'static str, name: String },
    #[error("the tracer does not model {0}")]
    Unsupported(String),
    #[error("more than {0} chains deep: a jump loop")]
    TooDeep(usize),
}

#[cfg(test)]
mod tests;
