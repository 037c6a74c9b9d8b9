//! One service port's rules, part by part, in upstream's order: its addresses in the shared
//! chains (cluster IP, external IPs, load-balancer IPs, NodePort, health check), then its own
//! chains (masquerading, the external and firewall chains, the policy chains, one chain per
//! endpoint).

use super::{
    KUBE_EXTERNAL_SERVICES, KUBE_MARK_MASQ, KUBE_NODEPORTS, KUBE_PROXY_FIREWALL, KUBE_SERVICES,
    RenderContext, Rule, ServiceRules, comment, endpoint_selection_rules,
};
use crate::model::{Endpoint, IpFamily, ServicePort};
use crate::proxier::iptables::names;
use crate::proxier::iptables::nfacct::LOCALHOST_NODEPORTS_ACCEPTED;
use crate::proxier::policy::{PortPolicy, Refusal};

/// Renders `port` with `endpoints` into `out`.
pub(super) fn render_port(
    port: &ServicePort,
    endpoints: &[Endpoint],
    ctx: &RenderContext,
    out: &mut ServiceRules,
) {
    let port = Port::new(port, endpoints, ctx);
    let (no_local_internal, no_local_external) = port.policy.no_local_endpoints();
    out.no_local_endpoints_internal += usize::from(no_local_internal);
    out.no_local_endpoints_external += usize::from(no_local_external);
    port.cluster_ip(out);
    port.external_ips(out);
    port.load_balancer_ips(out);
    port.node_port(out);
    port.health_check(out);
    port.internal_masquerade(out);
    port.external_chain(out);
    port.firewall_chain(out);
    port.policy_chains(out);
    port.endpoint_chains(out);
}

/// What a rule without a usable endpoint jumps to, and its comment.
type Filter = (&'static str, String);

/// A port and what every part of its rules needs.
struct Port<'a> {
    port: &'a ServicePort,
    ctx: &'a RenderContext,
    policy: PortPolicy<'a>,
    /// `ns/svc:port`, as the comments say it.
    name: String,
    proto: &'static str,
    cluster_chain: String,
    local_chain: String,
    ext_chain: String,
    fw_chain: String,
    internal_filter: Option<Filter>,
    external_filter: Option<Filter>,
}

impl<'a> Port<'a> {
    fn new(port: &'a ServicePort, endpoints: &'a [Endpoint], ctx: &'a RenderContext) -> Self {
        let policy = PortPolicy::new(port, endpoints, ctx.common.node());
        let name = port.name.to_string();
        let filter = |refusal: Refusal| match refusal {
            Refusal::Reject => ("REJECT", format!("{name} has no endpoints")),
            Refusal::Drop => ("DROP", format!("{name} has no local endpoints")),
        };
        let internal_filter = policy.internal_refusal().map(filter);
        let external_filter = policy.external_refusal().map(filter);
        Port {
            cluster_chain: names::cluster_policy_chain(&port.name),
            local_chain: names::local_policy_chain(&port.name),
            ext_chain: names::external_chain(&port.name),
            fw_chain: names::firewall_chain(&port.name),
            proto: port.name.protocol.lower(),
            port,
            ctx,
            policy,
            name,
            internal_filter,
            external_filter,
        }
    }

    /// `-m <proto> -p <proto> -d <dest> --dport <port>`.
    fn match_port(&self, dest: &dyn std::fmt::Display) -> String {
        let proto = self.proto;
        format!("-m {proto} -p {proto} -d {dest} --dport {}", self.port.port)
    }

    fn policy_chain(&self, local: bool) -> &str {
        if local {
            &self.local_chain
        } else {
            &self.cluster_chain
        }
    }

    fn internal_chain(&self) -> &str {
        self.policy_chain(self.policy.internal_local)
    }

    /// Where load-balancer traffic goes first: the firewall chain when source ranges apply.
    fn load_balancer_chain(&self) -> &str {
        if self.policy.uses_firewall {
            &self.fw_chain
        } else {
            &self.ext_chain
        }
    }

    fn cluster_ip(&self, out: &mut ServiceRules) {
        let (name, cluster_ip) = (&self.name, self.port.cluster_ips[0]);
        if self.policy.has_internal {
            let spec = format!(
                "{} {} -j {}",
                comment(&format!("{name} cluster IP")),
                self.match_port(&cluster_ip),
                self.internal_chain()
            );
            out.add_nat(Rule::new(KUBE_SERVICES, spec));
        } else if let Some((target, text)) = &self.internal_filter {
            let spec = format!(
                "{} {} -j {target}",
                comment(text),
                self.match_port(&cluster_ip)
            );
            out.add_filter(Rule::new(KUBE_SERVICES, spec));
        }
    }

