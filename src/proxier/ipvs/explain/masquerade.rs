//! Whether IPVS mode masquerades a connection. IPVS forwards it; iptables' nat KUBE-SERVICES
//! (and the KUBE-NODE-PORT and KUBE-LOAD-BALANCER chains it jumps to) mark it first, with rules
//! that match ipsets rather than each Service: a dozen rules however many Services there are,
//! read as text on either back end and evaluated on the flow, each set match one `ipset test`.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::net::IpAddr;

use super::super::render::{SETS, set_name};
use crate::model::IpFamily;
use crate::proxier::explanation::{ExplainError, Explanation, Flow, read_error};
use crate::proxier::xtables::evaluate::{PacketFacts, evaluate};
use crate::sys::ipset::{SetType, SystemIpset};
use crate::sys::nf_tables::wire::{NF_ACCEPT, NFT_RETURN};
use crate::sys::xtables::rules::{MatchOptions, RuleOptions, Target, read_rule};
use crate::sys::xtables::{ChainRules, Iptables};

const SERVICES: &str = "KUBE-SERVICES";
const MARK_MASQ: &str = "KUBE-MARK-MASQ";
/// The chains a packet can meet: KUBE-SERVICES and those it jumps to.
const CHAINS: [&str; 3] = [SERVICES, "KUBE-NODE-PORT", "KUBE-LOAD-BALANCER"];
/// How deep jumps are followed (ours go one deep).
const MAX_DEPTH: usize = 2;

/// What the flow is, for the rules' matches: the node's addresses, and the ipset entries the
/// flow's parts make, each asked of the kernel once.
struct Facts<'a> {
    flow: &'a Flow,
    local: &'a [IpAddr],
    ipset: &'a SystemIpset,
    tested: RefCell<BTreeSet<String>>,
}

impl PacketFacts for Facts<'_> {
    fn is_local(&self, address: IpAddr) -> bool {
        self.local.contains(&address)
    }

    fn in_set(&self, set: &str, flags: &str) -> Option<bool> {
        let family = IpFamily::of(&self.flow.destination.ip());
        let (_, kind, _) = SETS
            .iter()
            .find(|(base, _, _)| set_name(base, family) == set)?;
        let entry = set_entry(*kind, flags, self.flow)?;
        self.tested.borrow_mut().insert(set.to_string());
        // A set that does not exist holds nothing.
        let member = self.ipset.test(set, &entry).ok()?;
        Some(member.unwrap_or(false))
    }
}

/// The entry of a set of type `kind` that the flow's parts named by `flags` make (`dst,dst` on
/// hash:ip,port: `10.96.0.10,tcp:80`), `None` when the flow does not tell one (its source,
/// when not given; a source port).
fn set_entry(kind: SetType, flags: &str, flow: &Flow) -> Option<String> {
    let (_, parts) = kind.as_str().split_once(':')?;
    let parts: Vec<&str> = parts.split(',').collect();
    let sides: Vec<&str> = flags.split(',').collect();
    if parts.len() != sides.len() {
        return None;
    }
    let port = flow.destination.port();
    let mut entry = Vec::with_capacity(parts.len());
    for (part, side) in parts.into_iter().zip(sides) {
        entry.push(match (part, side) {
            ("ip" | "net", "src") => flow.source?.to_string(),
            ("ip" | "net", "dst") => flow.destination.ip().to_string(),
            ("port", "dst") if kind == SetType::BitmapPort => port.to_string(),
            ("port", "dst") => format!("{}:{port}", flow.protocol.lower()),
            _ => return None,
        });
    }
    Some(entry.join(","))
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
    rules: &'a ChainRules,
    flow: &'a Flow,
    facts: &'a dyn PacketFacts,
    ipv6: bool,
    sure: bool,
    marked: Option<Marking>,
}

impl Walk<'_> {
    /// Walks `chain`; `true` when the packet surely leaves the table there (ACCEPT).
    fn chain(&mut self, chain: &str, depth: usize) -> bool {
        let Some(rules) = self.rules.get(chain) else {
            return false;
        };
        for text in rules {
            let Ok(rule) = read_rule(self.ipv6, text) else {
                self.sure = false;
                continue;
            };
            let applies = evaluate(&rule, self.flow, self.facts);
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
                        rule: without_comment(text),
                        comment: comment_of(&rule),
                        sure,
                    });
                }
                Some(Target::Jump(target, _)) if target == MARK_MASQ => {}
                Some(Target::Jump(target, _)) if depth < MAX_DEPTH => {
                    let before = self.sure;
                    self.sure = sure;
                    if self.chain(target, depth + 1) {
                        return true;
                    }
                    self.sure = before;
                }
                Some(Target::Verdict(NFT_RETURN)) if sure => return false,
                Some(Target::Verdict(NF_ACCEPT)) if sure => return true,
                Some(Target::Verdict(NFT_RETURN | NF_ACCEPT)) => self.sure = false,
                _ => {}
            }
        }
        false
    }
}

