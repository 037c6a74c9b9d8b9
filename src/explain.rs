//! `kube-proxy-rs explain --to ADDRESS:PORT[/PROTOCOL] [--from ADDRESS] [--mode MODE]
//! [--config FILE] [--metrics ADDRESS] [-o text|json]`: what this node does with one packet,
//! read from the kernel of the network namespace it runs in (on a node: `kubectl -n
//! kube-system exec ds/kube-proxy -- kube-proxy-rs explain ...`), compared with what the
//! running daemon wants (its debug endpoint on the metrics address).

use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use crate::config::{ProxyMode, read_config_file};
use crate::proxier::explanation::{
    Candidate, Checked, Comparison, Explanation, Flow, NamedDestination, NamedRelay, Outcome,
    Tracked, Wanted, compare, policy_name,
};
use crate::proxier::modes;
use crate::servers::debug::{DESTINATIONS_PATH, RELAYS_PATH, SERVICES_PATH};

/// How the answer is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
}

/// What `explain` was asked.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// One flow, or (`None`) every service port of the node (`--all`).
    pub flow: Option<Flow>,
    pub mode: Option<ProxyMode>,
    pub output: Output,
    /// The daemon's metrics address, where its debug endpoint answers.
    pub metrics: String,
}

/// The metrics address when neither `--metrics` nor the config names one (upstream's default).
const DEFAULT_METRICS: &str = "127.0.0.1:10249";

