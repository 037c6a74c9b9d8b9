//! `kube-proxy-rs explain --to ADDRESS:PORT[/PROTOCOL] [--from ADDRESS] [--mode MODE]
//! [--config FILE] [--metrics ADDRESS] [-o text|json]` (its command line: `commands/explain.rs`):
//! what this node does with one packet,
//! read from the kernel of the network namespace it runs in (on a node: `kubectl -n
//! kube-system exec ds/kube-proxy -- kube-proxy-rs explain ...`), compared with what the
//! running daemon wants (its debug endpoint on the metrics address).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

use crate::config::{ProxyMode, read_config_file};
use crate::proxier::explanation::{
    Candidate, Checked, Comparison, Explanation, Flow, Outcome, Tracked, Wanted, compare,
};
use crate::proxier::modes;
use crate::servers::debug::SERVICES_PATH;

mod daemon;

use daemon::{ask_daemon, daemon_wants};

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

/// What to explain.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    /// A packet to `to` (`ADDRESS:PORT[/PROTOCOL]`), from `from` when given.
    Flow { to: String, from: Option<String> },
    /// Every service port of the node.
    All,
}

impl Request {
    /// The request for `target`: the mode and the daemon's metrics address as given, else as
    /// the configuration file `config` says, else the mode detected from the kernel and
    /// upstream's default address.
    pub fn new(
        target: Target,
        mode: Option<ProxyMode>,
        config: Option<&Path>,
        metrics: Option<String>,
        output: Output,
    ) -> Result<Request, String> {
        let flow = match target {
            Target::Flow { to, from } => Some(Flow::parse(&to, from.as_deref())?),
            Target::All => None,
        };
        let from_config = match config {
            Some(path) => Some(
                read_config_file(path)
                    .map_err(|err| err.to_string())?
                    .config,
            ),
            None => None,
        };
        let mode = match (mode, &from_config) {
            (Some(mode), _) => Some(mode),
            (None, Some(config)) if !config.mode.is_empty() => Some(
                config
                    .proxy_mode()
                    .ok_or_else(|| format!("mode {:?}: iptables, ipvs or nftables", config.mode))?,
            ),
            _ => None,
        };
        let metrics = metrics
            .or_else(|| {
                from_config
                    .map(|config| config.metrics_bind_address)
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

/// How many conntrack entries to endpoints still in use the text shows.
const TRACKED_SHOWN: usize = 5;

/// For a person: the flow and the Service first, then the steps, then where it goes.
pub fn text(explanation: &Explanation) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "flow:     {}", explanation.flow);
    let _ = writeln!(out, "mode:     {}", explanation.mode.as_str());
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
