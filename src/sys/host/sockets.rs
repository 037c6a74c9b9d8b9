//! Which socket takes TCP connections to an address of this namespace: one exact sock_diag
//! lookup (the kernel's own listener lookup, as for an incoming SYN), never a dump of the
//! socket table.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use netlink_sys::protocols::NETLINK_SOCK_DIAG;

use crate::model::IpFamily;
use crate::sys::netlink::{Connection, NetlinkError, RawMessage};

/// SOCK_DIAG_BY_FAMILY: the request and its answer.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// The message's one-byte fields, as libc numbers them.
const AF_INET: u8 = nix::libc::AF_INET as u8;
const AF_INET6: u8 = nix::libc::AF_INET6 as u8;
const IPPROTO_TCP: u8 = nix::libc::IPPROTO_TCP as u8;
/// The state of a socket that accepts connections.
const TCP_LISTEN: u8 = 10;
/// "Any socket": the cookie of a lookup by address.
const NO_COOKIE: u32 = u32::MAX;

/// A socket listening for TCP connections, as the kernel would pick it for a connection to
/// the address asked about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpListener {
    /// The address it is bound to: the one asked about, or the family's wildcard.
    pub bound: SocketAddr,
    /// Its inode (what `/proc/<pid>/fd` links name as `socket:[inode]`).
    pub inode: u32,
}

/// The listener a TCP connection to `address` would reach, if any.
pub fn tcp_listener(address: SocketAddr) -> Result<Option<TcpListener>, NetlinkError> {
    let mut connection = Connection::open(NETLINK_SOCK_DIAG)?;
    match lookup(&mut connection, address)? {
        Some(found) => Ok(Some(found)),
        None => {
            answers_lookups(&mut connection, address)?;
            Ok(None)
        }
    }
}

/// One exact lookup; `None` when the kernel finds no socket.
fn lookup(
    connection: &mut Connection,
    address: SocketAddr,
) -> Result<Option<TcpListener>, NetlinkError> {
    let request = RawMessage {
        message_type: SOCK_DIAG_BY_FAMILY,
        payload: lookup_request(address),
    };
    match connection.request(request, false) {
        Ok(replies) => Ok(replies.iter().find_map(|reply| listener_of(&reply.payload))),
        Err(NetlinkError::Errno(nix::libc::ENOENT)) => Ok(None),
        Err(err) => Err(err),
    }
}

/// The kernel answers "no such socket" too when it has no TCP socket diagnostics (tcp_diag
/// neither built in nor loadable): a listener of our own, on the loopback address of
/// `address`'s family, tells the two apart. Without a loopback address to listen on, the
/// answer is taken as it came.
fn answers_lookups(connection: &mut Connection, address: SocketAddr) -> Result<(), NetlinkError> {
    let loopback = IpFamily::of(&address.ip()).loopback();
    let Ok(probe) = std::net::TcpListener::bind((loopback, 0)) else {
        return Ok(());
    };
    let Ok(probe_address) = probe.local_addr() else {
        return Ok(());
    };
    match lookup(connection, probe_address)? {
        Some(_) => Ok(()),
        None => Err(NetlinkError::Unsupported(
            "the kernel's TCP socket diagnostics (tcp_diag) do not answer: which socket listens cannot be read".into(),
        )),
    }
}

/// inet_diag_req_v2 for the socket bound to `address`, connected to nothing.
fn lookup_request(address: SocketAddr) -> Vec<u8> {
    let family = if address.is_ipv4() { AF_INET } else { AF_INET6 };
    let mut payload = vec![family, IPPROTO_TCP, 0, 0];
    payload.extend(u32::MAX.to_ne_bytes()); // every state
    payload.extend(address.port().to_be_bytes()); // source port
    payload.extend([0, 0]); // destination port
    payload.extend(crate::sys::inet_addr(address.ip()));
    payload.extend([0; 16]); // destination address
    payload.extend(0u32.to_ne_bytes()); // any interface
    payload.extend(NO_COOKIE.to_ne_bytes());
    payload.extend(NO_COOKIE.to_ne_bytes());
    payload
}

/// The listener an inet_diag_msg describes; `None` for a socket in another state or a
/// message too short to be one.
fn listener_of(message: &[u8]) -> Option<TcpListener> {
    let (&family, &state) = (message.first()?, message.get(1)?);
    if state != TCP_LISTEN {
        return None;
    }
    let port = u16::from_be_bytes([*message.get(4)?, *message.get(5)?]);
    let source = message.get(8..24)?;
    let ip = match family {
        AF_INET => IpAddr::V4(Ipv4Addr::new(source[0], source[1], source[2], source[3])),
        AF_INET6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(source).ok()?)),
        _ => return None,
    };
    let inode = message.get(68..72)?;
    Some(TcpListener {
        bound: SocketAddr::new(ip, port),
        inode: u32::from_ne_bytes(inode.try_into().ok()?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listener_of_an_address_is_found_and_a_free_port_has_none() {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = socket.local_addr().unwrap();
        let found = tcp_listener(address).unwrap().expect("a listener");
        assert_eq!(found.bound, address);
        assert_ne!(found.inode, 0);
        drop(socket);
        assert_eq!(tcp_listener(address).unwrap(), None);
    }

    #[test]
    fn a_wildcard_listener_takes_connections_to_loopback() {
        let socket = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let port = socket.local_addr().unwrap().port();
        let found = tcp_listener(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port))
            .unwrap()
            .expect("the wildcard listener");
        assert_eq!(
            found.bound,
            SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port)
        );
    }

    #[test]
    fn a_message_of_another_state_or_too_short_is_no_listener() {
        let mut message = vec![AF_INET, TCP_LISTEN, 0, 0, 0x75, 0x30];
        message.resize(72, 0);
        message[8..12].copy_from_slice(&[127, 0, 0, 1]);
        message[68..72].copy_from_slice(&4242u32.to_ne_bytes());
        assert_eq!(
            listener_of(&message),
            Some(TcpListener {
                bound: "127.0.0.1:30000".parse().unwrap(),
                inode: 4242
            })
        );
        assert_eq!(listener_of(&message[..40]), None);
        message[1] = 1; // established
        assert_eq!(listener_of(&message), None);
    }
}
