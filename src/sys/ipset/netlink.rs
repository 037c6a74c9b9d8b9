//! ipset's netlink interface (nfnetlink subsystem 6), for reads that must not cost a process
//! each: membership tests, many in one send (`explain` evaluating set matches), and a set's
//! name from its kernel index (all that an iptables-nft rule's set match holds).

use std::net::IpAddr;

use netlink_sys::protocols::NETLINK_NETFILTER;

use crate::model::address::octets;
use crate::sys::netlink::{
    Attributes, Connection, NFPROTO_IPV4, NetlinkError, RawMessage, attributes,
};

const NFNL_SUBSYS_IPSET: u16 = 6;
const IPSET_CMD_TEST: u16 = 11;
const IPSET_CMD_GET_BYINDEX: u16 = 15;
/// The oldest protocol version kernels speak: 5.5 and later (protocol 7) still take it for a
/// test, and older ones take nothing else.
const IPSET_PROTOCOL_MIN: u8 = 6;
/// The version GET_BYINDEX came with over netlink (5.5); older kernels answer it only through
/// getsockopt, so [`IpsetNetlink::name_of`] fails there, and says so.
const IPSET_PROTOCOL: u8 = 7;
/// The kernel's answer to a request of a protocol it does not speak.
const IPSET_ERR_PROTOCOL: i32 = 4097;

const IPSET_ATTR_PROTOCOL: u16 = 1;
const IPSET_ATTR_SETNAME: u16 = 2;
const IPSET_ATTR_DATA: u16 = 7;
const IPSET_ATTR_INDEX: u16 = 11;
const IPSET_ATTR_IP: u16 = 1;
const IPSET_ATTR_PORT: u16 = 4;
const IPSET_ATTR_PROTO: u16 = 7;
const IPSET_ATTR_IP2: u16 = 20;
const IPSET_ATTR_IPADDR_IPV4: u16 = 1;
const IPSET_ATTR_IPADDR_IPV6: u16 = 2;
/// The flag the kernel wants on numbers it reads in network byte order.
const NLA_F_NET_BYTEORDER: u16 = 0x4000;

/// The kernel's answer to a test of an entry that is not in the set.
const IPSET_ERR_EXIST: i32 = 4103;
const ENOENT: i32 = 2;

/// One entry to look up, its parts in the set type's order: `hash:ip,port,net` takes all three
/// (a host address as `net` matches any network of the set that holds it), `bitmap:port` the
/// port alone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// The first dimension's address (`ip` of every hash type here).
    pub address: Option<IpAddr>,
    /// The protocol number that goes with `port` (hash types; a bitmap of ports takes none).
    pub protocol: Option<u8>,
    /// The port dimension.
    pub port: Option<u16>,
    /// The third dimension's address (`ip` or `net`).
    pub address2: Option<IpAddr>,
}

/// ipset over a NETLINK_NETFILTER socket in the calling thread's namespace.
pub struct IpsetNetlink {
    connection: Connection,
}

impl IpsetNetlink {
    /// A socket in the calling thread's network namespace.
    pub fn open() -> Result<IpsetNetlink, NetlinkError> {
        Ok(IpsetNetlink {
            connection: Connection::open(NETLINK_NETFILTER)?,
        })
    }

    /// Whether each entry is in its set, all asked in one send: `Some(member)`, or `None` when
    /// there is no such set.
    pub fn test(&mut self, tests: &[(&str, Entry)]) -> Result<Vec<Option<bool>>, NetlinkError> {
        let requests = tests
            .iter()
            .map(|(set, entry)| test_request(set, entry))
            .collect();
        self.connection
            .batch(requests)?
            .into_iter()
            .map(|outcome| match outcome {
                Ok(()) => Ok(Some(true)),
                Err(IPSET_ERR_EXIST) => Ok(Some(false)),
                Err(ENOENT) => Ok(None),
                Err(IPSET_ERR_PROTOCOL) => Err(protocol_refused()),
                Err(errno) => Err(NetlinkError::Errno(errno)),
            })
            .collect()
    }

    /// The name of the set the kernel holds at `index`, `None` when it holds none there.
    pub fn name_of(&mut self, index: u16) -> Result<Option<String>, NetlinkError> {
        let replies = match self.connection.request(name_request(index), false) {
            Ok(replies) => replies,
            Err(NetlinkError::Errno(ENOENT)) => return Ok(None),
            Err(NetlinkError::Errno(IPSET_ERR_PROTOCOL)) => return Err(protocol_refused()),
            Err(err) => return Err(err),
        };
        Ok(replies
            .iter()
            .find_map(|reply| {
                attributes(reply.payload.get(4..)?).find(|(kind, _)| *kind == IPSET_ATTR_SETNAME)
            })
            .map(|(_, name)| name)
            .map(|name| {
                let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
                String::from_utf8_lossy(&name[..end]).into_owned()
            }))
    }
}

