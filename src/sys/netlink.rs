//! One blocking netlink request/response exchange: send a message, collect the replies (one, a
//! dump, or just the ACK), and turn an NLMSG_ERROR into an errno.

use std::fmt::Debug;
use std::io;

use netlink_packet_core::{
    DecodeError, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NetlinkDeserializable,
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NetlinkSerializable,
};
use netlink_sys::{Socket, SocketAddr};

/// Why a netlink exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// The socket could not be opened or used.
    #[error("netlink socket: {0}")]
    Socket(io::Error),
    /// The kernel answered with an error.
    #[error("kernel answered: {}", io::Error::from_raw_os_error(*.0))]
    Errno(i32),
    /// A reply could not be decoded.
    #[error("undecodable netlink reply: {0}")]
    Decode(String),
    /// The kernel's state changed while it was being dumped: the dump may be inconsistent.
    #[error("the dump was interrupted by a concurrent change")]
    DumpInterrupted,
    /// The kernel does not offer what was asked (a protocol version, a command), and why.
    #[error("{0}")]
    Unsupported(String),
}

impl NetlinkError {
    /// The errno the kernel answered with, if that is what happened.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NetlinkError::Errno(errno) => Some(*errno),
            _ => None,
        }
    }
}

/// Received messages are read into a buffer this large: the kernel sizes each batch of a dump to
/// the largest read it has seen (up to 32 KiB), and with small reads a dump of 100,000 chains
/// takes thousands of batches, each of which walks the list from its start again.
const RECEIVE_BUFFER: usize = 32 * 1024;
/// [`Connection::dump_each`]'s buffer: twice the largest dump batch the kernel sends.
const REUSED_BUFFER: usize = 64 * 1024;
/// A receive that waits longer than this fails (EAGAIN).
const RECEIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// recv(2) flags (Linux values).
const MSG_PEEK: i32 = 0x2;
const MSG_TRUNC: i32 = 0x20;

/// A connected netlink socket of one protocol, with its own sequence numbers.
pub struct Connection {
    socket: Socket,
    sequence: u32,
    /// Where [`Connection::dump_each`] receives (allocated on first use).
    buffer: Vec<u8>,
}

