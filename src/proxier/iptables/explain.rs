//! One packet through our iptables chains, read from the kernel: nat's KUBE-SERVICES and each
//! chain the packet is sent to (on nft, one netlink dump per chain; on legacy, from one save of
//! the table, the only read that kernel interface offers), then, when nat leaves the packet
//! alone, the filter chains that reject or drop it. Never a whole nft table.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;

use super::render::{
    KUBE_EXTERNAL_SERVICES, KUBE_MARK_MASQ, KUBE_NODEPORTS, KUBE_PROXY_FIREWALL, KUBE_SERVICES,
};
use crate::config::ProxyMode;
use crate::model::{IpFamily, ServicePortName};
use crate::proxier::explanation::{
    Candidate, ExplainError, Explanation, Flow, Outcome, read_error,
};
use crate::proxier::xtables::evaluate::evaluate;
use crate::sys::host::net::{LocalAddresses, SystemAddresses};
use crate::sys::nf_tables::wire::{NF_ACCEPT, NF_DROP, NFT_GOTO, NFT_RETURN};
use crate::sys::xtables::rules::{RuleOptions, Target};
use crate::sys::xtables::{Backend, Iptables, ReadRule, SystemIptables};

mod chain;
mod rules;

use chain::ReadChain;

use rules::*;

/// How many chains deep the reader follows jumps (ours go at most four: KUBE-SERVICES, a
/// firewall or external chain, a policy chain, an endpoint chain).
const MAX_CHAINS: usize = 8;
const NAT: &str = "nat";
const FILTER: &str = "filter";
/// The filter chains that refuse what nat left alone, in the order a packet meets them.
const REFUSING_CHAINS: [&str; 3] = [KUBE_PROXY_FIREWALL, KUBE_SERVICES, KUBE_EXTERNAL_SERVICES];

/// Explains `flow` from the iptables chains the kernel holds, on the back end in use.
pub fn explain(flow: &Flow) -> Result<Explanation, ExplainError> {
    Session::open().explain(flow)
}

/// Reads for several flows (`explain --all`): each chain read once.
pub struct Session {
    iptables: Box<dyn Iptables>,
    backend: Backend,
    chains: BTreeMap<(IpFamily, &'static str, String), Rc<ReadChain>>,
    programmed: BTreeMap<IpFamily, bool>,
    /// The node's addresses (`addrtype LOCAL`).
    local: Vec<IpAddr>,
}

impl Session {
    /// The tools of the back end that holds our KUBE-SERVICES chain.
    pub fn open() -> Session {
        let backend = Backend::holding(NAT, KUBE_SERVICES);
        Session::with(
            Box::new(SystemIptables::new(backend)),
            backend,
            SystemAddresses.addresses(),
        )
    }

    pub fn with(iptables: Box<dyn Iptables>, backend: Backend, local: Vec<IpAddr>) -> Session {
        Session {
            iptables,
            backend,
            chains: BTreeMap::new(),
            programmed: BTreeMap::new(),
            local,
        }
    }

    /// Explains `flow` from what the kernel holds in its family's tables.
    pub fn explain(&mut self, flow: &Flow) -> Result<Explanation, ExplainError> {
        let family = IpFamily::of(&flow.destination.ip());
        if !self.programmed(family)? {
            return Err(ExplainError::NothingProgrammed(format!(
                "no chain {KUBE_SERVICES} in the {} nat table (iptables-{}): iptables mode programs nothing in this network namespace",
                family.name(),
                self.backend.as_str()
            )));
        }
        let mut reader = Reader {
            session: self,
            family,
            flow,
            near: None,
            explanation: Explanation::new(ProxyMode::Iptables, flow),
        };
        reader.explanation.outcome = reader.dispatch()?;
        let mut explanation = reader.explanation;
        if self.backend == Backend::Legacy {
            explanation.reads.insert(0, format!(
                "the whole {} nat and filter tables, once (iptables-legacy-save: the legacy kernel interface hands out whole tables only)",
                family.name()
            ));
        }
        Ok(explanation)
    }

