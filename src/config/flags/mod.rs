//! The command line, read as upstream kube-proxy 1.35 reads it (pflag): every upstream flag,
//! `--flag=value` and `--flag value`, booleans as `--flag` or `--flag=false`, `_` and `-` alike in
//! names, `-v 4` / `-v=4` / `-v4` / `--v=4`. What a flag does is in [`table`]; how flags and
//! `--config` combine is in `config::resolve`.

mod table;
mod values;

use std::path::PathBuf;

pub use table::{Kind, Role, Spec, Value};

use super::types::KubeProxyConfiguration;

/// Why a command line cannot be used (the process exits 1, as upstream's does).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    #[error("unknown flag: --{0}")]
    Unknown(String),
    #[error("unknown shorthand flag: '{0}' in {1}")]
    UnknownShorthand(char, String),
    #[error("flag needs an argument: --{0}")]
    NeedsValue(String),
    #[error("invalid argument {value:?} for \"--{name}\" flag: {reason}")]
    Invalid {
        name: String,
        value: String,
        reason: String,
    },
    #[error("\"kube-proxy\" does not take any arguments, got {0:?}")]
    Arguments(Vec<String>),
    #[error("{0}")]
    Usage(String),
}

/// What `--version` asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum VersionRequest {
    #[default]
    None,
    /// Print the version and exit.
    Print,
    /// Print it in full and exit.
    Raw,
    /// Report this version (upstream's `--version=vX.Y.Z`) and run.
    Set(String),
}

/// The words that name a subcommand of ours (upstream's command takes no arguments). The
/// subcommands read their own command lines (`crate::commands`).
pub const SUBCOMMANDS: [&str; 5] = ["explain", "render", "print-config", "completion", "help"];

/// One flag as given.
#[derive(Clone, Debug, PartialEq)]
pub struct Given {
    pub name: &'static str,
    pub value: Value,
}

/// The command line, read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Flags {
    /// Every upstream flag given, in order.
    pub given: Vec<Given>,
    /// Retired flags given (accepted, they do nothing): name and why.
    pub retired: Vec<(&'static str, &'static str)>,
    /// Where a subcommand's name stands (the first word that is no flag's, when it names one):
    /// reading stops there, and the whole command line is the subcommand's.
    pub subcommand_at: Option<usize>,
    pub version: VersionRequest,
    pub help: bool,
    pub dry_run: bool,
    pub ipvs_fallback: Option<bool>,
    pub exit_on_config_change: Option<bool>,
    /// `--offload-packet-threshold`: 0 or absent is off.
    pub offload_packet_threshold: Option<u32>,
}

