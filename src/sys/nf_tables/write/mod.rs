//! nftables transactions written over netlink, without the `nft` binary. `nft -f` first lists
//! every chain and set of the tables it writes to (its cache), which at 10,000 services is
//! 110,000 chains: over a second for a six-line change, almost all of it before the kernel
//! sees a byte. Our transactions are text we wrote ourselves in a small part of nft's
//! language, so they compile here to the same messages nft would send (checked byte for byte
//! against nft's own, tests/testdata/nft/), sent as one batch: atomic, as `nft -f` is.
//!
//! Text this compiler does not know goes to `nft -f` as before: the caller falls back.

mod compile;
mod rule;
mod values;

use std::io;

use netlink_sys::protocols::NETLINK_NETFILTER;
use netlink_sys::{Socket, SocketAddr};

#[cfg(test)]
use super::wire;
pub use super::wire::{Message, batch, unterminated_batch};
pub use compile::{AnonymousNames, CompileError, Compiled, compile, compile_with};
pub use values::{KeyType, protocol_name, verdict_text};

/// Netlink's error message type.
const NLMSG_ERROR: u16 = 2;
/// The extended-ACK attribute carrying the kernel's message.
const NLMSGERR_ATTR_MSG: u16 = 1;
/// Flag of an error message whose request was not echoed (NETLINK_CAP_ACK).
const NLM_F_CAPPED: u16 = 0x100;
/// Flag of an error message with extended-ACK attributes.
const NLM_F_ACK_TLVS: u16 = 0x200;
/// Receive buffer for the kernel's answers (errors only: successes are not acknowledged).
const RECEIVE_BUFFER: usize = 1 << 20;

/// Why a transaction sent over netlink failed.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The socket could not be opened, sized or used.
    #[error("netlink socket: {0}")]
    Socket(io::Error),
    /// The kernel refused a message (and with it the whole batch).
    #[error("the kernel refused it: {reason}")]
    Refused {
        reason: String,
        /// The index of the refused message, when the kernel named one of ours.
        message: Option<usize>,
    },
}

/// Sends transactions over one netlink socket, kept between them: closing a netfilter socket
/// waits for the kernel to free what the last commit replaced (an RCU grace period, 6-15 ms
/// measured here), which a socket per transaction paid on every sync.
#[derive(Default)]
pub struct Sender {
    /// The socket and the network namespace it was opened in.
    held: Option<(NamespaceId, OwnSocket)>,
    /// The next batch's first sequence number.
    next_sequence: u32,
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("open", &self.held.is_some())
            .finish()
    }
}

/// A clone opens its own socket when it first sends.
impl Clone for Sender {
    fn clone(&self) -> Self {
        Sender::default()
    }
}

/// A network namespace as the kernel names it (device and inode of its nsfs file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct NamespaceId(u64, u64);

impl NamespaceId {
    /// This thread's network namespace.
    fn current() -> io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata("/proc/thread-self/ns/net")?;
        Ok(NamespaceId(meta.dev(), meta.ino()))
    }
}

/// A socket whose port id is known as ours while it is open: the kernel's change events for
/// the transactions it sends are then not taken for another program's (see `nf_events`).
struct OwnSocket {
    socket: Socket,
    port: u32,
}

impl std::ops::Deref for OwnSocket {
    type Target = Socket;

    fn deref(&self) -> &Socket {
        &self.socket
    }
}

impl Drop for OwnSocket {
    fn drop(&mut self) {
        crate::sys::host::process::own_socket_closed(self.port);
    }
}

fn open_socket() -> io::Result<OwnSocket> {
    let mut socket = Socket::new(NETLINK_NETFILTER)?;
    let address = socket.bind_auto()?;
    let port = address.port_number();
    crate::sys::host::process::own_socket_opened(port);
    let socket = OwnSocket { socket, port };
    socket.connect(&SocketAddr::new(0, 0))?;
    // Errors name the failing message by its sequence number, not by echoing it, and carry
    // the kernel's reason when it gives one.
    socket.set_cap_ack(true)?;
    socket.set_ext_ack(true)?;
    nix::sys::socket::setsockopt(
        &socket.socket,
        nix::sys::socket::sockopt::RcvBufForce,
        &RECEIVE_BUFFER,
    )?;
    // The kernel handles a batch inside the send: what it has to say is queued when the send
    // returns, and is read without waiting.
    socket.set_non_blocking(true)?;
    Ok(socket)
}

/// What is queued on `socket`, read without waiting: the errors in it.
fn drain(socket: &Socket) -> Result<Vec<(u32, i32, Option<String>)>, SendError> {
    let mut errors = Vec::new();
    loop {
        let mut buffer = Vec::with_capacity(64 * 1024);
        match socket.recv(&mut buffer, 0) {
            Ok(0) => break,
            Ok(_) => errors.extend(errors_in(&buffer)),
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
            Err(err) => return Err(SendError::Socket(err)),
        }
    }
    Ok(errors)
}

/// Whether a batch is committed (applied) or only checked.
#[derive(Clone, Copy)]
enum Commit {
    Yes,
    No,
}

