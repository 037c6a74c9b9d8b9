//! Every flag upstream kube-proxy 1.35 accepts (cmd/kube-proxy/app/options.go, the logging
//! flags component-base registers, cobra's and verflag's, cadvisor's two), what each does here,
//! and the ones this program adds.

use super::super::duration::GoDuration;
use super::super::types::KubeProxyConfiguration;

/// How a flag's value is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `--flag` or `--flag=BOOL` (never `--flag BOOL`).
    Bool,
    Text,
    Int32,
    /// pflag's uint32 (kept in an int32: what this program reads fits).
    Uint32,
    Float32,
    Duration,
    /// Comma-separated values; repeating the flag adds more.
    List,
    /// `KEY=BOOL,...`; repeating the flag adds more.
    BoolMap,
    /// A klog level (`-v 4`).
    Level,
    Ip,
    IpPort,
    Quantity,
    /// `--version`, `--version=raw` or `--version=vX.Y.Z`.
    Version,
}

/// A value as read.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Bool(bool),
    Text(String),
    Int(i32),
    Float(f32),
    Duration(GoDuration),
    List(Vec<String>),
    BoolMap(Vec<(String, bool)>),
    Level(u32),
}

impl Value {
    fn text(&self) -> String {
        match self {
            Value::Text(text) => text.clone(),
            Value::List(items) => items.join(","),
            other => format!("{other:?}"),
        }
    }
}

/// Sets what a flag means on a configuration; `mode` is the proxy mode the command line asks for
/// (sync periods and masquerade-all go to that mode's section, as upstream's do).
pub type Setter = fn(&mut KubeProxyConfiguration, &Value, &str);

/// What a flag does.
#[derive(Clone, Copy)]
pub enum Role {
    /// Sets a configuration field. With `--config` the file wins and the flag is ignored (as
    /// upstream; a warning names it).
    Config(Setter),
    /// A logging setting: applies over the file too.
    Logging(Setter),
    /// Read by the program itself (`--config`, `--cleanup`, `--hostname-override`, ...).
    Control,
    /// Upstream's deprecated flag: accepted with its deprecation message.
    Deprecated(&'static str),
    /// Accepted, and does nothing here: why.
    NoEffect(&'static str),
}

/// One flag.
#[derive(Clone, Copy)]
pub struct Spec {
    pub name: &'static str,
    pub kind: Kind,
    pub role: Role,
    pub help: &'static str,
}

const fn spec(name: &'static str, kind: Kind, role: Role, help: &'static str) -> Spec {
    Spec {
        name,
        kind,
        role,
        help,
    }
}

fn text(value: &Value) -> String {
    value.text()
}

fn flag_bool(value: &Value) -> bool {
    matches!(value, Value::Bool(true))
}

fn int(value: &Value) -> i32 {
    match value {
        Value::Int(v) => *v,
        _ => 0,
    }
}

fn duration(value: &Value) -> GoDuration {
    match value {
        Value::Duration(d) => *d,
        _ => GoDuration::default(),
    }
}

fn list(value: &Value) -> Vec<String> {
    match value {
        Value::List(items) => items.clone(),
        _ => Vec::new(),
    }
}

mod upstream;

pub use upstream::{RETIRED, UPSTREAM};

/// This program's own flags.
pub const OURS: &[Spec] = &[
    spec(
        "dry-run",
        Kind::Bool,
        Role::Control,
        "Program nothing: log the service ports and endpoints each sync would program (kube-proxy-rs).",
    ),
    spec(
        "ipvs-fallback",
        Kind::Bool,
        Role::Control,
        "In IPVS mode, when the node cannot run IPVS, use iptables instead of exiting (default true; kube-proxy-rs).",
    ),
    spec(
        "exit-on-config-change",
        Kind::Bool,
        Role::Control,
        "Exit when the --config file changes, so that the DaemonSet restarts with it (default true; kube-proxy-rs).",
    ),
    spec(
        "offload-packet-threshold",
        Kind::Uint32,
        Role::Control,
        "In nftables mode, offload a connection to a ClusterIP to the kernel's flowtable fast path once it has seen more than this many packets (KEP-4963, not in upstream kube-proxy; its proposed default is 20). 0, the default, is off. Applies with --config too (kube-proxy-rs).",
    ),
];

/// The flag named `name` (dashes, not underscores).
pub fn find(name: &str) -> Option<&'static Spec> {
    UPSTREAM.iter().chain(OURS).find(|spec| spec.name == name)
}

/// The retired flag named `name`.
pub fn retired(name: &str) -> Option<&'static (&'static str, Kind, &'static str)> {
    RETIRED.iter().find(|(retired, _, _)| *retired == name)
}
