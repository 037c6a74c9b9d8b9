//! What `explain` asks the running daemon: its debug endpoint on the metrics address, for what
//! it wants for the Service a flow is bound for, the Service port of a destination whose kernel
//! objects carry no names, and where its localhost NodePort proxy relays a connection.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::model::{IpFamily, Protocol, ServicePortName};
use crate::proxier::explanation::{
    Candidate, Explanation, Flow, NamedDestination, NamedRelay, Outcome, Wanted, policy_name,
};
use crate::servers::debug::{DESTINATIONS_PATH, RELAYS_PATH, SERVICES_PATH};

/// What the daemon wants for the Service the kernel's answer names (or, where the kernel keeps
/// no names, the one the daemon names), to compare with; `None` when nothing is compared.
pub(super) fn daemon_wants(
    metrics: &str,
    explanation: &mut Explanation,
) -> Option<Result<Wanted, String>> {
    let loopback_tcp = explanation.flow.destination.ip().is_loopback()
        && explanation.flow.protocol == Protocol::Tcp;
    match (&explanation.outcome, explanation.service.clone()) {
        (Outcome::Untouched { .. }, None) if explanation.listener_on_destination => {
            relayed_by_daemon(metrics, explanation)
        }
        (_, Some(service)) => {
            let name = &service.service;
            Some(
                ask_daemon(metrics, &format!("{SERVICES_PATH}{name}")).and_then(|body| {
                    serde_json::from_str::<Wanted>(&body)
                        .map_err(|err| format!("the daemon's answer: {err}"))
                }),
            )
        }
        (Outcome::Untouched { .. }, None) if loopback_tcp => {
            unrelayed_by_daemon(metrics, explanation)
        }
        (Outcome::Untouched { .. }, None) => None,
        (_, None) => Some(named_by_daemon(metrics, explanation)),
    }
}

/// Whether the listener on a loopback address that takes a flow is the localhost NodePort
/// proxy's, as the daemon holds its listeners: then the flow is relayed, to the endpoints the
/// daemon names, and compared with what it wants for that Service. A listener the daemon does
/// not hold is another program's: nothing of kube-proxy's takes the flow; one the daemon cannot
/// be asked about is not said to relay.
fn relayed_by_daemon(
    metrics: &str,
    explanation: &mut Explanation,
) -> Option<Result<Wanted, String>> {
    let destination = explanation.flow.destination;
    let path = format!("{RELAYS_PATH}{}/{}", destination.ip(), destination.port());
    let named = match ask_decoded::<NamedRelay>(metrics, &path) {
        Ok(Some(named)) => named,
        Ok(None) => {
            qualify_listener(
                explanation,
                ": another program's, not the localhost NodePort proxy's (its daemon has no listener there)",
            );
            return unrelayed_by_daemon(metrics, explanation);
        }
        Err(why) => {
            qualify_listener(
                explanation,
                " (whether it is the localhost NodePort proxy's, only its daemon can say)",
            );
            return Some(Err(why));
        }
    };
    name_port(explanation, named.service_port, &named.policy);
    explanation.steps.push(format!(
        "the localhost NodePort proxy listens there (traffic policy {})",
        named.policy
    ));
    let share = 1.0 / named.endpoints.len().max(1) as f64;
    explanation.outcome = Outcome::Relayed {
        listener: destination,
        candidates: named
            .endpoints
            .iter()
            .map(|&endpoint| Candidate {
                endpoint,
                probability: share,
            })
            .collect(),
    };
    Some(Ok(named.wanted))
}

/// Says whose the listener on the destination is, after the untouched flow's reason.
fn qualify_listener(explanation: &mut Explanation, whose: &str) {
    if let Outcome::Untouched { reason } = &mut explanation.outcome {
        reason.push_str(whose);
    }
}

/// A TCP flow to a loopback address that nothing of ours takes: compared only where the daemon
/// names it as a NodePort its localhost proxy should relay (its listener is missing: the port
/// is another program's, or the proxy could not listen).
fn unrelayed_by_daemon(
    metrics: &str,
    explanation: &mut Explanation,
) -> Option<Result<Wanted, String>> {
    let destination = explanation.flow.destination;
    let path = destination_path(&explanation.flow, true);
    let named: NamedDestination = ask_decoded(metrics, &path).ok()??;
    let family = IpFamily::of(&destination.ip()).name();
    let relayed = named.wanted.ports.iter().any(|p| {
        p.localhost_proxy && p.family == family && p.node_port == Some(destination.port())
    });
    if !relayed {
        return None;
    }
    name_port(explanation, named.service_port, &named.policy);
    Some(Ok(named.wanted))
}

/// Names the Service port and policy of a flow whose kernel objects carry no names (IPVS'
/// virtual servers) by asking the daemon, and returns what it wants for that Service.
fn named_by_daemon(metrics: &str, explanation: &mut Explanation) -> Result<Wanted, String> {
    let destination = explanation.flow.destination;
    let node =
        crate::sys::host::net::LocalAddresses::addresses(&crate::sys::host::net::SystemAddresses)
            .contains(&destination.ip());
    let path = destination_path(&explanation.flow, node);
    let body = ask_daemon(metrics, &path).map_err(|why| {
        format!("the kernel keeps no Service name for it; asking the daemon: {why}")
    })?;
    let named: NamedDestination =
        serde_json::from_str(&body).map_err(|err| format!("the daemon's answer: {err}"))?;
    name_port(explanation, named.service_port, &named.policy);
    Ok(named.wanted)
}

