//! Whether a rule's matches hold for the flow asked about, on a packet made of what the flow
//! says: addresses and their masks, the protocol, the destination port, whether an address is
//! the node's (`addrtype`), and the state of a new connection. What the flow does not say (its
//! source, when not given; an interface; a mark; a random draw; a recent list) leaves the answer
//! open. A set match asks the caller ([`PacketFacts::in_set`]): IPVS mode's rules match ipsets.

use std::net::IpAddr;

use crate::model::address::octets;
use crate::proxier::explanation::Flow;
use crate::sys::xtables::rules::{AddressMatch, MatchOptions, RuleOptions};

/// addrtype's bits for a unicast and a local address (`1 << RTN_*`).
const UNICAST: u16 = 1 << 1;
const LOCAL: u16 = 1 << 2;
/// conntrack's NEW state: explain describes the first packet of a connection.
const NEW: u16 = 8;
/// recent's `--set`: an action, which always matches.
const RECENT_SET: u8 = 2;

/// What the packet meets besides its own fields: which addresses are the node's, and which
/// ipset entries exist.
pub trait PacketFacts {
    /// Whether `address` is one of the node's.
    fn is_local(&self, address: IpAddr) -> bool;
    /// Whether the flow's parts that `flags` name (`dst,dst`) make an entry of ipset `set`;
    /// `None` when that cannot be told.
    fn in_set(&self, _set: &str, _flags: &str) -> Option<bool> {
        None
    }
}

/// The node's addresses alone (no set is asked about).
impl<F: Fn(IpAddr) -> bool> PacketFacts for F {
    fn is_local(&self, address: IpAddr) -> bool {
        self(address)
    }
}

/// `Some(true)` when every match of `rule` holds, `Some(false)` when one does not, `None` when
/// one cannot be told.
pub fn evaluate(rule: &RuleOptions, flow: &Flow, facts: &dyn PacketFacts) -> Option<bool> {
    let mut open = false;
    let mut answer = |holds: Option<bool>| match holds {
        Some(false) => false,
        None => {
            open = true;
            true
        }
        Some(true) => true,
    };
    let header = [
        rule.protocol
            .map(|(protocol, inverted)| (protocol == flow.protocol.number()) != inverted),
        rule.destination
            .as_ref()
            .map(|matched| address_holds(matched, flow.destination.ip())),
    ];
    if header.contains(&Some(false)) {
        return Some(false);
    }
    if let Some(matched) = &rule.source
        && !answer(flow.source.map(|source| address_holds(matched, source)))
    {
        return Some(false);
    }
    if rule.in_interface.is_some() || rule.out_interface.is_some() {
        answer(None);
    }
    for matched in &rule.matches {
        if !answer(match_holds(matched, flow, facts)) {
            return Some(false);
        }
    }
    (!open).then_some(true)
}

fn address_holds(matched: &AddressMatch, address: IpAddr) -> bool {
    let bytes = octets(address);
    let equal = bytes.len() == matched.address.len()
        && bytes
            .iter()
            .zip(&matched.mask)
            .zip(&matched.address)
            .all(|((b, m), a)| b & m == *a);
    equal != matched.inverted
}

fn in_range(port: u16, range: Option<([u16; 2], bool)>) -> bool {
    range.is_none_or(|([low, high], inverted)| (low..=high).contains(&port) != inverted)
}

