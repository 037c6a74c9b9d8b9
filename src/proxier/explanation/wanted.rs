//! What the running daemon wants, as its debug endpoint answers, and how the kernel's answer
//! for a flow compares with it.

use std::net::{IpAddr, SocketAddr};

use serde::Serialize;

use super::{Explanation, Flow, Outcome};
use crate::model::{IpFamily, Protocol};

/// What the daemon wants programmed for one Service, as its debug endpoint answers
/// (`/debug/kube-proxy-rs/services/<namespace>/<name>` on the metrics address).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Wanted {
    pub service: String,
    /// Changes of this Service wait for a sync: what the kernel holds may be behind.
    pub pending_changes: bool,
    pub ports: Vec<WantedPort>,
}

/// One port of the Service in one family: the endpoints the daemon picks for each policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct WantedPort {
    /// The port's name (`""` when the Service has one unnamed port).
    pub name: String,
    pub protocol: String,
    pub family: String,
    /// The ClusterIP of this family, and the port.
    pub cluster_ip: Option<IpAddr>,
    pub port: u16,
    /// For traffic under the Cluster policy, and under the Local one.
    pub cluster: Vec<SocketAddr>,
    pub local: Vec<SocketAddr>,
    /// Where else the port answers: its NodePort, its external and load-balancer IPs.
    #[serde(default)]
    pub node_port: Option<u16>,
    #[serde(default)]
    pub external_ips: Vec<IpAddr>,
    /// Whether traffic to the ClusterIP, and traffic from outside, is under the Local policy.
    #[serde(default)]
    pub internal_local: bool,
    #[serde(default)]
    pub external_local: bool,
    /// Whether the daemon's userspace proxy relays this port's NodePort on this family's
    /// loopback address.
    #[serde(default)]
    pub localhost_proxy: bool,
}

/// What the daemon's debug endpoint answers for a destination (`/debug/kube-proxy-rs/
/// destinations/<protocol>/<address>/<port>[/node]`): the service port it is, the policy its
/// traffic is under, and what the daemon wants for that Service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct NamedDestination {
    pub service_port: String,
    pub policy: String,
    pub wanted: Wanted,
}

/// What the daemon's debug endpoint answers for a loopback address and port its localhost
/// NodePort proxy listens on (`/debug/kube-proxy-rs/localhost-node-ports/<address>/<port>`):
/// the service port, the policy of its traffic, the endpoints the listener relays to, and
/// what the daemon wants for that Service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct NamedRelay {
    pub service_port: String,
    pub policy: String,
    pub endpoints: Vec<SocketAddr>,
    pub wanted: Wanted,
}

/// A traffic policy's name: `Local` or `Cluster`.
pub fn policy_name(local: bool) -> &'static str {
    if local { "Local" } else { "Cluster" }
}

/// The service port (`ns/svc:port`) a flow is bound for, and the policy its traffic is under,
/// from what the daemon `wanted` (for a mode whose kernel objects carry no Service names:
/// IPVS). `node_address` says whether the destination is one NodePorts answer on.
pub fn port_of_flow(
    wanted: &[Wanted],
    flow: &Flow,
    node_address: bool,
) -> Option<(String, &'static str)> {
    let (ip, port) = (flow.destination.ip(), flow.destination.port());
    for service in wanted {
        for p in &service.ports {
            if p.protocol != flow.protocol.lower() {
                continue;
            }
            let name = format!("{}:{}", service.service, p.name);
            if p.cluster_ip == Some(ip) && p.port == port {
                return Some((name, policy_name(p.internal_local)));
            }
            let external = p.external_ips.contains(&ip) && p.port == port;
            let node_port = node_address && p.node_port == Some(port);
            if external || node_port {
                return Some((name, policy_name(p.external_local)));
            }
        }
    }
    None
}

/// How the kernel's answer compares with the daemon's.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "comparison", rename_all = "lowercase")]
pub enum Comparison {
    /// The kernel sends the packet where the daemon wants it.
    Agrees,
    /// It does not: endpoints the daemon wants that the kernel lacks, and ones it holds that
    /// the daemon does not want.
    Differs {
        missing: Vec<SocketAddr>,
        extra: Vec<SocketAddr>,
        why: String,
    },
    /// No comparison: why.
    Unknown { why: String },
}

/// One service port checked by `explain --all`: the flow to its ClusterIP, and how the kernel's
/// answer compares with the daemon's.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Checked {
    pub service_port: String,
    pub flow: Flow,
    #[serde(flatten)]
    pub comparison: Comparison,
}