    fn programmed(&mut self, family: IpFamily) -> Result<bool, ExplainError> {
        if let Some(programmed) = self.programmed.get(&family) {
            return Ok(*programmed);
        }
        let found = self
            .iptables
            .existing_chains(family, NAT, &[KUBE_SERVICES])
            .map_err(read_error("the nat table's chains"))?;
        let programmed = !found.is_empty();
        self.programmed.insert(family, programmed);
        Ok(programmed)
    }

    /// Reads those of `chains` not read yet, in one request to the back end.
    fn read(
        &mut self,
        family: IpFamily,
        table: &'static str,
        chains: &[&str],
    ) -> Result<(), ExplainError> {
        let missing: Vec<&str> = chains
            .iter()
            .copied()
            .filter(|c| !self.chains.contains_key(&(family, table, c.to_string())))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let read = self
            .iptables
            .rule_options(family, table, &missing)
            .map_err(read_error(table))?;
        for (chain, rules) in missing.into_iter().zip(read) {
            self.chains.insert(
                (family, table, chain.to_string()),
                Rc::new(ReadChain::new(rules)),
            );
        }
        Ok(())
    }

    /// Reads every chain of ours a packet can reach in `family` (`explain --all`), a level of
    /// jumps at a time, each level in one request.
    pub fn read_reachable(&mut self, family: IpFamily) -> Result<(), ExplainError> {
        if !self.programmed(family)? {
            return Ok(());
        }
        self.read(family, FILTER, &REFUSING_CHAINS)?;
        let mut level: Vec<String> = vec![KUBE_SERVICES.into(), KUBE_NODEPORTS.into()];
        for _ in 0..MAX_CHAINS {
            let names: Vec<&str> = level.iter().map(String::as_str).collect();
            self.read(family, NAT, &names)?;
            let mut next = BTreeSet::new();
            for chain in &level {
                let Some(read) = self.chains.get(&(family, NAT, chain.clone())) else {
                    continue;
                };
                for rule in read.rules.iter().flatten() {
                    if let Some((_, target)) = jump_of(rule)
                        && target != KUBE_MARK_MASQ
                        && !self.chains.contains_key(&(family, NAT, target.to_string()))
                    {
                        next.insert(target.to_string());
                    }
                }
            }
            if next.is_empty() {
                break;
            }
            level = next.into_iter().collect();
        }
        Ok(())
    }
}

/// Where a walk through a chain ends: the packet's fate, or back in the chain that jumped.
enum Walk {
    Ends(Outcome),
    Returns,
}

struct Reader<'a> {
    session: &'a mut Session,
    family: IpFamily,
    flow: &'a Flow,
    /// A Service whose address the packet has, but not its port or protocol.
    near: Option<ServicePortName>,
    explanation: Explanation,
}

