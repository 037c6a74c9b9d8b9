//! What `kube-proxy-rs explain` says of one packet: the flow asked about, and, as a mode read
//! it from the kernel, each step it meets, the Service it matches, and where it goes (the
//! candidate endpoints with the chance of each as programmed) or what stops it.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use serde::Serialize;

use crate::config::ProxyMode;
use crate::model::{Protocol, ServicePortName};
use crate::sys::host::sockets::tcp_listener;

mod wanted;

pub use wanted::{
    Checked, Comparison, NamedDestination, NamedRelay, Wanted, WantedPort, cluster_ip_flows,
    compare, policy_name, port_of_flow,
};

/// The packet asked about: its destination and, when given, its source.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Flow {
    pub destination: SocketAddr,
    #[serde(serialize_with = "protocol_name")]
    pub protocol: Protocol,
    pub source: Option<IpAddr>,
}

fn protocol_name<S: serde::Serializer>(protocol: &Protocol, out: S) -> Result<S::Ok, S::Error> {
    out.serialize_str(protocol.lower())
}

impl Flow {
    /// `ADDRESS:PORT[/PROTOCOL]` (`[ADDRESS]:PORT` for IPv6; TCP when no protocol is named).
    pub fn parse(to: &str, from: Option<&str>) -> Result<Flow, String> {
        let (address, protocol) = match to.rsplit_once('/') {
            Some((address, protocol)) => (address, protocol),
            None => (to, "tcp"),
        };
        let destination: SocketAddr = address.parse().map_err(|_| {
            format!("--to {to:?}: not ADDRESS:PORT[/PROTOCOL] (IPv6: [ADDRESS]:PORT)")
        })?;
        if destination.port() == 0 {
            return Err(format!("--to {to:?}: port 0 is not a port"));
        }
        let protocol = Protocol::from_api(&protocol.to_ascii_uppercase())
            .ok_or_else(|| format!("--to {to:?}: protocol {protocol:?} is not tcp, udp or sctp"))?;
        let source = match from {
            None => None,
            Some(text) => {
                let source: IpAddr = text
                    .parse()
                    .map_err(|_| format!("--from {text:?}: not an IP address"))?;
                if source.is_ipv4() != destination.is_ipv4() {
                    return Err(format!("--from {text:?}: not of --to's IP family"));
                }
                Some(source)
            }
        };
        Ok(Flow {
            destination,
            protocol,
            source,
        })
    }
}

impl fmt::Display for Flow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.destination, self.protocol.lower())?;
        if let Some(source) = self.source {
            write!(f, " from {source}")?;
        }
        Ok(())
    }
}

/// An endpoint the packet may be sent to, and the chance it is, as programmed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Candidate {
    pub endpoint: SocketAddr,
    pub probability: f64,
}

/// Where the packet ends up.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "lowercase")]
pub enum Outcome {
    /// DNATed to one of these endpoints.
    Dnat { candidates: Vec<Candidate> },
    /// Rejected (ICMP unreachable or a TCP reset), and why.
    Reject { reason: String },
    /// Dropped, and why.
    Drop { reason: String },
    /// Left to a userspace listener on a loopback address, which relays the connection to one
    /// of these endpoints (the localhost NodePort proxy's, as its daemon holds them).
    Relayed {
        listener: SocketAddr,
        candidates: Vec<Candidate>,
    },
    /// No rule of ours changes it, and why.
    Untouched { reason: String },
}

/// A connection conntrack already tracks for the flow: its packets follow the entry, not the
/// rules, until it ends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Tracked {
    pub source: SocketAddr,
    /// Where its packets go (after DNAT, the endpoint; else the destination itself).
    pub endpoint: SocketAddr,
    /// The endpoint is no longer one the rules send new connections to.
    pub gone: bool,
}

/// One packet's path as a mode programmed it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Explanation {
    #[serde(serialize_with = "mode_name")]
    pub mode: ProxyMode,
    pub flow: Flow,
    /// Connections conntrack already tracks for this flow (of `flow.source`, when given).
    pub conntrack: Vec<Tracked>,
    /// The Service port it matches (printed `ns/name:port`), if any.
    #[serde(serialize_with = "port_name")]
    pub service: Option<ServicePortName>,
    /// The traffic policy whose endpoints it is sent to (`Cluster` or `Local`), if it is.
    pub policy: Option<&'static str>,
    /// What it meets, in order: each a short line naming the object of ours.
    pub steps: Vec<String>,
    #[serde(flatten)]
    pub outcome: Outcome,
    /// What was read from the kernel to say so.
    pub reads: Vec<String>,
    /// How that compares with what the daemon wants, when it was asked.
    pub daemon: Option<Comparison>,
    /// A TCP socket listens on the destination itself, which no rule of ours changes: the
    /// localhost NodePort proxy's, if its daemon says so (`explain` asks, and then says
    /// `relayed`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub listener_on_destination: bool,
}

