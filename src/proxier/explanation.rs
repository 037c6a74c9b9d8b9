//! What `kube-proxy-rs explain` says of one packet: the flow asked about, and, as a mode read
//! it from the kernel, each step it meets, the Service it matches, and where it goes (the
//! candidate endpoints with the chance of each as programmed) or what stops it.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use serde::Serialize;

use crate::model::Protocol;

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
    pub mode: &'static str,
    pub flow: Flow,
    /// Connections conntrack already tracks for this flow (of `flow.source`, when given).
    pub conntrack: Vec<Tracked>,
    /// The Service port it matches (`ns/name:port`), if any.
    pub service: Option<String>,
    /// What it meets, in order: each a short line naming the object of ours.
    pub steps: Vec<String>,
    #[serde(flatten)]
    pub outcome: Outcome,
    /// What was read from the kernel to say so.
    pub reads: Vec<String>,
}

/// Why a packet could not be explained.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// The kernel holds none of the mode's objects.
    #[error("{0}")]
    NothingProgrammed(String),
    /// Reading the kernel failed.
    #[error("reading {what}: {reason}")]
    Read { what: String, reason: String },
    /// The mode is not explained yet.
    #[error("{0}")]
    Unsupported(String),
}

/// The connections conntrack tracks for `flow`, each marked when its endpoint is no longer
/// among those `outcome` names, read with one dump the kernel filters on the destination.
pub fn tracked(flow: &Flow, outcome: &Outcome) -> Result<Vec<Tracked>, ExplainError> {
    use crate::sys::conntrack::NetlinkConntrack;
    let read = |err: crate::sys::conntrack::ConntrackError| ExplainError::Read {
        what: "conntrack".into(),
        reason: err.to_string(),
    };
    let protocol = match flow.protocol {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    };
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
