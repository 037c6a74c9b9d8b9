//! The kernel's UDP conntrack entries over ctnetlink: list them, delete some. No `conntrack`
//! process: one dump per family and batched deletes on one NETLINK_NETFILTER socket.

use std::net::{IpAddr, SocketAddr};

use netlink_packet_core::{DefaultNla, NetlinkDeserializable, NetlinkHeader, Nla};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Protocol, Tuple,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::protocols::NETLINK_NETFILTER;

use super::netlink::{
    Attributes, Connection, NFPROTO_IPV4, NFPROTO_IPV6, NetlinkError, RawMessage,
};
use crate::model::IpFamily;
use crate::model::address::octets;

/// How many delete requests go to the kernel in one send.
const DELETE_BATCH: usize = 256;
/// CTA_ZONE: a flow's conntrack zone (big-endian u16), needed to name it when it is not zone 0.
const CTA_ZONE: u16 = 18;
const ENOENT: i32 = 2;

/// Why a conntrack operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    #[error("conntrack netlink: {0}")]
    Netlink(#[from] NetlinkError),
}

/// One UDP flow as conntrack tracks it: the tuple the client sent and where replies come from
/// (after DNAT, the endpoint that serves it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UdpFlow {
    pub orig_src: IpAddr,
    pub orig_src_port: u16,
    pub orig_dst: IpAddr,
    pub orig_dst_port: u16,
    pub reply_src: IpAddr,
    pub reply_src_port: u16,
    pub zone: u16,
}

/// The kernel's connection tracking table, UDP part.
pub trait Conntrack: Send {
    /// Every UDP flow of one family.
    fn udp_flows(&mut self, family: IpFamily) -> Result<Vec<UdpFlow>, ConntrackError>;
    /// Deletes these flows; returns how many were deleted (ones already gone are not errors).
    fn delete(&mut self, flows: &[UdpFlow]) -> Result<usize, ConntrackError>;
}

/// Conntrack over a NETLINK_NETFILTER socket in the calling thread's namespace.
pub struct NetlinkConntrack {
    connection: Connection,
}

impl NetlinkConntrack {
    /// Opens the socket.
    pub fn open() -> Result<Self, ConntrackError> {
        Ok(NetlinkConntrack {
            connection: Connection::open(NETLINK_NETFILTER)?,
        })
    }
}

/// CTA_FILTER, and in it CTA_FILTER_ORIG_FLAGS: which fields of the original tuple a dump
/// matches (kernel 5.8 and later).
const CTA_TUPLE_ORIG: u16 = 1;
const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_GET: u16 = 1;
const CTA_FILTER: u16 = 25;
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
const CTA_FILTER_IP_DST: u32 = 1 << 1;
const CTA_FILTER_PROTO_NUM: u32 = 1 << 3;
const CTA_FILTER_PROTO_DST_PORT: u32 = 1 << 5;

/// A flow of any protocol as conntrack tracks it: where the client sent it, and where the
/// replies come from (after DNAT, the endpoint that serves it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TrackedFlow {
    pub source: SocketAddr,
    pub destination: SocketAddr,
    pub reply_source: SocketAddr,
}

impl NetlinkConntrack {
    /// The flows of IP protocol `protocol` to `destination`: one dump that the kernel filters
    /// on the original tuple's destination address, protocol and port, so only those entries
    /// cross the socket, never the whole table.
    pub fn flows_to(
        &mut self,
        protocol: u8,
        destination: SocketAddr,
    ) -> Result<Vec<TrackedFlow>, ConntrackError> {
        // CTA_TUPLE_ORIG { CTA_TUPLE_IP { CTA_IP_V4_DST | CTA_IP_V6_DST }, CTA_TUPLE_PROTO {
        // CTA_PROTO_NUM, CTA_PROTO_DST_PORT } } and CTA_FILTER { CTA_FILTER_ORIG_FLAGS }. Built
        // by hand: the kernel parses CTA_FILTER strictly, as nested, and the netlink crate's
        // attributes drop the nested flag.
        let (family, address_kind) = match destination.ip() {
            IpAddr::V4(_) => (NFPROTO_IPV4, 2),
            IpAddr::V6(_) => (NFPROTO_IPV6, 4),
        };
        let flags = CTA_FILTER_IP_DST | CTA_FILTER_PROTO_NUM | CTA_FILTER_PROTO_DST_PORT;
        let mut attributes = Attributes::new();
        attributes
            .nested(CTA_TUPLE_ORIG, |tuple| {
                tuple.nested(1, |ip| {
                    ip.raw(address_kind, &octets(destination.ip()));
                });
                tuple.nested(2, |proto| {
                    proto
                        .raw(1, &[protocol])
                        .raw(3, &destination.port().to_be_bytes());
                });
            })
            .nested(CTA_FILTER, |filter| {
                filter.raw(CTA_FILTER_ORIG_FLAGS, &flags.to_ne_bytes());
            });
        let payload = [vec![family, 0, 0, 0], attributes.into_bytes()].concat();
        let request = RawMessage {
            message_type: NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_GET,
            payload,
        };
        let replies = self.connection.request(request, true)?;
        Ok(replies
            .iter()
            .filter_map(|reply| {
                let mut header = NetlinkHeader::default();
                header.message_type = reply.message_type;
                NetfilterMessage::deserialize(&header, &reply.payload).ok()
            })
            .filter_map(|message| decode_flow(&message))
            .filter(|flow| flow.destination == destination)
            .collect())
    }
}

