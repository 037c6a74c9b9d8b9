//! One service port's objects, part by part, in upstream's order: its elements in the shared
//! maps (cluster IP, external and load-balancer IPs, NodePort), then its own chains (firewall,
//! external, the policy chains, and the endpoints' chains where session affinity needs them).

use std::fmt::Write as _;
use std::net::IpAddr;

use super::{
    CLUSTER_IPS, FIREWALL_IPS, HAIRPIN_CONNECTIONS, LOCALHOST_REJECT_PORTS, NO_ENDPOINT_NODEPORTS,
    NO_ENDPOINT_SERVICES, NftContext, Objects, REJECT_CHAIN, SERVICE_IPS, SERVICE_NODEPORTS,
    SetDef, quoted,
};
use crate::model::{Endpoint, ServicePort};
use crate::proxier::nftables::names::{self, PortChains};
use crate::proxier::nftables::slots::{DRAWS, Placement, SlotTable};
use crate::proxier::nftables::text::{self, ElementText};
use crate::proxier::policy::{PortPolicy, Refusal};

/// The longest comment nft accepts.
const MAX_COMMENT: usize = 128;

/// A port and what every part of its objects needs.
pub(super) struct Port<'a> {
    port: &'a ServicePort,
    ctx: &'a NftContext,
    policy: PortPolicy<'a>,
    /// [`NftContext::local_matches`], worked out once per service.
    local_matches: Option<&'a (String, String)>,
    chains: PortChains,
    ip: &'static str,
    proto: &'static str,
    cluster_ip: IpAddr,
    /// What traffic without an endpoint it may use meets: reject when the port has no
    /// endpoints at all, drop when it has some, but none this traffic may use.
    internal_refusal: Option<String>,
    external_refusal: Option<String>,
}

impl<'a> Port<'a> {
    pub(super) fn new(
        port: &'a ServicePort,
        endpoints: &'a [Endpoint],
        ctx: &'a NftContext,
        local_matches: Option<&'a (String, String)>,
    ) -> Self {
        let policy = PortPolicy::new(port, endpoints, ctx.common.node());
        let verdict = |refusal: Refusal| match refusal {
            Refusal::Reject => format!("goto {REJECT_CHAIN}"),
            Refusal::Drop => "drop".to_string(),
        };
        Port {
            internal_refusal: policy.internal_refusal().map(verdict),
            external_refusal: policy.external_refusal().map(verdict),
            chains: names::port_chains(&port.name),
            ip: ctx.ip(),
            proto: port.name.protocol.lower(),
            cluster_ip: port.cluster_ips[0],
            port,
            ctx,
            policy,
            local_matches,
        }
    }

    /// Renders the port into `out`; its policy chains take their endpoint-map slots in `slots`.
    pub(super) fn render(&self, slots: &mut SlotTable, text: &mut ElementText, out: &mut Objects) {
        let (no_local_internal, no_local_external) = self.policy.no_local_endpoints();
        out.no_local_endpoints.0 += usize::from(no_local_internal);
        out.no_local_endpoints.1 += usize::from(no_local_external);
        self.cluster_ip(text, out);
        self.external_addresses(text, out);
        self.firewall_chain(text, out);
        self.node_port(text, out);
        self.external_chain(out);
        self.policy_chains(slots, text, out);
        self.endpoint_chains(text, out);
    }

    /// Only elements of services without usable endpoints carry it: the service port's name,
    /// cut to nft's 128 bytes as upstream 1.36 cuts it (kubernetes#139516; names of the longest
    /// a Service may have make 143).
    fn comment(&self) -> String {
        let mut name = self.port.name.to_string();
        if name.len() > MAX_COMMENT {
            let mut end = MAX_COMMENT;
            while !name.is_char_boundary(end) {
                end -= 1;
            }
            name.truncate(end);
        }
        quoted(&name)
    }

    fn policy_chain(&self, local: bool) -> &str {
        if local {
            &self.chains.local
        } else {
            &self.chains.service
        }
    }