/// The service port and the traffic policy the daemon names for the flow.
fn name_port(explanation: &mut Explanation, service_port: String, policy: &str) {
    explanation.service = ServicePortName::parse(&service_port, explanation.flow.protocol);
    explanation.policy = Some(policy_name(policy == "Local"));
}

/// The daemon's debug path naming the service port of `flow`'s destination (`node`: the
/// address is one NodePorts answer on).
fn destination_path(flow: &Flow, node: bool) -> String {
    format!(
        "{DESTINATIONS_PATH}{}/{}/{}{}",
        flow.protocol.lower(),
        flow.destination.ip(),
        flow.destination.port(),
        if node { "/node" } else { "" }
    )
}

/// The daemon's answer at `path`, decoded; `None` when it knows nothing there.
fn ask_decoded<T: serde::de::DeserializeOwned>(
    metrics: &str,
    path: &str,
) -> Result<Option<T>, String> {
    ask_daemon_if_known(metrics, path)?
        .map(|body| {
            serde_json::from_str(&body).map_err(|err| format!("the daemon's answer: {err}"))
        })
        .transpose()
}

/// The daemon's debug answer at `path`: one GET on the metrics address (on loopback when it is
/// every interface's).
pub(super) fn ask_daemon(metrics: &str, path: &str) -> Result<String, String> {
    ask_daemon_if_known(metrics, path)?.ok_or_else(|| format!("the daemon knows nothing at {path}"))
}

/// As [`ask_daemon`]; `None` when the daemon answers that it knows nothing there (404).
fn ask_daemon_if_known(metrics: &str, path: &str) -> Result<Option<String>, String> {
    let mut address: SocketAddr = metrics
        .parse()
        .map_err(|_| format!("the metrics address {metrics:?} is not ADDRESS:PORT"))?;
    if address.ip().is_unspecified() {
        address.set_ip(IpFamily::of(&address.ip()).loopback());
    }
    let unanswered = |err: std::io::Error| format!("the daemon did not answer at {address}: {err}");
    let limit = Duration::from_secs(5);
    let mut stream = TcpStream::connect_timeout(&address, limit).map_err(unanswered)?;
    stream.set_read_timeout(Some(limit)).map_err(unanswered)?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").map_err(unanswered)?;
    let mut response = String::new();
    stream
        .take(1 << 28)
        .read_to_string(&mut response)
        .map_err(unanswered)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.lines().next().unwrap_or_default();
    match status.split_whitespace().nth(1) {
        Some("200") => Ok(Some(body.to_string())),
        Some("404") => Ok(None),
        _ => Err(format!("the daemon answered {status:?} at {path}")),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;
    use std::net::TcpListener;

    use super::*;

    /// An explanation of a TCP flow to 127.0.0.1:30080 that a listener there takes.
    fn taken_by_a_listener() -> Explanation {
        let flow = Flow::parse("127.0.0.1:30080/tcp", None).unwrap();
        let mut explanation = Explanation::new(crate::config::ProxyMode::Iptables, &flow);
        explanation.outcome = Outcome::Untouched {
            reason: "no rule of ours matches; a TCP listener on 127.0.0.1:30080 takes it".into(),
        };
        explanation.listener_on_destination = true;
        explanation
    }

    /// A daemon that answers every request with 404, `answers` times.
    fn knowing_nothing(answers: usize) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for stream in listener.incoming().take(answers) {
                let mut stream = stream.unwrap();
                // The whole request first: closing with part of it unread resets the
                // connection instead of ending it.
                let mut request = Vec::new();
                let mut chunk = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = stream.write_all(b"HTTP/1.0 404 Not Found\r\n\r\n");
            }
        });
        address
    }

    fn reason(explanation: &Explanation) -> &str {
        match &explanation.outcome {
            Outcome::Untouched { reason } => reason,
            other => panic!("not untouched: {other:?}"),
        }
    }

    #[test]
    fn a_listener_the_daemon_cannot_be_asked_about_is_not_said_to_relay() {
        let unused = TcpListener::bind("127.0.0.1:0").unwrap();
        let metrics = unused.local_addr().unwrap().to_string();
        drop(unused);
        let mut explanation = taken_by_a_listener();
        let answer = daemon_wants(&metrics, &mut explanation);
        assert!(matches!(answer, Some(Err(_))), "{answer:?}");
        assert!(
            reason(&explanation).starts_with("no rule of ours matches; a TCP listener")
                && reason(&explanation).ends_with("only its daemon can say)"),
            "{explanation:?}"
        );
        let json = serde_json::to_string(&explanation).unwrap();
        assert!(json.contains("\"listener_on_destination\":true"), "{json}");
    }

    #[test]
    fn a_listener_the_daemon_does_not_hold_is_another_programs() {
        let metrics = knowing_nothing(2);
        let mut explanation = taken_by_a_listener();
        let answer = daemon_wants(&metrics, &mut explanation);
        // Nor does the daemon name the port as one its proxy should relay: nothing to compare.
        assert!(answer.is_none(), "{answer:?}");
        assert!(
            reason(&explanation).starts_with("no rule of ours matches; a TCP listener")
                && reason(&explanation).contains("another program's"),
            "{explanation:?}"
        );
    }

    #[test]
    fn a_flow_without_a_listener_leaves_the_field_out() {
        let flow = Flow::parse("127.0.0.1:30080/tcp", None).unwrap();
        let json =
            serde_json::to_string(&Explanation::new(crate::config::ProxyMode::Iptables, &flow))
                .unwrap();
        assert!(!json.contains("listener_on_destination"), "{json}");
    }
}
