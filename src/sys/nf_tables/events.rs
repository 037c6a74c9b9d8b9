//! Which of our chains (and, in nftables mode, sets) other programs change. The kernel reports every
//! nf_tables change to listeners of the NFNLGRP_NFTABLES group, each event carrying the port id
//! of the netlink socket that made it, which for a tool is its pid. A thread listens, drops the
//! events of the tools this process ran (its own restores and transactions) and of tables that
//! are not watched (iptables' for the iptables-based modes, `kube-proxy` for nftables mode), and
//! keeps the rest: drift is then known the moment it happens, at no cost while
//! nothing changes, whatever the size of the ruleset. Reading every chain back each period
//! would cost seconds at 10,000 services.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use netlink_packet_core::{NlaBuffer, NlasIterator};
use netlink_sys::protocols::NETLINK_NETFILTER;
use netlink_sys::{Socket, SocketAddr};

use crate::model::IpFamily;
use crate::sys::host::process::{is_our_tool, is_own_socket, tool_active_within};
use crate::sys::netlink::NetlinkError;

use super::wire::{
    NFNL_SUBSYS_NFTABLES, NFNLGRP_NFTABLES, NFPROTO_IPV4, NFPROTO_IPV6, NFT_MSG_DELCHAIN,
    NFT_MSG_DELRULE, NFT_MSG_DELSET, NFT_MSG_DELSETELEM, NFT_MSG_DELTABLE, NFT_MSG_NEWCHAIN,
    NFT_MSG_NEWRULE, NFT_MSG_NEWSET, NFT_MSG_NEWSETELEM, NFT_MSG_NEWTABLE, NFTA_CHAIN_NAME,
    NFTA_RULE_CHAIN, NFTA_SET_NAME as ATTR_SET, NFTA_TABLE_NAME as ATTR_TABLE,
};

const ENOBUFS: i32 = 105;
/// The tables the iptables tools keep in nf_tables.
const IPTABLES_TABLES: [&str; 4] = ["nat", "filter", "mangle", "raw"];
/// A full restore at 10,000 services commits a few MB of events per transaction.
const RECEIVE_BUFFER: usize = 64 << 20;

/// A chain changed by someone else: family, table, chain (empty for a whole table; `@name` for
/// a set or map of an nftables table, its elements included).
pub type ChainKey = (IpFamily, String, String);

/// Which tables' changes count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The iptables tools' tables (`nat`, `filter`, ...): our chains and the built-in ones.
    IptablesTables,
    /// One nftables table of ours, every object in it.
    NftTable(&'static str),
}

/// What changed since the last look.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Drift {
    /// Chains of iptables' tables that another program changed.
    pub chains: BTreeSet<ChainKey>,
    /// Events were lost (the socket overflowed): anything may have changed.
    pub lost: bool,
}

impl Drift {
    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        self.chains.is_empty() && !self.lost
    }
}

/// A source of the changes others make.
pub trait ChangeEvents: Send {
    /// What changed since the last call.
    fn take(&mut self) -> Drift;
}

/// The kernel's events, read by a thread of their own.
pub struct NfEvents {
    drift: Arc<Mutex<Drift>>,
    stop: Arc<AtomicBool>,
}

