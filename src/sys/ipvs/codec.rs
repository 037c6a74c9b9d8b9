//! The IPVS generic netlink family's messages (include/uapi/linux/ip_vs.h), typed. Encoding and
//! decoding are pure so they can be tested byte for byte against messages the kernel sent.

use std::net::IpAddr;

use netlink_packet_core::{DecodeError, Emitable, Nla, NlasIterator, ParseableParametrized};
use netlink_packet_generic::{GenlFamily, GenlHeader};

use crate::model::Protocol;
use crate::model::address::octets;

pub const CMD_NEW_SERVICE: u8 = 1;
pub const CMD_SET_SERVICE: u8 = 2;
pub const CMD_DEL_SERVICE: u8 = 3;
pub const CMD_GET_SERVICE: u8 = 4;
pub const CMD_NEW_DEST: u8 = 5;
pub const CMD_SET_DEST: u8 = 6;
pub const CMD_DEL_DEST: u8 = 7;
pub const CMD_GET_DEST: u8 = 8;
pub const CMD_SET_CONFIG: u8 = 12;
pub const CMD_FLUSH: u8 = 17;

const ATTR_SERVICE: u16 = 1;
const ATTR_DEST: u16 = 2;
const ATTR_TIMEOUT_TCP: u16 = 4;
const ATTR_TIMEOUT_TCP_FIN: u16 = 5;
const ATTR_TIMEOUT_UDP: u16 = 6;

const SVC_AF: u16 = 1;
const SVC_PROTOCOL: u16 = 2;
const SVC_ADDR: u16 = 3;
const SVC_PORT: u16 = 4;
const SVC_SCHED_NAME: u16 = 6;
const SVC_FLAGS: u16 = 7;
const SVC_TIMEOUT: u16 = 8;
const SVC_NETMASK: u16 = 9;

const DEST_ADDR: u16 = 1;
const DEST_PORT: u16 = 2;
const DEST_FWD_METHOD: u16 = 3;
const DEST_WEIGHT: u16 = 4;
const DEST_U_THRESH: u16 = 5;
const DEST_L_THRESH: u16 = 6;
const DEST_ACTIVE_CONNS: u16 = 7;
const DEST_INACT_CONNS: u16 = 8;
const DEST_ADDR_FAMILY: u16 = 11;

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
use crate::sys::netlink::{NLA_F_NESTED, NLA_TYPE_MASK};

/// Persistence (ClientIP affinity).
pub const FLAG_PERSISTENT: u32 = 0x1;
/// Set by the kernel on every service it reports; never sent, stripped when read.
pub const FLAG_HASHED: u32 = 0x2;
/// Masquerading (NAT), the forwarding method kube-proxy uses.
pub const FWD_MASQ: u32 = 0;

/// One virtual server, keyed by address, protocol and port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VirtualServer {
    pub address: IpAddr,
    pub protocol: Protocol,
    pub port: u16,
    pub scheduler: String,
    /// IP_VS_SVC_F_* without HASHED.
    pub flags: u32,
    /// Persistence timeout in seconds (with FLAG_PERSISTENT).
    pub timeout: u32,
}

impl VirtualServer {
    /// `address:port/PROTO`, as upstream prints it.
    pub fn key(&self) -> String {
        format!(
            "{}/{}",
            std::net::SocketAddr::new(self.address, self.port),
            self.protocol
        )
    }
}

/// One real server of a virtual server.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RealServer {
    pub address: IpAddr,
    pub port: u16,
    pub weight: u32,
    /// Connection counts, as the kernel reports them (0 when sending).
    pub active_conns: u32,
    pub inactive_conns: u32,
}

impl RealServer {
    /// A masqueraded real server as we send it (no connection counts).
    pub fn new(address: std::net::IpAddr, port: u16, weight: u32) -> RealServer {
        RealServer {
            address,
            port,
            weight,
            active_conns: 0,
            inactive_conns: 0,
        }
    }
}

