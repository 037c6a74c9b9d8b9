//! What to change: the kernel's IPVS state as observed, against the desired state, as a list of
//! operations (pure, so it can be tested without a kernel). Real servers that go away are drained
//! as upstream does: a TCP real server with connections left is set to weight 0 and deleted by a
//! later sync once they are gone; UDP and SCTP ones are deleted at once.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use super::render::DesiredIpvs;
use crate::model::{IpFamily, Protocol};
use crate::sys::ipvs::{RealServer, VirtualServer};

/// The kernel's IPVS state as read at the start of a sync.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// Virtual servers by key, with their real servers.
    pub services: BTreeMap<String, (VirtualServer, Vec<RealServer>)>,
    /// Addresses on kube-ipvs0.
    pub bound: BTreeSet<IpAddr>,
}

/// One change to make.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operation {
    AddService(VirtualServer),
    UpdateService(VirtualServer),
    DeleteService(VirtualServer),
    AddReal(VirtualServer, RealServer),
    /// Set a real server's weight (1 to revive a draining one, 0 to drain).
    UpdateReal(VirtualServer, RealServer),
    DeleteReal(VirtualServer, RealServer),
    Bind(IpAddr),
    Unbind(IpAddr),
}

fn real(address: &SocketAddr, weight: u32) -> RealServer {
    RealServer::new(address.ip(), address.port(), weight)
}

/// The operations that take `observed` to `desired`. Virtual servers that are not desired are
/// deleted only if `owned` says the address is ours (bound on kube-ipvs0, a node address we
/// serve NodePorts on, or one we programmed), so other IPVS users on the node are left alone.
/// With a `family`, addresses of other families on kube-ipvs0 are left to their own sync.
pub fn diff(
    desired: &DesiredIpvs,
    observed: &Observed,
    owned: &dyn Fn(&VirtualServer) -> bool,
    family: Option<IpFamily>,
) -> Vec<Operation> {
    let mut ops = Vec::new();
    // Addresses first: a virtual server on a bound address answers as soon as it exists.
    for ip in desired.bound.difference(&observed.bound) {
        ops.push(Operation::Bind(*ip));
    }
    for (key, (vs, reals)) in &desired.services {
        let Some((current, current_reals)) = observed.services.get(key) else {
            ops.push(Operation::AddService(vs.clone()));
            ops.extend(
                reals
                    .iter()
                    .map(|r| Operation::AddReal(vs.clone(), real(r, 1))),
            );
            continue;
        };
        if current != vs {
            ops.push(Operation::UpdateService(vs.clone()));
        }
        let by_address: BTreeMap<SocketAddr, &RealServer> = current_reals
            .iter()
            .map(|r| (SocketAddr::new(r.address, r.port), r))
            .collect();
        for address in reals {
            match by_address.get(address) {
                None => ops.push(Operation::AddReal(vs.clone(), real(address, 1))),
                Some(existing) if existing.weight != 1 => {
                    ops.push(Operation::UpdateReal(vs.clone(), real(address, 1)))
                }
                Some(_) => {}
            }
        }
        for (address, existing) in &by_address {
            if reals.contains(address) {
                continue;
            }
            let draining =
                vs.protocol == Protocol::Tcp && existing.active_conns + existing.inactive_conns > 0;
            if !draining {
                ops.push(Operation::DeleteReal(vs.clone(), (*existing).clone()));
            } else if existing.weight != 0 {
                ops.push(Operation::UpdateReal(vs.clone(), real(address, 0)));
            }
        }
    }
    for (key, (vs, _)) in &observed.services {
        if !desired.services.contains_key(key) && owned(vs) {
            ops.push(Operation::DeleteService(vs.clone()));
        }
    }
    for ip in observed.bound.difference(&desired.bound) {
        if family.is_none_or(|family| IpFamily::of(ip) == family) {
            ops.push(Operation::Unbind(*ip));
        }
    }
    ops
}

impl Observed {
    /// What the kernel holds once `operations` (computed against `self`) have been applied, so a
    /// later sync can diff against it without reading the kernel again.
    pub fn apply(&mut self, operations: &[Operation]) {
        for op in operations {
            match op {
                Operation::Bind(ip) => {
                    self.bound.insert(*ip);
                }
                Operation::Unbind(ip) => {
                    self.bound.remove(ip);
                }
                Operation::AddService(vs) | Operation::UpdateService(vs) => {
                    let entry = self
                        .services
                        .entry(vs.key())
                        .or_insert_with(|| (vs.clone(), Vec::new()));
                    entry.0 = vs.clone();
                }
                Operation::DeleteService(vs) => {
                    self.services.remove(&vs.key());
                }
                Operation::AddReal(vs, rs) | Operation::UpdateReal(vs, rs) => {
                    if let Some((_, reals)) = self.services.get_mut(&vs.key()) {
                        match reals
                            .iter_mut()
                            .find(|r| r.address == rs.address && r.port == rs.port)
                        {
                            // Connection counts stay as last read: they decide draining.
                            Some(existing) => existing.weight = rs.weight,
                            None => reals.push(rs.clone()),
                        }
                    }
                }
                Operation::DeleteReal(vs, rs) => {
                    if let Some((_, reals)) = self.services.get_mut(&vs.key()) {
                        reals.retain(|r| r.address != rs.address || r.port != rs.port);
                    }
                }
            }
        }
        // Kept until the next sync: no spare capacity (a third of a node's IPVS memory).
        for (_, reals) in self.services.values_mut() {
            reals.shrink_to_fit();
        }
    }

