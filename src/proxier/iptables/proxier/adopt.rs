//! Adoption: before a full sync writes anything it reads back how our chains hold their rules
//! (on nft over netlink, one chain at a time, our chains only; on legacy from the table read
//! once) and leaves alone every chain that already holds exactly what it would write. A restart onto a node an earlier run
//! programmed rewrites nothing that is right, and the hourly full sync, or one after a failure,
//! rewrites only what differs. Upstream rewrites everything each time.
//!
//! Service chains must hold their rules in order. The shared chains that services add rules to
//! (KUBE-SERVICES, KUBE-NODEPORTS, ...) may hold them in any order, as partial syncs leave
//! them, but the rules that must stay last (the jump to KUBE-NODEPORTS) must be last.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::super::render::{
    BaseRules, KUBE_MARK_MASQ, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_PROXY_CANARY, KUBE_SERVICES,
    Rule, ServiceRules,
};
use super::super::restore::{ChainSet, KeptChains};
use super::IptablesProxier;
use crate::model::{IpFamily, NamespacedName};
use crate::sys::iptables::{Iptables, IptablesError, RuleFingerprint, RuleFingerprinter};

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

impl Wanted<'_> {
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

impl<I: Iptables> IptablesProxier<I> {
    /// The chains of ours in `family` that already hold what a full sync of `base` and
    /// `services` writes; `nat_chains` are nat's chain names. Nothing is kept where the back
    /// end cannot tell how the kernel holds a rule.
    pub(super) fn kept_chains(
        &mut self,
        family: IpFamily,
        base: &BaseRules,
        services: &BTreeMap<NamespacedName, ServiceRules>,
        nat_chains: &BTreeSet<String>,
    ) -> Result<KeptChains, IptablesError> {
        let mut kept = KeptChains::default();
        let Some(fingerprint) = self.iptables.rule_fingerprinter() else {
            return Ok(kept);
        };
        // Looked up 120,000 times at 10,000 services: hashed.
        let nat_chains: HashSet<&str, ahash::RandomState> =
            nat_chains.iter().map(String::as_str).collect();
        let mut wanted_nat: Vec<(&str, Wanted<'_>)> = Vec::new();
        for service in services.values() {
            for (chain, rules) in &service.chains {
                if nat_chains.contains(chain.as_str()) {
                    let wanted = Wanted {
                        any_order: Vec::new(),
                        in_order: rules.iter().map(String::as_str).collect(),
                    };
                    wanted_nat.push((chain, wanted));
                }
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
        Ok(kept)
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
        let (expected, held) = std::thread::scope(|scope| {
            let expected = scope.spawn(|| {
                wanted
                    .iter()
                    .map(|(_, wanted)| wanted.expected(family, fingerprint))
                    .collect::<Vec<_>>()
            });
            let held = iptables.chain_fingerprints(family, table, &chains);
            (expected.join(), held)
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
