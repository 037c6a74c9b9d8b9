//! Adoption: before a full sync writes anything it reads back how our chains hold their rules
//! (on nft over netlink, one chain at a time, our chains only; on legacy from the table read
//! once) and leaves alone every chain that already holds exactly what it would write. A
//! restart onto a node an earlier run programmed rewrites nothing that is right, and the
//! hourly full sync, or one after a failure, rewrites only what differs. Upstream rewrites
//! everything each time.
//!
//! Where each chain is a kernel request of its own (nft), the endpoint chains (nine in ten at
//! 10,000 services x 10 endpoints) are not read at a full sync when their service's other
//! chains already hold what they should: an endpoint chain's name is a hash of its service
//! port, protocol and endpoint, and what else shapes it (session affinity) shows in the
//! service's chain. They are kept, and checked by the syncs that follow, a chunk at a time;
//! one that differs is rewritten there, as drift is. A restart then reads a tenth of the chains.
//!
//! Service chains must hold their rules in order. The shared chains that services add rules to
//! (KUBE-SERVICES, KUBE-NODEPORTS, ...) may hold them in any order, as partial syncs leave
//! them, but the rules that must stay last (the jump to KUBE-NODEPORTS) must be last.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use tracing::{info, warn};

use super::super::names::SEP_PREFIX;
use super::super::plan::{ChainSet, KeptChains};
use super::super::render::{
    BaseRules, KUBE_MARK_MASQ, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_PROXY_CANARY, KUBE_SERVICES,
    Rule, ServiceRules, render_service,
};
use super::{Failure, IptablesMode};
use crate::model::{IpFamily, NamespacedName, ProxyState};
use crate::proxier::quarantine::Quarantine;
use crate::sys::xtables::{Iptables, IptablesError, RuleFingerprint, RuleFingerprinter};

/// Endpoint chains a full sync kept by name, with their services: not read yet.
pub(super) type Trusted = Vec<(NamespacedName, String)>;

/// How many endpoint chains kept by name one sync checks (a fifth of a second's reading).
pub(super) const CHECKED_PER_SYNC: usize = 20_000;

/// What one chain should hold: rules in any order, then rules in this order.
#[derive(Default)]
struct Wanted<'a> {
    any_order: Vec<&'a str>,
    in_order: Vec<&'a str>,
}

/// [`Wanted`] as fingerprints: the unordered ones sorted.
struct Expected {
    any_order: Vec<RuleFingerprint>,
    in_order: Vec<RuleFingerprint>,
}

impl<'a> Wanted<'a> {
    /// A service's own chain: `rules` in this order.
    fn in_order(rules: &'a [String]) -> Self {
        Wanted {
            any_order: Vec::new(),
            in_order: rules.iter().map(String::as_str).collect(),
        }
    }

    /// Its fingerprints; `None` when a rule's kernel form cannot be told (the chain then never
    /// looks already right).
    fn expected(&self, family: IpFamily, fingerprint: RuleFingerprinter) -> Option<Expected> {
        let of = |specs: &[&str]| -> Option<Vec<RuleFingerprint>> {
            specs.iter().map(|spec| fingerprint(family, spec)).collect()
        };
        let mut any_order = of(&self.any_order)?;
        any_order.sort_unstable();
        Some(Expected {
            any_order,
            in_order: of(&self.in_order)?,
        })
    }
}

impl Expected {
    /// Whether `held` (the kernel's rules, in order) is what is wanted.
    fn is_held(&self, held: &[RuleFingerprint]) -> bool {
        if held.len() != self.any_order.len() + self.in_order.len() {
            return false;
        }
        let (unordered, ordered) = held.split_at(self.any_order.len());
        if ordered != self.in_order.as_slice() {
            return false;
        }
        let mut unordered = unordered.to_vec();
        unordered.sort_unstable();
        unordered == self.any_order
    }
}