/// The masquerade rule that `flow` meets in `rules` (nat's chains by name), if any.
fn marking(rules: &ChainRules, flow: &Flow, facts: &dyn PacketFacts) -> Option<Marking> {
    let mut walk = Walk {
        rules,
        flow,
        facts,
        ipv6: flow.destination.is_ipv6(),
        sure: true,
        marked: None,
    };
    walk.chain(SERVICES, 0);
    walk.marked
}

fn comment_of(rule: &RuleOptions) -> String {
    rule.matches
        .iter()
        .find_map(|m| match m {
            MatchOptions::Comment(text) => Some(text.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

/// The rule's text without its `-m comment --comment "..."`: the comment is told apart.
fn without_comment(text: &str) -> String {
    let Some(start) = text.find("-m comment --comment \"") else {
        return text.to_string();
    };
    let quoted = start + "-m comment --comment \"".len();
    let Some(end) = text[quoted..].find('"') else {
        return text.to_string();
    };
    format!(
        "{}{}",
        &text[..start],
        text[quoted + end + 1..].trim_start()
    )
}

/// Reads nat's KUBE-SERVICES and the chains it jumps to, and says whether the flow is marked
/// for masquerade and by which rule.
pub(super) fn masquerade(
    iptables: &mut dyn Iptables,
    ipset: &SystemIpset,
    local: &[IpAddr],
    flow: &Flow,
    explanation: &mut Explanation,
) -> Result<(), ExplainError> {
    let family = IpFamily::of(&flow.destination.ip());
    let rules = iptables
        .chain_rules(family, "nat", &CHAINS)
        .map_err(read_error("iptables"))?;
    explanation
        .reads
        .push(format!("the rules of nat's {}", CHAINS.join(", ")));
    let facts = Facts {
        flow,
        local,
        ipset,
        tested: RefCell::new(BTreeSet::new()),
    };
    let marked = marking(&rules, flow, &facts);
    for set in facts.tested.into_inner() {
        explanation
            .reads
            .push(format!("one entry of ipset {set} (ipset test)"));
    }
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
    use std::collections::BTreeMap;

    use super::*;
    use crate::model::{NodeInfo, ProxyState};
    use crate::proxier::fixtures::{NODE, Svc, ep, svc};
    use crate::proxier::ipvs::aggregate::render;
    use crate::proxier::ipvs::render::tests::context;

    fn state(services: Vec<Svc>) -> ProxyState {
        let mut state = ProxyState {
            node: NodeInfo {
                name: NODE.into(),
                ..NodeInfo::default()
            },
            ..ProxyState::default()
        };
        for s in services {
            state.services.insert(s.key.clone(), s.ports);
            state.endpoints.insert(s.key, s.endpoints);
        }
        state
    }

    fn flow(to: &str, from: Option<&str>) -> Flow {
        Flow::parse(to, from).unwrap()
    }

    #[test]
    fn set_entries_are_made_of_the_parts_the_flags_name() {
        let pod = flow("10.96.0.10:80/udp", Some("10.244.1.5"));
        let entry = |kind, flags| set_entry(kind, flags, &pod);
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
            set_entry(SetType::HashIpPortIp, "dst,dst,src", &v6).as_deref(),
            Some("fd00::10,tcp:80,fd00:10:244::5")
        );
    }

    /// The rules and set entries that IPVS mode renders, the sets asked as the kernel would.
    struct Rendered {
        rules: ChainRules,
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
            Some(entries.contains(&entry))
        }
    }

    fn rendered(services: Vec<Svc>) -> (ChainRules, BTreeMap<String, (SetType, BTreeSet<String>)>) {
        let desired = render(&state(services), &context(IpFamily::V4));
        let nat = desired.iptables.split("COMMIT").next().unwrap();
        let mut rules = ChainRules::new();
        for line in nat.lines() {
            if let Some((chain, rule)) = line.strip_prefix("-A ").and_then(|l| l.split_once(' ')) {
                rules.entry(chain.into()).or_default().push(rule.into());
            }
        }
        let sets = desired
            .sets
            .into_iter()
            .map(|(spec, entries)| (spec.name.clone(), (spec.set_type, entries)))
            .collect();
        (rules, sets)
    }

    /// Where each flow is marked, by the comment of the rule that marks it; `?` when it may be.
    fn marked_by(services: Vec<Svc>, flows: &[(&str, Option<&str>)]) -> Vec<String> {
        let (rules, sets) = rendered(services);
        flows
            .iter()
            .map(|(to, from)| {
                let facts = Rendered {
                    rules: rules.clone(),
                    sets: sets.clone(),
                    flow: flow(to, *from),
                };
                match marking(&facts.rules, &facts.flow, &facts) {
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
    fn the_comment_is_told_apart_from_the_rule() {
        assert_eq!(
            without_comment(
                "-m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ"
            ),
            "-m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ"
        );
        assert_eq!(without_comment("-j KUBE-MARK-MASQ"), "-j KUBE-MARK-MASQ");
    }
}