impl Flags {
    /// Reads `args` (without the program's name).
    pub fn parse_from<I, S>(args: I) -> Result<Flags, FlagError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let args: Vec<String> = args.into_iter().map(Into::into).collect();
        let mut flags = Flags::default();
        let mut positional = Vec::new();
        let mut index = 0;
        while index < args.len() {
            let arg = &args[index];
            index += 1;
            if arg == "--" {
                positional.extend(args[index..].iter().cloned());
                break;
            }
            let (name, inline) = if let Some(long) = arg.strip_prefix("--") {
                match long.split_once('=') {
                    Some((name, value)) => (name.replace('_', "-"), Some(value.to_string())),
                    None => (long.replace('_', "-"), None),
                }
            } else if let Some(short) = arg.strip_prefix('-').filter(|s| !s.is_empty()) {
                // Shorthands: -v (level) and -h (help) only.
                if let Some(rest) = short.strip_prefix('v') {
                    let value = rest.strip_prefix('=').unwrap_or(rest);
                    (
                        "v".to_string(),
                        (!value.is_empty()).then(|| value.to_string()),
                    )
                } else if short == "h" {
                    ("help".to_string(), None)
                } else {
                    let first = short.chars().next().unwrap_or_default();
                    return Err(FlagError::UnknownShorthand(first, arg.clone()));
                }
            } else {
                if positional.is_empty() && SUBCOMMANDS.contains(&arg.as_str()) {
                    flags.subcommand_at = Some(index - 1);
                    return Ok(flags);
                }
                positional.push(arg.clone());
                continue;
            };
            let Some(spec) = table::find(&name) else {
                if let Some((retired, kind, why)) = table::retired(&name) {
                    if *kind != Kind::Bool && inline.is_none() && index < args.len() {
                        index += 1;
                    }
                    flags.retired.push((retired, why));
                    continue;
                }
                return Err(FlagError::Unknown(name));
            };
            let raw = match (inline, spec.kind) {
                (Some(value), _) => value,
                (None, Kind::Bool) => "true".to_string(),
                (None, Kind::Version) => "true".to_string(),
                (None, _) if index < args.len() => {
                    index += 1;
                    args[index - 1].clone()
                }
                (None, _) => return Err(FlagError::NeedsValue(name)),
            };
            let value = read_value(spec, &raw).map_err(|reason| FlagError::Invalid {
                name: name.clone(),
                value: raw.clone(),
                reason,
            })?;
            flags.take(spec, value, &raw);
        }
        let non_empty: Vec<String> = positional.into_iter().filter(|a| !a.is_empty()).collect();
        if !non_empty.is_empty() {
            return Err(FlagError::Arguments(non_empty));
        }
        Ok(flags)
    }

    /// Records a flag: this program's own and the special ones in fields, the rest in `given`.
    fn take(&mut self, spec: &'static Spec, value: Value, raw: &str) {
        let flag = |v: &Value| matches!(v, Value::Bool(true));
        match spec.name {
            "dry-run" => self.dry_run = flag(&value),
            "ipvs-fallback" => self.ipvs_fallback = Some(flag(&value)),
            "exit-on-config-change" => self.exit_on_config_change = Some(flag(&value)),
            "offload-packet-threshold" => {
                if let Value::Int(count) = value {
                    self.offload_packet_threshold = u32::try_from(count).ok();
                }
            }
            "help" => self.help = flag(&value),
            "version" => {
                self.version = match raw {
                    "true" => VersionRequest::Print,
                    "raw" => VersionRequest::Raw,
                    _ if values::parse_bool(raw) == Ok(false) => VersionRequest::None,
                    other => VersionRequest::Set(other.to_string()),
                }
            }
            _ => self.given.push(Given {
                name: spec.name,
                value,
            }),
        }
    }

    /// The last value given for `name`.
    pub fn last(&self, name: &str) -> Option<&Value> {
        self.given
            .iter()
            .rev()
            .find(|g| g.name == name)
            .map(|g| &g.value)
    }

    fn text(&self, name: &str) -> Option<String> {
        match self.last(name)? {
            Value::Text(text) => Some(text.clone()),
            _ => None,
        }
    }

    fn boolean(&self, name: &str) -> bool {
        matches!(self.last(name), Some(Value::Bool(true)))
    }

    pub fn config(&self) -> Option<PathBuf> {
        self.text("config")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
    }

    pub fn write_config_to(&self) -> Option<PathBuf> {
        self.text("write-config-to")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
    }

    pub fn cleanup(&self) -> bool {
        self.boolean("cleanup")
    }

    pub fn init_only(&self) -> bool {
        self.boolean("init-only")
    }

    pub fn hostname_override(&self) -> Option<String> {
        self.text("hostname-override")
    }

    pub fn master(&self) -> Option<String> {
        self.text("master").filter(|m| !m.is_empty())
    }

    pub fn kubeconfig(&self) -> Option<PathBuf> {
        self.text("kubeconfig")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
    }

    pub fn proxy_mode(&self) -> Option<String> {
        self.text("proxy-mode")
    }

    /// The configuration the flags alone describe (no `--config`): upstream's defaults, then
    /// each flag in order; sync periods and masquerade-all go to the asked mode's section; the
    /// deprecated port flags fold into the bind addresses.
    pub fn apply_to(&self, config: &mut KubeProxyConfiguration) {
        let mode = self.proxy_mode().unwrap_or_default();
        for given in &self.given {
            if let Some(Role::Config(set) | Role::Logging(set)) =
                table::find(given.name).map(|s| s.role)
            {
                set(config, &given.value, &mode);
            }
        }
    }

    /// Applies only the logging flags (which win over a `--config` file, as upstream's do).
    pub fn apply_logging_to(&self, config: &mut KubeProxyConfiguration) {
        let mode = self.proxy_mode().unwrap_or_default();
        for given in &self.given {
            if let Some(Role::Logging(set)) = table::find(given.name).map(|s| s.role) {
                set(config, &given.value, &mode);
            }
        }
    }

    /// The deprecated `--healthz-port` / `--metrics-port` values given (without `--config`
    /// they set the bind addresses' ports; 0 turns the server off).
    pub fn deprecated_port(&self, name: &str) -> Option<i32> {
        match self.last(name)? {
            Value::Int(port) => Some(*port),
            _ => None,
        }
    }

    /// Flags that set configuration fields, which a `--config` file overrides (named in a
    /// warning; upstream ignores them silently).
    pub fn overridden_by_config_file(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for given in &self.given {
            // --kubeconfig still counts when the file names none (ours).
            let overridden = given.name != "kubeconfig"
                && matches!(
                    table::find(given.name).map(|s| s.role),
                    Some(Role::Config(_) | Role::Deprecated(_))
                );
            let name = format!("--{}", given.name);
            if overridden && !names.contains(&name) {
                names.push(name);
            }
        }
        names
    }

    /// Warnings the flags deserve (deprecated, retired, or read without effect here).
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        for given in &self.given {
            match table::find(given.name).map(|s| s.role) {
                Some(Role::Deprecated(message)) => warnings.push(format!(
                    "Flag --{} has been deprecated, {message}",
                    given.name
                )),
                Some(Role::NoEffect(why)) => warnings.push(format!(
                    "Flag --{} is accepted and has no effect in kube-proxy-rs: {why}",
                    given.name
                )),
                _ => {}
            }
        }
        for (name, why) in &self.retired {
            warnings.push(format!(
                "Flag --{name} is accepted and ignored: {why} (upstream kube-proxy 1.35 refuses it)"
            ));
        }
        warnings
    }
}