/// Any flow a dump entry describes, by its tuples' addresses and ports.
fn decode_flow(message: &NetfilterMessage) -> Option<TrackedFlow> {
    let NetfilterMessageInner::Conntrack(ConntrackMessage::New(attributes)) = &message.inner else {
        return None;
    };
    let (mut orig, mut reply) = (None, None);
    for attribute in attributes {
        match attribute {
            ConntrackAttribute::CtaTupleOrig(tuple) => orig = Endpoints::of(tuple),
            ConntrackAttribute::CtaTupleReply(tuple) => reply = Endpoints::of(tuple),
            _ => {}
        }
    }
    let (orig, reply) = (orig?, reply?);
    Some(TrackedFlow {
        source: SocketAddr::new(orig.src, orig.src_port),
        destination: SocketAddr::new(orig.dst, orig.dst_port),
        reply_source: SocketAddr::new(reply.src, reply.src_port),
    })
}

fn header(family: IpFamily) -> NetfilterHeader {
    let family = match family {
        IpFamily::V4 => NetfilterProtoFamily::IPv4,
        IpFamily::V6 => NetfilterProtoFamily::IPv6,
    };
    NetfilterHeader::new(family, 0, 0)
}

impl Conntrack for NetlinkConntrack {
    fn udp_flows(&mut self, family: IpFamily) -> Result<Vec<UdpFlow>, ConntrackError> {
        let request = NetfilterMessage::new(header(family), ConntrackMessage::Get(Vec::new()));
        let replies = self.connection.request(request, true)?;
        Ok(replies.iter().filter_map(decode_udp_flow).collect())
    }

    fn delete(&mut self, flows: &[UdpFlow]) -> Result<usize, ConntrackError> {
        let mut deleted = 0;
        for batch in flows.chunks(DELETE_BATCH) {
            let requests = batch.iter().map(encode_delete).collect();
            for outcome in self.connection.batch(requests)? {
                match outcome {
                    Ok(()) => deleted += 1,
                    // Expired (or deleted by someone else) since the dump: the goal is met.
                    Err(ENOENT) => {}
                    Err(errno) => return Err(NetlinkError::Errno(errno).into()),
                }
            }
        }
        Ok(deleted)
    }
}

/// The delete request naming `flow` by its original tuple (and zone).
pub fn encode_delete(flow: &UdpFlow) -> NetfilterMessage {
    let tuple = vec![
        Tuple::Ip(vec![
            IPTuple::SourceAddress(flow.orig_src),
            IPTuple::DestinationAddress(flow.orig_dst),
        ]),
        Tuple::Proto(vec![
            ProtoTuple::Protocol(Protocol::Udp),
            ProtoTuple::SourcePort(flow.orig_src_port),
            ProtoTuple::DestinationPort(flow.orig_dst_port),
        ]),
    ];
    let mut attributes = vec![ConntrackAttribute::CtaTupleOrig(tuple)];
    if flow.zone != 0 {
        attributes.push(ConntrackAttribute::Other(DefaultNla::new(
            CTA_ZONE,
            flow.zone.to_be_bytes().to_vec(),
        )));
    }
    NetfilterMessage::new(
        header(IpFamily::of(&flow.orig_src)),
        ConntrackMessage::Delete(attributes),
    )
}

