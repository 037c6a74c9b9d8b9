//! `explain`'s command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgGroup, Args};

use super::EXIT_BAD_FLAGS;
use crate::config::ProxyMode;
use crate::explain::{self, Output, Request, Target};

/// What this node does with one packet, read from the kernel of the network namespace it runs
/// in, and compared with what the running daemon wants.
///
/// It reads only the objects the packet can meet (never a whole table, but on legacy iptables,
/// whose kernel interface hands out whole tables), prints the connections conntrack already
/// tracks for the flow, the Service, each step, the endpoints with the chance of each as
/// programmed (or why the packet is rejected, dropped or left alone), and whether the kernel
/// agrees with the daemon's debug endpoint, is behind it, or drifted. --all checks every
/// service port of the node that way and lists the ones that differ.
#[derive(Args)]
#[command(
    group(ArgGroup::new("target").required(true).args(["to", "all"])),
    after_help = EXAMPLES
)]
pub struct ExplainArgs {
    /// The packet's destination; tcp unless a protocol (tcp, udp, sctp) is given.
    #[arg(long, value_name = "ADDRESS:PORT[/PROTOCOL]")]
    to: Option<String>,
    /// The packet's source, to evaluate source matches (masquerade, loadBalancerSourceRanges).
    #[arg(long, value_name = "ADDRESS", requires = "to")]
    from: Option<String>,
    /// Every service port of the node, each compared with what the daemon wants.
    #[arg(long)]
    all: bool,
    /// The mode to read [default: the config's, else the one whose objects the kernel holds].
    #[arg(long, value_name = "MODE", value_parser = mode_names())]
    mode: Option<String>,
    /// The daemon's configuration file, for its mode and metrics address.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The daemon's metrics address, where its debug endpoint answers [default: the config's
    /// metricsBindAddress, else 127.0.0.1:10249].
    #[arg(long, value_name = "ADDRESS")]
    metrics: Option<String>,
    /// How to print the answer.
    #[arg(short = 'o', long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json"])]
    output: String,
}

const EXAMPLES: &str = "\
Examples:
  kubectl -n kube-system exec ds/kube-proxy -- kube-proxy-rs explain --to 10.96.0.10:80/tcp
  kube-proxy-rs explain --to [fd00::10]:53/udp --from fd00:10:244:1::5 -o json
  kube-proxy-rs explain --all --config=/var/lib/kube-proxy/config.conf";

/// `explain`: prints the answer, or says why there is none.
pub fn run(args: ExplainArgs) -> ExitCode {
    let request = match request(args) {
        Ok(request) => request,
        Err(err) => {
            eprintln!("kube-proxy-rs explain: {err}");
            return ExitCode::from(EXIT_BAD_FLAGS);
        }
    };
    match explain::run(&request) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("kube-proxy-rs explain: {err}");
            ExitCode::FAILURE
        }
    }
}

fn mode_names() -> clap::builder::PossibleValuesParser {
    ProxyMode::ALL.map(ProxyMode::as_str).into()
}

fn request(args: ExplainArgs) -> Result<Request, String> {
    let mode = match args.mode.as_deref() {
        Some(word) => Some(ProxyMode::parse(word).ok_or_else(|| format!("--mode {word:?}"))?),
        None => None,
    };
    let target = match (args.to, args.all) {
        (Some(to), _) => Target::Flow {
            to,
            from: args.from,
        },
        (None, _) => Target::All,
    };
    let output = if args.output == "json" {
        Output::Json
    } else {
        Output::Text
    };
    Request::new(target, mode, args.config.as_deref(), args.metrics, output)
}