impl Connection {
    /// Opens a socket of `protocol` (NETLINK_GENERIC, NETLINK_ROUTE) in this thread's namespace.
    pub fn open(protocol: isize) -> Result<Self, NetlinkError> {
        let mut socket = Socket::new(protocol).map_err(NetlinkError::Socket)?;
        // The kernel answers at once; a reply that never comes must fail the sync, not hang it.
        let limit = nix::sys::time::TimeVal::new(RECEIVE_TIMEOUT.as_secs() as i64, 0);
        nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::ReceiveTimeout, &limit)
            .map_err(|errno| NetlinkError::Socket(errno.into()))?;
        socket.bind_auto().map_err(NetlinkError::Socket)?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(NetlinkError::Socket)?;
        Ok(Connection {
            socket,
            sequence: 0,
            buffer: Vec::new(),
        })
    }

    /// The next datagram, whole.
    fn receive(&mut self) -> Result<Vec<u8>, NetlinkError> {
        let mut buffer = Vec::with_capacity(RECEIVE_BUFFER);
        let (length, _) = self
            .socket
            .recv_from(&mut buffer, MSG_PEEK | MSG_TRUNC)
            .map_err(NetlinkError::Socket)?;
        buffer.clear();
        buffer.reserve(length);
        self.socket
            .recv_from(&mut buffer, 0)
            .map_err(NetlinkError::Socket)?;
        Ok(buffer)
    }

    /// Sends `requests` in one buffer, each asking for an ACK, and returns each one's outcome in
    /// order: `Ok` or the errno the kernel answered that request with. One send and one pass over
    /// the answers, however many requests: the way to delete thousands of entries.
    pub fn batch<I>(&mut self, requests: Vec<I>) -> Result<Vec<Result<(), i32>>, NetlinkError>
    where
        I: NetlinkSerializable + NetlinkDeserializable + Debug,
        <I as NetlinkDeserializable>::Error: std::fmt::Display,
    {
        let first = self.sequence.wrapping_add(1);
        let count = requests.len();
        let mut buffer = Vec::new();
        for inner in requests {
            self.sequence = self.sequence.wrapping_add(1);
            let mut message =
                NetlinkMessage::new(Default::default(), NetlinkPayload::InnerMessage(inner));
            message.header.flags = NLM_F_REQUEST | NLM_F_ACK;
            message.header.sequence_number = self.sequence;
            message.finalize();
            let start = buffer.len();
            buffer.resize(start + message.buffer_len(), 0);
            message.serialize(&mut buffer[start..]);
        }
        if count == 0 {
            return Ok(Vec::new());
        }
        self.socket.send(&buffer, 0).map_err(NetlinkError::Socket)?;

        let mut outcomes: Vec<Option<Result<(), i32>>> = vec![None; count];
        let mut answered = 0;
        while answered < count {
            let data = self.receive()?;
            let mut offset = 0;
            while offset < data.len() {
                let reply = NetlinkMessage::<I>::deserialize(&data[offset..])
                    .map_err(|err| NetlinkError::Decode(err.to_string()))?;
                let length = reply.header.length as usize;
                let index = reply.header.sequence_number.wrapping_sub(first) as usize;
                if let (NetlinkPayload::Error(error), Some(slot)) =
                    (reply.payload, outcomes.get_mut(index))
                {
                    if slot.is_none() {
                        answered += 1;
                    }
                    *slot = Some(match error.code {
                        None => Ok(()),
                        Some(code) => Err(-code.get()),
                    });
                }
                if length == 0 {
                    break;
                }
                offset += (length + 3) & !3;
            }
        }
        Ok(outcomes.into_iter().map(|o| o.unwrap_or(Ok(()))).collect())
    }

    /// Sends `request` as a dump and hands each reply's message type and payload to `each` as
    /// it arrives, copying and keeping nothing (the way to read 100,000 small dumps). A dump the
    /// kernel marks interrupted ends in [`NetlinkError::DumpInterrupted`] after every reply was
    /// handed over: the caller starts again.
    pub fn dump_each<I>(
        &mut self,
        request: I,
        mut each: impl FnMut(u16, &[u8]),
    ) -> Result<(), NetlinkError>
    where
        I: NetlinkSerializable + Debug,
    {
        const NLMSG_ERROR: u16 = 2;
        const NLMSG_DONE: u16 = 3;
        const HEADER: usize = 16;
        self.sequence = self.sequence.wrapping_add(1);
        let sequence = self.sequence;
        let mut message =
            NetlinkMessage::new(Default::default(), NetlinkPayload::InnerMessage(request));
        message.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        message.header.sequence_number = sequence;
        message.finalize();
        let mut buffer = vec![0u8; message.buffer_len()];
        message.serialize(&mut buffer);
        self.socket.send(&buffer, 0).map_err(NetlinkError::Socket)?;

        let mut interrupted = false;
        loop {
            let length = self.receive_reused()?;
            let data = &self.buffer[..length];
            let mut offset = 0;
            while offset + HEADER <= data.len() {
                let field = |at: usize, len: usize| &data[offset + at..offset + at + len];
                let total = u32::from_ne_bytes(field(0, 4).try_into().unwrap_or_default()) as usize;
                let kind = u16::from_ne_bytes(field(4, 2).try_into().unwrap_or_default());
                let flags = u16::from_ne_bytes(field(6, 2).try_into().unwrap_or_default());
                let seq = u32::from_ne_bytes(field(8, 4).try_into().unwrap_or_default());
                if total < HEADER || offset + total > data.len() {
                    return Err(NetlinkError::Decode(format!(
                        "a netlink message of {total} bytes in a datagram of {}",
                        data.len()
                    )));
                }
                let payload = &data[offset + HEADER..offset + total];
                offset += (total + 3) & !3;
                if seq != sequence {
                    continue;
                }
                interrupted |= flags & NLM_F_DUMP_INTR != 0;
                match kind {
                    NLMSG_DONE if interrupted => return Err(NetlinkError::DumpInterrupted),
                    NLMSG_DONE => return Ok(()),
                    NLMSG_ERROR => {
                        let code = payload
                            .get(..4)
                            .and_then(|b| b.try_into().ok())
                            .map(i32::from_ne_bytes)
                            .unwrap_or(0);
                        return if code == 0 {
                            Ok(())
                        } else {
                            Err(NetlinkError::Errno(-code))
                        };
                    }
                    _ => each(kind, payload),
                }
            }
        }
    }

    /// Receives the next datagram into this connection's buffer (kept from one receive to the
    /// next), whole: the kernel never sends a dump batch over 32 KiB, nor us an answer near the
    /// buffer's size. Returns its length.
    fn receive_reused(&mut self) -> Result<usize, NetlinkError> {
        if self.buffer.capacity() < REUSED_BUFFER {
            self.buffer = Vec::with_capacity(REUSED_BUFFER);
        }
        self.buffer.clear();
        let (length, _) = self
            .socket
            .recv_from(&mut self.buffer, MSG_TRUNC)
            .map_err(NetlinkError::Socket)?;
        if length > self.buffer.len() {
            return Err(NetlinkError::Decode(format!(
                "a datagram of {length} bytes, over the {REUSED_BUFFER}-byte buffer"
            )));
        }
        Ok(length)
    }

    /// Sends `inner` as a request (a dump when `dump`) and returns the replies' payloads.
    pub fn request<I>(&mut self, inner: I, dump: bool) -> Result<Vec<I>, NetlinkError>
    where
        I: NetlinkSerializable + NetlinkDeserializable + Debug,
        <I as NetlinkDeserializable>::Error: std::fmt::Display,
    {
        self.request_with_flags(inner, dump, 0)
    }

    /// As [`Connection::request`], with extra header flags (NLM_F_CREATE | NLM_F_EXCL, ...).
    pub fn request_with_flags<I>(
        &mut self,
        inner: I,
        dump: bool,
        extra_flags: u16,
    ) -> Result<Vec<I>, NetlinkError>
    where
        I: NetlinkSerializable + NetlinkDeserializable + Debug,
        <I as NetlinkDeserializable>::Error: std::fmt::Display,
    {
        self.sequence = self.sequence.wrapping_add(1);
        let sequence = self.sequence;
        let mut message =
            NetlinkMessage::new(Default::default(), NetlinkPayload::InnerMessage(inner));
        message.header.flags =
            NLM_F_REQUEST | extra_flags | if dump { NLM_F_DUMP } else { NLM_F_ACK };
        message.header.sequence_number = sequence;
        message.finalize();
        let mut buffer = vec![0u8; message.buffer_len()];
        message.serialize(&mut buffer);
        self.socket.send(&buffer, 0).map_err(NetlinkError::Socket)?;

        let mut replies = Vec::new();
        let mut interrupted = false;
        loop {
            let data = self.receive()?;
            let mut offset = 0;
            while offset < data.len() {
                let reply = NetlinkMessage::<I>::deserialize(&data[offset..])
                    .map_err(|err| NetlinkError::Decode(err.to_string()))?;
                let length = reply.header.length as usize;
                if reply.header.sequence_number == sequence {
                    interrupted |= reply.header.flags & NLM_F_DUMP_INTR != 0;
                    match reply.payload {
                        // Dump entries, or the one answer to a request (its ACK follows).
                        NetlinkPayload::InnerMessage(inner) => replies.push(inner),
                        NetlinkPayload::Error(error) => match error.code {
                            None => return Ok(replies),
                            Some(code) => return Err(NetlinkError::Errno(-code.get())),
                        },
                        NetlinkPayload::Done(_) if interrupted => {
                            return Err(NetlinkError::DumpInterrupted);
                        }
                        NetlinkPayload::Done(_) => return Ok(replies),
                        _ => {}
                    }
                }
                if length == 0 {
                    break;
                }
                offset += (length + 3) & !3;
            }
        }
    }
}