    /// Only the named virtual servers and addresses: what a sync of a few services diffs against.
    pub fn restricted(&self, services: &BTreeSet<String>, bound: &BTreeSet<IpAddr>) -> Observed {
        Observed {
            services: services
                .iter()
                .filter_map(|key| Some((key.clone(), self.services.get(key)?.clone())))
                .collect(),
            bound: self.bound.intersection(bound).copied().collect(),
        }
    }

    /// Virtual servers with a real server at weight 0: their connection counts must be read
    /// again to know when the draining is over.
    pub fn draining(&self) -> Vec<VirtualServer> {
        self.services
            .values()
            .filter(|(_, reals)| reals.iter().any(|r| r.weight == 0))
            .map(|(vs, _)| vs.clone())
            .collect()
    }

    /// Whether the kernel's virtual servers (without their real servers) and bound addresses are
    /// still those of `self`: the cheap check for state removed or added behind our back.
    pub fn same_outline(&self, services: &[VirtualServer], bound: &BTreeSet<IpAddr>) -> bool {
        &self.bound == bound
            && self.services.len() == services.len()
            && services.iter().all(|vs| {
                self.services
                    .get(&vs.key())
                    .is_some_and(|(known, _)| known == vs)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vs(address: &str, port: u16) -> VirtualServer {
        VirtualServer {
            address: address.parse().unwrap(),
            protocol: Protocol::Tcp,
            port,
            scheduler: "rr".into(),
            flags: 0,
            timeout: 0,
        }
    }

    fn rs(address: &str, port: u16, weight: u32, conns: u32) -> RealServer {
        RealServer {
            active_conns: conns,
            ..RealServer::new(address.parse().unwrap(), port, weight)
        }
    }

    fn desired(services: &[(VirtualServer, &[&str])], bound: &[&str]) -> DesiredIpvs {
        DesiredIpvs {
            services: services
                .iter()
                .map(|(vs, reals)| {
                    (
                        vs.key(),
                        (
                            vs.clone(),
                            reals.iter().map(|r| r.parse().unwrap()).collect(),
                        ),
                    )
                })
                .collect(),
            bound: bound.iter().map(|ip| ip.parse().unwrap()).collect(),
            ..DesiredIpvs::default()
        }
    }

    fn observed(services: Vec<(VirtualServer, Vec<RealServer>)>, bound: &[&str]) -> Observed {
        Observed {
            services: services
                .into_iter()
                .map(|(vs, reals)| (vs.key(), (vs, reals)))
                .collect(),
            bound: bound.iter().map(|ip| ip.parse().unwrap()).collect(),
        }
    }

    #[test]
    fn a_family_sync_leaves_the_other_familys_addresses() {
        let want = desired(&[], &["10.96.0.10"]);
        let mut kernel = Observed::default();
        kernel.bound.insert("10.96.0.11".parse().unwrap());
        kernel.bound.insert("fd00::11".parse().unwrap());
        let unbind = |ip: &str| Operation::Unbind(ip.parse().unwrap());
        let bind = Operation::Bind("10.96.0.10".parse().unwrap());
        assert_eq!(
            diff(&want, &kernel, &|_| true, Some(IpFamily::V4)),
            vec![bind.clone(), unbind("10.96.0.11")]
        );
        assert_eq!(
            diff(&want, &kernel, &|_| true, None),
            vec![bind, unbind("10.96.0.11"), unbind("fd00::11")]
        );
    }

    #[test]
    fn empty_node_gets_everything() {
        let want = desired(
            &[(
                vs("10.96.0.10", 80),
                &["10.244.1.5:8080", "10.244.1.6:8080"],
            )],
            &["10.96.0.10"],
        );
        let ops = diff(&want, &Observed::default(), &|_| true, None);
        assert_eq!(
            ops,
            vec![
                Operation::Bind("10.96.0.10".parse().unwrap()),
                Operation::AddService(vs("10.96.0.10", 80)),
                Operation::AddReal(vs("10.96.0.10", 80), rs("10.244.1.5", 8080, 1, 0)),
                Operation::AddReal(vs("10.96.0.10", 80), rs("10.244.1.6", 8080, 1, 0)),
            ]
        );
        let converged = observed(
            vec![(
                vs("10.96.0.10", 80),
                vec![rs("10.244.1.5", 8080, 1, 3), rs("10.244.1.6", 8080, 1, 0)],
            )],
            &["10.96.0.10"],
        );
        assert!(
            diff(&want, &converged, &|_| true, None).is_empty(),
            "converged: nothing to do"
        );
    }

    #[test]
    fn removed_real_servers_drain_before_deletion() {
        let want = desired(
            &[(vs("10.96.0.10", 80), &["10.244.1.5:8080"])],
            &["10.96.0.10"],
        );
        let busy = observed(
            vec![(
                vs("10.96.0.10", 80),
                vec![rs("10.244.1.5", 8080, 1, 0), rs("10.244.1.6", 8080, 1, 2)],
            )],
            &["10.96.0.10"],
        );
        assert_eq!(
            diff(&want, &busy, &|_| true, None),
            vec![Operation::UpdateReal(
                vs("10.96.0.10", 80),
                rs("10.244.1.6", 8080, 0, 0)
            )]
        );
        let draining = observed(
            vec![(
                vs("10.96.0.10", 80),
                vec![rs("10.244.1.5", 8080, 1, 0), rs("10.244.1.6", 8080, 0, 1)],
            )],
            &["10.96.0.10"],
        );
        assert!(
            diff(&want, &draining, &|_| true, None).is_empty(),
            "still draining: wait"
        );
        let drained = observed(
            vec![(
                vs("10.96.0.10", 80),
                vec![rs("10.244.1.5", 8080, 1, 0), rs("10.244.1.6", 8080, 0, 0)],
            )],
            &["10.96.0.10"],
        );
        assert_eq!(
            diff(&want, &drained, &|_| true, None),
            vec![Operation::DeleteReal(
                vs("10.96.0.10", 80),
                rs("10.244.1.6", 8080, 0, 0)
            )]
        );
        // An endpoint that comes back while draining is revived.
        let back = desired(
            &[(
                vs("10.96.0.10", 80),
                &["10.244.1.5:8080", "10.244.1.6:8080"],
            )],
            &["10.96.0.10"],
        );
        assert_eq!(
            diff(&back, &draining, &|_| true, None),
            vec![Operation::UpdateReal(
                vs("10.96.0.10", 80),
                rs("10.244.1.6", 8080, 1, 0)
            )]
        );
        // UDP real servers go at once.
        let mut udp = vs("10.96.0.53", 53);
        udp.protocol = Protocol::Udp;
        let want = desired(&[(udp.clone(), &[])], &[]);
        let busy = observed(vec![(udp.clone(), vec![rs("10.244.1.9", 53, 1, 5)])], &[]);
        assert_eq!(
            diff(&want, &busy, &|_| true, None),
            vec![Operation::DeleteReal(udp, rs("10.244.1.9", 53, 1, 5))]
        );
    }

    #[test]
    fn applying_operations_to_the_observed_state_converges() {
        let want = desired(
            &[
                (
                    vs("10.96.0.10", 80),
                    &["10.244.1.5:8080", "10.244.1.7:8080"],
                ),
                (vs("10.96.0.11", 80), &["10.244.1.8:8080"]),
            ],
            &["10.96.0.10", "10.96.0.11"],
        );
        let mut state = observed(
            vec![
                (
                    vs("10.96.0.10", 80),
                    vec![rs("10.244.1.5", 8080, 1, 0), rs("10.244.1.6", 8080, 1, 2)],
                ),
                (vs("10.96.0.12", 80), vec![rs("10.244.1.9", 8080, 1, 0)]),
            ],
            &["10.96.0.10", "10.96.0.12"],
        );
        let ops = diff(&want, &state, &|_| true, None);
        state.apply(&ops);
        assert_eq!(
            diff(&want, &state, &|_| true, None),
            vec![],
            "nothing left to do after applying"
        );
        assert_eq!(state.draining(), vec![vs("10.96.0.10", 80)]);
        let outline: Vec<VirtualServer> = state.services.values().map(|(v, _)| v.clone()).collect();
        assert!(state.same_outline(&outline, &state.bound.clone()));
        assert!(!state.same_outline(&outline[..1], &state.bound.clone()));
        assert!(!state.same_outline(&outline, &BTreeSet::new()));
    }

    #[test]
    fn changed_and_stale_services_and_foreign_ones_left_alone() {
        let mut sticky = vs("10.96.0.10", 80);
        sticky.flags = 1;
        sticky.timeout = 600;
        let want = desired(&[(sticky.clone(), &[])], &["10.96.0.10"]);
        let current = observed(
            vec![
                (vs("10.96.0.10", 80), vec![]),
                (vs("10.96.0.99", 80), vec![]),
                (vs("172.17.0.1", 8080), vec![]),
            ],
            &["10.96.0.10", "10.96.0.99"],
        );
        let ours = |v: &VirtualServer| v.address.to_string().starts_with("10.96.");
        assert_eq!(
            diff(&want, &current, &ours, None),
            vec![
                Operation::UpdateService(sticky),
                Operation::DeleteService(vs("10.96.0.99", 80)),
                Operation::Unbind("10.96.0.99".parse().unwrap()),
            ]
        );
    }
}
