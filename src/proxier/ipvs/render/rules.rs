//! IPVS mode's iptables rules, in upstream's order: they match the sets, not each service, so
//! their number stays constant; a rule that matches a set exists only while the set has
//! entries.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::IpAddr;

use super::{FILTER_CHAINS, IpvsContext, NAT_CHAINS, SETS, set_name};
use crate::model::IpFamily;

/// What the iptables rules depend on besides the context: which sets have entries, and the LB
/// addresses the node itself may not reach.
pub(in crate::proxier::ipvs) struct RuleInputs<'a> {
    pub non_empty: BTreeSet<&'static str>,
    pub no_node_access: Vec<&'a (IpAddr, &'static str, u16)>,
}

impl RuleInputs<'_> {
    fn has(&self, base: &str) -> bool {
        self.non_empty.contains(base)
    }
}

/// A rule that sends what a set matches somewhere: in nat (else filter), the set's base name,
/// the chain it is in, the protocol it needs, the set's match flags, the target.
struct SetRule {
    nat: bool,
    set: &'static str,
    chain: &'static str,
    protocol: Option<&'static str>,
    flags: &'static str,
    target: &'static str,
}

const fn set_rule(
    nat: bool,
    set: &'static str,
    chain: &'static str,
    protocol: Option<&'static str>,
    flags: &'static str,
    target: &'static str,
) -> SetRule {
    SetRule {
        nat,
        set,
        chain,
        protocol,
        flags,
        target,
    }
}

/// Upstream's set rules, in its order.
const SET_RULES: [SetRule; 12] = [
    set_rule(
        true,
        "KUBE-LOOP-BACK",
        "KUBE-POSTROUTING",
        None,
        "dst,dst,src",
        "MASQUERADE",
    ),
    set_rule(
        true,
        "KUBE-LOAD-BALANCER",
        "KUBE-SERVICES",
        None,
        "dst,dst",
        "KUBE-LOAD-BALANCER",
    ),
    set_rule(
        true,
        "KUBE-LOAD-BALANCER-LOCAL",
        "KUBE-LOAD-BALANCER",
        None,
        "dst,dst",
        "RETURN",
    ),
    set_rule(
        true,
        "KUBE-NODE-PORT-LOCAL-TCP",
        "KUBE-NODE-PORT",
        Some("tcp"),
        "dst",
        "RETURN",
    ),
    set_rule(
        true,
        "KUBE-NODE-PORT-TCP",
        "KUBE-NODE-PORT",
        Some("tcp"),
        "dst",
        "KUBE-MARK-MASQ",
    ),
    set_rule(
        true,
        "KUBE-NODE-PORT-LOCAL-UDP",
        "KUBE-NODE-PORT",
        Some("udp"),
        "dst",
        "RETURN",
    ),
    set_rule(
        true,
        "KUBE-NODE-PORT-UDP",
        "KUBE-NODE-PORT",
        Some("udp"),
        "dst",
        "KUBE-MARK-MASQ",
    ),
    set_rule(
        true,
        "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
        "KUBE-NODE-PORT",
        Some("sctp"),
        "dst,dst",
        "RETURN",
    ),
    set_rule(
        true,
        "KUBE-NODE-PORT-SCTP-HASH",
        "KUBE-NODE-PORT",
        Some("sctp"),
        "dst,dst",
        "KUBE-MARK-MASQ",
    ),
    set_rule(
        false,
        "KUBE-LOAD-BALANCER-FW",
        "KUBE-PROXY-FIREWALL",
        None,
        "dst,dst",
        "KUBE-SOURCE-RANGES-FIREWALL",
    ),
    set_rule(
        false,
        "KUBE-LOAD-BALANCER-SOURCE-CIDR",
        "KUBE-SOURCE-RANGES-FIREWALL",
        None,
        "dst,dst,src",
        "RETURN",
    ),
    set_rule(
        false,
        "KUBE-LOAD-BALANCER-SOURCE-IP",
        "KUBE-SOURCE-RANGES-FIREWALL",
        None,
        "dst,dst,src",
        "RETURN",
    ),
];