impl Sender {
    /// Sends `messages` as one transaction in this thread's network namespace (a socket opened
    /// in another one is replaced).
    pub fn send(&mut self, messages: &[Message]) -> Result<(), SendError> {
        self.transact(messages, Commit::Yes)
    }

    /// Has the kernel check `messages` as one transaction and abort it (nothing changes):
    /// `nft --check`, without nft's read of the ruleset first.
    pub fn check(&mut self, messages: &[Message]) -> Result<(), SendError> {
        self.transact(messages, Commit::No)
    }

    fn transact(&mut self, messages: &[Message], commit: Commit) -> Result<(), SendError> {
        if messages.is_empty() {
            return Ok(());
        }
        let namespace = NamespaceId::current().map_err(SendError::Socket)?;
        if self
            .held
            .as_ref()
            .is_none_or(|(held, _)| *held != namespace)
        {
            self.held = Some((namespace, open_socket().map_err(SendError::Socket)?));
        }
        let result = self.send_on_held(messages, commit);
        if matches!(result, Err(SendError::Socket(_))) {
            // A socket that failed is not trusted with the next transaction.
            self.held = None;
        }
        result
    }

    fn send_on_held(&mut self, messages: &[Message], commit: Commit) -> Result<(), SendError> {
        let Some((_, socket)) = self.held.as_ref() else {
            return Err(SendError::Socket(io::ErrorKind::NotConnected.into()));
        };
        // Nothing from an earlier batch may be taken for this one's answer.
        drain(socket)?;
        let count = u32::try_from(messages.len() + 2).unwrap_or(u32::MAX);
        if self.next_sequence == 0 || self.next_sequence.checked_add(count).is_none() {
            self.next_sequence = 1;
        }
        let first_sequence = self.next_sequence;
        self.next_sequence += count;
        let bytes = match commit {
            Commit::Yes => batch(messages, first_sequence),
            // No BATCH_END: the kernel handles every message, then aborts.
            Commit::No => unterminated_batch(messages, first_sequence),
        };
        // A batch goes to the kernel in one send, so the socket's send buffer must hold it.
        let size = bytes.len() + 64 * 1024;
        nix::sys::socket::setsockopt(
            &socket.socket,
            nix::sys::socket::sockopt::SndBufForce,
            &size,
        )
        .map_err(|errno| SendError::Socket(errno.into()))?;
        socket.send(&bytes, 0).map_err(SendError::Socket)?;
        match drain(socket)?.into_iter().next() {
            None => Ok(()),
            Some((sequence, errno, text)) => {
                let index = sequence.checked_sub(first_sequence + 1).map(|i| i as usize);
                let message = index.filter(|i| *i < messages.len());
                let mut reason = io::Error::from_raw_os_error(errno).to_string();
                if let Some(text) = text {
                    reason = format!("{reason} ({text})");
                }
                Err(SendError::Refused { reason, message })
            }
        }
    }
}

/// The errors in a datagram of netlink messages: (sequence, errno, the kernel's text).
fn errors_in(data: &[u8]) -> Vec<(u32, i32, Option<String>)> {
    let mut errors = Vec::new();
    let mut offset = 0;
    while offset + 16 <= data.len() {
        let header = &data[offset..offset + 16];
        let length = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let kind = u16::from_ne_bytes([header[4], header[5]]);
        let flags = u16::from_ne_bytes([header[6], header[7]]);
        if length < 16 || offset + length > data.len() {
            break;
        }
        let body = &data[offset + 16..offset + length];
        if kind == NLMSG_ERROR && body.len() >= 20 {
            let code = i32::from_ne_bytes([body[0], body[1], body[2], body[3]]);
            // The request's header follows the code; its sequence number names it.
            let sequence = u32::from_ne_bytes([body[12], body[13], body[14], body[15]]);
            if code != 0 {
                let request_length = if flags & NLM_F_CAPPED != 0 {
                    16
                } else {
                    u32::from_ne_bytes([body[4], body[5], body[6], body[7]]) as usize
                };
                let text = if flags & NLM_F_ACK_TLVS != 0 {
                    extack_message(body.get(4 + ((request_length + 3) & !3)..).unwrap_or(&[]))
                } else {
                    None
                };
                errors.push((sequence, -code, text));
            }
        }
        offset += (length + 3) & !3;
    }
    errors
}

/// The kernel's message in extended-ACK attributes.
fn extack_message(attributes: &[u8]) -> Option<String> {
    let mut offset = 0;
    while offset + 4 <= attributes.len() {
        let length = u16::from_ne_bytes([attributes[offset], attributes[offset + 1]]) as usize;
        let kind = u16::from_ne_bytes([attributes[offset + 2], attributes[offset + 3]]) & 0x3fff;
        if length < 4 || offset + length > attributes.len() {
            return None;
        }
        if kind == NLMSGERR_ATTR_MSG {
            let value = &attributes[offset + 4..offset + length];
            let end = value.iter().position(|b| *b == 0).unwrap_or(value.len());
            return Some(String::from_utf8_lossy(&value[..end]).into_owned());
        }
        offset += (length + 3) & !3;
    }
    None
}

#[cfg(test)]
mod tests;
