//! One packet through our `kube-proxy` table, read from the kernel with targeted reads only:
//! the map elements its destination is a key of (one request each), the rules of the chains it
//! is sent to (one dump per chain), and the endpoint map a policy chain draws from. Never the
//! whole table.

use crate::model::ServicePortName;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use super::render::{
    CLUSTER_IPS, FIREWALL_IPS, NO_ENDPOINT_SERVICES, REJECT_CHAIN, SERVICE_IPS, TABLE,
};
use crate::config::ProxyMode;
use crate::model::IpFamily;
use crate::model::address::octets;
use crate::proxier::explanation::{
    Candidate, ExplainError, Explanation, Flow, Outcome, read_error,
};
use crate::sys::host::net::{LocalAddresses, SystemAddresses};
use crate::sys::nf_tables::elements::{KeyLayout, address_number};
use crate::sys::nf_tables::expr::{Data, Expr};
use crate::sys::nf_tables::family_keyword;
use crate::sys::nf_tables::lookups::{KernelLookups, Lookups};
use crate::sys::nf_tables::wire::{CMP_GT, NFT_GOTO};
use crate::sys::nf_tables::write::KeyType;

/// How many chains a packet may be sent through before the reader gives up (ours send it
/// through at most three: firewall or external, then a policy chain).
const MAX_CHAINS: usize = 6;

mod evaluate;
mod filters;
mod hairpin;
mod node_ports;
mod rules;

use evaluate::{Context, evaluate};
use rules::*;

/// Explains `flow` from what the kernel holds in our table of its family.
pub fn explain(flow: &Flow) -> Result<Explanation, ExplainError> {
    Session::open()?.explain(flow)
}

/// One share of an endpoint map: its first and last draw, and its endpoint.
type Share = (u64, u64, SocketAddr);

/// Reads for several flows (`explain --all`): one socket, and each endpoint map read once.
pub struct Session {
    lookups: Box<dyn Lookups + Send>,
    tables: BTreeMap<IpFamily, bool>,
    /// Endpoint maps read: each share's first and last draw and its endpoint, by first draw.
    maps: BTreeMap<(IpFamily, String), Vec<Share>>,
    /// The rules of chain `services`, by family (read once).
    services: BTreeMap<IpFamily, Vec<Vec<Expr>>>,
    /// The rules of chain `filter-forward` that offload to a flowtable, by family (read once).
    offloads: BTreeMap<IpFamily, Vec<Vec<Expr>>>,
    /// The node's addresses (NodePorts, `fib ... type local`).
    local: Vec<IpAddr>,
}

impl Session {
    pub fn open() -> Result<Session, ExplainError> {
        let kernel = KernelLookups::open().map_err(read_error("netlink"))?;
        Ok(Session::with(Box::new(kernel), SystemAddresses.addresses()))
    }

    /// A session reading through `lookups`, on a node whose addresses are `local`.
    pub fn with(lookups: Box<dyn Lookups + Send>, local: Vec<IpAddr>) -> Session {
        Session {
            lookups,
            tables: BTreeMap::new(),
            maps: BTreeMap::new(),
            services: BTreeMap::new(),
            offloads: BTreeMap::new(),
            local,
        }
    }

    /// Explains `flow` from what the kernel holds in our table of its family.
    pub fn explain(&mut self, flow: &Flow) -> Result<Explanation, ExplainError> {
        let family = IpFamily::of(&flow.destination.ip());
        let present = match self.tables.get(&family) {
            Some(present) => *present,
            None => {
                let present = self
                    .lookups
                    .table_exists(family, TABLE)
                    .map_err(read_error("our table"))?;
                *self.tables.entry(family).or_insert(present)
            }
        };
        if !present {
            return Err(ExplainError::NothingProgrammed(format!(
                "no table {} {TABLE}: nftables mode programs nothing in this network namespace",
                family_keyword(family)
            )));
        }
        let mut reader = Reader {
            session: self,
            family,
            flow,
            explanation: Explanation::new(ProxyMode::Nftables, flow),
            cluster_ip: false,
        };
        reader.explanation.outcome = reader.dispatch()?;
        Ok(reader.explanation)
    }
}

struct Reader<'a> {
    session: &'a mut Session,
    family: IpFamily,
    flow: &'a Flow,
    explanation: Explanation,
    /// The destination is in @cluster-ips (known once a service map matched it).
    cluster_ip: bool,
}