    fn external_ips(&self, out: &mut ServiceRules) {
        let name = &self.name;
        for ip in &self.port.external_ips {
            if self.policy.has_endpoints {
                let spec = format!(
                    "{} {} -j {}",
                    comment(&format!("{name} external IP")),
                    self.match_port(ip),
                    self.ext_chain
                );
                out.add_nat(Rule::new(KUBE_SERVICES, spec));
            }
            if let Some((target, text)) = &self.external_filter {
                let spec = format!("{} {} -j {target}", comment(text), self.match_port(ip));
                out.add_filter(Rule::new(KUBE_EXTERNAL_SERVICES, spec));
            }
        }
    }

    fn load_balancer_ips(&self, out: &mut ServiceRules) {
        let name = &self.name;
        for ip in &self.port.load_balancer_ips {
            if self.policy.has_endpoints {
                let spec = format!(
                    "{} {} -j {}",
                    comment(&format!("{name} loadbalancer IP")),
                    self.match_port(ip),
                    self.load_balancer_chain()
                );
                out.add_nat(Rule::new(KUBE_SERVICES, spec));
            }
            if self.policy.uses_firewall {
                let text = format!("{name} traffic not accepted by {}", self.fw_chain);
                let spec = format!("{} {} -j DROP", comment(&text), self.match_port(ip));
                out.add_filter(Rule::new(KUBE_PROXY_FIREWALL, spec));
            }
        }
        if let Some((target, text)) = &self.external_filter {
            for ip in &self.port.load_balancer_ips {
                let spec = format!("{} {} -j {target}", comment(text), self.match_port(ip));
                out.add_filter(Rule::new(KUBE_EXTERNAL_SERVICES, spec));
            }
        }
    }

    fn node_port(&self, out: &mut ServiceRules) {
        let Some(node_port) = self.port.node_port else {
            return;
        };
        let (name, proto, ctx, ext_chain) = (&self.name, self.proto, self.ctx, &self.ext_chain);
        if self.policy.has_endpoints {
            // Counted separately when it comes to a loopback address (upstream's metric).
            if ctx.common.family == IpFamily::V4
                && ctx.localhost_node_ports
                && ctx.nfacct.localhost_node_ports
            {
                let spec = format!(
                    "{} -m {proto} -p {proto} -d 127.0.0.0/8 --dport {node_port} -m nfacct --nfacct-name {LOCALHOST_NODEPORTS_ACCEPTED} -j {ext_chain}",
                    comment(name)
                );
                out.add_nat(Rule::new(KUBE_NODEPORTS, spec));
            }
            let spec = format!(
                "{} -m {proto} -p {proto} --dport {node_port} -j {ext_chain}",
                comment(name)
            );
            out.add_nat(Rule::new(KUBE_NODEPORTS, spec));
        }
        if let Some((target, text)) = &self.external_filter {
            // Left to the proxy, which refuses what it does not serve, as in nftables mode.
            let loopback = if ctx.localhost_proxy && ctx.common.family == IpFamily::V4 {
                " ! -d 127.0.0.0/8"
            } else {
                ""
            };
            let spec = format!(
                "{} -m addrtype --dst-type LOCAL{loopback} -m {proto} -p {proto} --dport {node_port} -j {target}",
                comment(text)
            );
            out.add_filter(Rule::new(KUBE_EXTERNAL_SERVICES, spec));
        }
    }

    /// The health check node port: accepted whether or not there are local endpoints.
    fn health_check(&self, out: &mut ServiceRules) {
        if let Some(health_port) = self.port.health_check_node_port {
            let spec = format!(
                "{} -m tcp -p tcp --dport {health_port} -j ACCEPT",
                comment(&format!("{} health check node port", self.name))
            );
            out.add_filter(Rule::new(KUBE_NODEPORTS, spec));
        }
    }

    /// Internal traffic: masquerade what does not come from a local pod (or everything).
    fn internal_masquerade(&self, out: &mut ServiceRules) {
        if !self.policy.has_internal {
            return;
        }
        let args = format!(
            "{} {}",
            comment(&format!("{} cluster IP", self.name)),
            self.match_port(&self.port.cluster_ips[0])
        );
        let common = &self.ctx.common;
        if common.masquerade_all {
            out.push_chain_rule(self.internal_chain(), format!("{args} -j {KUBE_MARK_MASQ}"));
        } else if let Some(not_local) = common.local_detector.if_not_local() {
            out.push_chain_rule(
                self.internal_chain(),
                format!("{args} {not_local} -j {KUBE_MARK_MASQ}"),
            );
        }
    }