/// The flow to each port's ClusterIP of every Service the daemon `wanted`, with its port.
pub fn cluster_ip_flows(wanted: &[Wanted]) -> Vec<(&Wanted, &WantedPort, Flow)> {
    let mut flows = Vec::new();
    for service in wanted {
        for port in &service.ports {
            let (Some(ip), Some(protocol)) = (
                port.cluster_ip,
                Protocol::from_api(&port.protocol.to_ascii_uppercase()),
            ) else {
                continue;
            };
            let flow = Flow {
                destination: SocketAddr::new(ip, port.port),
                protocol,
                source: None,
            };
            flows.push((service, port, flow));
        }
    }
    flows
}

/// Compares where `explanation` says the packet goes with what the daemon `wanted` for the
/// port and the policy whose endpoints it is sent to.
pub fn compare(explanation: &Explanation, wanted: &Wanted) -> Comparison {
    let local = explanation.policy == Some("Local");
    let family = IpFamily::of(&explanation.flow.destination.ip()).name();
    let protocol = explanation.flow.protocol.lower();
    // The port the kernel's chain names, else the one whose ClusterIP and port it is.
    let named = explanation.service.as_ref().map(|s| s.port.as_str());
    let port = wanted.ports.iter().find(|p| {
        p.protocol == protocol
            && p.family == family
            && match named {
                Some(name) => p.name == name,
                None => {
                    p.cluster_ip == Some(explanation.flow.destination.ip())
                        && p.port == explanation.flow.destination.port()
                }
            }
    });
    let have: Vec<SocketAddr> = match &explanation.outcome {
        Outcome::Dnat { candidates } | Outcome::Relayed { candidates, .. } => {
            candidates.iter().map(|c| c.endpoint).collect()
        }
        _ => Vec::new(),
    };
    let Some(port) = port else {
        return Comparison::Differs {
            missing: Vec::new(),
            extra: have,
            why: format!("the daemon wants no such port of {}", wanted.service),
        };
    };
    // Rejected or dropped: the daemon wants no endpoint for it either, under the policy the
    // verdict says (a drop: the Local one).
    let local = local || matches!(explanation.outcome, Outcome::Drop { .. });
    // A loopback NodePort the daemon's proxy does not relay: nothing may relay it, and in
    // nftables mode (which programs none) it is refused or rejected, as the daemon wants.
    let relayed = matches!(explanation.outcome, Outcome::Relayed { .. });
    let unserved_loopback = (explanation.mode == crate::config::ProxyMode::Nftables || relayed)
        && explanation.flow.destination.ip().is_loopback()
        && !port.localhost_proxy;
    let want: &[SocketAddr] = if unserved_loopback {
        &[]
    } else if local {
        &port.local
    } else {
        &port.cluster
    };
    let missing: Vec<SocketAddr> = want.iter().filter(|e| !have.contains(e)).copied().collect();
    let extra: Vec<SocketAddr> = have.iter().filter(|e| !want.contains(e)).copied().collect();
    if missing.is_empty() && extra.is_empty() {
        return Comparison::Agrees;
    }
    let why = if wanted.pending_changes {
        "changes of this Service wait for a sync: the kernel is behind the daemon".into()
    } else {
        "no change of this Service waits for a sync: the kernel's state drifted from the daemon's (another program changed it, or a sync failed)".into()
    };
    Comparison::Differs {
        missing,
        extra,
        why,
    }
}

#[cfg(test)]
mod tests {
    use super::super::Candidate;
    use super::*;

    fn explained(endpoints: &[&str], policy: &'static str) -> Explanation {
        Explanation {
            mode: crate::config::ProxyMode::Nftables,
            flow: Flow::parse("10.96.0.10:80/tcp", None).unwrap(),
            conntrack: Vec::new(),
            service: Some(crate::model::ServicePortName::new(
                "default",
                "web",
                "http",
                crate::model::Protocol::Tcp,
            )),
            policy: Some(policy),
            steps: Vec::new(),
            outcome: Outcome::Dnat {
                candidates: endpoints
                    .iter()
                    .map(|e| Candidate {
                        endpoint: e.parse().unwrap(),
                        probability: 1.0 / endpoints.len() as f64,
                    })
                    .collect(),
            },
            reads: Vec::new(),
            daemon: None,
            listener_on_destination: false,
        }
    }

    fn wanted(cluster: &[&str], local: &[&str], pending_changes: bool) -> Wanted {
        let addresses = |v: &[&str]| v.iter().map(|e| e.parse().unwrap()).collect();
        Wanted {
            service: "default/web".into(),
            pending_changes,
            ports: vec![WantedPort {
                name: "http".into(),
                protocol: "tcp".into(),
                family: "IPv4".into(),
                cluster_ip: "10.96.0.10".parse().ok(),
                port: 80,
                cluster: addresses(cluster),
                local: addresses(local),
                ..WantedPort::default()
            }],
        }
    }