    fn internal_chain(&self) -> &str {
        self.policy_chain(self.policy.internal_local)
    }

    fn affinity(&self) -> bool {
        self.port.session_affinity_seconds.is_some()
    }

    /// Cluster IP: always an active ClusterIP (traffic to its other ports is rejected).
    fn cluster_ip(&self, text: &mut ElementText, out: &mut Objects) {
        text.address_key(&self.cluster_ip)
            .add_into(out.elements_of(CLUSTER_IPS));
        text.service_key(&self.cluster_ip, self.proto, self.port.port);
        if self.policy.has_internal {
            text.rest(&[" : goto ", self.internal_chain()])
                .add_into(out.elements_of(SERVICE_IPS));
        } else if let Some(verdict) = &self.internal_refusal {
            text.rest(&[" comment ", &self.comment(), " : ", verdict])
                .add_into(out.elements_of(NO_ENDPOINT_SERVICES));
        }
    }

    /// External IPs and load-balancer IPs.
    fn external_addresses(&self, text: &mut ElementText, out: &mut Objects) {
        let port = self.port;
        for address in port.external_ips.iter().chain(&port.load_balancer_ips) {
            text.service_key(address, self.proto, port.port);
            if self.policy.has_endpoints {
                text.rest(&[" : goto ", &self.chains.external])
                    .add_into(out.elements_of(SERVICE_IPS));
            }
            if let Some(verdict) = &self.external_refusal {
                text.rest(&[" comment ", &self.comment(), " : ", verdict])
                    .add_into(out.elements_of(NO_ENDPOINT_SERVICES));
            }
        }
    }

    /// Load-balancer traffic filtered by source. The load balancer's own IPs are allowed too
    /// when a range holds the node (hairpin through a VIP bound on the node).
    fn firewall_chain(&self, text: &mut ElementText, out: &mut Objects) {
        if !self.policy.uses_firewall {
            return;
        }
        let (port, firewall) = (self.port, &self.chains.firewall);
        for address in &port.load_balancer_ips {
            text.service_key(address, self.proto, port.port)
                .rest(&[" : goto ", firewall])
                .add_into(out.elements_of(FIREWALL_IPS));
        }
        let ranges = &port.load_balancer_source_ranges;
        let mut allowed: Vec<String> = ranges.iter().map(|n| n.to_string()).collect();
        if self
            .ctx
            .common
            .node_ip
            .is_some_and(|node| ranges.iter().any(|n| n.contains(&node)))
        {
            allowed.extend(port.load_balancer_ips.iter().map(|ip| ip.to_string()));
        }
        if allowed.is_empty() {
            // Unreadable ranges: nothing is allowed (never everything).
            out.rule(firewall, "drop".into());
        } else {
            let ip = self.ip;
            out.rule(
                firewall,
                format!("{ip} saddr != {{ {} }} drop", allowed.join(", ")),
            );
        }
    }

    fn node_port(&self, text: &mut ElementText, out: &mut Objects) {
        let Some(node_port) = self.port.node_port else {
            return;
        };
        text.node_port_key(self.proto, node_port);
        if self.policy.has_endpoints {
            text.rest(&[" : goto ", &self.chains.external])
                .add_into(out.elements_of(SERVICE_NODEPORTS));
        }
        if let Some(verdict) = &self.external_refusal {
            text.rest(&[" comment ", &self.comment(), " : ", verdict])
                .add_into(out.elements_of(NO_ENDPOINT_NODEPORTS));
        }
        if self
            .ctx
            .localhost_rejects
            .contains(&self.port.name.protocol)
        {
            text.rest(&[
                " : goto ",
                super::localhost_reject_chain(self.port.name.protocol),
            ])
            .add_into(out.elements_of(LOCALHOST_REJECT_PORTS));
        }
    }