    /// External traffic: masqueraded under the Cluster policy; under the Local one, pod and
    /// node traffic to an external address may use any endpoint (as if it went out to the load
    /// balancer and came back).
    fn external_chain(&self, out: &mut ServiceRules) {
        if !self.policy.uses_external_chain {
            return;
        }
        let (name, ext_chain) = (&self.name, &self.ext_chain);
        out.chains.entry(ext_chain.clone()).or_default();
        if !self.port.external_policy_local {
            let text = format!("masquerade traffic for {name} external destinations");
            out.push_chain_rule(ext_chain, format!("{} -j {KUBE_MARK_MASQ}", comment(&text)));
        } else if let Some(target) = self.short_circuit() {
            if let Some(local) = self.ctx.common.local_detector.if_local() {
                let text = format!("pod traffic for {name} external destinations");
                out.push_chain_rule(ext_chain, format!("{} {local} -j {target}", comment(&text)));
            }
            let text = format!("masquerade LOCAL traffic for {name} external destinations");
            out.push_chain_rule(
                ext_chain,
                format!(
                    "{} -m addrtype --src-type LOCAL -j {KUBE_MARK_MASQ}",
                    comment(&text)
                ),
            );
            let text = format!("route LOCAL traffic for {name} external destinations");
            out.push_chain_rule(
                ext_chain,
                format!(
                    "{} -m addrtype --src-type LOCAL -j {target}",
                    comment(&text)
                ),
            );
        }
        if self.policy.has_external {
            let external_policy_chain = self.policy_chain(self.policy.external_local);
            out.push_chain_rule(ext_chain, format!("-j {external_policy_chain}"));
        }
    }

    /// Where pod and node traffic to an external address goes under the Local policy.
    fn short_circuit(&self) -> Option<&str> {
        if self.policy.uses_cluster_endpoints {
            Some(&self.cluster_chain)
        } else {
            self.policy
                .uses_local_endpoints
                .then_some(self.local_chain.as_str())
        }
    }

    /// LoadBalancer source ranges (and the load balancer's own IPs when a range holds the
    /// node: a VIP-like IP bound on the node loops back with the VIP as source).
    fn firewall_chain(&self, out: &mut ServiceRules) {
        if !self.policy.uses_firewall {
            return;
        }
        let (fw_chain, ext_chain) = (&self.fw_chain, &self.ext_chain);
        out.chains.entry(fw_chain.clone()).or_default();
        let allow = comment(&format!("{} loadbalancer IP", self.name));
        let mut allow_from_node = false;
        for net in &self.port.load_balancer_source_ranges {
            out.push_chain_rule(fw_chain, format!("{allow} -s {net} -j {ext_chain}"));
            allow_from_node |= self.ctx.common.node_ip.is_some_and(|ip| net.contains(&ip));
        }
        if allow_from_node {
            for ip in &self.port.load_balancer_ips {
                out.push_chain_rule(fw_chain, format!("{allow} -s {ip} -j {ext_chain}"));
            }
        }
        let text = format!(
            "other traffic to {} will be dropped by {KUBE_PROXY_FIREWALL}",
            self.name
        );
        out.push_chain_rule(fw_chain, comment(&text));
    }

    fn policy_chains(&self, out: &mut ServiceRules) {
        let selected = &self.policy.selected;
        if self.policy.uses_cluster_endpoints {
            endpoint_selection_rules(out, &self.cluster_chain, self.port, &selected.cluster);
        }
        if self.policy.uses_local_endpoints {
            endpoint_selection_rules(out, &self.local_chain, self.port, &selected.local);
        }
    }

    /// One chain per endpoint: masquerade hairpin traffic, then DNAT (and remember the client
    /// for session affinity).
    fn endpoint_chains(&self, out: &mut ServiceRules) {
        let proto = self.proto;
        let service = comment(&self.name);
        for ep in &self.policy.selected.all_reachable {
            let address = ep.address();
            let chain = names::endpoint_chain(&self.port.name, &address);
            out.push_chain_rule(
                &chain,
                format!("{service} -s {} -j {KUBE_MARK_MASQ}", ep.ip),
            );
            let affinity = if self.port.session_affinity_seconds.is_some() {
                format!(" -m recent --name {chain} --set")
            } else {
                String::new()
            };
            out.push_chain_rule(
                &chain,
                format!(
                    "{service}{affinity} -m {proto} -p {proto} -j DNAT --to-destination {address}"
                ),
            );
        }
    }
}