fn comment_of(base: &str) -> &'static str {
    SETS.iter()
        .find(|(name, _, _)| *name == base)
        .map(|(_, _, c)| *c)
        .unwrap_or("")
}

/// The nat and filter rules being written.
struct Tables<'a> {
    ctx: &'a IpvsContext,
    sets: &'a RuleInputs<'a>,
    mark: String,
    nat: String,
    filter: String,
}

/// Upstream's rules for IPVS mode, as `iptables-restore` input (nat and filter).
pub(in crate::proxier::ipvs) fn iptables_rules(ctx: &IpvsContext, sets: &RuleInputs<'_>) -> String {
    let mut tables = Tables {
        ctx,
        sets,
        mark: format!("{:#010x}", ctx.common.masquerade_mark),
        nat: String::new(),
        filter: String::new(),
    };
    tables.loopback_return();
    tables.set_rules();
    tables.cluster_ip_masquerade();
    tables.external_ips();
    tables.dispatch();
    tables.filters();
    tables.postrouting();
    tables.into_restore()
}

impl Tables<'_> {
    fn set_name(&self, base: &str) -> String {
        set_name(base, self.ctx.common.family)
    }

    /// Traffic from the node's loopback addresses is never a service's.
    fn loopback_return(&mut self) {
        let loopback = if self.ctx.common.family == IpFamily::V4 {
            "127.0.0.0/8"
        } else {
            "::1/128"
        };
        let _ = writeln!(self.nat, "-A KUBE-SERVICES -s {loopback} -j RETURN");
    }

    fn set_rules(&mut self) {
        for rule in SET_RULES.iter().filter(|rule| self.sets.has(rule.set)) {
            let protocol = rule
                .protocol
                .map(|p| format!("-p {p} "))
                .unwrap_or_default();
            let line = format!(
                "-A {} {protocol}-m comment --comment \"{}\" -m set --match-set {} {} -j {}",
                rule.chain,
                comment_of(rule.set),
                self.set_name(rule.set),
                rule.flags,
                rule.target
            );
            let out = if rule.nat {
                &mut self.nat
            } else {
                &mut self.filter
            };
            let _ = writeln!(out, "{line}");
        }
    }

    /// Traffic to a cluster IP is masqueraded: all of it with masqueradeAll, else what does
    /// not come from this node's pods (or, with no way to tell, what comes from outside).
    fn cluster_ip_masquerade(&mut self) {
        if !self.sets.has("KUBE-CLUSTER-IP") {
            return;
        }
        let prefix = format!(
            "-A KUBE-SERVICES -m comment --comment \"{}\" -m set --match-set {}",
            comment_of("KUBE-CLUSTER-IP"),
            self.set_name("KUBE-CLUSTER-IP")
        );
        let common = &self.ctx.common;
        let nat = &mut self.nat;
        if common.masquerade_all {
            let _ = writeln!(nat, "{prefix} dst,dst -j KUBE-MARK-MASQ");
        } else if let Some(not_local) = common.local_detector.if_not_local() {
            let _ = writeln!(nat, "{prefix} dst,dst {not_local} -j KUBE-MARK-MASQ");
        } else {
            let _ = writeln!(nat, "{prefix} src,dst -j KUBE-MARK-MASQ");
        }
    }

    /// External IPs are accepted (for IPVS to take) when they come from outside the node, or
    /// go to an address of the node's; under the Cluster policy they are masqueraded first.
    fn external_ips(&mut self) {
        for (base, masquerade) in [
            ("KUBE-EXTERNAL-IP", true),
            ("KUBE-EXTERNAL-IP-LOCAL", false),
        ] {
            if !self.sets.has(base) {
                continue;
            }
            let prefix = format!(
                "-A KUBE-SERVICES -m comment --comment \"{}\" -m set --match-set {} dst,dst",
                comment_of(base),
                self.set_name(base)
            );
            let nat = &mut self.nat;
            if masquerade {
                let _ = writeln!(nat, "{prefix} -j KUBE-MARK-MASQ");
            }
            let _ = writeln!(
                nat,
                "{prefix} -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT"
            );
            let _ = writeln!(nat, "{prefix} -m addrtype --dst-type LOCAL -j ACCEPT");
        }
    }

    /// NodePorts, the load balancers' masquerading, the source-range firewall's default, the
    /// node's own packets to LB IPs that leave it out, and the accepts IPVS takes over from.
    fn dispatch(&mut self) {
        let _ = writeln!(
            self.nat,
            "-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT"
        );
        let _ = writeln!(self.nat, "-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ");
        let _ = writeln!(self.filter, "-A KUBE-SOURCE-RANGES-FIREWALL -j DROP");
        for (ip, proto, port) in &self.sets.no_node_access {
            let _ = writeln!(
                self.filter,
                "-A KUBE-IPVS-OUT-FILTER -s {ip} -m ipvs --vaddr {ip} --vproto {proto} --vport {port} -j DROP"
            );
        }
        for base in ["KUBE-CLUSTER-IP", "KUBE-LOAD-BALANCER"] {
            if self.sets.has(base) {
                let _ = writeln!(
                    self.nat,
                    "-A KUBE-SERVICES -m set --match-set {} dst,dst -j ACCEPT",
                    self.set_name(base)
                );
            }
        }
    }

    /// Forwarding of marked and established traffic, health-check ports, and the rejection of
    /// new connections to kube-ipvs0's addresses on ports no service has.
    fn filters(&mut self) {
        let mark = &self.mark;
        let _ = writeln!(
            self.filter,
            "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {mark}/{mark} -j ACCEPT"
        );
        let _ = writeln!(
            self.filter,
            "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
        );
        let _ = writeln!(
            self.filter,
            "-A KUBE-NODE-PORT -m comment --comment \"Kubernetes health check node port\" -m set --match-set {} dst -j ACCEPT",
            self.set_name("KUBE-HEALTH-CHECK-NODE-PORT")
        );
        for (base, matching) in [
            ("KUBE-LOAD-BALANCER", "dst,dst"),
            ("KUBE-CLUSTER-IP", "dst,dst"),
            ("KUBE-EXTERNAL-IP", "dst,dst"),
            ("KUBE-EXTERNAL-IP-LOCAL", "dst,dst"),
            ("KUBE-HEALTH-CHECK-NODE-PORT", "dst"),
        ] {
            let _ = writeln!(
                self.filter,
                "-A KUBE-IPVS-FILTER -m set --match-set {} {matching} -j RETURN",
                self.set_name(base)
            );
        }
        let _ = writeln!(
            self.filter,
            "-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set {} dst -j REJECT",
            self.set_name("KUBE-IPVS-IPS")
        );
    }

    /// Marked traffic is masqueraded on its way out; the mark is what KUBE-MARK-MASQ sets.
    fn postrouting(&mut self) {
        let (mark, nat) = (&self.mark, &mut self.nat);
        let _ = writeln!(
            nat,
            "-A KUBE-POSTROUTING -m mark ! --mark {mark}/{mark} -j RETURN"
        );
        let _ = writeln!(nat, "-A KUBE-POSTROUTING -j MARK --xor-mark {mark}");
        let _ = writeln!(
            nat,
            "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully"
        );
        let _ = writeln!(nat, "-A KUBE-MARK-MASQ -j MARK --or-mark {mark}");
    }

    fn into_restore(self) -> String {
        let mut out = String::from("*nat\n");
        for chain in NAT_CHAINS {
            let _ = writeln!(out, ":{chain} - [0:0]");
        }
        out.push_str(&self.nat);
        out.push_str("COMMIT\n*filter\n");
        for chain in FILTER_CHAINS {
            let _ = writeln!(out, ":{chain} - [0:0]");
        }
        out.push_str(&self.filter);
        out.push_str("COMMIT\n");
        out
    }
}