/// The UDP flow a dump entry describes; `None` for other protocols or incomplete entries.
pub fn decode_udp_flow(message: &NetfilterMessage) -> Option<UdpFlow> {
    let NetfilterMessageInner::Conntrack(ConntrackMessage::New(attributes)) = &message.inner else {
        return None;
    };
    let mut orig = None;
    let mut reply = None;
    let mut zone = 0;
    for attribute in attributes {
        match attribute {
            ConntrackAttribute::CtaTupleOrig(tuple) => orig = Some(Endpoints::of(tuple)?),
            ConntrackAttribute::CtaTupleReply(tuple) => reply = Some(Endpoints::of(tuple)?),
            ConntrackAttribute::Other(nla) if nla.kind() == CTA_ZONE && nla.value_len() == 2 => {
                let mut value = [0u8; 2];
                nla.emit_value(&mut value);
                zone = u16::from_be_bytes(value);
            }
            _ => {}
        }
    }
    let (orig, reply) = (orig?, reply?);
    (orig.udp && reply.udp).then_some(UdpFlow {
        orig_src: orig.src,
        orig_src_port: orig.src_port,
        orig_dst: orig.dst,
        orig_dst_port: orig.dst_port,
        reply_src: reply.src,
        reply_src_port: reply.src_port,
        zone,
    })
}

/// One direction's tuple.
struct Endpoints {
    src: IpAddr,
    dst: IpAddr,
    src_port: u16,
    dst_port: u16,
    udp: bool,
}