/// A raw attribute: kind and payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub kind: u16,
    pub value: Vec<u8>,
}

impl Nla for Attr {
    fn value_len(&self) -> usize {
        self.value.len()
    }
    fn kind(&self) -> u16 {
        self.kind
    }
    fn emit_value(&self, buffer: &mut [u8]) {
        buffer.copy_from_slice(&self.value);
    }
}

fn attr(kind: u16, value: impl Into<Vec<u8>>) -> Attr {
    Attr {
        kind,
        value: value.into(),
    }
}

fn nest(kind: u16, inner: &[Attr]) -> Attr {
    let mut value = vec![0u8; inner.buffer_len()];
    inner.emit(&mut value);
    Attr {
        kind: kind | NLA_F_NESTED,
        value,
    }
}

fn parse_attrs(buffer: &[u8]) -> Result<Vec<Attr>, DecodeError> {
    NlasIterator::new(buffer)
        .map(|nla| {
            nla.map(|nla| Attr {
                kind: nla.kind() & NLA_TYPE_MASK,
                value: nla.value().to_vec(),
            })
        })
        .collect()
}

/// A message of the IPVS family: a command and its top-level attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpvsMessage {
    pub cmd: u8,
    pub attrs: Vec<Attr>,
}

impl GenlFamily for IpvsMessage {
    fn family_name() -> &'static str {
        "IPVS"
    }
    fn command(&self) -> u8 {
        self.cmd
    }
    fn version(&self) -> u8 {
        1
    }
}

impl Emitable for IpvsMessage {
    fn buffer_len(&self) -> usize {
        self.attrs.as_slice().buffer_len()
    }
    fn emit(&self, buffer: &mut [u8]) {
        self.attrs.as_slice().emit(buffer)
    }
}

impl ParseableParametrized<[u8], GenlHeader> for IpvsMessage {
    fn parse_with_param(buffer: &[u8], header: GenlHeader) -> Result<Self, DecodeError> {
        Ok(IpvsMessage {
            cmd: header.cmd,
            attrs: parse_attrs(buffer)?,
        })
    }
}

fn af(address: &IpAddr) -> u16 {
    if address.is_ipv4() { AF_INET } else { AF_INET6 }
}

