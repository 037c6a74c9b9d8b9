//! Whether IPVS mode masquerades a connection. IPVS forwards it; iptables' nat KUBE-SERVICES
//! (and the KUBE-NODE-PORT and KUBE-LOAD-BALANCER chains it jumps to) mark it first, with rules
//! that match ipsets rather than each Service: a dozen rules however many Services there are,
//! read into their options (over netlink on the nft back end), their set matches tested on the
//! flow in one netlink send, then walked in order.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::super::render::{SETS, set_name};
use crate::model::IpFamily;
use crate::proxier::explanation::{ExplainError, Explanation, Flow, read_error};
use crate::proxier::xtables::evaluate::{PacketFacts, evaluate};
use crate::proxier::xtables::text::{comment_of, rule_text};
use crate::sys::ipset::IpsetLookups;
use crate::sys::ipset::SetType;
use crate::sys::ipset::netlink::Entry;
use crate::sys::nf_tables::wire::{NF_ACCEPT, NFT_RETURN};
use crate::sys::xtables::rules::{MatchOptions, Target};
use crate::sys::xtables::{Iptables, ReadRule};

/// Where the rules are, and the chain they start from.
pub(super) const NAT: &str = "nat";
pub(super) const SERVICES: &str = "KUBE-SERVICES";
const MARK_MASQ: &str = "KUBE-MARK-MASQ";
/// The chains a packet can meet: KUBE-SERVICES and those it jumps to.
const CHAINS: [&str; 3] = [SERVICES, "KUBE-NODE-PORT", "KUBE-LOAD-BALANCER"];
/// How deep jumps are followed (ours go one deep).
const MAX_DEPTH: usize = 2;

/// nat's chains by name, each rule read into its options.
type Chains = BTreeMap<&'static str, Vec<ReadRule>>;

/// What the flow is, for the rules' matches: the node's addresses, and whether the entry the
/// flow makes is in each set a rule matches (by set and flags; absent when it cannot be told).
struct Facts<'a> {
    local: &'a [IpAddr],
    members: BTreeMap<(String, String), Option<bool>>,
}

impl PacketFacts for Facts<'_> {
    fn is_local(&self, address: IpAddr) -> bool {
        self.local.contains(&address)
    }

    fn in_set(&self, set: &str, flags: &str) -> Option<bool> {
        *self.members.get(&(set.to_string(), flags.to_string()))?
    }
}

/// The set matches of `chains` with the entry the flow makes for each (those of our sets whose
/// entry the flow tells).
fn set_tests(chains: &Chains, flow: &Flow) -> BTreeMap<(String, String), Entry> {
    let family = IpFamily::of(&flow.destination.ip());
    let mut tests = BTreeMap::new();
    for rule in chains.values().flatten().flatten() {
        for matched in &rule.matches {
            let MatchOptions::Set { name, flags, .. } = matched else {
                continue;
            };
            let kind = SETS
                .iter()
                .find(|(base, _, _)| set_name(base, family) == *name)
                .map(|(_, kind, _)| *kind);
            if let Some(entry) = kind.and_then(|kind| set_entry(kind, flags, flow)) {
                tests.insert((name.clone(), flags.clone()), entry);
            }
        }
    }
    tests
}

/// The entry of a set of type `kind` that the flow's parts named by `flags` make (`dst,dst` on
/// hash:ip,port: its destination address, protocol and port), `None` when the flow does not
/// tell one (its source, when not given; a source port).
fn set_entry(kind: SetType, flags: &str, flow: &Flow) -> Option<Entry> {
    let (_, parts) = kind.as_str().split_once(':')?;
    let parts: Vec<&str> = parts.split(',').collect();
    let sides: Vec<&str> = flags.split(',').collect();
    if parts.len() != sides.len() {
        return None;
    }
    let mut entry = Entry::default();
    for (at, (part, side)) in parts.into_iter().zip(sides).enumerate() {
        match (part, side) {
            ("ip" | "net", side) => {
                let address = match side {
                    "src" => flow.source?,
                    "dst" => flow.destination.ip(),
                    _ => return None,
                };
                if at == 0 {
                    entry.address = Some(address);
                } else {
                    entry.address2 = Some(address);
                }
            }
            ("port", "dst") => {
                entry.port = Some(flow.destination.port());
                if kind != SetType::BitmapPort {
                    entry.protocol = Some(flow.protocol.number());
                }
            }
            _ => return None,
        }
    }
    Some(entry)
}