impl NfEvents {
    /// Starts listening in this thread's network namespace; `changed` is called (from the
    /// listening thread) whenever something of interest changed.
    pub fn start(scope: Scope, changed: Box<dyn Fn() + Send>) -> Result<NfEvents, NetlinkError> {
        let mut socket = Socket::new(NETLINK_NETFILTER).map_err(NetlinkError::Socket)?;
        socket.bind_auto().map_err(NetlinkError::Socket)?;
        socket
            .add_membership(NFNLGRP_NFTABLES)
            .map_err(NetlinkError::Socket)?;
        let errno = |e: nix::errno::Errno| NetlinkError::Socket(e.into());
        use nix::sys::socket::{setsockopt, sockopt};
        // A large buffer (forced: we have CAP_NET_ADMIN) so bursts are not lost; a timeout so
        // the thread notices when it is no longer wanted.
        let _ = setsockopt(&socket, sockopt::RcvBufForce, &RECEIVE_BUFFER);
        setsockopt(
            &socket,
            sockopt::ReceiveTimeout,
            &nix::sys::time::TimeVal::new(1, 0),
        )
        .map_err(errno)?;
        let drift = Arc::new(Mutex::new(Drift::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (shared, stopping) = (drift.clone(), stop.clone());
        std::thread::Builder::new()
            .name("nf-events".into())
            .spawn(move || listen(scope, socket, &shared, &stopping, changed.as_ref()))
            .map_err(NetlinkError::Socket)?;
        Ok(NfEvents { drift, stop })
    }
}

impl ChangeEvents for NfEvents {
    fn take(&mut self) -> Drift {
        std::mem::take(&mut *self.drift.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Drop for NfEvents {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn listen(
    scope: Scope,
    socket: Socket,
    drift: &Mutex<Drift>,
    stop: &AtomicBool,
    changed: &dyn Fn(),
) {
    let mut buffer = Vec::with_capacity(256 * 1024);
    while !stop.load(Ordering::Relaxed) {
        buffer.clear();
        let received: Result<(usize, SocketAddr), std::io::Error> =
            socket.recv_from(&mut buffer, 0);
        let news = match received {
            Ok(_) => {
                let mut news = foreign_changes(scope, &buffer);
                if scope == Scope::IptablesTables {
                    news.retain(|(_, table, chain)| may_be_ours(table, chain));
                }
                news
            }
            Err(err) if err.raw_os_error() == Some(ENOBUFS) => {
                drift.lock().unwrap_or_else(|p| p.into_inner()).lost = true;
                changed();
                continue;
            }
            // The timeout (a chance to stop), or a signal.
            Err(_) => continue,
        };
        if !news.is_empty() {
            drift
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .chains
                .extend(news);
            changed();
        }
    }
}

/// Whether a change can concern kube-proxy: a chain of ours (`KUBE-` names), a built-in chain
/// (our jumps start there), or a whole table. Other programs' busy chains wake nobody.
fn may_be_ours(table: &str, chain: &str) -> bool {
    chain.is_empty()
        || chain.starts_with("KUBE-")
        || crate::sys::xtables::builtin_chains(table).contains(&chain)
}

/// The chains (and sets) of the watched tables that a datagram of events says another program
/// changed.
pub fn foreign_changes(scope: Scope, datagram: &[u8]) -> Vec<ChainKey> {
    let mut changes = Vec::new();
    let mut offset = 0;
    while let Some(header) = datagram.get(offset..offset + 16) {
        let length = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if length < 16 || offset + length > datagram.len() {
            break;
        }
        let message_type = u16::from_ne_bytes([header[4], header[5]]);
        let port = u32::from_ne_bytes([header[12], header[13], header[14], header[15]]);
        let payload = &datagram[offset + 16..offset + length];
        if let Some(change) = change_of(scope, message_type, payload)
            && !made_by_us(port)
        {
            changes.push(change);
        }
        offset += (length + 3) & !3;
    }
    changes
}

/// Whether an event's netlink port id is one of our own writing sockets' or of our tools'. A
/// tool's socket gets its pid as port id, unless that number is taken in the network namespace
/// (a host process with the same pid in another pid namespace): the kernel then picks a
/// negative one. Such an event, while one of our tools runs, is taken for ours: treating our
/// own restores as drift would rewrite them again and again.
fn made_by_us(port: u32) -> bool {
    is_own_socket(port)
        || is_our_tool(port)
        || ((port as i32) < 0 && tool_active_within(Duration::from_secs(2)))
}

/// The chain (or set) one event changed, if it is a change to a watched table.
fn change_of(scope: Scope, message_type: u16, payload: &[u8]) -> Option<ChainKey> {
    if message_type >> 8 != NFNL_SUBSYS_NFTABLES {
        return None;
    }
    let sets = matches!(scope, Scope::NftTable(_));
    let (name_attribute, prefix) = match message_type & 0xff {
        NFT_MSG_NEWRULE | NFT_MSG_DELRULE => (Some(NFTA_RULE_CHAIN), ""),
        NFT_MSG_NEWCHAIN | NFT_MSG_DELCHAIN => (Some(NFTA_CHAIN_NAME), ""),
        NFT_MSG_NEWTABLE | NFT_MSG_DELTABLE => (None, ""),
        NFT_MSG_NEWSET | NFT_MSG_DELSET | NFT_MSG_NEWSETELEM | NFT_MSG_DELSETELEM if sets => {
            (Some(ATTR_SET), "@")
        }
        _ => return None,
    };
    let (nfgenmsg, attributes) = payload.split_first_chunk::<4>()?;
    let family = match nfgenmsg[0] {
        NFPROTO_IPV4 => IpFamily::V4,
        NFPROTO_IPV6 => IpFamily::V6,
        _ => return None,
    };
    let mut table = None;
    let mut chain = String::new();
    for attribute in NlasIterator::new(attributes) {
        let attribute: NlaBuffer<&[u8]> = attribute.ok()?;
        let value = attribute.value();
        let text = || {
            let end = value.iter().position(|b| *b == 0).unwrap_or(value.len());
            String::from_utf8_lossy(&value[..end]).into_owned()
        };
        if attribute.kind() == ATTR_TABLE {
            table = Some(text());
        } else if Some(attribute.kind()) == name_attribute {
            chain = format!("{prefix}{}", text());
        }
    }
    let table = table.filter(|t| match scope {
        Scope::IptablesTables => IPTABLES_TABLES.contains(&t.as_str()),
        Scope::NftTable(ours) => t == ours,
    })?;
    // Anonymous sets belong to rules (a rule's change is reported as such).
    if chain.starts_with("@__") {
        return None;
    }
    Some((family, table, chain))
}

/// Events a test hands to a proxier.
#[derive(Clone, Debug, Default)]
pub struct FakeEvents {
    pub pending: Arc<Mutex<Drift>>,
}

impl ChangeEvents for FakeEvents {
    fn take(&mut self) -> Drift {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// How long [`NfEvents`] waits in one receive before checking whether it should stop.
pub const POLL: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    /// One event message: header (type, port), nfgenmsg (family), string attributes.
    fn event(message_type: u16, port: u32, family: u8, attributes: &[(u16, &str)]) -> Vec<u8> {
        let mut body = vec![family, 0, 0, 0];
        for (kind, text) in attributes {
            let length = 4 + text.len() + 1;
            body.extend((length as u16).to_ne_bytes());
            body.extend(kind.to_ne_bytes());
            body.extend(text.as_bytes());
            body.push(0);
            body.resize((body.len() + 3) & !3, 0);
        }
        let mut message = Vec::new();
        message.extend(((16 + body.len()) as u32).to_ne_bytes());
        message.extend(message_type.to_ne_bytes());
        message.extend(0u16.to_ne_bytes());
        message.extend(0u32.to_ne_bytes());
        message.extend(port.to_ne_bytes());
        message.extend(body);
        message
    }

    #[test]
    fn events_name_the_chains_others_change_in_iptables_tables() {
        let foreign = 3_000_000;
        let mut datagram = event(
            0x0a08,
            foreign,
            NFPROTO_IPV4,
            &[(1, "nat"), (2, "KUBE-SVC-AAAA")],
        );
        datagram.extend(event(
            0x0a06,
            foreign,
            NFPROTO_IPV6,
            &[(1, "filter"), (2, "INPUT")],
        ));
        datagram.extend(event(
            0x0a05,
            foreign,
            NFPROTO_IPV4,
            &[(1, "nat"), (3, "KUBE-SEP-B")],
        ));
        // Another program's own nft table, and another family: not iptables'.
        datagram.extend(event(
            0x0a06,
            foreign,
            NFPROTO_IPV4,
            &[(1, "kube-proxy"), (2, "services")],
        ));
        datagram.extend(event(0x0a06, foreign, 1, &[(1, "nat"), (2, "x")]));
        // Not nf_tables at all (conntrack).
        datagram.extend(event(0x0100, foreign, NFPROTO_IPV4, &[(1, "nat")]));
        datagram.extend(event(0x0a02, foreign, NFPROTO_IPV4, &[(1, "nat")]));
        assert_eq!(
            foreign_changes(Scope::IptablesTables, &datagram),
            vec![
                (IpFamily::V4, "nat".to_string(), "KUBE-SVC-AAAA".to_string()),
                (IpFamily::V6, "filter".to_string(), "INPUT".to_string()),
                (IpFamily::V4, "nat".to_string(), "KUBE-SEP-B".to_string()),
                (IpFamily::V4, "nat".to_string(), String::new()),
            ]
        );
    }

    #[test]
    fn in_nftables_scope_only_our_table_counts_sets_included() {
        let foreign = 3_000_000;
        let mut datagram = event(
            0x0a06,
            foreign,
            NFPROTO_IPV4,
            &[(1, "kube-proxy"), (2, "services")],
        );
        datagram.extend(event(
            0x0a0e,
            foreign,
            NFPROTO_IPV4,
            &[(1, "kube-proxy"), (2, "service-ips")],
        ));
        datagram.extend(event(
            0x0a0c,
            foreign,
            NFPROTO_IPV4,
            &[(1, "kube-proxy"), (2, "__map3")],
        ));
        datagram.extend(event(
            0x0a06,
            foreign,
            NFPROTO_IPV4,
            &[(1, "nat"), (2, "KUBE-SERVICES")],
        ));
        datagram.extend(event(0x0a02, foreign, NFPROTO_IPV6, &[(1, "kube-proxy")]));
        assert_eq!(
            foreign_changes(Scope::NftTable("kube-proxy"), &datagram),
            vec![
                (
                    IpFamily::V4,
                    "kube-proxy".to_string(),
                    "services".to_string()
                ),
                (
                    IpFamily::V4,
                    "kube-proxy".to_string(),
                    "@service-ips".to_string()
                ),
                (IpFamily::V6, "kube-proxy".to_string(), String::new()),
            ]
        );
    }

    #[test]
    fn our_own_tools_changes_are_not_drift() {
        // A tool run through the runner: its pid (its netlink port id) is known as ours.
        let out = crate::sys::host::process::Tool::new("sh", &["-c", "echo $$"])
            .run()
            .unwrap();
        let pid: u32 = String::from_utf8(out).unwrap().trim().parse().unwrap();
        let datagram = event(
            0x0a06,
            pid,
            NFPROTO_IPV4,
            &[(1, "nat"), (2, "KUBE-SERVICES")],
        );
        assert!(foreign_changes(Scope::IptablesTables, &datagram).is_empty());
        let other = event(
            0x0a06,
            pid + 1_000_000,
            NFPROTO_IPV4,
            &[(1, "nat"), (2, "KUBE-SERVICES")],
        );
        assert_eq!(foreign_changes(Scope::IptablesTables, &other).len(), 1);
    }

    #[test]
    fn changes_our_own_sockets_sent_are_not_drift() {
        use crate::sys::host::process::{own_socket_closed, own_socket_opened};
        // A port id no process has (above any pid; not negative, which the tools' heuristic
        // would claim while a tool runs).
        let port = 2_000_000_123;
        let datagram = event(
            0x0a06,
            port,
            NFPROTO_IPV4,
            &[(1, "kube-proxy"), (2, "services")],
        );
        let scope = Scope::NftTable("kube-proxy");
        assert_eq!(foreign_changes(scope, &datagram).len(), 1);
        own_socket_opened(port);
        assert!(foreign_changes(scope, &datagram).is_empty());
        // Closed: the number may be another program's now.
        own_socket_closed(port);
        assert_eq!(foreign_changes(scope, &datagram).len(), 1);
    }
}