fn protocol_number(protocol: Protocol) -> u16 {
    match protocol {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

/// The attributes that name a service (enough for delete and for destination requests).
fn service_key_attrs(vs: &VirtualServer) -> Vec<Attr> {
    vec![
        attr(SVC_AF, af(&vs.address).to_ne_bytes()),
        attr(SVC_PROTOCOL, protocol_number(vs.protocol).to_ne_bytes()),
        attr(SVC_ADDR, octets(vs.address)),
        attr(SVC_PORT, vs.port.to_be_bytes()),
    ]
}

/// Every attribute of a service, as NEW_SERVICE / SET_SERVICE require.
fn service_attrs(vs: &VirtualServer) -> Vec<Attr> {
    let mut attrs = service_key_attrs(vs);
    let mut scheduler = vs.scheduler.as_bytes().to_vec();
    scheduler.push(0);
    attrs.push(attr(SVC_SCHED_NAME, scheduler));
    let mut flags = (vs.flags & !FLAG_HASHED).to_ne_bytes().to_vec();
    flags.extend_from_slice(&u32::MAX.to_ne_bytes());
    attrs.push(attr(SVC_FLAGS, flags));
    attrs.push(attr(SVC_TIMEOUT, vs.timeout.to_ne_bytes()));
    // The kernel reads the netmask big-endian for IPv4 and as a prefix length for IPv6.
    let netmask = if vs.address.is_ipv4() {
        u32::MAX.to_be_bytes()
    } else {
        128u32.to_ne_bytes()
    };
    attrs.push(attr(SVC_NETMASK, netmask));
    attrs
}

fn dest_attrs(rs: &RealServer) -> Vec<Attr> {
    vec![
        attr(DEST_ADDR, octets(rs.address)),
        attr(DEST_PORT, rs.port.to_be_bytes()),
        attr(DEST_FWD_METHOD, FWD_MASQ.to_ne_bytes()),
        attr(DEST_WEIGHT, rs.weight.to_ne_bytes()),
        attr(DEST_U_THRESH, 0u32.to_ne_bytes()),
        attr(DEST_L_THRESH, 0u32.to_ne_bytes()),
        attr(DEST_ADDR_FAMILY, af(&rs.address).to_ne_bytes()),
    ]
}

/// NEW_SERVICE / SET_SERVICE.
pub fn service_message(cmd: u8, vs: &VirtualServer) -> IpvsMessage {
    IpvsMessage {
        cmd,
        attrs: vec![nest(ATTR_SERVICE, &service_attrs(vs))],
    }
}

/// DEL_SERVICE.
pub fn delete_service_message(vs: &VirtualServer) -> IpvsMessage {
    IpvsMessage {
        cmd: CMD_DEL_SERVICE,
        attrs: vec![nest(ATTR_SERVICE, &service_key_attrs(vs))],
    }
}

/// GET_SERVICE as a dump of every service.
pub fn list_services_message() -> IpvsMessage {
    IpvsMessage {
        cmd: CMD_GET_SERVICE,
        attrs: vec![],
    }
}

/// GET_SERVICE of the one virtual server with `vs`'s address, protocol and port.
pub fn get_service_message(vs: &VirtualServer) -> IpvsMessage {
    IpvsMessage {
        cmd: CMD_GET_SERVICE,
        attrs: vec![nest(ATTR_SERVICE, &service_key_attrs(vs))],
    }
}

/// NEW_DEST / SET_DEST / DEL_DEST.
pub fn dest_message(cmd: u8, vs: &VirtualServer, rs: &RealServer) -> IpvsMessage {
    IpvsMessage {
        cmd,
        attrs: vec![
            nest(ATTR_SERVICE, &service_key_attrs(vs)),
            nest(ATTR_DEST, &dest_attrs(rs)),
        ],
    }
}

/// GET_DEST as a dump of one service's real servers.
pub fn list_dests_message(vs: &VirtualServer) -> IpvsMessage {
    IpvsMessage {
        cmd: CMD_GET_DEST,
        attrs: vec![nest(ATTR_SERVICE, &service_key_attrs(vs))],
    }
}

/// SET_CONFIG: connection timeouts in seconds; 0 leaves one as it is.
pub fn timeouts_message(tcp: u32, tcp_fin: u32, udp: u32) -> IpvsMessage {
    IpvsMessage {
        cmd: CMD_SET_CONFIG,
        attrs: vec![
            attr(ATTR_TIMEOUT_TCP, tcp.to_ne_bytes()),
            attr(ATTR_TIMEOUT_TCP_FIN, tcp_fin.to_ne_bytes()),
            attr(ATTR_TIMEOUT_UDP, udp.to_ne_bytes()),
        ],
    }
}

fn find(attrs: &[Attr], kind: u16) -> Option<&[u8]> {
    attrs
        .iter()
        .find(|a| a.kind & NLA_TYPE_MASK == kind)
        .map(|a| a.value.as_slice())
}

fn u16_ne(bytes: Option<&[u8]>) -> Option<u16> {
    Some(u16::from_ne_bytes(bytes?.get(..2)?.try_into().ok()?))
}

fn u32_ne(bytes: Option<&[u8]>) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes?.get(..4)?.try_into().ok()?))
}

fn decode_address(family: u16, bytes: &[u8]) -> Option<IpAddr> {
    match family {
        AF_INET => Some(IpAddr::from(<[u8; 4]>::try_from(bytes.get(..4)?).ok()?)),
        AF_INET6 => Some(IpAddr::from(<[u8; 16]>::try_from(bytes.get(..16)?).ok()?)),
        _ => None,
    }
}

fn malformed(what: &str) -> DecodeError {
    DecodeError::from(format!("IPVS reply without a valid {what}"))
}