impl<I: Iptables> IptablesMode<I> {
    /// The chains of ours in `family` that already hold what a full sync of `base` and
    /// `services` writes; `nat_chains` are nat's chain names. Nothing is kept where the back
    /// end cannot tell how the kernel holds a rule. Also the endpoint chains kept by name
    /// without being read (see the module's docs), with their services.
    pub(super) fn kept_chains(
        &mut self,
        family: IpFamily,
        base: &BaseRules,
        services: &BTreeMap<NamespacedName, ServiceRules>,
        nat_chains: &BTreeSet<String>,
    ) -> Result<(KeptChains, Trusted), IptablesError> {
        let mut kept = KeptChains::default();
        let Some(fingerprint) = self.iptables.rule_fingerprinter() else {
            return Ok((kept, Vec::new()));
        };
        let defer_endpoints = self.iptables.reads_each_chain();
        // Looked up 120,000 times at 10,000 services: hashed.
        let nat_chains: HashSet<&str, ahash::RandomState> =
            nat_chains.iter().map(String::as_str).collect();
        let mut wanted_nat: Vec<(&str, Wanted<'_>)> = Vec::new();
        // Per service, its endpoint chains that exist, read only if its other chains differ.
        let mut endpoint_chains: Vec<(&NamespacedName, Vec<(&str, Wanted<'_>)>)> = Vec::new();
        for (key, service) in services {
            let mut endpoints = Vec::new();
            for (chain, rules) in &service.chains {
                if !nat_chains.contains(chain.as_str()) {
                    continue;
                }
                let chain_wanted = Wanted::in_order(rules);
                if defer_endpoints && chain.starts_with(SEP_PREFIX) {
                    endpoints.push((chain.as_str(), chain_wanted));
                } else {
                    wanted_nat.push((chain.as_str(), chain_wanted));
                }
            }
            if !endpoints.is_empty() {
                endpoint_chains.push((key, endpoints));
            }
        }
        let shared_nat = [
            KUBE_SERVICES,
            KUBE_NODEPORTS,
            KUBE_POSTROUTING,
            KUBE_MARK_MASQ,
        ];
        for chain in shared_nat.into_iter().chain([KUBE_PROXY_CANARY]) {
            if nat_chains.contains(chain) {
                let mut wanted = shared(chain, &base.nat, services, |s| &s.nat);
                if chain == KUBE_SERVICES {
                    let tail = base.nat_services_tail.iter().map(|r| r.spec.as_str());
                    wanted.in_order.extend(tail);
                }
                wanted_nat.push((chain, wanted));
            }
        }
        kept.nat = self.held_alike(family, "nat", &wanted_nat, fingerprint)?;

        // Endpoint chains: kept by name where every other chain of their service exists and
        // is kept, read now where not.
        let mut trusted = Vec::new();
        let mut to_read = Vec::new();
        for (key, endpoints) in endpoint_chains {
            let service = &services[key];
            let others_right = service
                .chains
                .keys()
                .filter(|chain| !chain.starts_with(SEP_PREFIX))
                .all(|chain| kept.nat.contains(chain.as_str()));
            if others_right {
                trusted.extend(
                    endpoints
                        .iter()
                        .map(|(chain, _)| (key.clone(), chain.to_string())),
                );
            } else {
                to_read.extend(endpoints);
            }
        }
        if !to_read.is_empty() {
            let alike = self.held_alike(family, "nat", &to_read, fingerprint)?;
            kept.nat.extend(alike);
        }
        kept.nat
            .extend(trusted.iter().map(|(_, chain)| chain.clone()));

        // Looked up by name: listing filter's chains would walk nat's too.
        let mut wanted_filter = Vec::new();
        for chain in base.filter_chains().into_iter().chain([KUBE_PROXY_CANARY]) {
            if self.iptables.chain_exists(family, "filter", chain)? {
                wanted_filter.push((chain, shared(chain, &base.filter, services, |s| &s.filter)));
            }
        }
        kept.filter = self.held_alike(family, "filter", &wanted_filter, fingerprint)?;

        if self
            .iptables
            .chain_exists(family, "mangle", KUBE_PROXY_CANARY)?
        {
            let canary = [(KUBE_PROXY_CANARY, Wanted::default())];
            kept.mangle = self.held_alike(family, "mangle", &canary, fingerprint)?;
        }
        Ok((kept, trusted))
    }

    /// Checks up to [`CHECKED_PER_SYNC`] of the endpoint chains a full sync kept by name
    /// against what `state` renders for them; those that differ are marked for the repair
    /// that follows in the same sync. Whether some are left for the next sync.
    pub(super) fn check_trusted(
        &mut self,
        family: IpFamily,
        state: &ProxyState,
        quarantine: &Quarantine,
    ) -> Result<bool, Failure> {
        let Some(pending) = self.unverified.get_mut(&family) else {
            return Ok(false);
        };
        let batch = pending.split_off(pending.len().saturating_sub(CHECKED_PER_SYNC));
        let left = !pending.is_empty();
        if !left {
            self.unverified.remove(&family);
        }
        let (Some(programmed), Some(fingerprint)) = (
            self.programmed.get(&family),
            self.iptables.rule_fingerprinter(),
        ) else {
            return Ok(left);
        };
        // Each service rendered once, from the state this sync has just programmed; a chain
        // the service no longer has was deleted by the sync that dropped it.
        let mut rendered: BTreeMap<&NamespacedName, ServiceRules> = BTreeMap::new();
        for (key, _) in &batch {
            if rendered.contains_key(key) || quarantine.contains(key) {
                continue;
            }
            if let Some(ports) = state.services.get(key) {
                let rules = render_service(ports, state.endpoints.get(key), &programmed.ctx);
                rendered.insert(key, rules);
            }
        }
        let wanted: Vec<(&str, Wanted<'_>)> = batch
            .iter()
            .filter_map(|(key, chain)| {
                let rules = rendered.get(key)?.chains.get(chain)?;
                programmed.services.get(key)?.chain(chain)?;
                Some((chain.as_str(), Wanted::in_order(rules)))
            })
            .collect();
        // A chain gone since reads as empty: it differs, and the repair writes it.
        let alike = self
            .held_alike(family, "nat", &wanted, fingerprint)
            .map_err(Failure::unattributed)?;
        let differing: BTreeSet<(String, String)> = wanted
            .iter()
            .filter(|(chain, _)| !alike.contains(*chain))
            .map(|(chain, _)| ("nat".to_string(), chain.to_string()))
            .collect();
        if differing.is_empty() {
            info!(
                family = family.name(),
                chains = batch.len(),
                "Checked endpoint chains a full sync kept by name: all as they should be"
            );
        } else {
            warn!(
                family = family.name(),
                chains = batch.len(),
                differing = differing.len(),
                "Endpoint chains a full sync kept by name differ; rewriting them"
            );
            self.drifted.entry(family).or_default().extend(differing);
        }
        Ok(left)
    }

    /// Which of `wanted`'s chains (all existing) of `table` hold what is wanted. What is wanted
    /// is fingerprinted on one thread while the kernel's rules are read on the others.
    fn held_alike(
        &mut self,
        family: IpFamily,
        table: &str,
        wanted: &[(&str, Wanted<'_>)],
        fingerprint: RuleFingerprinter,
    ) -> Result<ChainSet, IptablesError> {
        let chains: Vec<&str> = wanted.iter().map(|(chain, _)| *chain).collect();
        let iptables = &mut self.iptables;
        let expect = || {
            wanted
                .iter()
                .map(|(_, wanted)| wanted.expected(family, fingerprint))
                .collect::<Vec<_>>()
        };
        // (Here, after the read, if no thread can be had.)
        let (expected, held) = std::thread::scope(|scope| {
            let expected = std::thread::Builder::new()
                .name("iptables-expect".into())
                .spawn_scoped(scope, expect);
            let held = iptables.chain_fingerprints(family, table, &chains);
            let expected = match expected {
                Ok(thread) => thread.join(),
                Err(_) => Ok(expect()),
            };
            (expected, held)
        });
        let expected = expected.map_err(|_| IptablesError::ReaderPanicked)?;
        let Some(held) = held? else {
            return Ok(ChainSet::default());
        };
        Ok(chains
            .iter()
            .zip(expected)
            .zip(held)
            .filter(|((_, expected), rules)| {
                expected
                    .as_ref()
                    .is_some_and(|expected| expected.is_held(rules))
            })
            .map(|((chain, _), _)| chain.to_string())
            .collect())
    }
}

/// What a shared chain should hold: the services' rules in it (any order), then the base rules
/// in it (in order).
fn shared<'a>(
    chain: &str,
    base_rules: &'a [Rule],
    services: &'a BTreeMap<NamespacedName, ServiceRules>,
    of: impl Fn(&'a ServiceRules) -> &'a Vec<Rule>,
) -> Wanted<'a> {
    Wanted {
        any_order: services
            .values()
            .flat_map(of)
            .filter(|rule| rule.chain == chain)
            .map(|rule| rule.spec.as_str())
            .collect(),
        in_order: base_rules
            .iter()
            .filter(|rule| rule.chain == chain)
            .map(|rule| rule.spec.as_str())
            .collect(),
    }
}