fn match_holds(matched: &MatchOptions, flow: &Flow, facts: &dyn PacketFacts) -> Option<bool> {
    let port = flow.destination.port();
    let protocol = flow.protocol.number();
    match matched {
        MatchOptions::Comment(_) | MatchOptions::Nfacct(_) => Some(true),
        MatchOptions::Ports {
            tcp,
            source,
            destination,
        } => {
            let right_protocol = protocol == if *tcp { 6 } else { 17 };
            if !right_protocol || !in_range(port, *destination) {
                Some(false)
            } else if source.is_some() {
                None
            } else {
                Some(true)
            }
        }
        MatchOptions::Sctp {
            source,
            destination,
        } => {
            let holds = protocol == 132
                && destination.is_none_or(|[low, high]| (low..=high).contains(&port));
            if holds && source.is_some() {
                None
            } else {
                Some(holds)
            }
        }
        MatchOptions::Addrtype {
            source,
            destination,
            flags,
        } => {
            // Bits 2 and 3 limit the lookup to an interface: not the flow's to say.
            if flags & 0b1100 != 0 {
                return None;
            }
            let kind = |address: IpAddr| {
                if facts.is_local(address) {
                    LOCAL
                } else {
                    UNICAST
                }
            };
            let mut holds = true;
            if *source != 0 {
                let kind = kind(flow.source?);
                holds &= (source & kind != 0) != (flags & 1 != 0);
            }
            if *destination != 0 {
                let kind = kind(flow.destination.ip());
                holds &= (destination & kind != 0) != (flags & 2 != 0);
            }
            Some(holds)
        }
        MatchOptions::Conntrack { states, inverted } => Some((states & NEW != 0) != *inverted),
        MatchOptions::Recent { check_set, .. } if *check_set == RECENT_SET => Some(true),
        MatchOptions::Set {
            name,
            flags,
            inverted,
            ..
        } => facts.in_set(name, flags).map(|member| member != *inverted),
        MatchOptions::Physdev { is_in: None } => Some(true),
        // Whether it came in through a bridge port is not the flow's to say.
        MatchOptions::Physdev { is_in: Some(_) } => None,
        MatchOptions::Mark { .. }
        | MatchOptions::Statistic { .. }
        | MatchOptions::Recent { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::xtables::rules::read_rule;

    fn flow(to: &str, from: Option<&str>) -> Flow {
        Flow::parse(to, from).unwrap()
    }

    fn rule(spec: &str) -> RuleOptions {
        read_rule(false, spec).unwrap()
    }

    #[test]
    fn matches_hold_or_not_or_stay_open() {
        let never = |_: IpAddr| false;
        let service = rule("-d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-A");
        assert_eq!(
            evaluate(&service, &flow("10.96.0.10:80", None), &never),
            Some(true)
        );
        assert_eq!(
            evaluate(&service, &flow("10.96.0.10:81", None), &never),
            Some(false)
        );
        assert_eq!(
            evaluate(&service, &flow("10.96.0.10:80/udp", None), &never),
            Some(false)
        );
        assert_eq!(
            evaluate(&service, &flow("10.96.0.11:80", None), &never),
            Some(false)
        );

        let masquerade = rule("! -s 10.244.0.0/16 -d 10.96.0.10/32 -j KUBE-MARK-MASQ");
        let to = "10.96.0.10:80";
        assert_eq!(evaluate(&masquerade, &flow(to, None), &never), None);
        assert_eq!(
            evaluate(&masquerade, &flow(to, Some("10.244.1.5")), &never),
            Some(false)
        );
        assert_eq!(
            evaluate(&masquerade, &flow(to, Some("192.168.1.1")), &never),
            Some(true)
        );

        let node = |a: IpAddr| a == "192.168.0.2".parse::<IpAddr>().unwrap();
        let node_ports = rule("-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS");
        assert_eq!(
            evaluate(&node_ports, &flow("192.168.0.2:30080", None), &node),
            Some(true)
        );
        assert_eq!(
            evaluate(&node_ports, &flow("192.168.0.3:30080", None), &node),
            Some(false)
        );
        let from_node = rule("-m addrtype --src-type LOCAL -j KUBE-MARK-MASQ");
        assert_eq!(evaluate(&from_node, &flow(to, None), &node), None);
        assert_eq!(
            evaluate(&from_node, &flow(to, Some("192.168.0.2")), &node),
            Some(true)
        );

        let random = rule("-m statistic --mode random --probability 0.5 -j KUBE-SEP-A");
        assert_eq!(evaluate(&random, &flow(to, None), &never), None);
        let new = rule("-m conntrack --ctstate NEW -d 10.96.0.10/32 -j REJECT");
        assert_eq!(evaluate(&new, &flow(to, None), &never), Some(true));
    }
}
