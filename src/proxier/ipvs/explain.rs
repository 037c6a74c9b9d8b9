//! One packet through IPVS mode, read from the kernel: the one virtual server its destination,
//! protocol and port name (one request, never a dump of every virtual server), that virtual
//! server's real servers (one dump of them), and, for a load-balancer IP with source ranges,
//! the ipset entries that decide whether its source may in (each asked over netlink, never a
//! process); then iptables' few nat rules that mark it for masquerade (masquerade.rs). IPVS
//! keeps no Service names: `explain` asks the daemon which Service port the destination is.

mod masquerade;

use std::net::IpAddr;

use super::render::set_name;
use crate::config::ProxyMode;
use crate::model::IpFamily;
use crate::proxier::explanation::{
    Candidate, ExplainError, Explanation, Flow, Outcome, read_error,
};
use crate::sys::host::net::{LocalAddresses, SystemAddresses};
use crate::sys::ipset::IpsetLookups;
use crate::sys::ipset::netlink::{Entry, IpsetNetlink};
use crate::sys::ipvs::codec::FLAG_PERSISTENT;
use crate::sys::ipvs::{Ipvs, IpvsClient, IpvsError, RealServer, VirtualServer};
use crate::sys::xtables::{Backend, Iptables, SystemIptables};

/// The sets that say which load-balancer IPs have source ranges, and which sources they let in.
const FIREWALLED: &str = "KUBE-LOAD-BALANCER-FW";
const ALLOWED_SOURCES: &str = "KUBE-LOAD-BALANCER-SOURCE-CIDR";
const ALLOWED_NODE: &str = "KUBE-LOAD-BALANCER-SOURCE-IP";
/// The set of every Service IP bound to kube-ipvs0, and the sets of the destinations the
/// access filter lets through before it rejects the rest of those IPs (the health check
/// NodePorts are a set of ports alone, let through on any address).
const SERVICE_IPS: &str = "KUBE-IPVS-IPS";
const HEALTH_CHECK_PORTS: &str = "KUBE-HEALTH-CHECK-NODE-PORT";
const ACCESS_ALLOWED: [&str; 4] = [
    "KUBE-LOAD-BALANCER",
    "KUBE-CLUSTER-IP",
    "KUBE-EXTERNAL-IP",
    "KUBE-EXTERNAL-IP-LOCAL",
];
/// The set of endpoints whose connections to their own Service are masqueraded.
const LOOP_BACK: &str = "KUBE-LOOP-BACK";

/// Explains `flow` from the virtual servers the kernel holds, and, when it is forwarded,
/// whether iptables marks it for masquerade.
pub fn explain(flow: &Flow) -> Result<Explanation, ExplainError> {
    let session = &mut Session::open()?;
    let backend = Backend::holding(masquerade::NAT, masquerade::SERVICES);
    session.explain_with_masquerade(flow, &mut SystemIptables::new(backend))
}

/// Reads for several flows (`explain --all`): one IPVS socket and one ipset socket.
/// Masquerade is left to [`explain`]: `--all` compares endpoints.
pub struct Session {
    ipvs: Box<dyn Ipvs>,
    ipset: Box<dyn IpsetLookups>,
    local: Vec<IpAddr>,
}

impl Session {
    pub fn open() -> Result<Session, ExplainError> {
        let ipvs = IpvsClient::connect().map_err(|err| match err {
            IpvsError::NotAvailable => ExplainError::NothingProgrammed(format!(
                "{err}: ipvs mode programs nothing on this kernel"
            )),
            other => read_error("IPVS")(other),
        })?;
        let ipset = IpsetNetlink::open().map_err(read_error("ipset"))?;
        Ok(Session::with(
            Box::new(ipvs),
            Box::new(ipset),
            SystemAddresses.addresses(),
        ))
    }

    /// A session reading through these (the kernel's, or fakes), on a node whose addresses
    /// are `local`.
    pub fn with(ipvs: Box<dyn Ipvs>, ipset: Box<dyn IpsetLookups>, local: Vec<IpAddr>) -> Self {
        Session { ipvs, ipset, local }
    }

