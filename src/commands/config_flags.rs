//! The daemon's configuration flags, offered by `render` and `print-config` as clap arguments:
//! one for each flag the daemon reads but those that run or stop it (`--cleanup`, `--version`,
//! ...), so that their help lists them and a mistyped one gets the closest name. What was given
//! goes back, in order, to the daemon's own reader (`config::Flags`), which checks each value
//! and combines them with `--config` exactly as the daemon does.

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches};

use crate::config::{self, Kind, Role, Spec};

/// Flags that make a subcommand's configuration, shown first: the rest go under a heading.
const FIRST: [&str; 3] = ["config", "hostname-override", "proxy-mode"];

/// The heading of the rest (shown by `--help`, not `-h`).
const HEADING: &str = "Configuration flags (the daemon's, as upstream kube-proxy reads them)";

/// The daemon's own flags that do something other than configure it.
const NOT_CONFIGURATION: [&str; 9] = [
    "write-config-to",
    "cleanup",
    "init-only",
    "version",
    "help",
    "dry-run",
    "ipvs-fallback",
    "exit-on-config-change",
    "offload-packet-threshold",
];

/// Every configuration flag of the daemon's, and the retired ones it accepts (hidden).
fn names() -> impl Iterator<Item = &'static str> {
    offered()
        .map(|spec| spec.name)
        .chain(config::retired_flags().iter().map(|(name, _, _)| *name))
}

/// The daemon's flags `render` and `print-config` take (retired ones aside).
pub fn offered() -> impl Iterator<Item = &'static Spec> {
    config::specs().filter(|spec| !NOT_CONFIGURATION.contains(&spec.name))
}

/// `command` with the daemon's configuration flags.
pub fn add(command: clap::Command) -> clap::Command {
    let (first, rest): (Vec<&Spec>, Vec<&Spec>) =
        offered().partition(|spec| FIRST.contains(&spec.name));
    let retired = config::retired_flags()
        .iter()
        .map(|(name, kind, why)| arg(name, *kind, why).hide(true));
    command
        .args(first.into_iter().map(shown))
        .next_help_heading(HEADING)
        .args(
            rest.into_iter()
                .map(|spec| shown(spec).hide_short_help(true)),
        )
        .args(retired)
}

fn shown(spec: &Spec) -> Arg {
    let arg = arg(spec.name, spec.kind, spec.help);
    match spec.role {
        Role::Deprecated(_) | Role::NoEffect(_) => arg.hide(true),
        _ => arg,
    }
}

fn arg(name: &'static str, kind: Kind, help: &'static str) -> Arg {
    let arg = Arg::new(name)
        .long(name)
        .help(help)
        .action(ArgAction::Append);
    let arg = if name == "v" { arg.short('v') } else { arg };
    match kind {
        // pflag's booleans: `--flag` or `--flag=false`, never `--flag false`.
        Kind::Bool => arg
            .num_args(0..=1)
            .require_equals(true)
            .default_missing_value("true")
            .value_name("BOOL"),
        other => arg
            .num_args(1)
            .allow_hyphen_values(true)
            .value_name(value_name(other)),
    }
}

fn value_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Bool | Kind::Version => "BOOL",
        Kind::Text => "STRING",
        Kind::Int32 => "INT32",
        Kind::Uint32 => "UINT32",
        Kind::Float32 => "FLOAT32",
        Kind::Duration => "DURATION",
        Kind::List => "STRINGS",
        Kind::BoolMap => "KEY=BOOL,...",
        Kind::Level => "LEVEL",
        Kind::Ip => "IP",
        Kind::IpPort => "IP:PORT",
        Kind::Quantity => "QUANTITY",
    }
}

/// The configuration flags given, in the order given, as the daemon's reader takes them
/// (`--name=value`).
pub fn given(matches: &ArgMatches) -> Vec<String> {
    let mut given: Vec<(usize, String)> = Vec::new();
    for name in names() {
        if matches.value_source(name) != Some(ValueSource::CommandLine) {
            continue;
        }
        let (Some(indices), Some(values)) = (matches.indices_of(name), matches.get_raw(name))
        else {
            continue;
        };
        for (index, value) in indices.zip(values) {
            given.push((index, format!("--{name}={}", value.to_string_lossy())));
        }
    }
    given.sort();
    given.into_iter().map(|(_, flag)| flag).collect()
}
