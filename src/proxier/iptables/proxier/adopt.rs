//! Adoption: before a full sync writes anything it reads back how our chains hold their rules
//! (on nft: over netlink, one chain at a time, our chains only) and leaves alone every chain
//! that already holds exactly what it would write. A restart onto a node an earlier run
//! programmed rewrites nothing that is right, and the hourly full sync, or one after a failure,
//! rewrites only what differs. Upstream rewrites everything each time.
//!
//! Service chains must hold their rules in order. The shared chains that services add rules to
//! (KUBE-SERVICES, KUBE-NODEPORTS, ...) may hold them in any order, as partial syncs leave
//! them, but the rules that must stay last (the jump to KUBE-NODEPORTS) must be last.

use std::collections::{BTreeMap, BTreeSet};

use super::super::render::{
    BaseRules, KUBE_MARK_MASQ, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_PROXY_CANARY,
    KUBE_SERVICES, Rule, ServiceRules,
};
use super::super::restore::KeptChains;
use super::IptablesProxier;
use crate::model::{IpFamily, NamespacedName};
use crate::sys::iptables::{Iptables, IptablesError, RuleFingerprint};

/// What one chain should hold: rules in any order, then rules in this order.
#[derive(Default)]
struct Wanted<'a> {
    any_order: Vec<&'a str>,
    in_order: Vec<&'a str>,
}

impl<'a> Wanted<'a> {
    fn in_order(rules: impl IntoIterator<Item = &'a str>) -> Self {
        Wanted {
            any_order: Vec::new(),
            in_order: rules.into_iter().collect(),
        }
    }

    /// Whether `held` (the kernel's rules, in order) is what is wanted; a rule whose kernel
    /// form cannot be told makes the chain look different.
    fn is_held(&self, held: &[RuleFingerprint], expect: impl Fn(&str) -> Option<RuleFingerprint>) -> bool {
        if held.len() != self.any_order.len() + self.in_order.len() {
            return false;
        }
        let (unordered, ordered) = held.split_at(self.any_order.len());
        let ordered_ok = self
            .in_order
            .iter()
            .zip(ordered)
            .all(|(spec, held)| expect(spec) == Some(*held));
        if !ordered_ok {
            return false;
        }
        let Some(mut wanted) = self
            .any_order
            .iter()
            .map(|spec| expect(spec))
            .collect::<Option<Vec<_>>>()
        else {
            return false;
        };
        let mut unordered = unordered.to_vec();
        wanted.sort_unstable();
        unordered.sort_unstable();
        wanted == unordered
    }
}

impl<I: Iptables> IptablesProxier<I> {
    /// The chains of ours in `family` that already hold what a full sync of `base` and
    /// `services` writes; `nat_chains` are nat's chain names. Nothing is kept where the back
    /// end cannot read chains one at a time.
    pub(super) fn kept_chains(
        &mut self,
        family: IpFamily,
        base: &BaseRules,
        services: &BTreeMap<NamespacedName, ServiceRules>,
        nat_chains: &BTreeSet<String>,
    ) -> Result<KeptChains, IptablesError> {
        let mut wanted_nat: BTreeMap<&str, Wanted<'_>> = BTreeMap::new();
        for service in services.values() {
            for (chain, rules) in &service.chains {
                if nat_chains.contains(chain) {
                    wanted_nat.insert(chain, Wanted::in_order(rules.iter().map(String::as_str)));
                }
            }
        }
        let shared_nat = [KUBE_SERVICES, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_MARK_MASQ];
        for chain in shared_nat.into_iter().chain([KUBE_PROXY_CANARY]) {
            if nat_chains.contains(chain) {
                wanted_nat.insert(chain, shared(chain, &base.nat, services, |s| &s.nat));
            }
        }
        if let Some(wanted) = wanted_nat.get_mut(KUBE_SERVICES) {
            wanted
                .in_order
                .extend(base.nat_services_tail.iter().map(|r| r.spec.as_str()));
        }
        let mut kept = KeptChains::default();
        let Some(nat) = self.held_alike(family, "nat", &wanted_nat)? else {
            return Ok(kept);
        };
        kept.nat = nat;

        let filter_chains = self.iptables.chain_names(family, "filter")?;
        let wanted_filter: BTreeMap<&str, Wanted<'_>> = base
            .filter_chains()
            .into_iter()
            .chain([KUBE_PROXY_CANARY])
            .filter(|chain| filter_chains.contains(*chain))
            .map(|chain| (chain, shared(chain, &base.filter, services, |s| &s.filter)))
            .collect();
        kept.filter = self.held_alike(family, "filter", &wanted_filter)?.unwrap_or_default();

        if self.iptables.chain_names(family, "mangle")?.contains(KUBE_PROXY_CANARY) {
            let canary = BTreeMap::from([(KUBE_PROXY_CANARY, Wanted::default())]);
            kept.mangle = self.held_alike(family, "mangle", &canary)?.unwrap_or_default();
        }
        Ok(kept)
    }

    /// Which of `wanted`'s chains (all existing) of `table` hold what is wanted; `None` when
    /// the back end cannot tell.
    fn held_alike(
        &mut self,
        family: IpFamily,
        table: &str,
        wanted: &BTreeMap<&str, Wanted<'_>>,
    ) -> Result<Option<BTreeSet<String>>, IptablesError> {
        let chains: Vec<&str> = wanted.keys().copied().collect();
        let Some(held) = self.iptables.chain_fingerprints(family, table, &chains)? else {
            return Ok(None);
        };
        let iptables = &self.iptables;
        let expect = |spec: &str| iptables.expected_fingerprint(family, spec);
        Ok(Some(
            wanted
                .iter()
                .filter(|(chain, wanted)| {
                    held.get(**chain)
                        .is_some_and(|rules| wanted.is_held(rules, expect))
                })
                .map(|(chain, _)| chain.to_string())
                .collect(),
        ))
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