/// The masquerade rule the packet meets: where, the rule's text, and whether it surely does.
struct Marking {
    chain: String,
    rule: String,
    comment: String,
    sure: bool,
}

/// The packet through the rules: whether every step so far is sure, and the marking found.
struct Walk<'a> {
    chains: &'a Chains,
    flow: &'a Flow,
    facts: &'a dyn PacketFacts,
    ipv6: bool,
    sure: bool,
    marked: Option<Marking>,
}

/// How the packet left a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Left {
    /// Surely accepted: it leaves the table.
    Accepted,
    /// Maybe accepted (a rule whose match is open): what follows is unsure.
    MaybeAccepted,
    /// Back to the chain that jumped (or the table's end).
    Returned,
}

impl Walk<'_> {
    /// Walks `chain` and says how the packet left it.
    fn chain(&mut self, chain: &str, depth: usize) -> Left {
        let Some(rules) = self.chains.get(chain) else {
            return Left::Returned;
        };
        let mut may_accept = false;
        for rule in rules {
            let Ok(rule) = rule else {
                self.sure = false;
                continue;
            };
            let applies = evaluate(rule, self.flow, self.facts);
            if applies == Some(false) {
                continue;
            }
            let sure = self.sure && applies == Some(true);
            match &rule.target {
                // The first rule that marks it, unless a later one surely does.
                Some(Target::Jump(target, _))
                    if target == MARK_MASQ
                        && self.marked.as_ref().is_none_or(|m| !m.sure && sure) =>
                {
                    self.marked = Some(Marking {
                        chain: chain.to_string(),
                        rule: rule_text(self.ipv6, rule, true),
                        comment: comment_of(rule).unwrap_or_default().to_string(),
                        sure,
                    });
                }
                Some(Target::Jump(target, _)) if target == MARK_MASQ => {}
                Some(Target::Jump(target, _)) if depth < MAX_DEPTH => {
                    let before = self.sure;
                    self.sure = sure;
                    match self.chain(target, depth + 1) {
                        Left::Accepted => return Left::Accepted,
                        Left::MaybeAccepted => {
                            self.sure = false;
                            may_accept = true;
                        }
                        Left::Returned => self.sure = before,
                    }
                }
                Some(Target::Verdict(NFT_RETURN)) if sure => break,
                Some(Target::Verdict(NF_ACCEPT)) if sure => return Left::Accepted,
                Some(Target::Verdict(NFT_RETURN)) => self.sure = false,
                Some(Target::Verdict(NF_ACCEPT)) => {
                    self.sure = false;
                    may_accept = true;
                }
                _ => {}
            }
        }
        if may_accept {
            Left::MaybeAccepted
        } else {
            Left::Returned
        }
    }
}

/// The masquerade rule that `flow` meets in `chains`, if any.
fn marking(chains: &Chains, flow: &Flow, facts: &dyn PacketFacts) -> Option<Marking> {
    let mut walk = Walk {
        chains,
        flow,
        facts,
        ipv6: flow.destination.is_ipv6(),
        sure: true,
        marked: None,
    };
    walk.chain(SERVICES, 0);
    walk.marked
}