    /// External traffic: masqueraded under the Cluster policy; under the Local one, traffic
    /// from pods and from the node itself may use any endpoint (as if it went out to the load
    /// balancer and came back).
    fn external_chain(&self, out: &mut Objects) {
        let policy = &self.policy;
        if !policy.uses_external_chain {
            return;
        }
        let PortChains {
            service: cluster,
            external,
            ..
        } = &self.chains;
        out.chain(external);
        let mark = self.ctx.mark_for_masquerade();
        if !policy.external_local {
            out.rule(external, format!("{mark} comment \"masquerade\""));
        } else if policy.uses_cluster_endpoints {
            if let Some((local, _)) = self.local_matches {
                out.rule(
                    external,
                    format!("{local} goto {cluster} comment \"short-circuit pod traffic\""),
                );
            }
            out.rule(
                external,
                format!("fib saddr type local {mark} comment \"masquerade local traffic\""),
            );
            out.rule(
                external,
                format!(
                    "fib saddr type local goto {cluster} comment \"short-circuit local traffic\""
                ),
            );
        }
        if policy.has_external && (!policy.external_local || policy.uses_local_endpoints) {
            let target = self.policy_chain(policy.external_local);
            out.rule(external, format!("goto {target}"));
        }
    }

    /// The policy chains. Without affinity a policy chain DNATs through a map of addresses
    /// (upstream 1.36's form, in a slot of a shared map: see `slots`): no endpoint chains, so
    /// the table has a tenth of the chains that the kernel re-validates at a commit that adds a
    /// NAT rule; hairpin traffic is found in postrouting by @hairpin-connections.
    fn policy_chains(&self, slots: &mut SlotTable, text: &mut ElementText, out: &mut Objects) {
        let selected = &self.policy.selected;
        for (chain, used, endpoints) in [
            (
                &self.chains.service,
                self.policy.uses_cluster_endpoints,
                &selected.cluster,
            ),
            (
                &self.chains.local,
                self.policy.uses_local_endpoints,
                &selected.local,
            ),
        ] {
            if !used {
                continue;
            }
            out.chain(chain);
            let chosen = sorted_by_address(endpoints);
            if self.affinity() {
                self.affinity_selection(chain, &chosen, out);
            } else {
                self.address_selection(chain, &chosen, slots, text, out);
            }
        }
    }

    /// DNAT through the chain's slot of a shared endpoint map, or an anonymous map when it
    /// gets no slot.
    fn address_selection(
        &self,
        chain: &str,
        chosen: &[&Endpoint],
        slots: &mut SlotTable,
        text: &mut ElementText,
        out: &mut Objects,
    ) {
        let (ip, proto) = (self.ip, self.proto);
        let placement = (chosen.len() <= DRAWS as usize)
            .then(|| slots.claim(proto, chain, &self.port.name.service))
            .flatten();
        match placement {
            Some((placement, claim)) => {
                out.slots.push(claim);
                endpoint_map(chain, ip, proto, chosen, &placement, text, out);
            }
            None => out.rule(chain, destination_selection(ip, proto, chosen)),
        }
    }

    /// With affinity: a source seen lately goes back to its endpoint's chain, others to one
    /// picked at random.
    fn affinity_selection(&self, chain: &str, chosen: &[&Endpoint], out: &mut Objects) {
        let ip = self.ip;
        let mut targets = Vec::with_capacity(chosen.len());
        for ep in chosen {
            let names::EndpointNames {
                chain: target,
                affinity,
            } = names::endpoint_names(&self.port.name, ep);
            out.rule(chain, format!("{ip} saddr @{affinity} goto {target}"));
            targets.push(target);
        }
        out.rule(chain, endpoint_selection(&targets));
    }