impl Endpoints {
    fn of(tuple: &[Tuple]) -> Option<Endpoints> {
        let (mut src, mut dst, mut src_port, mut dst_port, mut udp) = (None, None, 0, 0, false);
        for part in tuple {
            match part {
                Tuple::Ip(ips) => {
                    for ip in ips {
                        match ip {
                            IPTuple::SourceAddress(a) => src = Some(*a),
                            IPTuple::DestinationAddress(a) => dst = Some(*a),
                            _ => {}
                        }
                    }
                }
                Tuple::Proto(fields) => {
                    for field in fields {
                        match field {
                            ProtoTuple::Protocol(p) => udp = *p == Protocol::Udp,
                            ProtoTuple::SourcePort(p) => src_port = *p,
                            ProtoTuple::DestinationPort(p) => dst_port = *p,
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        Some(Endpoints {
            src: src?,
            dst: dst?,
            src_port,
            dst_port,
            udp,
        })
    }
}

/// A shared handle, so that a test can keep one and look at the table the proxy changed.
impl<C: Conntrack> Conntrack for std::sync::Arc<std::sync::Mutex<C>> {
    fn udp_flows(&mut self, family: IpFamily) -> Result<Vec<UdpFlow>, ConntrackError> {
        self.lock()
            .unwrap_or_else(|p| p.into_inner())
            .udp_flows(family)
    }

    fn delete(&mut self, flows: &[UdpFlow]) -> Result<usize, ConntrackError> {
        self.lock().unwrap_or_else(|p| p.into_inner()).delete(flows)
    }
}

/// A conntrack table in memory: tests see what was deleted.
#[derive(Clone, Debug, Default)]
pub struct FakeConntrack {
    pub flows: Vec<UdpFlow>,
    /// How many dumps were asked for (a sync with nothing to check should ask for none).
    pub dumps: usize,
}

impl Conntrack for FakeConntrack {
    fn udp_flows(&mut self, family: IpFamily) -> Result<Vec<UdpFlow>, ConntrackError> {
        self.dumps += 1;
        Ok(self
            .flows
            .iter()
            .filter(|f| IpFamily::of(&f.orig_src) == family)
            .copied()
            .collect())
    }

    fn delete(&mut self, flows: &[UdpFlow]) -> Result<usize, ConntrackError> {
        let before = self.flows.len();
        self.flows.retain(|f| !flows.contains(f));
        Ok(before - self.flows.len())
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::{Emitable, ParseableParametrized};

    use super::*;

    /// (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW: the type of each dump entry.
    const IPCTNL_MSG_CT_NEW_IN_CONNTRACK: u16 = 1 << 8;

    fn flow() -> UdpFlow {
        UdpFlow {
            orig_src: "10.0.0.5".parse().unwrap(),
            orig_src_port: 40000,
            orig_dst: "10.96.0.10".parse().unwrap(),
            orig_dst_port: 53,
            reply_src: "10.244.1.7".parse().unwrap(),
            reply_src_port: 5353,
            zone: 0,
        }
    }

    /// The bytes `conntrack -D -p udp -s 10.0.0.5 -d 10.96.0.10 --sport 40000 --dport 53`
    /// sends (after the netlink header): nfgenmsg AF_INET, then CTA_TUPLE_ORIG with the
    /// addresses and the UDP ports, nested attributes flagged NLA_F_NESTED.
    #[test]
    fn delete_request_names_the_original_tuple() {
        let message = encode_delete(&flow());
        let mut bytes = vec![0u8; message.buffer_len()];
        message.emit(&mut bytes);
        let expected: Vec<u8> = vec![
            0x02, 0x00, 0x00, 0x00, // nfgenmsg: AF_INET, version 0, res_id 0
            0x34, 0x00, 0x01, 0x80, // CTA_TUPLE_ORIG (nested), 52 bytes
            0x14, 0x00, 0x01, 0x80, // CTA_TUPLE_IP (nested)
            0x08, 0x00, 0x01, 0x00, 10, 0, 0, 5, // CTA_IP_V4_SRC
            0x08, 0x00, 0x02, 0x00, 10, 96, 0, 10, // CTA_IP_V4_DST
            0x1c, 0x00, 0x02, 0x80, // CTA_TUPLE_PROTO (nested)
            0x05, 0x00, 0x01, 0x00, 17, 0, 0, 0, // CTA_PROTO_NUM udp
            0x06, 0x00, 0x02, 0x00, 0x9c, 0x40, 0, 0, // CTA_PROTO_SRC_PORT 40000
            0x06, 0x00, 0x03, 0x00, 0x00, 0x35, 0, 0, // CTA_PROTO_DST_PORT 53
        ];
        assert_eq!(bytes, expected);
    }

    #[test]
    fn zone_is_named_when_not_zero() {
        let zoned = UdpFlow { zone: 7, ..flow() };
        let message = encode_delete(&zoned);
        let mut bytes = vec![0u8; message.buffer_len()];
        message.emit(&mut bytes);
        assert_eq!(&bytes[bytes.len() - 8..], &[6, 0, 18, 0, 0, 7, 0, 0]);
    }

    #[test]
    fn dump_entries_decode_to_flows() {
        let f = flow();
        let tuple = |src, sport, dst, dport| {
            vec![
                Tuple::Ip(vec![
                    IPTuple::SourceAddress(src),
                    IPTuple::DestinationAddress(dst),
                ]),
                Tuple::Proto(vec![
                    ProtoTuple::Protocol(Protocol::Udp),
                    ProtoTuple::SourcePort(sport),
                    ProtoTuple::DestinationPort(dport),
                ]),
            ]
        };
        let entry = NetfilterMessage::new(
            header(IpFamily::V4),
            ConntrackMessage::New(vec![
                ConntrackAttribute::CtaTupleOrig(tuple(
                    f.orig_src,
                    f.orig_src_port,
                    f.orig_dst,
                    f.orig_dst_port,
                )),
                ConntrackAttribute::CtaTupleReply(tuple(
                    f.reply_src,
                    f.reply_src_port,
                    f.orig_src,
                    f.orig_src_port,
                )),
                ConntrackAttribute::Other(DefaultNla::new(CTA_ZONE, vec![0, 3])),
            ]),
        );
        // Through bytes and back, as the kernel's dump arrives.
        let mut bytes = vec![0u8; entry.buffer_len()];
        entry.emit(&mut bytes);
        let parsed =
            NetfilterMessage::parse_with_param(&bytes, IPCTNL_MSG_CT_NEW_IN_CONNTRACK).unwrap();
        assert_eq!(decode_udp_flow(&parsed), Some(UdpFlow { zone: 3, ..f }));
    }

    #[test]
    fn fake_deletes_only_what_it_is_told() {
        let other = UdpFlow {
            orig_src_port: 40001,
            ..flow()
        };
        let mut fake = FakeConntrack {
            flows: vec![flow(), other],
            dumps: 0,
        };
        assert_eq!(fake.delete(&[flow(), flow()]).unwrap(), 1);
        assert_eq!(fake.flows, vec![other]);
        assert_eq!(fake.udp_flows(IpFamily::V6).unwrap(), vec![]);
    }
}