    #[test]
    fn a_destination_names_its_service_port_and_policy() {
        let mut service = wanted(&[], &[], false);
        let port = &mut service.ports[0];
        port.node_port = Some(30080);
        port.external_ips = vec!["192.168.200.1".parse().unwrap()];
        port.external_local = true;
        let named = |to: &str, node| {
            port_of_flow(
                std::slice::from_ref(&service),
                &Flow::parse(to, None).unwrap(),
                node,
            )
        };
        let web = Some(("default/web:http".to_string(), "Cluster"));
        let external = Some(("default/web:http".to_string(), "Local"));
        assert_eq!(named("10.96.0.10:80/tcp", false), web);
        assert_eq!(named("192.168.200.1:80/tcp", false), external);
        assert_eq!(named("192.168.0.2:30080/tcp", true), external);
        assert_eq!(named("192.168.0.2:30080/tcp", false), None);
        assert_eq!(named("10.96.0.10:80/udp", false), None);
        assert_eq!(named("10.96.0.10:81/tcp", false), None);
    }

    /// A flow to a loopback NodePort: relayed by the daemon's proxy, or (nftables mode, which
    /// programs none) rejected or refused when the proxy does not serve it.
    #[test]
    fn a_loopback_node_port_is_compared_with_what_the_proxy_serves() {
        let a = "10.0.0.1:80";
        let mut served = wanted(&[a], &[], false);
        served.ports[0].node_port = Some(30080);
        served.ports[0].localhost_proxy = true;
        let mut unserved = served.clone();
        unserved.ports[0].localhost_proxy = false;
        let mut relayed = explained(&[a], "Cluster");
        relayed.flow = Flow::parse("127.0.0.1:30080", None).unwrap();
        relayed.outcome = Outcome::Relayed {
            listener: relayed.flow.destination,
            candidates: vec![Candidate {
                endpoint: a.parse().unwrap(),
                probability: 1.0,
            }],
        };
        assert_eq!(compare(&relayed, &served), Comparison::Agrees);
        let Comparison::Differs { extra, .. } = compare(&relayed, &unserved) else {
            panic!("a relay the daemon does not want");
        };
        assert_eq!(extra, vec![a.parse().unwrap()]);

        let mut rejected = relayed.clone();
        rejected.outcome = Outcome::Reject {
            reason: "not served".into(),
        };
        assert_eq!(compare(&rejected, &unserved), Comparison::Agrees);
        assert!(matches!(
            compare(&rejected, &served),
            Comparison::Differs { .. }
        ));
        // iptables mode DNATs loopback NodePorts itself (route_localnet): compared as any.
        rejected.mode = crate::config::ProxyMode::Iptables;
        assert!(matches!(
            compare(&rejected, &unserved),
            Comparison::Differs { .. }
        ));
        // ... but nothing may relay one its daemon's proxy does not serve, in any mode.
        relayed.mode = crate::config::ProxyMode::Iptables;
        assert!(matches!(
            compare(&relayed, &unserved),
            Comparison::Differs { .. }
        ));
        // A proxy whose listener is missing: the endpoints it should relay to are missing.
        let mut refused = relayed.clone();
        refused.outcome = Outcome::Untouched {
            reason: "nothing listens".into(),
        };
        let Comparison::Differs { missing, .. } = compare(&refused, &served) else {
            panic!("a missing listener");
        };
        assert_eq!(missing, vec![a.parse().unwrap()]);
    }

    #[test]
    fn the_kernel_is_compared_with_the_policy_it_sends_to() {
        let a = "10.0.0.1:80";
        let b = "10.0.0.2:80";
        let both = wanted(&[a, b], &[a], false);
        assert_eq!(
            compare(&explained(&[a, b], "Cluster"), &both),
            Comparison::Agrees
        );
        assert_eq!(
            compare(&explained(&[a], "Local"), &both),
            Comparison::Agrees
        );
        let Comparison::Differs {
            missing,
            extra,
            why,
        } = compare(&explained(&[a], "Cluster"), &both)
        else {
            panic!("a difference");
        };
        assert_eq!((missing, extra), (vec![b.parse().unwrap()], vec![]));
        assert!(why.contains("drifted"), "{why}");
        let behind = wanted(&[a], &[a], true);
        let Comparison::Differs { why, .. } = compare(&explained(&[a, b], "Cluster"), &behind)
        else {
            panic!("a difference");
        };
        assert!(why.contains("wait for a sync"), "{why}");
    }
}
