//! What our rules and elements say, read: a random pick and its map, an endpoint chain's
//! DNAT, a rule's verdict and conditions, the names and texts our table uses.

use crate::model::{Protocol, ServicePortName};
use std::net::{IpAddr, SocketAddr};

use crate::proxier::explanation::{Candidate, Outcome};
use crate::sys::nf_tables::expr::{Data, Expr};
use crate::sys::nf_tables::wire::{NFT_GOTO, NFT_JUMP, REG_VERDICT};

/// A rule that picks at random: a numgen draw looked up in a map.
pub(super) struct RandomPick {
    pub(super) set: String,
    pub(super) kind: PickKind,
    pub(super) modulus: u32,
    pub(super) offset: u32,
}

pub(super) enum PickKind {
    /// A policy chain's slot in a named endpoint map (intervals of draws).
    Slot,
    /// An anonymous map of endpoints (more than a slot holds, or a slot another chain holds).
    Endpoints,
    /// An anonymous verdict map of endpoint chains (session affinity).
    Chains,
}

pub(super) fn random_pick(rule: &[Expr]) -> Option<RandomPick> {
    let (modulus, offset) = rule.iter().find_map(|e| match e {
        Expr::Numgen {
            modulus, offset, ..
        } => Some((*modulus, *offset)),
        _ => None,
    })?;
    let (set, verdicts) = rule.iter().find_map(|e| match e {
        Expr::Lookup { set, dreg, .. } => Some((set.name.clone(), *dreg == Some(REG_VERDICT))),
        _ => None,
    })?;
    let kind = match (set.starts_with("__"), verdicts) {
        (_, true) => PickKind::Chains,
        (true, false) => PickKind::Endpoints,
        (false, false) => PickKind::Slot,
    };
    Some(RandomPick {
        set,
        kind,
        modulus,
        offset,
    })
}

/// An endpoint chain's DNAT target: the address and port it loads before its `dnat`.
pub(super) fn dnat_target(rule: &[Expr]) -> Option<SocketAddr> {
    if !rule
        .iter()
        .any(|e| matches!(e, Expr::DnatRange { .. } | Expr::Dnat { .. }))
    {
        return None;
    }
    let mut values = rule.iter().filter_map(|e| match e {
        Expr::Immediate {
            data: Data::Value(bytes),
            ..
        } => Some(bytes.as_slice()),
        _ => None,
    });
    let (address, port) = (values.next()?, values.next()?);
    let address: IpAddr = match address.len() {
        4 => <[u8; 4]>::try_from(address).ok()?.into(),
        16 => <[u8; 16]>::try_from(address).ok()?.into(),
        _ => return None,
    };
    let port = u16::from_be_bytes(port.get(..2)?.try_into().ok()?);
    Some(SocketAddr::new(address, port))
}

/// Each of `endpoints` with an equal chance.
pub(super) fn evenly(endpoints: Vec<SocketAddr>) -> Outcome {
    if endpoints.is_empty() {
        return Outcome::Untouched {
            reason: "the random pick names no endpoint this reader can read".into(),
        };
    }
    let probability = 1.0 / endpoints.len() as f64;
    Outcome::Dnat {
        candidates: endpoints
            .into_iter()
            .map(|endpoint| Candidate {
                endpoint,
                probability,
            })
            .collect(),
    }
}

/// The rule's verdict with a chain: (code, chain).
pub(super) fn verdict_of(rule: &[Expr]) -> Option<(i32, String)> {
    match rule.last()? {
        Expr::Immediate {
            data: Data::Verdict(verdict),
            ..
        } if verdict.code == NFT_GOTO || verdict.code == NFT_JUMP => {
            Some((verdict.code, verdict.chain.clone()?))
        }
        _ => None,
    }
}

/// Whether the rule matches only some packets (it compares or looks something up before its
/// verdict).
pub(super) fn is_conditional(rule: &[Expr]) -> bool {
    rule.iter().any(|e| {
        matches!(
            e,
            Expr::Cmp { .. } | Expr::Lookup { dreg: None, .. } | Expr::Range { .. }
        )
    })
}