impl Reader<'_> {
    /// The element of `set` whose key is `key`, as `(key text, rest of its text)`.
    fn element(
        &mut self,
        set: &str,
        layout: &[KeyType],
        key: &[u8],
    ) -> Result<Option<String>, ExplainError> {
        let layout = KeyLayout::Keys(layout.to_vec());
        let found = self
            .session
            .lookups
            .element(self.family, TABLE, set, &layout, key)
            .map_err(read_error(set))?;
        self.explanation
            .reads
            .push(format!("one element of @{set}"));
        Ok(found.map(|(_, rest)| rest))
    }

    fn address_type(&self) -> KeyType {
        match self.family {
            IpFamily::V4 => KeyType::Ipv4,
            IpFamily::V6 => KeyType::Ipv6,
        }
    }

    /// The key `address . protocol . port` as the kernel holds it (each part padded to four).
    fn service_key(&self) -> Vec<u8> {
        let mut key = octets(self.flow.destination.ip());
        key.extend(self.protocol_and_port());
        key
    }

    fn protocol_and_port(&self) -> Vec<u8> {
        let port = self.flow.destination.port().to_be_bytes();
        vec![self.flow.protocol.number(), 0, 0, 0, port[0], port[1], 0, 0]
    }

    /// The service maps in upstream's order: ClusterIPs, external and load-balancer IPs, then
    /// ClusterIPs with other ports, then NodePorts.
    fn dispatch(&mut self) -> Result<Outcome, ExplainError> {
        let (address, proto, port) = (self.address_type(), KeyType::Protocol, KeyType::Port);
        let key = self.service_key();
        if let Some(rest) = self.element(FIREWALL_IPS, &[address, proto, port], &key)? {
            self.step(format!("@{FIREWALL_IPS}: {}{rest}", self.key_text()));
            if let Some(dropped) = self.firewall(&rest)? {
                return Ok(dropped);
            }
        }
        let mut nat = None;
        if let Some(rest) = self.element(SERVICE_IPS, &[address, proto, port], &key)? {
            self.step(format!("@{SERVICE_IPS}: {}{rest}", self.key_text()));
            let ip = octets(self.flow.destination.ip());
            self.cluster_ip = self.element(CLUSTER_IPS, &[address], &ip)?.is_some();
            if self.cluster_ip {
                self.cluster_ip_marks()?;
            }
            nat = Some(self.follow_verdict(&rest)?);
            if self.cluster_ip && matches!(nat, Some(Outcome::Dnat { .. })) {
                self.offload()?;
            }
        }
        // What the NAT chains leave alone meets the filter hooks' no-endpoint map.
        match nat {
            Some(outcome) if !matches!(outcome, Outcome::Untouched { .. }) => return Ok(outcome),
            nat => {
                if let Some(rest) =
                    self.element(NO_ENDPOINT_SERVICES, &[address, proto, port], &key)?
                {
                    self.step(format!(
                        "@{NO_ENDPOINT_SERVICES}: {}{rest}",
                        self.key_text()
                    ));
                    return Ok(self.refusal(&rest));
                }
                if let Some(untouched) = nat {
                    return Ok(untouched);
                }
            }
        }
        let ip = octets(self.flow.destination.ip());
        if self.element(CLUSTER_IPS, &[address], &ip)?.is_some() {
            self.step(format!(
                "@{CLUSTER_IPS}: {} is a ClusterIP",
                self.flow.destination.ip()
            ));
            return Ok(Outcome::Reject {
                reason: format!(
                    "no port {}/{} of that Service (cluster-ips-check rejects it)",
                    self.flow.destination.port(),
                    self.flow.protocol.lower()
                ),
            });
        }
        if let Some(dropped) = self.unallocated_cluster_ip()? {
            return Ok(dropped);
        }
        self.node_port()
    }

    /// The rules of `services` that mark traffic to any ClusterIP for masquerading, before the
    /// service maps (upstream 1.36's place for them); read once a session.
    fn cluster_ip_marks(&mut self) -> Result<(), ExplainError> {
        let mut rules = self.services_rules()?;
        rules.retain(|rule| rule.iter().any(|e| matches!(e, Expr::MetaSet { .. })));
        for rule in rules {
            self.rule("services", &rule, 0)?;
        }
        Ok(())
    }

    /// A connection to a ClusterIP that the node forwards meets filter-forward's offload rule
    /// (`--offload-packet-threshold`): past the threshold, its packets take the flowtable.
    /// The node's own connections are not forwarded, and never offloaded.
    fn offload(&mut self) -> Result<(), ExplainError> {
        let local = &self.session.local;
        if self
            .flow
            .source
            .is_some_and(|source| source.is_loopback() || local.contains(&source))
        {
            return Ok(());
        }
        let rules = match self.session.offloads.get(&self.family) {
            Some(rules) => rules.clone(),
            None => {
                let mut rules = self.rules_of("filter-forward")?;
                rules.retain(|rule| rule.iter().any(|e| matches!(e, Expr::FlowOffload { .. })));
                self.session.offloads.insert(self.family, rules.clone());
                rules
            }
        };
        for rule in rules {
            let flowtable = rule.iter().find_map(|e| match e {
                Expr::FlowOffload { flowtable } => Some(flowtable.as_str()),
                _ => None,
            });
            // `ct packets > N`: the comparison of eight bytes in network order.
            let threshold = rule.iter().find_map(|e| match e {
                Expr::Cmp {
                    op: CMP_GT, data, ..
                } => Some(u64::from_be_bytes(data.as_slice().try_into().ok()?)),
                _ => None,
            });
            let after = threshold.map_or("past its packet threshold".to_string(), |n| {
                format!("once it has seen more than {n} packets")
            });
            self.step(format!(
                "filter-forward: offloaded to flowtable {} {after} (when forwarded); its later packets take the kernel's fast path past these chains",
                flowtable.unwrap_or_default()
            ));
        }
        Ok(())
    }

    /// The rules of chain `services`, read once a session.
    fn services_rules(&mut self) -> Result<Vec<Vec<Expr>>, ExplainError> {
        if let Some(rules) = self.session.services.get(&self.family) {
            return Ok(rules.clone());
        }
        let rules = self.rules_of("services")?;
        self.session.services.insert(self.family, rules.clone());
        Ok(rules)
    }

    fn key_text(&self) -> String {
        format!(
            "{} . {} . {}",
            self.flow.destination.ip(),
            self.flow.protocol.lower(),
            self.flow.destination.port()
        )
    }

    fn node_port_text(&self) -> String {
        format!(
            "{} . {}",
            self.flow.protocol.lower(),
            self.flow.destination.port()
        )
    }

    fn step(&mut self, text: String) {
        self.explanation.steps.push(text);
    }

    /// The rules of `chain`, as expressions: one dump of that chain.
    fn rules_of(&mut self, chain: &str) -> Result<Vec<Vec<Expr>>, ExplainError> {
        let rules = self
            .session
            .lookups
            .chain_rules(self.family, TABLE, chain)
            .map_err(read_error(chain))?;
        self.explanation
            .reads
            .push(format!("the {} rules of chain {chain}", rules.len()));
        Ok(rules)
    }

    /// Whether `rule`'s match holds for the flow (see `evaluate`), the anonymous sets of
    /// addresses it looks up read when the flow's source is known.
    fn applies(&mut self, rule: &[Expr]) -> Result<Option<bool>, ExplainError> {
        self.applies_reading(rule, self.flow.source.is_some())
    }

    /// As [`Self::applies`], the anonymous sets read when `read_sets` (a match on the
    /// destination needs them whether the source is known or not).
    fn applies_reading(
        &mut self,
        rule: &[Expr],
        read_sets: bool,
    ) -> Result<Option<bool>, ExplainError> {
        let mut sets: BTreeMap<String, Vec<(u128, u128)>> = BTreeMap::new();
        if read_sets {
            for expr in rule {
                if let Expr::Lookup {
                    set, dreg: None, ..
                } = expr
                    && set.name.starts_with("__")
                {
                    let read = self
                        .session
                        .lookups
                        .address_intervals(self.family, TABLE, &set.name)
                        .map_err(read_error(&set.name))?;
                    self.explanation
                        .reads
                        .push(format!("the elements of {}", set.name));
                    sets.insert(set.name.clone(), read);
                }
            }
        }
        let local = &self.session.local;
        let (destination, cluster_ip) = (octets(self.flow.destination.ip()), self.cluster_ip);
        let member = |set: &str, value: &[u8]| {
            if set == CLUSTER_IPS {
                // Known for the destination alone.
                return (value == destination.as_slice()).then_some(cluster_ip);
            }
            let intervals = sets.get(set)?;
            let value = address_number(value)?;
            Some(
                intervals
                    .iter()
                    .any(|(first, end)| *first <= value && value < *end),
            )
        };
        let context = Context {
            local: &|address| local.contains(&address),
            member: &member,
        };
        Ok(evaluate(rule, self.flow, &context))
    }

    /// The firewall chain a load-balancer IP with source ranges goes through (in the filter
    /// hook, before DNAT): the drop, if this packet's source is outside the ranges.
    fn firewall(&mut self, rest: &str) -> Result<Option<Outcome>, ExplainError> {
        let Some(chain) = rest.rsplit_once("goto ").map(|(_, c)| c.trim().to_string()) else {
            return Ok(None);
        };
        let rules = self.rules_of(&chain)?;
        for rule in &rules {
            match self.applies(rule)? {
                Some(true) => {
                    self.step(format!(
                        "{chain}: dropped: its source is outside the Service's loadBalancerSourceRanges"
                    ));
                    return Ok(Some(Outcome::Drop {
                        reason: "its source is outside the Service's loadBalancerSourceRanges"
                            .into(),
                    }));
                }
                Some(false) => self.step(format!(
                    "{chain}: its source is within the Service's loadBalancerSourceRanges"
                )),
                None => self.step(format!(
                    "{chain}: a source outside the Service's loadBalancerSourceRanges is dropped (give --from to evaluate it)"
                )),
            }
        }
        Ok(None)
    }

    /// An element of a no-endpoint map: ` comment "ns/svc:port" : goto reject-chain | drop`.
    fn refusal(&mut self, rest: &str) -> Outcome {
        if let Some(service) = comment_of(rest) {
            self.explanation.service = ServicePortName::parse(service, self.flow.protocol);
        }
        if rest.ends_with(&format!("goto {REJECT_CHAIN}")) {
            Outcome::Reject {
                reason: "the Service has no endpoints".into(),
            }
        } else {
            Outcome::Drop {
                reason: "the Service has endpoints, but none this traffic may use (traffic policy Local without local endpoints)".into(),
            }
        }
    }

    /// Follows ` : goto CHAIN` into the chain.
    fn follow_verdict(&mut self, rest: &str) -> Result<Outcome, ExplainError> {
        let Some(chain) = rest
            .rsplit_once("goto ")
            .map(|(_, chain)| chain.trim().to_string())
        else {
            return Ok(Outcome::Untouched {
                reason: format!("the element's verdict{rest} sends it nowhere this reader knows"),
            });
        };
        self.explanation.service = service_of_chain(&chain, self.flow.protocol);
        self.chain(chain, 0)
    }

    /// The rules of `chain`, in order, until one sends the packet on for sure.
    fn chain(&mut self, chain: String, depth: usize) -> Result<Outcome, ExplainError> {
        if depth == MAX_CHAINS {
            return Ok(Outcome::Untouched {
                reason: format!("more than {MAX_CHAINS} chains deep at {chain}"),
            });
        }
        let rules = self.rules_of(&chain)?;
        for rule in &rules {
            if let Some(outcome) = self.rule(&chain, rule, depth)? {
                return Ok(outcome);
            }
        }
        Ok(Outcome::Untouched {
            reason: format!("chain {chain} ends without sending it anywhere"),
        })
    }

    /// What one rule does with the packet: `Some` when the packet leaves the chain for sure.
    fn rule(
        &mut self,
        chain: &str,
        rule: &[Expr],
        depth: usize,
    ) -> Result<Option<Outcome>, ExplainError> {
        let applies = self.applies(rule)?;
        let conditional = is_conditional(rule) && applies != Some(true);
        let when = match applies {
            Some(true) if is_conditional(rule) => " (its match holds for this packet)".to_string(),
            _ => condition_text(rule),
        };
        if let Some(pick) = random_pick(rule) {
            return self.pick(chain, pick).map(Some);
        }
        let masquerades = rule.iter().any(|e| matches!(e, Expr::MetaSet { .. }));
        if applies == Some(false) {
            if masquerades {
                self.step(format!(
                    "{chain}: not marked for masquerade (the rule's match does not hold for this packet)"
                ));
            }
            return Ok(None);
        }
        if masquerades {
            self.step(format!("{chain}: marked for masquerade{when}"));
            return Ok(None);
        }
        if matches!(rule.last(), Some(Expr::Immediate { data: Data::Verdict(v), .. }) if v.code == 0)
        {
            self.step(format!("{chain}: dropped{when}"));
            return Ok((!conditional).then(|| Outcome::Drop {
                reason: format!("chain {chain} drops it"),
            }));
        }
        let Some((code, target)) = verdict_of(rule) else {
            return Ok(None);
        };
        let verb = if code == NFT_GOTO {
            "goes to"
        } else {
            "jumps to"
        };
        self.step(format!("{chain}: {verb} {target}{when}"));
        if conditional {
            return Ok(None);
        }
        self.chain(target, depth + 1).map(Some)
    }

    /// Where a random pick sends the packet: a slot of a named endpoint map, an anonymous map
    /// of endpoints, or (with session affinity) an anonymous verdict map of endpoint chains.
    fn pick(&mut self, chain: &str, pick: RandomPick) -> Result<Outcome, ExplainError> {
        self.explanation.policy = Some(if chain.starts_with("local-") {
            "Local"
        } else {
            "Cluster"
        });
        let outcome = match pick.kind {
            PickKind::Slot => self.draws(chain, pick)?,
            PickKind::Endpoints => {
                let endpoints = self.indexed(&pick.set)?;
                self.step(format!(
                    "{chain}: DNAT to one of {} endpoints at random (numgen mod {})",
                    endpoints.len(),
                    pick.modulus
                ));
                let endpoints = endpoints
                    .iter()
                    .filter_map(|data| destination(data))
                    .collect();
                evenly(endpoints)
            }
            PickKind::Chains => self.affinity(chain, pick)?,
        };
        self.hairpin(&outcome)?;
        Ok(outcome)
    }

    /// The data of an anonymous map indexed by a numgen draw, in index order.
    fn indexed(&mut self, set: &str) -> Result<Vec<String>, ExplainError> {
        let elements = self
            .session
            .lookups
            .set_elements(self.family, TABLE, set, &KeyLayout::Indices)
            .map_err(read_error(set))?;
        self.explanation
            .reads
            .push(format!("the elements of {set}"));
        let mut indexed: Vec<(u32, String)> = elements
            .into_iter()
            .filter_map(|(index, data)| Some((index.parse().ok()?, data)))
            .collect();
        indexed.sort();
        Ok(indexed
            .into_iter()
            .map(|(_, data)| data.trim_start_matches(" : ").to_string())
            .collect())
    }

    /// Session affinity: a new client goes to one endpoint chain at random, each of which
    /// DNATs to its endpoint; a client seen lately goes back to its own (earlier rules).
    fn affinity(&mut self, chain: &str, pick: RandomPick) -> Result<Outcome, ExplainError> {
        let targets = self.indexed(&pick.set)?;
        self.step(format!(
            "{chain}: a new client goes to one of {} endpoint chains at random",
            targets.len()
        ));
        let mut endpoints = Vec::new();
        for target in &targets {
            let Some(target) = target.strip_prefix("goto ") else {
                continue;
            };
            let rules = self.rules_of(target)?;
            endpoints.extend(rules.iter().find_map(|rule| dnat_target(rule)));
        }
        Ok(evenly(endpoints))
    }

    /// The endpoints of a policy chain's slot in an endpoint map: each share of the slot's
    /// draws, with its part of them.
    fn draws(&mut self, chain: &str, map: RandomPick) -> Result<Outcome, ExplainError> {
        let key = (self.family, map.set.clone());
        if !self.session.maps.contains_key(&key) {
            let read = self
                .session
                .lookups
                .set_elements(self.family, TABLE, &map.set, &KeyLayout::Draws)
                .map_err(read_error(&map.set))?;
            let mut shares: Vec<Share> = read
                .iter()
                .filter_map(|(range, data)| {
                    let (first, last) = draw_range(range)?;
                    Some((first, last, destination(data)?))
                })
                .collect();
            shares.sort_unstable();
            self.session.maps.insert(key.clone(), shares);
        }
        self.explanation
            .reads
            .push(format!("the elements of @{}", map.set));
        let (first_draw, end) = (
            u64::from(map.offset),
            u64::from(map.offset) + u64::from(map.modulus),
        );
        let mut candidates: BTreeMap<SocketAddr, u64> = BTreeMap::new();
        let shares = self
            .session
            .maps
            .get(&key)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let start = shares.partition_point(|(first, _, _)| *first < first_draw);
        for (first, last, endpoint) in &shares[start..] {
            if *first >= end {
                break;
            }
            if *last < end {
                *candidates.entry(*endpoint).or_default() += last - first + 1;
            }
        }
        self.step(format!(
            "{chain}: DNAT to an endpoint drawn from @{} (draws {first_draw}-{})",
            map.set,
            end - 1
        ));
        if candidates.is_empty() {
            return Ok(Outcome::Untouched {
                reason: format!(
                    "@{} holds no endpoint for the draws of chain {chain}",
                    map.set
                ),
            });
        }
        let modulus = f64::from(map.modulus);
        Ok(Outcome::Dnat {
            candidates: candidates
                .into_iter()
                .map(|(endpoint, draws)| Candidate {
                    endpoint,
                    probability: draws as f64 / modulus,
                })
                .collect(),
        })
    }
}

impl crate::proxier::explanation::Explain for Session {
    fn explain(&mut self, flow: &Flow) -> Result<Explanation, ExplainError> {
        Session::explain(self, flow)
    }
}