fn read_value(spec: &Spec, raw: &str) -> Result<Value, values::ValueError> {
    Ok(match spec.kind {
        Kind::Bool => Value::Bool(values::parse_bool(raw)?),
        Kind::Text | Kind::Version => Value::Text(raw.to_string()),
        Kind::Int32 => Value::Int(values::parse_int32(raw)?),
        Kind::Uint32 => Value::Int(values::parse_uint32(raw)?),
        Kind::Float32 => Value::Float(values::parse_float32(raw)?),
        Kind::Duration => Value::Duration(values::parse_duration(raw)?),
        Kind::List => Value::List(values::parse_list(raw)?),
        Kind::BoolMap => Value::BoolMap(values::parse_bool_map(raw)?),
        Kind::Level => Value::Level(values::parse_level(raw)?),
        // Empty is a no-op upstream (the value is left as it was).
        Kind::Ip if raw.is_empty() => Value::Text(String::new()),
        Kind::Ip => Value::Text(values::parse_ip(raw).map(|_| raw.to_string())?),
        Kind::IpPort if raw.is_empty() => Value::Text(String::new()),
        Kind::IpPort => Value::Text(values::parse_ip_port(raw)?),
        Kind::Quantity => Value::Text(values::parse_quantity(raw)?),
    })
}

/// Every flag the daemon reads: upstream's, then ours.
pub fn specs() -> impl Iterator<Item = &'static Spec> {
    table::UPSTREAM.iter().chain(table::OURS)
}

/// The retired flags the daemon accepts (and ignores): name, kind, why.
pub fn retired_flags() -> &'static [(&'static str, Kind, &'static str)] {
    table::RETIRED
}

/// `--help`'s text.
pub fn usage() -> String {
    let mut text = String::from(
        "kube-proxy-rs: a drop-in replacement for Kubernetes' kube-proxy.\n\n\
         Usage:\n  \
         kube-proxy-rs [flags]                run the proxy (upstream kube-proxy's flags, below)\n  \
         kube-proxy-rs explain --to ADDRESS:PORT[/PROTOCOL] | --all [flags]\n                                       one packet's path through what this node programmed\n  \
         kube-proxy-rs render [flags] FILE... what this node would program for objects in YAML files\n  \
         kube-proxy-rs print-config [flags]   the configuration in force, as YAML\n  \
         kube-proxy-rs completion SHELL       shell completion for the subcommands\n  \
         kube-proxy-rs help [COMMAND]         this text, or a subcommand's flags and examples\n\n\
         Flags:\n",
    );
    for spec in specs() {
        if matches!(spec.role, Role::Deprecated(_)) {
            continue;
        }
        let shorthand = match spec.name {
            "v" => "-v, ",
            "help" => "-h, ",
            _ => "    ",
        };
        let kind = match spec.kind {
            Kind::Bool | Kind::Version => "",
            Kind::Text => " string",
            Kind::Int32 => " int32",
            Kind::Uint32 => " uint32",
            Kind::Float32 => " float32",
            Kind::Duration => " duration",
            Kind::List => " strings",
            Kind::BoolMap => " mapStringBool",
            Kind::Level => " Level",
            Kind::Ip => " ip",
            Kind::IpPort => " ipport",
            Kind::Quantity => " quantity",
        };
        text.push_str(&format!(
            "  {shorthand}--{}{kind}\n        {}\n",
            spec.name, spec.help
        ));
    }
    text
}

#[cfg(test)]
mod tests;
