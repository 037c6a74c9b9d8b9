//! The hooks a packet meets on a node, and the base chains at each. Arriving: prerouting, then
//! input if its (DNAT'd) destination is the node's, else forward and postrouting. Sent by the
//! node: output and postrouting; to one of the node's own addresses it then comes back in over
//! the loopback, through prerouting's and input's filter chains (NAT for the connection was
//! decided on the way out). NAT chains see only the first packet of a connection, which is the
//! packet traced, until one of them translates it.

use std::net::IpAddr;

use super::evaluate::{Exit, Host, State, chain};
use super::ruleset::{Hook, Ruleset, Table};
use super::{Fate, Packet, Path, TraceError};
use crate::sys::netlink::{NFPROTO_IPV4, NFPROTO_IPV6};

const PREROUTING: u32 = 0;
const INPUT: u32 = 1;
const FORWARD: u32 = 2;
const OUTPUT: u32 = 3;
const POSTROUTING: u32 = 4;
/// NFPROTO_INET: a table of both families.
const NFPROTO_INET: u8 = 1;

fn hook_name(number: u32) -> &'static str {
    match number {
        PREROUTING => "prerouting",
        INPUT => "input",
        FORWARD => "forward",
        OUTPUT => "output",
        POSTROUTING => "postrouting",
        _ => "hook",
    }
}

/// A packet between hooks: its state, whether NAT of its destination has been decided, and
/// whether it came back in over the loopback (NAT was decided on the way out).
struct Flow {
    state: State,
    destination_decided: bool,
    looped: bool,
}

/// Every way `packet`, the first of its connection, goes through `ruleset` on a node whose
/// addresses are `local` (loopback addresses are always the node's).
pub fn trace(
    ruleset: &Ruleset,
    local: &[IpAddr],
    packet: &Packet,
) -> Result<Vec<Path>, TraceError> {
    trace_packet(ruleset, local, packet, 1)
}

/// [`trace`], as if the connection had seen `packets` packets with this one (`ct packets`): a
/// long flow's packets meet what a first one does not, such as an offload past a threshold.
/// Everything else is the first packet's: it is still a new connection (`ct state new`), and its
/// NAT is decided here.
pub fn trace_packet(
    ruleset: &Ruleset,
    local: &[IpAddr],
    packet: &Packet,
    packets: u64,
) -> Result<Vec<Path>, TraceError> {
    let is_local = |address: IpAddr| address.is_loopback() || local.contains(&address);
    let host = Host { local: &is_local };
    let family = if packet.dst.is_ipv4() {
        NFPROTO_IPV4
    } else {
        NFPROTO_IPV6
    };
    let tables: Vec<&Table> = ruleset
        .tables
        .iter()
        .filter(|((f, _), _)| *f == family || *f == NFPROTO_INET)
        .map(|(_, table)| table)
        .collect();
    let tracer = Tracer {
        tables,
        host: &host,
    };
    let mut ended = Vec::new();
    let start = vec![Flow {
        state: State::new(packet.clone(), packets),
        destination_decided: false,
        looped: false,
    }];
    let delivered = if packet.from_node {
        let out = tracer.hook(OUTPUT, start, &mut ended)?;
        let out = tracer.hook(POSTROUTING, out, &mut ended)?;
        let (mut back, away): (Vec<_>, Vec<_>) =
            out.into_iter().partition(|f| is_local(f.state.packet.dst));
        back.iter_mut().for_each(|f| f.looped = true);
        let back = tracer.hook(PREROUTING, back, &mut ended)?;
        let mut delivered = tracer.hook(INPUT, back, &mut ended)?;
        delivered.extend(away);
        delivered
    } else {
        let routed = tracer.hook(PREROUTING, start, &mut ended)?;
        let (local_in, forwarded): (Vec<_>, Vec<_>) = routed
            .into_iter()
            .partition(|f| is_local(f.state.packet.dst));
        let mut delivered = tracer.hook(INPUT, local_in, &mut ended)?;
        let forwarded = tracer.hook(FORWARD, forwarded, &mut ended)?;
        delivered.extend(tracer.hook(POSTROUTING, forwarded, &mut ended)?);
        delivered
    };
    ended.extend(delivered.into_iter().map(|f| path(f.state, Fate::Accepted)));
    Ok(ended)
}

fn path(state: State, fate: Fate) -> Path {
    Path {
        weight: state.weight,
        fate,
        dnat: state.dnat,
        masquerade: state.masquerade,
        chains: state.chains,
        offload: state.offload,
    }
}

struct Tracer<'a> {
    tables: Vec<&'a Table>,
    host: &'a Host<'a>,
}

impl Tracer<'_> {
    /// The base chains at hook `number`, in the order the kernel runs them: by priority, but
    /// the NAT chains all at the NAT core's priority (destination NAT -100, source NAT 100),
    /// among themselves by their own.
    fn chains(&self, number: u32) -> Vec<(&Table, &str, &Hook)> {
        let mut chains: Vec<_> = self
            .tables
            .iter()
            .flat_map(|table| {
                table.chains.iter().filter_map(move |(name, chain)| {
                    let hook = chain.hook.as_ref().filter(|h| h.number == number)?;
                    Some((*table, name.as_str(), hook))
                })
            })
            .collect();
        let nat_core = if matches!(number, PREROUTING | OUTPUT) {
            -100
        } else {
            100
        };
        chains.sort_by_key(|(_, _, hook)| match hook.kind.as_str() {
            "nat" => (nat_core, 1, hook.priority),
            _ => (hook.priority, 0, 0),
        });
        chains
    }

    /// Runs `flows` through hook `number`: the flows that pass it; the others end in `ended`.
    fn hook(
        &self,
        number: u32,
        flows: Vec<Flow>,
        ended: &mut Vec<Path>,
    ) -> Result<Vec<Flow>, TraceError> {
        let mut live = flows;
        for (table, name, hook) in self.chains(number) {
            let nat = hook.kind == "nat";
            let mut next = Vec::new();
            for mut flow in live {
                let skipped = nat
                    && (flow.looped
                        || match number {
                            PREROUTING | OUTPUT => flow.destination_decided,
                            // Source NAT: only masquerading here, decided once.
                            _ => flow.state.masquerade,
                        });
                if skipped {
                    next.push(flow);
                    continue;
                }
                flow.state
                    .chains
                    .push(format!("{}:{name}", hook_name(number)));
                flow.state.hook = Some((number, nat));
                let (decided, looped) = (flow.destination_decided, flow.looped);
                for (state, exit) in chain(table, name, flow.state, self.host, 0)? {
                    let fate = match exit {
                        Exit::Accept => None,
                        Exit::Fallthrough if hook.accepts => None,
                        Exit::Fallthrough | Exit::Drop => Some(Fate::Dropped),
                        Exit::Reject => Some(Fate::Rejected),
                    };
                    match fate {
                        Some(fate) => ended.push(path(state, fate)),
                        None => next.push(Flow {
                            destination_decided: decided || (nat && state.dnat.is_some()),
                            looped,
                            state,
                        }),
                    }
                }
            }
            live = next;
        }
        if matches!(number, PREROUTING | OUTPUT) {
            live.iter_mut().for_each(|f| f.destination_decided = true);
        }
        Ok(live)
    }
}