    /// The hairpin elements of the endpoints on this node (upstream 1.36: a connection DNATed
    /// back to its own source is masqueraded in postrouting), and the endpoints' own chains
    /// where session affinity needs them.
    fn endpoint_chains(&self, text: &mut ElementText, out: &mut Objects) {
        let (ip, proto) = (self.ip, self.proto);
        let reachable = &self.policy.selected.all_reachable;
        let node = &self.ctx.common.node_name;
        let mut local = reachable.iter().filter(|ep| ep.is_local(node)).peekable();
        if local.peek().is_some() {
            let hairpins = out.elements_of(HAIRPIN_CONNECTIONS);
            for ep in local {
                text.hairpin_key(&ep.ip, proto, ep.port).add_into(hairpins);
            }
        }
        let Some(timeout) = self.port.session_affinity_seconds else {
            return;
        };
        for ep in reachable {
            let names::EndpointNames {
                chain,
                affinity: set,
            } = names::endpoint_names(&self.port.name, ep);
            out.sets.insert(
                set.clone(),
                SetDef {
                    kind: "set",
                    spec: format!(
                        "{{ type {} ; flags dynamic,timeout ; timeout {timeout}s ; }}",
                        self.ctx.addr_type()
                    ),
                },
            );
            out.rule(&chain, format!("update @{set} {{ {ip} saddr }}"));
            out.rule(
                &chain,
                format!("meta l4proto {proto} dnat to {}", ep.address()),
            );
        }
    }
}

/// A policy chain's DNAT through its slot of a shared endpoint map: each of `endpoints` owns an
/// equal share (to within one draw) of the slot's draws, in order.
fn endpoint_map(
    chain: &str,
    ip: &str,
    proto: &str,
    endpoints: &[&Endpoint],
    placement: &Placement,
    text: &mut ElementText,
    out: &mut Objects,
) {
    let Placement { map, offset } = placement;
    out.rule(
        chain,
        format!(
            "meta l4proto {proto} dnat {ip} addr . port to numgen random mod {DRAWS} offset {offset} map @{map}"
        ),
    );
    let (count, draws, offset) = (endpoints.len() as u64, u64::from(DRAWS), u64::from(*offset));
    if endpoints.is_empty() {
        return;
    }
    let shares = out.elements_of(map);
    for (index, ep) in (0u64..).zip(endpoints) {
        let first = offset + index * draws / count;
        let last = offset + (index + 1) * draws / count - 1;
        text.share(first, last, &ep.ip, ep.port).add_into(shares);
    }
}

/// `endpoints` in the order of their `ip:port` text, as upstream orders them; the texts are
/// written once, into one buffer.
fn sorted_by_address<'a>(endpoints: &[&'a Endpoint]) -> Vec<&'a Endpoint> {
    let mut addresses = String::with_capacity(endpoints.len() * 24);
    let mut spans = Vec::with_capacity(endpoints.len());
    for ep in endpoints {
        let start = addresses.len();
        text::push_socket(&mut addresses, &ep.ip, ep.port);
        spans.push((start..addresses.len(), *ep));
    }
    spans.sort_by(|(a, _), (b, _)| addresses[a.clone()].cmp(&addresses[b.clone()]));
    spans.into_iter().map(|(_, ep)| ep).collect()
}

/// The rule that DNATs to one of `endpoints` at random through an anonymous map (upstream
/// 1.36's form): for a chain whose slot another holds, or with more endpoints than [`DRAWS`].
fn destination_selection(ip: &str, proto: &str, endpoints: &[&Endpoint]) -> String {
    let mut rule = format!(
        "meta l4proto {proto} dnat {ip} addr . port to numgen random mod {} map {{ ",
        endpoints.len()
    );
    for (index, ep) in endpoints.iter().enumerate() {
        if index > 0 {
            rule.push_str(" , ");
        }
        let _ = write!(rule, "{index} : {} . {}", ep.ip, ep.port);
    }
    rule.push_str(" }");
    rule
}

/// The rule that picks one of `targets` at random (upstream's form).
fn endpoint_selection(targets: &[String]) -> String {
    let mut rule = format!("numgen random mod {} vmap {{ ", targets.len());
    for (index, target) in targets.iter().enumerate() {
        if index > 0 {
            rule.push_str(" , ");
        }
        let _ = write!(rule, "{index} : goto {target}");
    }
    rule.push_str(" }");
    rule
}
