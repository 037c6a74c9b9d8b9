//! A family's desired IPVS state kept as per-service fragments with counts, so a sync of a few
//! changed services re-renders those only and hands the diff just the virtual servers,
//! addresses and set entries they touch (pure).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use super::render::{
    DesiredIpvs, Fragment, IpvsContext, RuleInputs, SETS, iptables_rules, render_service, set_name,
};
use crate::model::{NamespacedName, ProxyState};
use crate::sys::ipset::SetSpec;
use crate::sys::ipvs::VirtualServer;

type Reals = BTreeSet<SocketAddr>;
/// A virtual server as the aggregate keeps it: its key, itself, its real servers.
type StoredService = (String, VirtualServer, Arc<[SocketAddr]>);

/// A service's fragment as the aggregate keeps it: sorted slices without spare capacity (a
/// small BTreeMap takes a whole node: 6 KB a service at 10,000 services, against ~1 KB).
#[derive(Clone, Debug, Default)]
struct Stored {
    /// Virtual servers by key, sorted by key. Their real servers are shared: a service's
    /// ClusterIP and NodePort usually have the same.
    services: Box<[StoredService]>,
    bound: Box<[IpAddr]>,
    entries: Box<[(&'static str, String)]>,
    no_node_access: Box<[(IpAddr, &'static str, u16)]>,
}

impl Stored {
    fn of(fragment: Fragment) -> Self {
        let mut shared: Vec<Arc<[SocketAddr]>> = Vec::new();
        let mut share = |reals: BTreeSet<SocketAddr>| {
            let reals: Arc<[SocketAddr]> = reals.into_iter().collect();
            match shared.iter().find(|known| **known == reals) {
                Some(known) => known.clone(),
                None => {
                    shared.push(reals.clone());
                    reals
                }
            }
        };
        Stored {
            services: fragment
                .services
                .into_iter()
                .map(|(key, (vs, reals))| (key, vs, share(reals)))
                .collect(),
            bound: fragment.bound.into_iter().collect(),
            entries: fragment.entries.into_iter().collect(),
            no_node_access: fragment.no_node_access.into_iter().collect(),
        }
    }

    fn service(&self, vs_key: &str) -> Option<(VirtualServer, Reals)> {
        let index = self
            .services
            .binary_search_by(|(key, _, _)| key.as_str().cmp(vs_key))
            .ok()?;
        let (_, vs, reals) = self.services.get(index)?;
        Some((vs.clone(), reals.iter().copied().collect()))
    }
}

/// Every service's fragment, and how many services need each piece.
#[derive(Clone, Debug, Default)]
pub struct Aggregate {
    fragments: BTreeMap<NamespacedName, Stored>,
    /// The services claiming each virtual server, by its key, in name order; two may claim one
    /// (the same external IP and port): the last by name wins, as in a full render.
    services: BTreeMap<String, Vec<NamespacedName>>,
    bound: BTreeMap<IpAddr, usize>,
    entries: BTreeMap<&'static str, BTreeMap<String, usize>>,
    no_node_access: BTreeMap<(IpAddr, &'static str, u16), usize>,
}

/// What replacing fragments touched: only these can differ from before.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Touched {
    pub services: BTreeSet<String>,
    pub bound: BTreeSet<IpAddr>,
    pub entries: BTreeSet<(&'static str, String)>,
}

impl Touched {
    /// Adds what `other` touched.
    pub fn extend(&mut self, other: Touched) {
        self.services.extend(other.services);
        self.bound.extend(other.bound);
        self.entries.extend(other.entries);
    }
}

fn count_up<K: Ord>(map: &mut BTreeMap<K, usize>, key: K) {
    *map.entry(key).or_default() += 1;
}

fn count_down<K: Ord>(map: &mut BTreeMap<K, usize>, key: &K) {
    if let Some(count) = map.get_mut(key) {
        *count -= 1;
        if *count == 0 {
            map.remove(key);
        }
    }
}

impl Aggregate {
    /// Renders every service of `state`.
    pub fn build(state: &ProxyState, ctx: &IpvsContext) -> Self {
        let mut aggregate = Aggregate::default();
        for (key, ports) in &state.services {
            aggregate.replace(
                key,
                render_service(Some(ports), state.endpoints.get(key), ctx),
            );
        }
        aggregate
    }

    /// Re-renders one service from `state` (gone if it is not there any more).
    pub fn rerender(
        &mut self,
        key: &NamespacedName,
        state: &ProxyState,
        ctx: &IpvsContext,
    ) -> Touched {
        let fragment = render_service(state.services.get(key), state.endpoints.get(key), ctx);
        self.replace(key, fragment)
    }

    fn replace(&mut self, key: &NamespacedName, fragment: Fragment) -> Touched {
        let mut touched = Touched::default();
        if let Some(old) = self.fragments.remove(key) {
            for (vs_key, _, _) in old.services.iter() {
                if let Some(claims) = self.services.get_mut(vs_key) {
                    claims.retain(|claim| claim != key);
                    if claims.is_empty() {
                        self.services.remove(vs_key);
                    }
                }
            }
            old.bound
                .iter()
                .for_each(|ip| count_down(&mut self.bound, ip));
            for (base, entry) in old.entries.iter() {
                if let Some(counts) = self.entries.get_mut(base) {
                    count_down(counts, entry);
                    if counts.is_empty() {
                        self.entries.remove(base);
                    }
                }
            }
            old.no_node_access
                .iter()
                .for_each(|n| count_down(&mut self.no_node_access, n));
            touched
                .services
                .extend(old.services.into_vec().into_iter().map(|(k, _, _)| k));
            touched.bound.extend(old.bound.iter().copied());
            touched.entries.extend(old.entries.into_vec());
        }
        for vs_key in fragment.services.keys() {
            let claims = self.services.entry(vs_key.clone()).or_default();
            if let Err(at) = claims.binary_search(key) {
                claims.insert(at, key.clone());
            }
        }
        fragment
            .bound
            .iter()
            .for_each(|ip| count_up(&mut self.bound, *ip));
        for (base, entry) in &fragment.entries {
            count_up(self.entries.entry(base).or_default(), entry.clone());
        }
        fragment
            .no_node_access
            .iter()
            .for_each(|n| count_up(&mut self.no_node_access, *n));
        touched.services.extend(fragment.services.keys().cloned());
        touched.bound.extend(fragment.bound.iter().copied());
        touched.entries.extend(fragment.entries.iter().cloned());
        if fragment != Fragment::default() {
            self.fragments.insert(key.clone(), Stored::of(fragment));
        }
        touched
    }

    /// The virtual server `vs_key` and its real servers, as the service that wins it wants them.
    fn service(&self, vs_key: &str) -> Option<(VirtualServer, Reals)> {
        let winner = self.services.get(vs_key)?.last()?;
        self.fragments.get(winner)?.service(vs_key)
    }

    fn iptables(&self, ctx: &IpvsContext) -> String {
        let inputs = RuleInputs {
            non_empty: self.entries.keys().copied().collect(),
            no_node_access: self.no_node_access.keys().collect(),
        };
        iptables_rules(ctx, &inputs)
    }

    fn spec(base: &str, ctx: &IpvsContext) -> Option<SetSpec> {
        SETS.iter()
            .find(|(name, _, _)| *name == base)
            .map(|(name, set_type, _)| SetSpec {
                name: set_name(name, ctx.common.family),
                set_type: *set_type,
                family: ctx.common.family,
            })
    }

    /// The whole desired state: every set of upstream's table (empty ones too), every virtual
    /// server and address.
    pub fn desired(&self, ctx: &IpvsContext) -> DesiredIpvs {
        DesiredIpvs {
            services: self
                .services
                .keys()
                .filter_map(|k| Some((k.clone(), self.service(k)?)))
                .collect(),
            bound: self.bound.keys().copied().collect(),
            sets: SETS
                .iter()
                .filter_map(|(base, _, _)| {
                    let entries = self
                        .entries
                        .get(base)
                        .map(|counts| counts.keys().cloned().collect())
                        .unwrap_or_default();
                    Some((Self::spec(base, ctx)?, entries))
                })
                .collect(),
            iptables: self.iptables(ctx),
        }
    }

    /// The desired state restricted to what `touched` names: its virtual servers and addresses
    /// that are still wanted, and per set the touched entries that are still wanted (every set of
    /// the table appears, so the diff against an equally restricted current state is exact).
    pub fn desired_part(&self, ctx: &IpvsContext, touched: &Touched) -> DesiredIpvs {
        let mut sets: BTreeMap<SetSpec, BTreeSet<String>> = SETS
            .iter()
            .filter_map(|(base, _, _)| Some((Self::spec(base, ctx)?, BTreeSet::new())))
            .collect();
        for (base, entry) in &touched.entries {
            let wanted = self
                .entries
                .get(base)
                .is_some_and(|counts| counts.contains_key(entry));
            if let (true, Some(spec)) = (wanted, Self::spec(base, ctx))
                && let Some(entries) = sets.get_mut(&spec)
            {
                entries.insert(entry.clone());
            }
        }
        DesiredIpvs {
            services: touched
                .services
                .iter()
                .filter_map(|k| Some((k.clone(), self.service(k)?)))
                .collect(),
            bound: touched
                .bound
                .iter()
                .filter(|ip| self.bound.contains_key(ip))
                .copied()
                .collect(),
            sets,
            iptables: self.iptables(ctx),
        }
    }
}

/// Renders one family (every service, through an aggregate).
pub fn render(state: &ProxyState, ctx: &IpvsContext) -> DesiredIpvs {
    Aggregate::build(state, ctx).desired(ctx)
}

#[cfg(test)]
mod tests;