fn protocol_refused() -> NetlinkError {
    NetlinkError::Unsupported(
        "the kernel's ipset refuses this protocol version over netlink (a kernel before 5.5 names no set by index there)".into(),
    )
}

/// IPSET_CMD_TEST of `entry` in `set`.
fn test_request(set: &str, entry: &Entry) -> RawMessage {
    let mut attributes = header(IPSET_PROTOCOL_MIN);
    attributes
        .string(IPSET_ATTR_SETNAME, set)
        .nested(IPSET_ATTR_DATA, |data| entry_attributes(entry, data));
    message(IPSET_CMD_TEST, attributes)
}

/// IPSET_CMD_GET_BYINDEX of `index`.
fn name_request(index: u16) -> RawMessage {
    let mut attributes = header(IPSET_PROTOCOL);
    attributes.raw(IPSET_ATTR_INDEX | NLA_F_NET_BYTEORDER, &index.to_be_bytes());
    message(IPSET_CMD_GET_BYINDEX, attributes)
}

fn header(protocol: u8) -> Attributes {
    let mut attributes = Attributes::new();
    attributes.raw(IPSET_ATTR_PROTOCOL, &[protocol]);
    attributes
}

fn message(command: u16, attributes: Attributes) -> RawMessage {
    RawMessage {
        message_type: NFNL_SUBSYS_IPSET << 8 | command,
        payload: [vec![NFPROTO_IPV4, 0, 0, 0], attributes.into_bytes()].concat(),
    }
}

fn entry_attributes(entry: &Entry, data: &mut Attributes) {
    let address = |data: &mut Attributes, kind: u16, address: IpAddr| {
        data.nested(kind, |nested| {
            let kind = match address {
                IpAddr::V4(_) => IPSET_ATTR_IPADDR_IPV4,
                IpAddr::V6(_) => IPSET_ATTR_IPADDR_IPV6,
            };
            nested.raw(kind | NLA_F_NET_BYTEORDER, &octets(address));
        });
    };
    if let Some(ip) = entry.address {
        address(data, IPSET_ATTR_IP, ip);
    }
    if let Some(port) = entry.port {
        data.raw(IPSET_ATTR_PORT | NLA_F_NET_BYTEORDER, &port.to_be_bytes());
    }
    if let Some(protocol) = entry.protocol {
        data.raw(IPSET_ATTR_PROTO, &[protocol]);
    }
    if let Some(ip) = entry.address2 {
        address(data, IPSET_ATTR_IP2, ip);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_request_nests_the_entry_as_the_kernel_reads_it() {
        let entry = Entry {
            address: Some("10.96.0.10".parse().unwrap()),
            protocol: Some(6),
            port: Some(80),
            address2: None,
        };
        let mut data = Attributes::new();
        entry_attributes(&entry, &mut data);
        assert_eq!(
            data.bytes(),
            [
                12, 0, 1, 0x80, // IP, nested
                8, 0, 1, 0x40, 10, 96, 0, 10, // IPADDR_IPV4, network byte order
                6, 0, 4, 0x40, 0, 80, 0, 0, // PORT, network byte order
                5, 0, 7, 0, 6, 0, 0, 0, // PROTO
            ]
        );
    }

    #[test]
    fn whole_requests_are_as_the_kernel_reads_them() {
        let entry = Entry {
            port: Some(30080),
            ..Entry::default()
        };
        let test = test_request("KUBE-NODE-PORT-TCP", &entry);
        assert_eq!(test.message_type, 6 << 8 | 11, "nfnetlink ipset, TEST");
        assert_eq!(
            test.payload,
            [
                &[2, 0, 0, 0][..],         // nfgenmsg: AF_INET, version 0, resource 0
                &[5, 0, 1, 0, 6, 0, 0, 0], // PROTOCOL 6
                &[23, 0, 2, 0],            // SETNAME, NUL-terminated, padded
                b"KUBE-NODE-PORT-TCP\0\0",
                &[12, 0, 7, 0x80],                  // DATA, nested
                &[6, 0, 4, 0x40, 0x75, 0x80, 0, 0], // PORT 30080, network byte order
            ]
            .concat()
        );
        let name = name_request(3);
        assert_eq!(
            name.message_type,
            6 << 8 | 15,
            "nfnetlink ipset, GET_BYINDEX"
        );
        assert_eq!(
            name.payload,
            [
                2, 0, 0, 0, 5, 0, 1, 0, 7, 0, 0, 0, 6, 0, 11, 0x40, 0, 3, 0, 0
            ]
        );
    }
}