impl Reader<'_> {
    /// nat first (it DNATs), then the filter chains that refuse what nat left alone.
    fn dispatch(&mut self) -> Result<Outcome, ExplainError> {
        if let Walk::Ends(outcome) = self.chain(NAT, KUBE_SERVICES, 0)? {
            return Ok(outcome);
        }
        for chain in REFUSING_CHAINS {
            if let Walk::Ends(outcome) = self.chain(FILTER, chain, 0)? {
                return Ok(outcome);
            }
        }
        let destination = format!("{}/{}", self.flow.destination, self.flow.protocol.lower());
        Ok(Outcome::Untouched {
            reason: match &self.near {
                Some(service) => format!(
                    "{} is an address of {service}, which has no port {destination}: iptables mode leaves it alone",
                    self.flow.destination.ip()
                ),
                None => format!(
                    "no rule of ours matches {destination}: no ClusterIP, external or load-balancer IP of a Service with that port, and no NodePort of this node"
                ),
            },
        })
    }

    fn step(&mut self, text: String) {
        self.explanation.steps.push(text);
    }

    /// The rules of `chain` as read (none when it was not).
    fn cached(&self, table: &'static str, chain: &str) -> Rc<ReadChain> {
        let key = (self.family, table, chain.to_string());
        self.session
            .chains
            .get(&key)
            .cloned()
            .unwrap_or_else(|| Rc::new(ReadChain::new(Vec::new())))
    }

    /// The rules of `chain`, read once.
    fn rules(&mut self, table: &'static str, chain: &str) -> Result<Rc<ReadChain>, ExplainError> {
        self.session.read(self.family, table, &[chain])?;
        let read = self.cached(table, chain);
        if self.session.backend == Backend::Nft {
            self.explanation.reads.push(format!(
                "{} of {table} chain {chain}",
                rules_count(read.rules.len())
            ));
        }
        Ok(read)
    }

    fn ipv6(&self) -> bool {
        self.family == IpFamily::V6
    }

    /// The rules of `chain`, in order, until one sends the packet on for sure.
    fn chain(
        &mut self,
        table: &'static str,
        chain: &str,
        depth: usize,
    ) -> Result<Walk, ExplainError> {
        if depth == MAX_CHAINS {
            return Ok(Walk::Ends(Outcome::Untouched {
                reason: format!("more than {MAX_CHAINS} chains deep at {chain}"),
            }));
        }
        if chain.starts_with("KUBE-SVC-") {
            self.explanation.policy = Some("Cluster");
        } else if chain.starts_with("KUBE-SVL-") {
            self.explanation.policy = Some("Local");
        }
        let label = match table {
            FILTER => format!("filter {chain}"),
            _ => chain.to_string(),
        };
        let read = self.rules(table, chain)?;
        let destination = crate::model::address::octets(self.flow.destination.ip());
        for index in read.candidates(&destination) {
            let rule = match &read.rules[index] {
                Ok(rule) => rule,
                Err(why) => {
                    self.step(format!(
                        "{label}: a rule this reader cannot read ({why}), taken as not matching"
                    ));
                    continue;
                }
            };
            if probability(rule).is_some() {
                return self
                    .pick(table, &label, &read.rules[index..])
                    .map(Walk::Ends);
            }
            if let Some(walk) = self.rule(table, &label, chain, rule, depth)? {
                return Ok(walk);
            }
        }
        Ok(Walk::Returns)
    }

    /// What one rule does with the packet: `Some` when the packet leaves the chain for sure.
    fn rule(
        &mut self,
        table: &'static str,
        label: &str,
        chain: &str,
        rule: &RuleOptions,
        depth: usize,
    ) -> Result<Option<Walk>, ExplainError> {
        let local = &self.session.local;
        let applies = evaluate(rule, self.flow, &|address: IpAddr| local.contains(&address));
        if let Some((list, seconds)) = affinity_check(rule) {
            if applies != Some(false) {
                self.step(format!(
                    "{label}: a client seen within {seconds} s goes back to its endpoint (recent list {list}); a new client is drawn below"
                ));
            }
            return Ok(None);
        }
        let when = self.when(rule, applies);
        let masquerades = jump_of(rule).is_some_and(|(_, target)| target == KUBE_MARK_MASQ);
        if applies == Some(false) {
            if masquerades {
                self.step(format!(
                    "{label}: not marked for masquerade (the rule's match does not hold for this packet)"
                ));
            } else {
                self.note_near(rule);
            }
            return Ok(None);
        }
        if masquerades {
            self.step(format!("{label}: marked for masquerade{when}"));
            return Ok(None);
        }
        match &rule.target {
            Some(Target::Jump(target, code)) => {
                self.jump(table, label, chain, rule, (target, *code), applies, depth)
            }
            Some(Target::Verdict(NF_DROP)) | Some(Target::Reject) => {
                let rejects = matches!(rule.target, Some(Target::Reject));
                let verb = if rejects { "rejected" } else { "dropped" };
                if applies.is_none() {
                    self.step(format!("{label}: {verb}{when}"));
                    return Ok(None);
                }
                self.step(format!("{label}: {verb}{}", described(rule)));
                Ok(Some(Walk::Ends(self.refusal(chain, rule, rejects))))
            }
            Some(Target::Verdict(NF_ACCEPT)) if applies == Some(true) => {
                Ok(Some(Walk::Ends(Outcome::Untouched {
                    reason: format!("{label} accepts it"),
                })))
            }
            Some(Target::Verdict(NFT_RETURN)) if applies == Some(true) => Ok(Some(Walk::Returns)),
            Some(Target::Dnat(_)) if applies == Some(true) => {
                let Some(endpoint) = dnat_target(rule, self.flow.destination) else {
                    return Ok(None);
                };
                self.step(format!("{label}: DNAT to {endpoint}"));
                Ok(Some(Walk::Ends(Outcome::Dnat {
                    candidates: vec![Candidate {
                        endpoint,
                        probability: 1.0,
                    }],
                })))
            }
            _ => Ok(None),
        }
    }

    /// ` when -s 10.0.0.0/8 (give --from ...)`, or that it holds, for a conditional rule.
    fn when(&self, rule: &RuleOptions, applies: Option<bool>) -> String {
        if !is_conditional(self.ipv6(), rule) {
            return String::new();
        }
        match applies {
            Some(true) => " (its match holds for this packet)".into(),
            _ if self.flow.source.is_none() && rule.source.is_some() => format!(
                " when {} (give --from to evaluate it)",
                match_text(self.ipv6(), rule)
            ),
            _ => format!(" when {}", match_text(self.ipv6(), rule)),
        }
    }

    /// Remembers a Service whose address the packet has (for why nothing matched).
    fn note_near(&mut self, rule: &RuleOptions) {
        let address = crate::model::address::octets(self.flow.destination.ip());
        let exact = rule.destination.as_ref().is_some_and(|d| {
            !d.inverted && d.address == address && d.mask.iter().all(|b| *b == 0xff)
        });
        if exact && self.near.is_none() {
            self.near = comment_of(rule).and_then(|c| service_of(c, self.flow.protocol));
        }
    }

    /// Follows a jump the packet takes (or may take: a firewall chain's allowed source, when
    /// the flow has none, is followed and said so).
    #[allow(clippy::too_many_arguments)]
    fn jump(
        &mut self,
        table: &'static str,
        label: &str,
        chain: &str,
        rule: &RuleOptions,
        (target, code): (&str, i32),
        applies: Option<bool>,
        depth: usize,
    ) -> Result<Option<Walk>, ExplainError> {
        let firewall = chain.starts_with("KUBE-FW-");
        let verb = if code == NFT_GOTO {
            "goes to"
        } else {
            "jumps to"
        };
        match applies {
            None if firewall => self.step(format!(
                "{label}: a source outside the Service's loadBalancerSourceRanges is dropped (give --from to evaluate it)"
            )),
            None => {
                self.step(format!("{label}: {verb} {target}{}", self.when(rule, applies)));
                return Ok(None);
            }
            _ if firewall => self.step(format!(
                "{label}: its source is within the Service's loadBalancerSourceRanges"
            )),
            _ => {}
        }
        self.step(format!("{label}: {verb} {target}{}", described(rule)));
        if self.explanation.service.is_none() {
            self.explanation.service =
                comment_of(rule).and_then(|c| service_of(c, self.flow.protocol));
        }
        Ok(match self.chain(table, target, depth + 1)? {
            Walk::Ends(outcome) => Some(Walk::Ends(outcome)),
            Walk::Returns if code == NFT_GOTO => Some(Walk::Returns),
            Walk::Returns => None,
        })
    }

    /// A filter rule that refuses the packet: why, from its chain and comment.
    fn refusal(&mut self, chain: &str, rule: &RuleOptions, rejects: bool) -> Outcome {
        let comment = comment_of(rule).unwrap_or_default();
        if let Some(service) = service_of(comment, self.flow.protocol) {
            self.explanation.service.get_or_insert(service);
        }
        let reason = if chain == KUBE_PROXY_FIREWALL {
            "its source is outside the Service's loadBalancerSourceRanges (KUBE-PROXY-FIREWALL drops what the Service's firewall chain did not accept)".to_string()
        } else if comment.ends_with("has no local endpoints") {
            "the Service has endpoints, but none this traffic may use (traffic policy Local without local endpoints)".into()
        } else if comment.ends_with("has no endpoints") {
            "the Service has no endpoints".into()
        } else {
            format!("filter chain {chain} refuses it")
        };
        if rejects {
            Outcome::Reject { reason }
        } else {
            Outcome::Drop { reason }
        }
    }

    /// A policy chain's random pick: each `statistic` rule takes its chance of what the rules
    /// before it left, the last rule the rest; each endpoint chain's DNAT names its endpoint.
    fn pick(
        &mut self,
        table: &'static str,
        label: &str,
        rules: &[ReadRule],
    ) -> Result<Outcome, ExplainError> {
        let mut left = 1.0;
        let mut shares: Vec<(f64, String)> = Vec::new();
        for rule in rules.iter().flatten() {
            let Some((_, target)) = jump_of(rule) else {
                continue;
            };
            match probability(rule) {
                Some(p) => {
                    shares.push((left * p, target.to_string()));
                    left *= 1.0 - p;
                }
                None => {
                    shares.push((left, target.to_string()));
                    left = 0.0;
                    break;
                }
            }
        }
        let targets: Vec<&str> = shares.iter().map(|(_, t)| t.as_str()).collect();
        self.session.read(self.family, table, &targets)?;
        let mut candidates: BTreeMap<SocketAddr, f64> = BTreeMap::new();
        if self.session.backend == Backend::Nft {
            self.explanation
                .reads
                .push(format!("the rules of {} endpoint chains", targets.len()));
        }
        for (share, target) in &shares {
            let chain = self.cached(table, target);
            let endpoint = chain
                .rules
                .iter()
                .flatten()
                .find_map(|rule| dnat_target(rule, self.flow.destination));
            if let Some(endpoint) = endpoint {
                *candidates.entry(endpoint).or_default() += share;
                self.hairpin(target, &chain, endpoint);
            }
        }
        self.step(format!(
            "{label}: DNAT to one of {} endpoints at random (statistic rules, each endpoint chain's DNAT)",
            candidates.len()
        ));
        if left > 1e-9 {
            self.step(format!(
                "{label}: no rule takes the last {:.2}% of new connections: they leave the chain unchanged",
                left * 100.0
            ));
        }
        if candidates.is_empty() {
            return Ok(Outcome::Untouched {
                reason: format!(
                    "{label}'s endpoint chains DNAT to no endpoint this reader can read"
                ),
            });
        }
        Ok(Outcome::Dnat {
            candidates: candidates
                .into_iter()
                .map(|(endpoint, probability)| Candidate {
                    endpoint,
                    probability,
                })
                .collect(),
        })
    }
}