/// `explain`'s arguments (those after the word `explain`).
pub fn parse_args(args: &[String]) -> Result<Request, String> {
    let (mut to, mut from, mut mode, mut config, mut output) =
        (None, None, None, None, Output::Text);
    let mut metrics = None;
    let mut all = false;
    let mut words = args.iter();
    while let Some(word) = words.next() {
        let (name, inline) = match word.split_once('=') {
            Some((name, value)) => (name, Some(value.to_string())),
            None => (word.as_str(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| words.next().cloned())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match name {
            "--to" => to = Some(value()?),
            "--from" => from = Some(value()?),
            "--mode" => mode = Some(value()?),
            "--config" => config = Some(value()?),
            "--metrics" => metrics = Some(value()?),
            "--all" if inline.is_none() => all = true,
            "-o" | "--output" => {
                output = match value()?.as_str() {
                    "text" => Output::Text,
                    "json" => Output::Json,
                    other => return Err(format!("-o {other:?}: text or json")),
                }
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let flow = match (to, all) {
        (Some(to), false) => Some(Flow::parse(&to, from.as_deref())?),
        (None, true) => None,
        (Some(_), true) => return Err("--to and --all: one or the other".into()),
        (None, false) => return Err("--to ADDRESS:PORT[/PROTOCOL] or --all is needed".into()),
    };
    let from_config = match &config {
        Some(path) => Some(read_config_file(Path::new(path)).map_err(|err| err.to_string())?),
        None => None,
    };
    let mode = match (mode, &from_config) {
        (Some(mode), _) => Some(parse_mode(&mode, "--mode")?),
        (None, Some(decoded)) if !decoded.config.mode.is_empty() => {
            Some(parse_mode(&decoded.config.mode, "mode")?)
        }
        _ => None,
    };
    let metrics = metrics
        .or_else(|| {
            from_config
                .map(|decoded| decoded.config.metrics_bind_address)
                .filter(|address| !address.is_empty())
        })
        .unwrap_or_else(|| DEFAULT_METRICS.into());
    Ok(Request {
        flow,
        mode,
        output,
        metrics,
    })
}

fn parse_mode(text: &str, field: &str) -> Result<ProxyMode, String> {
    match text {
        "" | "iptables" => Ok(ProxyMode::Iptables),
        "ipvs" => Ok(ProxyMode::Ipvs),
        "nftables" => Ok(ProxyMode::Nftables),
        other => Err(format!("{field} {other:?}: iptables, ipvs or nftables")),
    }
}

/// Answers `request` from the kernel: the text to print, or why there is none.
pub fn run(request: &Request) -> Result<String, String> {
    let mode = request.mode.unwrap_or_else(modes::detect);
    let Some(flow) = &request.flow else {
        return run_all(request, mode);
    };
    let mut explanation = modes::explain(mode, flow).map_err(|err| err.to_string())?;
    let wanted = daemon_wants(&request.metrics, &mut explanation);
    explanation.daemon = wanted.map(|wanted| match wanted {
        Ok(wanted) => compare(&explanation, &wanted),
        Err(why) => Comparison::Unknown { why },
    });
    Ok(match request.output {
        Output::Json => {
            serde_json::to_string_pretty(&explanation).map_err(|err| err.to_string())? + "\n"
        }
        Output::Text => text(&explanation),
    })
}

/// What the daemon wants for the Service the kernel's answer names (or, where the kernel keeps
/// no names, the one the daemon names), to compare with; `None` when nothing is compared.
fn daemon_wants(metrics: &str, explanation: &mut Explanation) -> Option<Result<Wanted, String>> {
    let loopback_tcp = explanation.flow.destination.ip().is_loopback()
        && explanation.flow.protocol == crate::model::Protocol::Tcp;
    match (&explanation.outcome, explanation.service.clone()) {
        (Outcome::Relayed { .. }, None) => relayed_by_daemon(metrics, explanation),
        (_, Some(service)) => {
            let name = service
                .rsplit_once(':')
                .map_or(service.as_str(), |(name, _)| name);
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

/// Where the localhost NodePort proxy relays a flow a listener on a loopback address takes, as
/// the daemon holds its listeners, and what the daemon wants for that Service. A listener the
/// daemon does not hold is another program's: nothing of kube-proxy's takes the flow; one the
/// daemon cannot be asked about is not said to relay.
fn relayed_by_daemon(
    metrics: &str,
    explanation: &mut Explanation,
) -> Option<Result<Wanted, String>> {
    let destination = explanation.flow.destination;
    let path = format!("{RELAYS_PATH}{}/{}", destination.ip(), destination.port());
    let asked = ask_daemon_if_known(metrics, &path).and_then(|answer| {
        answer
            .map(|body| {
                serde_json::from_str::<NamedRelay>(&body)
                    .map_err(|err| format!("the daemon's answer: {err}"))
            })
            .transpose()
    });
    let named = match asked {
        Ok(Some(named)) => named,
        Ok(None) => {
            explanation.outcome = Outcome::Untouched {
                reason: format!(
                    "no rule of ours; a program listening on {destination} takes it, not the localhost NodePort proxy (its daemon has no listener there)"
                ),
            };
            return unrelayed_by_daemon(metrics, explanation);
        }
        Err(why) => {
            explanation.outcome = Outcome::Untouched {
                reason: format!(
                    "no rule of ours; a TCP listener on {destination} takes it (whether it is the localhost NodePort proxy's, only its daemon can say)"
                ),
            };
            return Some(Err(why));
        }
    };
    explanation.service = Some(named.service_port);
    explanation.policy = Some(policy_name(named.policy == "Local"));
    explanation.steps.push(format!(
        "the localhost NodePort proxy listens there (traffic policy {})",
        named.policy
    ));
    let share = 1.0 / named.endpoints.len().max(1) as f64;
    if let Outcome::Relayed { candidates, .. } = &mut explanation.outcome {
        *candidates = named
            .endpoints
            .iter()
            .map(|&endpoint| Candidate {
                endpoint,
                probability: share,
            })
            .collect();
    }
    Some(Ok(named.wanted))
}

/// A TCP flow to a loopback address that nothing of ours takes: compared only where the daemon
/// names it as a NodePort its localhost proxy should relay (its listener is missing: the port
/// is another program's, or the proxy could not listen).
fn unrelayed_by_daemon(
    metrics: &str,
    explanation: &mut Explanation,
) -> Option<Result<Wanted, String>> {
    let destination = explanation.flow.destination;
    let path = format!(
        "{DESTINATIONS_PATH}tcp/{}/{}/node",
        destination.ip(),
        destination.port()
    );
    let body = ask_daemon_if_known(metrics, &path).ok()??;
    let named: NamedDestination = serde_json::from_str(&body).ok()?;
    let family = if destination.is_ipv4() {
        "IPv4"
    } else {
        "IPv6"
    };
    let relayed = named.wanted.ports.iter().any(|p| {
        p.localhost_proxy && p.family == family && p.node_port == Some(destination.port())
    });
    if !relayed {
        return None;
    }
    explanation.service = Some(named.service_port);
    explanation.policy = Some(policy_name(named.policy == "Local"));
    Some(Ok(named.wanted))
}

/// Names the Service port and policy of a flow whose kernel objects carry no names (IPVS'
/// virtual servers) by asking the daemon, and returns what it wants for that Service.
fn named_by_daemon(metrics: &str, explanation: &mut Explanation) -> Result<Wanted, String> {
    let destination = explanation.flow.destination;
    let node =
        crate::sys::host::net::LocalAddresses::addresses(&crate::sys::host::net::SystemAddresses)
            .contains(&destination.ip());
    let path = format!(
        "{DESTINATIONS_PATH}{}/{}/{}{}",
        explanation.flow.protocol.lower(),
        destination.ip(),
        destination.port(),
        if node { "/node" } else { "" }
    );
    let body = ask_daemon(metrics, &path).map_err(|why| {
        format!("the kernel keeps no Service name for it; asking the daemon: {why}")
    })?;
    let named: NamedDestination =
        serde_json::from_str(&body).map_err(|err| format!("the daemon's answer: {err}"))?;
    explanation.service = Some(named.service_port);
    explanation.policy = Some(policy_name(named.policy == "Local"));
    Ok(named.wanted)
}

/// `--all`: every service port the daemon wants, a flow to its ClusterIP each, compared with
/// the kernel; the differences are listed.
fn run_all(request: &Request, mode: ProxyMode) -> Result<String, String> {
    let body = ask_daemon(&request.metrics, SERVICES_PATH)?;
    let wanted: Vec<Wanted> =
        serde_json::from_str(&body).map_err(|err| format!("the daemon's answer: {err}"))?;
    let checked = modes::explain_all(mode, &wanted).map_err(|err| err.to_string())?;
    let differing: Vec<&Checked> = checked
        .iter()
        .filter(|c| c.comparison != Comparison::Agrees)
        .collect();
    if request.output == Output::Json {
        let answer = serde_json::json!({
            "mode": mode.as_str(),
            "services": wanted.len(),
            "checked": checked.len(),
            "differing": differing,
        });
        return serde_json::to_string_pretty(&answer)
            .map(|text| text + "\n")
            .map_err(|err| err.to_string());
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "checked {} service ports of {} Services ({} mode): {} differ",
        checked.len(),
        wanted.len(),
        mode.as_str(),
        differing.len()
    );
    for checked in differing {
        let _ = writeln!(out, "{}  ({})", checked.service_port, checked.flow);
        daemon_text(Some(&checked.comparison), &mut out);
    }
    Ok(out)
}

/// The daemon's debug answer at `path`: one GET on the metrics address (on loopback when it is
/// every interface's).
fn ask_daemon(metrics: &str, path: &str) -> Result<String, String> {
    ask_daemon_if_known(metrics, path)?.ok_or_else(|| format!("the daemon knows nothing at {path}"))
}

/// As [`ask_daemon`]; `None` when the daemon answers that it knows nothing there (404).
fn ask_daemon_if_known(metrics: &str, path: &str) -> Result<Option<String>, String> {
    let mut address: SocketAddr = metrics
        .parse()
        .map_err(|_| format!("the metrics address {metrics:?} is not ADDRESS:PORT"))?;
    if address.ip().is_unspecified() {
        address.set_ip(match address {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
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

/// How many conntrack entries to endpoints still in use the text shows.
const TRACKED_SHOWN: usize = 5;

/// For a person: the flow and the Service first, then the steps, then where it goes.
pub fn text(explanation: &Explanation) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "flow:     {}", explanation.flow);
    let _ = writeln!(out, "mode:     {}", explanation.mode);
    // Entries to gone endpoints first, all of them; of the rest, a few.
    let mut tracked: Vec<&Tracked> = explanation.conntrack.iter().collect();
    tracked.sort_by_key(|entry| !entry.gone);
    let shown = tracked.iter().filter(|e| e.gone).count().max(TRACKED_SHOWN);
    for (index, entry) in tracked.iter().take(shown).enumerate() {
        let label = if index == 0 { "tracked:" } else { "" };
        let gone = if entry.gone {
            "  (a gone endpoint: this connection's packets still go there)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "{label:<10}{} -> {}{gone}",
            entry.source, entry.endpoint
        );
    }
    if tracked.len() > shown {
        let _ = writeln!(
            out,
            "          and {} more to current endpoints (-o json lists them)",
            tracked.len() - shown
        );
    }
    if let Some(service) = &explanation.service {
        let _ = writeln!(out, "service:  {service}");
    }
    for (index, step) in explanation.steps.iter().enumerate() {
        let label = if index == 0 { "path:" } else { "" };
        let _ = writeln!(out, "{label:<10}{step}");
    }
    let list = |candidates: &[Candidate], out: &mut String| {
        for candidate in candidates {
            let _ = writeln!(
                out,
                "          {:<40} {:>6.2}%",
                candidate.endpoint.to_string(),
                candidate.probability * 100.0
            );
        }
    };
    match &explanation.outcome {
        Outcome::Dnat { candidates } => {
            let _ = writeln!(out, "verdict:  DNAT to one of {}:", candidates.len());
            list(candidates, &mut out);
        }
        Outcome::Relayed {
            listener,
            candidates,
        } => {
            let _ = writeln!(
                out,
                "verdict:  relayed by the listener on {listener} to one of {}:",
                candidates.len()
            );
            list(candidates, &mut out);
        }
        Outcome::Reject { reason } => {
            let _ = writeln!(out, "verdict:  rejected: {reason}");
        }
        Outcome::Drop { reason } => {
            let _ = writeln!(out, "verdict:  dropped: {reason}");
        }
        Outcome::Untouched { reason } => {
            let _ = writeln!(out, "verdict:  not changed by kube-proxy: {reason}");
        }
    }
    daemon_text(explanation.daemon.as_ref(), &mut out);
    let _ = writeln!(out, "read:     {}", explanation.reads.join("; "));
    out
}

/// How the kernel's answer compares with the daemon's.
fn daemon_text(comparison: Option<&Comparison>, out: &mut String) {
    let list = |v: &[SocketAddr]| {
        v.iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match comparison {
        Some(Comparison::Agrees) => {
            let _ = writeln!(
                out,
                "daemon:   agrees: the kernel sends it where the daemon wants"
            );
        }
        Some(Comparison::Differs {
            missing,
            extra,
            why,
        }) => {
            let _ = writeln!(out, "daemon:   differs: {why}");
            if !missing.is_empty() {
                let _ = writeln!(
                    out,
                    "          the daemon wants, the kernel lacks: {}",
                    list(missing)
                );
            }
            if !extra.is_empty() {
                let _ = writeln!(
                    out,
                    "          the kernel holds, the daemon does not want: {}",
                    list(extra)
                );
            }
        }
        Some(Comparison::Unknown { why }) => {
            let _ = writeln!(out, "daemon:   not compared: {why}");
        }
        None => {}
    }
}