/// A netfilter message kept as bytes: a request built by hand (nf_tables', a conntrack dump
/// with a filter the netlink crate cannot write), or a reply kept whole for decoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawMessage {
    pub message_type: u16,
    /// nfgenmsg and attributes.
    pub payload: Vec<u8>,
}

impl NetlinkSerializable for RawMessage {
    fn message_type(&self) -> u16 {
        self.message_type
    }

    fn buffer_len(&self) -> usize {
        self.payload.len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        buffer.copy_from_slice(&self.payload);
    }
}

impl NetlinkDeserializable for RawMessage {
    type Error = DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, DecodeError> {
        Ok(RawMessage {
            message_type: header.message_type,
            payload: payload.to_vec(),
        })
    }
}

/// The netfilter family numbers of nfgenmsg (NFPROTO_*).
pub const NFPROTO_IPV4: u8 = 2;
pub const NFPROTO_IPV6: u8 = 10;

/// An attribute holding attributes.
pub const NLA_F_NESTED: u16 = 0x8000;
/// An attribute type without its nested / byte-order flags.
pub const NLA_TYPE_MASK: u16 = 0x3fff;

/// The attributes in `value` (a message's, or a nested attribute's), as (type, value); the
/// type keeps no flag bits. A malformed tail ends the list.
pub fn attributes(value: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut rest = value;
    std::iter::from_fn(move || {
        let length = usize::from(u16::from_ne_bytes([*rest.first()?, *rest.get(1)?]));
        let kind = u16::from_ne_bytes([*rest.get(2)?, *rest.get(3)?]) & NLA_TYPE_MASK;
        let attribute = rest.get(4..length)?;
        rest = rest.get(length.div_ceil(4) * 4..).unwrap_or_default();
        Some((kind, attribute))
    })
}