impl Reader<'_> {
    /// With `--from` an endpoint of the Service: its endpoint chain masquerades a connection
    /// the draw sends back to it (hairpin), when the chain's masquerade rule holds.
    fn hairpin(&mut self, chain: &str, read: &ReadChain, endpoint: SocketAddr) {
        if self.flow.source != Some(endpoint.ip()) {
            return;
        }
        let local = &self.session.local;
        let masquerades = read.rules.iter().flatten().any(|rule| {
            jump_of(rule).is_some_and(|(_, target)| target == KUBE_MARK_MASQ)
                && evaluate(rule, self.flow, &|a: IpAddr| local.contains(&a)) == Some(true)
        });
        if masquerades {
            self.step(format!(
                "{chain}: marked for masquerade when the draw sends {} back to itself (hairpin)",
                endpoint.ip()
            ));
        }
    }
}

/// `the 1 rule`, `the 3 rules`.
fn rules_count(count: usize) -> String {
    match count {
        1 => "the 1 rule".into(),
        n => format!("the {n} rules"),
    }
}

/// ` ("the rule's comment")`, when it has one.
fn described(rule: &RuleOptions) -> String {
    comment_of(rule)
        .map(|comment| format!(" (\"{comment}\")"))
        .unwrap_or_default()
}

impl crate::proxier::explanation::Explain for Session {
    fn explain(&mut self, flow: &Flow) -> Result<Explanation, ExplainError> {
        Session::explain(self, flow)
    }
}