/// What the rule's match says, in words, for the kinds our rules use.
pub(super) fn condition_text(rule: &[Expr]) -> String {
    if rule
        .iter()
        .any(|e| matches!(e, Expr::FibAddressType { source: true, .. }))
    {
        " when it comes from this node".into()
    } else if rule.iter().any(|e| {
        matches!(
            e,
            Expr::Lookup {
                dreg: None,
                inverted: true,
                ..
            }
        )
    }) {
        " when its source is not in the allowed ranges".into()
    } else if is_conditional(rule) {
        " when it matches the rule's source or destination match (give --from to evaluate it)"
            .into()
    } else {
        String::new()
    }
}

/// `ns/svc:port` from a chain name `PREFIX-HASH-ns/svc/proto/port`.
pub(super) fn service_of_chain(chain: &str, protocol: Protocol) -> Option<ServicePortName> {
    let base = chain.splitn(3, '-').nth(2)?;
    let mut parts = base.split('/');
    let (namespace, name, _proto, port) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    Some(ServicePortName::new(namespace, name, port, protocol))
}

/// The `ns/svc:port` a no-endpoint element's comment names.
pub(super) fn comment_of(rest: &str) -> Option<&str> {
    rest.split_once("comment \"")?
        .1
        .split_once('"')
        .map(|(c, _)| c)
}

/// `FIRST-LAST` of a draws map's element.
pub(super) fn draw_range(range: &str) -> Option<(u64, u64)> {
    let (first, last) = range.split_once('-')?;
    Some((first.parse().ok()?, last.parse().ok()?))
}

/// ` : ADDRESS . PORT` of a draws map's element.
pub(super) fn destination(data: &str) -> Option<SocketAddr> {
    let (address, port) = data.trim_start_matches(" : ").split_once(" . ")?;
    Some(SocketAddr::new(address.parse().ok()?, port.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::nf_tables::wire::REG_VERDICT;

    #[test]
    fn random_picks_are_told_apart_by_their_map() {
        use crate::sys::nf_tables::expr::SetRef;
        let pick = |set: &str, dreg| {
            let rule = [
                Expr::Numgen {
                    dreg: 1,
                    modulus: 3,
                    offset: 0,
                },
                Expr::Lookup {
                    sreg: 1,
                    dreg: Some(dreg),
                    set: SetRef {
                        name: set.into(),
                        id: None,
                    },
                    inverted: false,
                },
            ];
            random_pick(&rule).map(|pick| pick.kind)
        };
        assert!(matches!(pick("endpoints-tcp-3", 1), Some(PickKind::Slot)));
        assert!(matches!(pick("__mapABC", 1), Some(PickKind::Endpoints)));
        assert!(matches!(
            pick("__mapABC", REG_VERDICT),
            Some(PickKind::Chains)
        ));
        assert!(random_pick(&[]).is_none());
    }

    #[test]
    fn an_endpoint_chains_dnat_names_its_endpoint() {
        let rule = [
            Expr::Immediate {
                dreg: 1,
                data: Data::Value(vec![10, 244, 1, 11]),
            },
            Expr::Immediate {
                dreg: 2,
                data: Data::Value(8080u16.to_be_bytes().to_vec()),
            },
            Expr::DnatRange {
                family: 2,
                addr: 1,
                port: 2,
            },
        ];
        assert_eq!(
            dnat_target(&rule),
            Some("10.244.1.11:8080".parse().unwrap())
        );
        assert_eq!(dnat_target(&rule[..2]), None);
        let Outcome::Dnat { candidates } = evenly(vec!["10.0.0.1:1".parse().unwrap(); 4]) else {
            panic!("a DNAT");
        };
        assert_eq!(candidates[0].probability, 0.25);
    }

    #[test]
    fn names_and_texts_read_as_written() {
        assert_eq!(
            service_of_chain("service-ULMVA6XW-ns1/svc1/tcp/p80", Protocol::Tcp),
            Some(ServicePortName::new("ns1", "svc1", "p80", Protocol::Tcp))
        );
        assert_eq!(service_of_chain("services", Protocol::Tcp), None);
        assert_eq!(
            comment_of(" comment \"ns/svc:http\" : drop"),
            Some("ns/svc:http")
        );
        assert_eq!(
            draw_range("2140094464-2140099924"),
            Some((2_140_094_464, 2_140_099_924))
        );
        assert_eq!(
            destination(" : 10.244.1.11 . 8080"),
            Some("10.244.1.11:8080".parse().unwrap())
        );
        assert_eq!(
            destination(" : fd00::1 . 80"),
            Some("[fd00::1]:80".parse().unwrap())
        );
    }
}
