//! The subcommands: `explain`, `render`, `print-config`, `completion` and `help`, read with clap
//! (each has `--help` with its flags and an example; a mistyped flag gets the closest one). The
//! daemon's own command line is upstream's, read by `config::flags` with pflag's rules; `main`
//! hands a command line here when its first word that is no flag's names a subcommand.

mod config_flags;
mod explain;
mod render;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::config::{self, NodeNameSources};

pub use config_flags::offered as configuration_flags;

/// Exit status for a configuration or input the program cannot use (sysexits' EX_USAGE).
pub const EXIT_BAD_CONFIG: u8 = 64;
/// Exit status for a command line it cannot read (upstream's, for flag errors).
pub const EXIT_BAD_FLAGS: u8 = 1;

/// The binary's name, as every message says it.
const PROGRAM: &str = "kube-proxy-rs";

#[derive(Parser)]
#[command(name = PROGRAM, disable_version_flag = true)]
struct Cli {
    #[command(subcommand)]
    command: Sub,
}

#[derive(Subcommand)]
enum Sub {
    Explain(explain::ExplainArgs),
    Render(render::RenderArgs),
    PrintConfig(render::PrintConfigArgs),
    /// Print a completion script for the subcommands' flags.
    #[command(after_help = COMPLETION_EXAMPLES)]
    Completion {
        /// The shell to complete in.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

const COMPLETION_EXAMPLES: &str = "\
Examples:
  kube-proxy-rs completion bash > /etc/bash_completion.d/kube-proxy-rs
  source <(kube-proxy-rs completion zsh)";

/// The subcommands as clap sees them: the derived ones, with the daemon's configuration flags
/// added to `render` and `print-config`, and `help` (clap's) printing the daemon's usage when
/// it names no subcommand.
fn command() -> clap::Command {
    Cli::command()
        .override_help(config::usage())
        .mut_subcommand("render", config_flags::add)
        .mut_subcommand("print-config", config_flags::add)
}

/// Runs the subcommand `args` names (without the program's name; the subcommand's name first,
/// or among flags before it, which are then the subcommand's) and answers the exit status.
pub fn run(args: Vec<String>, at: usize) -> ExitCode {
    let (before, from_name) = args.split_at(at.min(args.len()));
    let Some((name, after)) = from_name.split_first() else {
        return ExitCode::from(EXIT_BAD_FLAGS);
    };
    let mut line: Vec<OsString> = vec![PROGRAM.into(), name.into()];
    line.extend(
        before
            .iter()
            .chain(after)
            .map(|word| OsString::from(dashed(word))),
    );
    let matches = match command().try_get_matches_from(line) {
        Ok(matches) => matches,
        Err(err) => return clap_exit(&err),
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(err) => return clap_exit(&err),
    };
    let Some((_, sub_matches)) = matches.subcommand() else {
        return ExitCode::from(EXIT_BAD_FLAGS);
    };
    match cli.command {
        Sub::Explain(args) => explain::run(args),
        Sub::Render(args) => render::render(&args, config_flags::given(sub_matches)),
        Sub::PrintConfig(_) => render::print_config(config_flags::given(sub_matches)),
        Sub::Completion { shell } => {
            clap_complete::generate(shell, &mut command(), PROGRAM, &mut std::io::stdout());
            ExitCode::SUCCESS
        }
    }
}

/// A long flag's name with `-` for `_`, as pflag (and so the daemon) reads names.
fn dashed(word: &str) -> String {
    match word.strip_prefix("--") {
        Some(flag) => {
            let (name, value) = flag
                .split_once('=')
                .map_or((flag, None), |(n, v)| (n, Some(v)));
            let name = name.replace('_', "-");
            match value {
                Some(value) => format!("--{name}={value}"),
                None => format!("--{name}"),
            }
        }
        None => word.to_string(),
    }
}

/// clap's message (help and errors alike) and the exit status: 0 for help, 1 for an error, as
/// for the daemon's flags.
fn clap_exit(err: &clap::Error) -> ExitCode {
    let _ = err.print();
    if err.use_stderr() {
        ExitCode::from(EXIT_BAD_FLAGS)
    } else {
        ExitCode::SUCCESS
    }
}

/// Where the node's name may come from besides the flags: `NODE_NAME`, then the hostname.
pub fn node_name_sources() -> NodeNameSources {
    NodeNameSources {
        env_node_name: std::env::var("NODE_NAME").ok(),
        hostname: gethostname::gethostname().into_string().ok(),
    }
}

/// Writes the configuration as YAML: to stdout (`print-config`), or to a file
/// (`--write-config-to`, which then exits as upstream does).
pub fn write_config(
    config: &config::KubeProxyConfiguration,
    path: Option<&std::path::Path>,
) -> ExitCode {
    let text = match config::config_yaml(config) {
        Ok(text) => text,
        Err(err) => {
            eprintln!("{PROGRAM}: cannot write the configuration: {err}");
            return ExitCode::FAILURE;
        }
    };
    let Some(path) = path else {
        print!("{text}");
        return ExitCode::SUCCESS;
    };
    match std::fs::write(path, text) {
        Ok(()) => {
            tracing::info!(file = %path.display(), "Wrote configuration");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("{PROGRAM}: cannot write {}: {err}", path.display());
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests;