impl Explanation {
    /// An explanation of `flow` in `mode` that has found nothing yet.
    pub fn new(mode: ProxyMode, flow: &Flow) -> Explanation {
        Explanation {
            mode,
            flow: flow.clone(),
            conntrack: Vec::new(),
            service: None,
            policy: None,
            steps: Vec::new(),
            outcome: Outcome::Untouched {
                reason: String::new(),
            },
            reads: Vec::new(),
            daemon: None,
            listener_on_destination: false,
        }
    }
}

/// Makes a failed read of `what` an [`ExplainError`].
pub fn read_error<E: std::error::Error + Send + Sync + 'static>(
    what: &str,
) -> impl Fn(E) -> ExplainError + '_ {
    move |err| ExplainError::Read {
        what: what.to_string(),
        source: Box::new(err),
    }
}

/// A mode's reader of flows (its `explain::Session`), over that mode's kernel traits: the
/// kernel's in the daemon's namespace, fakes in tests. Each read is kept for the next flow.
pub trait Explain {
    fn explain(&mut self, flow: &Flow) -> Result<Explanation, ExplainError>;
}

/// Why a packet could not be explained.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// The kernel holds none of the mode's objects.
    #[error("{0}")]
    NothingProgrammed(String),
    /// Reading the kernel failed.
    #[error("reading {what}: {source}")]
    Read {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// The Service port as upstream prints it (`ns/name:port`), in the JSON answer.
fn port_name<S: serde::Serializer>(
    port: &Option<ServicePortName>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match port {
        Some(port) => serializer.collect_str(port),
        None => serializer.serialize_none(),
    }
}

/// The mode as the configuration spells it, in the JSON answer.
fn mode_name<S: serde::Serializer>(mode: &ProxyMode, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(mode.as_str())
}

/// The connections conntrack tracks for `flow`, each marked when its endpoint is no longer
/// among those `outcome` names, read with one dump the kernel filters on the destination.
pub fn tracked(flow: &Flow, outcome: &Outcome) -> Result<Vec<Tracked>, ExplainError> {
    use crate::sys::conntrack::NetlinkConntrack;
    let read = read_error::<crate::sys::conntrack::ConntrackError>("conntrack");
    let protocol = flow.protocol.number();
    let flows = NetlinkConntrack::open()
        .and_then(|mut conntrack| conntrack.flows_to(protocol, flow.destination))
        .map_err(read)?;
    let current = |endpoint: &SocketAddr| match outcome {
        Outcome::Dnat { candidates } => candidates.iter().any(|c| c.endpoint == *endpoint),
        _ => false,
    };
    Ok(flows
        .into_iter()
        .filter(|f| flow.source.is_none_or(|source| f.source.ip() == source))
        .map(|f| Tracked {
            source: f.source,
            endpoint: f.reply_source,
            gone: f.reply_source != flow.destination && !current(&f.reply_source),
        })
        .collect())
}

/// A TCP flow to a loopback address that no rule of ours changes: the socket that takes it,
/// found with one exact lookup. The localhost NodePort proxy listens on the loopback address
/// itself; whether such a listener is the proxy's, only its daemon can say (`explain` asks).
pub fn loopback_listener(explanation: &mut Explanation) -> Result<(), ExplainError> {
    let destination = explanation.flow.destination;
    let Outcome::Untouched { reason } = &explanation.outcome else {
        return Ok(());
    };
    let found = tcp_listener(destination).map_err(read_error("the TCP listener"))?;
    let outcome = match found {
        Some(listener) if listener.bound == destination => {
            explanation.steps.push(format!(
                "no rule of ours: a TCP listener on {destination} takes it"
            ));
            explanation.listener_on_destination = true;
            Outcome::Untouched {
                reason: format!("{reason}; a TCP listener on {destination} takes it"),
            }
        }
        Some(listener) => Outcome::Untouched {
            reason: format!(
                "{reason}; a program listening on {} takes it (the localhost NodePort proxy listens on the loopback address itself)",
                listener.bound
            ),
        },
        None => Outcome::Untouched {
            reason: format!(
                "{reason}; nothing listens on {destination} either: the connection is refused"
            ),
        },
    };
    explanation.outcome = outcome;
    explanation
        .reads
        .push(format!("the TCP listener of {destination}"));
    Ok(())
}