/// Reads nat's KUBE-SERVICES and the chains it jumps to, and says whether the flow is marked
/// for masquerade and by which rule.
pub(super) fn masquerade(
    iptables: &mut dyn Iptables,
    ipset: &mut dyn IpsetLookups,
    local: &[IpAddr],
    flow: &Flow,
    explanation: &mut Explanation,
) -> Result<(), ExplainError> {
    let family = IpFamily::of(&flow.destination.ip());
    let read = iptables
        .rule_options(family, NAT, &CHAINS)
        .map_err(read_error("iptables"))?;
    let chains: Chains = CHAINS.into_iter().zip(read).collect();
    explanation
        .reads
        .push(format!("the rules of nat's {}", CHAINS.join(", ")));
    let tests = set_tests(&chains, flow);
    let asked: Vec<(&str, Entry)> = tests
        .iter()
        .map(|((set, _), entry)| (set.as_str(), entry.clone()))
        .collect();
    let answers = ipset.test(&asked).map_err(read_error("ipset"))?;
    if !asked.is_empty() {
        explanation.reads.push(format!(
            "{} ipset entries the flow makes (one netlink send)",
            asked.len()
        ));
    }
    let facts = Facts {
        local,
        // A set that does not exist holds nothing.
        members: tests
            .into_keys()
            .zip(answers)
            .map(|(key, member)| (key, Some(member.unwrap_or(false))))
            .collect(),
    };
    let marked = marking(&chains, flow, &facts);
    explanation.steps.push(match marked {
        Some(Marking {
            chain,
            rule,
            comment,
            sure,
        }) => {
            let when = match (sure, flow.source) {
                (true, _) => " (its match holds for this packet)",
                (false, None) => " when its match holds (give --from to evaluate it)",
                (false, Some(_)) => " when its match holds (the flow does not tell)",
            };
            let why = if comment.is_empty() {
                String::new()
            } else {
                format!(" {comment}:")
            };
            format!("{chain}: marked for masquerade{when}:{why} {rule}")
        }
        None => format!(
            "{SERVICES}: not marked for masquerade (no masquerade rule holds for this packet)"
        ),
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::proxier::fixtures::{NODE, Svc, ep, svc};
    use crate::proxier::ipvs::aggregate::render;
    use crate::proxier::ipvs::render::tests::{context, state};
    use crate::sys::xtables::rules::read_rule;

    fn flow(to: &str, from: Option<&str>) -> Flow {
        Flow::parse(to, from).unwrap()
    }

    /// An entry as ipset prints it.
    fn text(entry: Entry) -> String {
        let protocol = match entry.protocol {
            Some(6) => "tcp:",
            Some(17) => "udp:",
            Some(_) => "?:",
            None => "",
        };
        let parts = [
            entry.address.map(|a| a.to_string()),
            entry.port.map(|p| format!("{protocol}{p}")),
            entry.address2.map(|a| a.to_string()),
        ];
        parts.into_iter().flatten().collect::<Vec<_>>().join(",")
    }

    #[test]
    fn set_entries_are_made_of_the_parts_the_flags_name() {
        let pod = flow("10.96.0.10:80/udp", Some("10.244.1.5"));
        let entry = |kind, flags| set_entry(kind, flags, &pod).map(text);
        assert_eq!(
            entry(SetType::HashIpPort, "dst,dst").as_deref(),
            Some("10.96.0.10,udp:80")
        );
        assert_eq!(
            entry(SetType::HashIpPort, "src,dst").as_deref(),
            Some("10.244.1.5,udp:80")
        );
        assert_eq!(
            entry(SetType::HashIpPortNet, "dst,dst,src").as_deref(),
            Some("10.96.0.10,udp:80,10.244.1.5")
        );
        assert_eq!(entry(SetType::BitmapPort, "dst").as_deref(), Some("80"));
        assert_eq!(entry(SetType::HashIp, "dst").as_deref(), Some("10.96.0.10"));
        // A source port is never told; a source only with --from; the flags must fit the type.
        assert_eq!(entry(SetType::HashIpPort, "dst,src"), None);
        let no_source = flow("10.96.0.10:80", None);
        assert_eq!(set_entry(SetType::HashIpPort, "src,dst", &no_source), None);
        assert_eq!(entry(SetType::HashIpPort, "dst"), None);
        let v6 = flow("[fd00::10]:80", Some("fd00:10:244::5"));
        assert_eq!(
            set_entry(SetType::HashIpPortIp, "dst,dst,src", &v6).map(text),
            Some("fd00::10,tcp:80,fd00:10:244::5".to_string())
        );
    }

    /// The set entries that IPVS mode renders, asked as the kernel would be.
    struct Rendered {
        sets: BTreeMap<String, (SetType, BTreeSet<String>)>,
        flow: Flow,
    }

    impl PacketFacts for Rendered {
        fn is_local(&self, address: IpAddr) -> bool {
            address == "192.168.0.2".parse::<IpAddr>().unwrap()
        }

        fn in_set(&self, set: &str, flags: &str) -> Option<bool> {
            let (kind, entries) = &self.sets[set];
            let entry = set_entry(*kind, flags, &self.flow)?;
            Some(entries.contains(&text(entry)))
        }
    }

    type Sets = BTreeMap<String, (SetType, BTreeSet<String>)>;

    /// IPVS mode's nat chains and sets for `services`, its rules read as the kernel holds them.
    fn rendered(services: Vec<Svc>) -> (Chains, Sets) {
        let desired = render(&state(services), &context(IpFamily::V4));
        let nat = desired.iptables.split("COMMIT").next().unwrap();
        let mut chains = Chains::new();
        for line in nat.lines() {
            let Some((chain, rule)) = line.strip_prefix("-A ").and_then(|l| l.split_once(' '))
            else {
                continue;
            };
            if let Some(chain) = CHAINS.into_iter().find(|c| *c == chain) {
                chains
                    .entry(chain)
                    .or_default()
                    .push(read_rule(false, rule));
            }
        }
        let sets = desired
            .sets
            .into_iter()
            .map(|(spec, entries)| (spec.name.clone(), (spec.set_type, entries)))
            .collect();
        (chains, sets)
    }

    /// Where each flow is marked, by the comment of the rule that marks it; `?` when it may be.
    fn marked_by(services: Vec<Svc>, flows: &[(&str, Option<&str>)]) -> Vec<String> {
        let (chains, sets) = rendered(services);
        flows
            .iter()
            .map(|(to, from)| {
                let facts = Rendered {
                    sets: sets.clone(),
                    flow: flow(to, *from),
                };
                match marking(&chains, &facts.flow, &facts) {
                    Some(m) => format!("{}{}", if m.sure { "" } else { "? " }, m.comment),
                    None => "-".into(),
                }
            })
            .collect()
    }

    #[test]
    fn the_rules_ipvs_mode_writes_mark_what_upstream_masquerades() {
        let services = vec![
            svc("default", "web", "10.96.0.10", |s| {
                s.node_port = Some(30080);
                s.external_ips = vec!["203.0.113.7".parse().unwrap()];
            })
            .with_endpoints(vec![ep("10.244.2.5", 8080, "node-b")]),
            svc("default", "local", "10.96.0.11", |s| {
                s.node_port = Some(30081);
                s.external_policy_local = true;
                s.load_balancer_ips = vec!["192.168.200.1".parse().unwrap()];
            })
            .with_endpoints(vec![ep("10.244.1.5", 8080, NODE)]),
        ];
        let cluster_ip = "Kubernetes service cluster ip + port for masquerade purpose";
        let node_port = "Kubernetes nodeport TCP port for masquerade purpose";
        let external = "Kubernetes service external ip + port for masquerade and filter purpose";
        let flows = [
            // A pod's connection to a ClusterIP is not masqueraded; one from outside the
            // cluster CIDR is; without --from, it may be.
            ("10.96.0.10:80", Some("10.244.1.5")),
            ("10.96.0.10:80", Some("192.168.1.1")),
            ("10.96.0.10:80", None),
            // A NodePort under the Cluster policy is masqueraded, under Local it is not.
            ("192.168.0.2:30080", Some("192.168.1.1")),
            ("192.168.0.2:30081", Some("192.168.1.1")),
            // An external IP under the Cluster policy is.
            ("203.0.113.7:80", Some("192.168.1.1")),
            // The node's loopback addresses never are.
            ("10.96.0.10:80", Some("127.0.0.1")),
            // A load-balancer IP under the Local policy is not.
            ("192.168.200.1:80", Some("192.168.1.1")),
        ];
        assert_eq!(
            marked_by(services, &flows),
            [
                "-".to_string(),
                cluster_ip.into(),
                format!("? {cluster_ip}"),
                node_port.into(),
                "-".into(),
                external.into(),
                "-".into(),
                "-".into(),
            ]
        );
    }

    #[test]
    fn a_marking_rule_is_shown_as_saved_without_its_comment() {
        let rule = read_rule(
            false,
            "-m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ",
        )
        .unwrap();
        assert_eq!(
            rule_text(false, &rule, true),
            "! -s 10.244.0.0/16 -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ"
        );
        assert_eq!(
            comment_of(&rule),
            Some("Kubernetes service cluster ip + port for masquerade purpose")
        );
    }

    /// Facts of a flow that meets no set.
    struct NoSets;

    impl PacketFacts for NoSets {
        fn is_local(&self, _: IpAddr) -> bool {
            false
        }
    }

    #[test]
    fn an_accept_that_may_happen_in_a_jumped_chain_leaves_the_rest_unsure() {
        let mut chains = Chains::new();
        chains.insert(
            SERVICES,
            vec![
                read_rule(false, "-j KUBE-NODE-PORT"),
                read_rule(false, "-j KUBE-MARK-MASQ"),
            ],
        );
        chains.insert(
            "KUBE-NODE-PORT",
            vec![read_rule(false, "-s 10.0.0.0/8 -j ACCEPT")],
        );
        let marked = |from: Option<&str>| {
            marking(&chains, &flow("10.96.0.10:80", from), &NoSets).map(|m| m.sure)
        };
        assert_eq!(marked(None), Some(false), "accepted or marked: unsure");
        assert_eq!(marked(Some("10.1.1.1")), None, "accepted before the mark");
        assert_eq!(marked(Some("192.168.1.1")), Some(true));
    }
}