    /// Explains `flow`, and, when it is sent to a real server, whether iptables (`iptables`,
    /// nat's rules) marks it for masquerade.
    pub fn explain_with_masquerade(
        &mut self,
        flow: &Flow,
        iptables: &mut dyn Iptables,
    ) -> Result<Explanation, ExplainError> {
        let mut explanation = self.explain(flow)?;
        if matches!(explanation.outcome, Outcome::Dnat { .. }) {
            masquerade::masquerade(
                iptables,
                self.ipset.as_mut(),
                &self.local,
                flow,
                &mut explanation,
            )?;
        }
        Ok(explanation)
    }

    /// Explains `flow` from the virtual server on its destination.
    pub fn explain(&mut self, flow: &Flow) -> Result<Explanation, ExplainError> {
        let mut explanation = Explanation::new(ProxyMode::Ipvs, flow);
        let (ip, port) = (flow.destination.ip(), flow.destination.port());
        let found = self
            .ipvs
            .service(&VirtualServer {
                address: ip,
                protocol: flow.protocol,
                port,
                scheduler: String::new(),
                flags: 0,
                timeout: 0,
            })
            .map_err(read_error("IPVS"))?;
        let destination = format!("{}/{}", flow.destination, flow.protocol.lower());
        explanation
            .reads
            .push(format!("the virtual server {destination}"));
        let Some(vs) = found else {
            if let Some(rejected) = self.access_filter(flow, &mut explanation)? {
                explanation.outcome = rejected;
                return Ok(explanation);
            }
            explanation.outcome = Outcome::Untouched {
                reason: if self.local.contains(&ip) {
                    format!(
                        "no virtual server on {destination}: {ip} is an address of this node (kube-ipvs0 holds the Services' IPs), so the node's own sockets answer it"
                    )
                } else {
                    format!(
                        "no virtual server on {destination}: no ClusterIP, external or load-balancer IP of a Service with that port, and no NodePort of this node"
                    )
                },
            };
            return Ok(explanation);
        };
        let persistence = if vs.flags & FLAG_PERSISTENT != 0 {
            format!(
                ", persistent {} s (session affinity: a client seen within it goes back to its real server)",
                vs.timeout
            )
        } else {
            String::new()
        };
        explanation.steps.push(format!(
            "virtual server {destination}: scheduler {}{persistence}",
            vs.scheduler
        ));
        if let Some(dropped) = self.source_ranges(flow, &mut explanation)? {
            explanation.outcome = dropped;
            return Ok(explanation);
        }
        let reals = self
            .ipvs
            .destinations(&vs)
            .map_err(read_error("IPVS real servers"))?;
        explanation.reads.push(format!(
            "its {} real server{}",
            reals.len(),
            if reals.len() == 1 { "" } else { "s" }
        ));
        explanation.outcome = shares(&vs, &reals, &mut explanation.steps);
        self.hairpin(flow, &reals, &mut explanation)?;
        Ok(explanation)
    }