/// Attributes being written into a buffer; nested attributes are written in place and their
/// length filled in when they close.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attributes {
    bytes: Vec<u8>,
}

impl Attributes {
    pub fn new() -> Self {
        Attributes::default()
    }

    /// The bytes written so far.
    #[cfg(test)]
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// One attribute with `value` as its payload, padded to four bytes.
    pub fn raw(&mut self, kind: u16, value: &[u8]) -> &mut Self {
        let length = 4 + value.len();
        self.bytes.extend_from_slice(&(length as u16).to_ne_bytes());
        self.bytes.extend_from_slice(&kind.to_ne_bytes());
        self.bytes.extend_from_slice(value);
        self.pad();
        self
    }

    /// A NUL-terminated string.
    pub fn string(&mut self, kind: u16, value: &str) -> &mut Self {
        let mut bytes = Vec::with_capacity(value.len() + 1);
        bytes.extend_from_slice(value.as_bytes());
        bytes.push(0);
        self.raw(kind, &bytes)
    }

    /// A 32-bit number in network byte order (as nf_tables and ctnetlink take numbers).
    pub fn u32(&mut self, kind: u16, value: u32) -> &mut Self {
        self.raw(kind, &value.to_be_bytes())
    }

    /// A 64-bit number in network byte order.
    pub fn u64(&mut self, kind: u16, value: u64) -> &mut Self {
        self.raw(kind, &value.to_be_bytes())
    }

    /// A nested attribute whose content `fill` writes.
    pub fn nested(&mut self, kind: u16, fill: impl FnOnce(&mut Attributes)) -> &mut Self {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(&[0, 0]);
        self.bytes
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        fill(self);
        // Callers keep what they nest small (a longer attribute would be cut short).
        debug_assert!(self.bytes.len() - start <= usize::from(u16::MAX));
        let length = (self.bytes.len() - start) as u16;
        self.bytes[start..start + 2].copy_from_slice(&length.to_ne_bytes());
        self
    }

    fn pad(&mut self) {
        while !self.bytes.len().is_multiple_of(4) {
            self.bytes.push(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_read_back_as_written() {
        let mut written = Attributes::new();
        written.raw(1, &[7]).string(2, "KUBE-CLUSTER-IP");
        let bytes = written.into_bytes();
        let found = |kind| attributes(&bytes).find(|(k, _)| *k == kind).map(|(_, v)| v);
        assert_eq!(found(2), Some(&b"KUBE-CLUSTER-IP\0"[..]));
        assert_eq!(found(3), None);
        assert_eq!(
            attributes(&[5, 0]).count(),
            0,
            "a malformed tail ends the list"
        );
    }
}
