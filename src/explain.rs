//! `kube-proxy-rs explain --to ADDRESS:PORT[/PROTOCOL] [--from ADDRESS] [--mode MODE]
//! [--config FILE] [-o text|json]`: what this node does with one packet, read from the kernel
//! of the network namespace it runs in (on a node: `kubectl -n kube-system exec
//! ds/kube-proxy -- kube-proxy-rs explain ...`).

use std::fmt::Write as _;
use std::path::Path;

use crate::config::{ProxyMode, read_config_file};
use crate::proxier::explanation::{Explanation, Flow, Outcome};
use crate::proxier::modes;

/// How the answer is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
}

/// What `explain` was asked.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub flow: Flow,
    pub mode: Option<ProxyMode>,
    pub output: Output,
}

/// `explain`'s arguments (those after the word `explain`).
pub fn parse_args(args: &[String]) -> Result<Request, String> {
    let (mut to, mut from, mut mode, mut config, mut output) =
        (None, None, None, None, Output::Text);
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
    let to = to.ok_or("--to ADDRESS:PORT[/PROTOCOL] is needed")?;
    let flow = Flow::parse(&to, from.as_deref())?;
    let mode = match (mode, config) {
        (Some(mode), _) => Some(parse_mode(&mode, "--mode")?),
        (None, Some(path)) => config_mode(Path::new(&path))?,
        (None, None) => None,
    };
    Ok(Request { flow, mode, output })
}

fn parse_mode(text: &str, field: &str) -> Result<ProxyMode, String> {
    match text {
        "" | "iptables" => Ok(ProxyMode::Iptables),
        "ipvs" => Ok(ProxyMode::Ipvs),
        "nftables" => Ok(ProxyMode::Nftables),
        other => Err(format!("{field} {other:?}: iptables, ipvs or nftables")),
    }
}

/// The mode a config file names (`None`: it names none, so the kernel decides).
fn config_mode(path: &Path) -> Result<Option<ProxyMode>, String> {
    let decoded = read_config_file(path).map_err(|err| err.to_string())?;
    if decoded.config.mode.is_empty() {
        return Ok(None);
    }
    parse_mode(&decoded.config.mode, "mode").map(Some)
}

/// Answers `request` from the kernel: the text to print, or why there is none.
pub fn run(request: &Request) -> Result<String, String> {
    let mode = request.mode.unwrap_or_else(modes::detect);
    let explanation = modes::explain(mode, &request.flow).map_err(|err| err.to_string())?;
    Ok(match request.output {
        Output::Json => {
            serde_json::to_string_pretty(&explanation).map_err(|err| err.to_string())? + "\n"
        }
        Output::Text => text(&explanation),
    })
}

/// For a person: the flow and the Service first, then the steps, then where it goes.
pub fn text(explanation: &Explanation) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "flow:     {}", explanation.flow);
    let _ = writeln!(out, "mode:     {}", explanation.mode);
    for (index, entry) in explanation.conntrack.iter().enumerate() {
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
    if let Some(service) = &explanation.service {
        let _ = writeln!(out, "service:  {service}");
    }
    for (index, step) in explanation.steps.iter().enumerate() {
        let label = if index == 0 { "path:" } else { "" };
        let _ = writeln!(out, "{label:<10}{step}");
    }
    match &explanation.outcome {
        Outcome::Dnat { candidates } => {
            let _ = writeln!(out, "verdict:  DNAT to one of {}:", candidates.len());
            for candidate in candidates {
                let _ = writeln!(
                    out,
                    "          {:<40} {:>6.2}%",
                    candidate.endpoint.to_string(),
                    candidate.probability * 100.0
                );
            }
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
    let _ = writeln!(out, "read:     {}", explanation.reads.join("; "));
    out
}