    /// A Service IP without a virtual server on this port and protocol: the access filter
    /// (filter's KUBE-IPVS-FILTER, in INPUT) rejects a new connection to an address of
    /// KUBE-IPVS-IPS that none of its sets lets through (asked over netlink in one send). The
    /// node's own connections meet it too: with no virtual server to take them, they come back
    /// in over the loopback.
    fn access_filter(
        &mut self,
        flow: &Flow,
        explanation: &mut Explanation,
    ) -> Result<Option<Outcome>, ExplainError> {
        let ip = flow.destination.ip();
        let family = IpFamily::of(&ip);
        let set = set_name(SERVICE_IPS, family);
        let address = Entry {
            address: Some(ip),
            ..Entry::default()
        };
        let served = Entry {
            protocol: Some(flow.protocol.number()),
            port: Some(flow.destination.port()),
            ..address.clone()
        };
        // The filter's order: a destination its sets serve returns first.
        let mut asked: Vec<(String, Entry)> = ACCESS_ALLOWED
            .iter()
            .map(|base| (set_name(base, family), served.clone()))
            .collect();
        let port_only = Entry {
            port: Some(flow.destination.port()),
            ..Entry::default()
        };
        asked.push((set_name(HEALTH_CHECK_PORTS, family), port_only));
        asked.push((set.clone(), address));
        let tests: Vec<(&str, Entry)> = asked
            .iter()
            .map(|(name, entry)| (name.as_str(), entry.clone()))
            .collect();
        explanation.reads.push(format!(
            "{} ipset entries of the access filter (one netlink send)",
            tests.len()
        ));
        let members = self.ipset.test(&tests).map_err(read_error("ipset"))?;
        let Some((service_ip, allowed)) = members.split_last() else {
            return Ok(None);
        };
        if allowed.contains(&Some(true)) || *service_ip != Some(true) {
            return Ok(None);
        }
        explanation.steps.push(format!(
            "{set}: {ip} is a Service IP, and no Service serves port {}/{} on it",
            flow.destination.port(),
            flow.protocol.lower()
        ));
        Ok(Some(Outcome::Reject {
            reason: "KUBE-IPVS-FILTER rejects new connections to a Service IP on a port no Service serves there".into(),
        }))
    }

    /// With `--from` one of the real servers: whether a connection the scheduler sends back to
    /// it is masqueraded (its entry in KUBE-LOOP-BACK, asked over netlink).
    fn hairpin(
        &mut self,
        flow: &Flow,
        reals: &[RealServer],
        explanation: &mut Explanation,
    ) -> Result<(), ExplainError> {
        let Some(source) = flow.source else {
            return Ok(());
        };
        let Some(own) = reals.iter().find(|r| r.address == source && r.weight > 0) else {
            return Ok(());
        };
        let set = set_name(LOOP_BACK, IpFamily::of(&source));
        let entry = Entry {
            address: Some(source),
            protocol: Some(flow.protocol.number()),
            port: Some(own.port),
            address2: Some(source),
        };
        explanation
            .reads
            .push(format!("one entry of ipset {set} (over netlink)"));
        let member = self
            .ipset
            .test(&[(&set, entry)])
            .map_err(read_error("ipset"))?;
        if member.first() == Some(&Some(true)) {
            explanation.steps.push(format!(
                "{set}: {source},{}:{},{source}: masqueraded when the scheduler sends {source} back to itself (hairpin)",
                flow.protocol.lower(),
                own.port
            ));
        }
        Ok(())
    }

    /// A load-balancer IP with source ranges drops a source outside them (iptables' firewall
    /// chain, from two sets): `Some(drop)` when the flow's source is outside.
    fn source_ranges(
        &mut self,
        flow: &Flow,
        explanation: &mut Explanation,
    ) -> Result<Option<Outcome>, ExplainError> {
        let family = IpFamily::of(&flow.destination.ip());
        let service = Entry {
            address: Some(flow.destination.ip()),
            protocol: Some(flow.protocol.number()),
            port: Some(flow.destination.port()),
            address2: None,
        };
        let firewalled = set_name(FIREWALLED, family);
        explanation
            .reads
            .push(format!("one entry of ipset {firewalled} (over netlink)"));
        let member = self
            .ipset
            .test(&[(&firewalled, service.clone())])
            .map_err(read_error("ipset"))?;
        if member.first() != Some(&Some(true)) {
            return Ok(None);
        }
        let Some(source) = flow.source else {
            explanation.steps.push(
                "a source outside the Service's loadBalancerSourceRanges is dropped (give --from to evaluate it)".into(),
            );
            return Ok(None);
        };
        let allowing = [
            set_name(ALLOWED_SOURCES, family),
            set_name(ALLOWED_NODE, family),
        ];
        let with_source = Entry {
            address2: Some(source),
            ..service
        };
        let asked: Vec<(&str, Entry)> = allowing
            .iter()
            .map(|set| (set.as_str(), with_source.clone()))
            .collect();
        explanation.reads.push(format!(
            "one entry of ipsets {} (over netlink)",
            allowing.join(" and ")
        ));
        let members = self.ipset.test(&asked).map_err(read_error("ipset"))?;
        if members.contains(&Some(true)) {
            explanation
                .steps
                .push("its source is within the Service's loadBalancerSourceRanges".into());
            return Ok(None);
        }
        let reason = "its source is outside the Service's loadBalancerSourceRanges";
        explanation.steps.push(format!(
            "{}: dropped: {reason}",
            set_name(FIREWALLED, family)
        ));
        Ok(Some(Outcome::Drop {
            reason: reason.into(),
        }))
    }
}