/// Reads a service from a NEW_SERVICE reply. Services on firewall marks are `None` (not ours).
pub fn decode_service(message: &IpvsMessage) -> Result<Option<VirtualServer>, DecodeError> {
    let nested = find(&message.attrs, ATTR_SERVICE).ok_or_else(|| malformed("service"))?;
    let attrs = parse_attrs(nested)?;
    let Some(address) = find(&attrs, SVC_ADDR) else {
        return Ok(None);
    };
    let family = u16_ne(find(&attrs, SVC_AF)).ok_or_else(|| malformed("address family"))?;
    let address = decode_address(family, address).ok_or_else(|| malformed("address"))?;
    let protocol = match u16_ne(find(&attrs, SVC_PROTOCOL)).ok_or_else(|| malformed("protocol"))? {
        6 => Protocol::Tcp,
        17 => Protocol::Udp,
        132 => Protocol::Sctp,
        _ => return Ok(None),
    };
    let port = find(&attrs, SVC_PORT)
        .and_then(|b| Some(u16::from_be_bytes(b.get(..2)?.try_into().ok()?)))
        .ok_or_else(|| malformed("port"))?;
    let scheduler = find(&attrs, SVC_SCHED_NAME)
        .map(|b| {
            String::from_utf8_lossy(b)
                .trim_end_matches('\0')
                .to_string()
        })
        .unwrap_or_default();
    let flags = u32_ne(find(&attrs, SVC_FLAGS)).unwrap_or(0) & !FLAG_HASHED;
    let timeout = u32_ne(find(&attrs, SVC_TIMEOUT)).unwrap_or(0);
    Ok(Some(VirtualServer {
        address,
        protocol,
        port,
        scheduler,
        flags,
        timeout,
    }))
}

/// Reads a real server from a NEW_DEST reply of a service in `family` (the service's address).
pub fn decode_dest(
    message: &IpvsMessage,
    service_address: &IpAddr,
) -> Result<RealServer, DecodeError> {
    let nested = find(&message.attrs, ATTR_DEST).ok_or_else(|| malformed("destination"))?;
    let attrs = parse_attrs(nested)?;
    let family = u16_ne(find(&attrs, DEST_ADDR_FAMILY))
        .filter(|f| *f != 0)
        .unwrap_or(af(service_address));
    let address = find(&attrs, DEST_ADDR)
        .and_then(|b| decode_address(family, b))
        .ok_or_else(|| malformed("address"))?;
    let port = find(&attrs, DEST_PORT)
        .and_then(|b| Some(u16::from_be_bytes(b.get(..2)?.try_into().ok()?)))
        .ok_or_else(|| malformed("port"))?;
    Ok(RealServer {
        address,
        port,
        weight: u32_ne(find(&attrs, DEST_WEIGHT)).unwrap_or(0),
        active_conns: u32_ne(find(&attrs, DEST_ACTIVE_CONNS)).unwrap_or(0),
        inactive_conns: u32_ne(find(&attrs, DEST_INACT_CONNS)).unwrap_or(0),
    })
}

/// Reply messages as the kernel sends them, rebuilt from typed values: for tests and fakes.
pub fn service_reply(vs: &VirtualServer) -> IpvsMessage {
    let mut attrs = service_attrs(vs);
    // The kernel always reports HASHED and a 16-byte address.
    if let Some(flags) = attrs.iter_mut().find(|a| a.kind == SVC_FLAGS) {
        flags.value[..4].copy_from_slice(&(vs.flags | FLAG_HASHED).to_ne_bytes());
    }
    if let Some(address) = attrs.iter_mut().find(|a| a.kind == SVC_ADDR) {
        address.value.resize(16, 0);
    }
    IpvsMessage {
        cmd: CMD_NEW_SERVICE,
        attrs: vec![nest(ATTR_SERVICE, &attrs)],
    }
}

#[cfg(test)]
mod tests;