/// Where the scheduler sends a new connection: among the real servers with weight, in turn (rr:
/// equal turns, whatever the weight), in proportion to it (wrr), else evenly with a word on how
/// the scheduler chooses. kube-proxy gives every endpoint weight 1; a terminating endpoint
/// keeps weight 0: its connections go on, it gets no new one.
fn shares(vs: &VirtualServer, reals: &[RealServer], steps: &mut Vec<String>) -> Outcome {
    for real in reals.iter().filter(|r| r.weight == 0) {
        steps.push(format!(
            "real server {}: weight 0 (terminating): its {} active connections go on, it gets no new one",
            std::net::SocketAddr::new(real.address, real.port),
            real.active_conns
        ));
    }
    let usable: Vec<&RealServer> = reals.iter().filter(|r| r.weight > 0).collect();
    if usable.is_empty() {
        return Outcome::Reject {
            reason: "the Service has no endpoints this traffic may use: the virtual server has no real server with weight, and IPVS answers port unreachable".into(),
        };
    }
    let weighted = vs.scheduler == "wrr";
    if !matches!(vs.scheduler.as_str(), "rr" | "wrr") {
        steps.push(format!(
            "the {} scheduler chooses by connection counts or hashes, not in turn: each share is shown as equal",
            vs.scheduler
        ));
    }
    let total: f64 = usable
        .iter()
        .map(|r| if weighted { f64::from(r.weight) } else { 1.0 })
        .sum();
    steps.push(format!(
        "virtual server: to one of {} real servers ({} scheduling, masquerading forward)",
        usable.len(),
        vs.scheduler
    ));
    Outcome::Dnat {
        candidates: usable
            .iter()
            .map(|r| Candidate {
                endpoint: std::net::SocketAddr::new(r.address, r.port),
                probability: if weighted { f64::from(r.weight) } else { 1.0 } / total,
            })
            .collect(),
    }
}

impl crate::proxier::explanation::Explain for Session {
    fn explain(&mut self, flow: &Flow) -> Result<Explanation, ExplainError> {
        Session::explain(self, flow)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Protocol;

    fn vs(scheduler: &str) -> VirtualServer {
        VirtualServer {
            address: "10.96.0.10".parse().unwrap(),
            protocol: Protocol::Tcp,
            port: 80,
            scheduler: scheduler.into(),
            flags: 0,
            timeout: 0,
        }
    }

    #[test]
    fn shares_follow_the_weights_and_skip_terminating_endpoints() {
        let reals = [
            RealServer::new("10.244.1.1".parse().unwrap(), 8080, 1),
            RealServer::new("10.244.1.2".parse().unwrap(), 8080, 3),
            RealServer::new("10.244.1.3".parse().unwrap(), 8080, 0),
        ];
        let mut steps = Vec::new();
        let Outcome::Dnat { candidates } = shares(&vs("wrr"), &reals, &mut steps) else {
            panic!("a DNAT");
        };
        let shares: Vec<f64> = candidates.iter().map(|c| c.probability).collect();
        assert_eq!(shares, [0.25, 0.75]);
        assert!(steps[0].contains("terminating"), "{steps:?}");
        let Outcome::Dnat { candidates } = shares_of(&vs("lc"), &reals) else {
            panic!("a DNAT");
        };
        assert!(candidates.iter().all(|c| c.probability == 0.5));
        assert!(matches!(
            shares_of(&vs("rr"), &reals[2..]),
            Outcome::Reject { .. }
        ));
    }

    fn shares_of(vs: &VirtualServer, reals: &[RealServer]) -> Outcome {
        shares(vs, reals, &mut Vec::new())
    }
}
