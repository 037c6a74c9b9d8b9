//! Links over rtnetlink: dummy links and their addresses (kube-ipvs0 holds every service IP in
//! IPVS mode), the names of the node's links (nftables mode's flowtable covers them) and the
//! events that say a link appeared.

use std::collections::BTreeSet;
use std::net::IpAddr;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::AddressFamily;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage};

use crate::sys::netlink::{Connection, NetlinkError};

pub mod events;
pub mod fake;

const EEXIST: i32 = 17;
const ENODEV: i32 = 19;
const EADDRNOTAVAIL: i32 = 99;

/// Why a link operation failed.
#[derive(Debug, thiserror::Error)]
#[error("{operation}: {cause}")]
pub struct LinkError {
    pub operation: String,
    pub cause: NetlinkError,
}

/// The link operations IPVS mode makes: a dummy link and the addresses bound to it.
pub trait DummyLinks: Send {
    /// The index of dummy link `name`, created if missing.
    fn ensure_dummy(&mut self, name: &str) -> Result<u32, LinkError>;
    /// The addresses bound to link `index`.
    fn addresses(&mut self, index: u32) -> Result<Vec<IpAddr>, LinkError>;
    /// Binds an address (/32 or /128); already bound is fine.
    fn add_address(&mut self, index: u32, ip: IpAddr) -> Result<(), LinkError>;
    /// Unbinds an address; not bound is fine.
    fn delete_address(&mut self, index: u32, ip: IpAddr) -> Result<(), LinkError>;
}

impl DummyLinks for Links {
    fn ensure_dummy(&mut self, name: &str) -> Result<u32, LinkError> {
        Links::ensure_dummy(self, name)
    }

    fn addresses(&mut self, index: u32) -> Result<Vec<IpAddr>, LinkError> {
        Links::addresses(self, index)
    }

    fn add_address(&mut self, index: u32, ip: IpAddr) -> Result<(), LinkError> {
        Links::add_address(self, index, ip)
    }

    fn delete_address(&mut self, index: u32, ip: IpAddr) -> Result<(), LinkError> {
        Links::delete_address(self, index, ip)
    }
}

/// The names of the links of this network namespace.
pub trait LinkNames: Send {
    fn names(&mut self) -> Result<BTreeSet<String>, LinkError>;
}

impl LinkNames for Links {
    fn names(&mut self) -> Result<BTreeSet<String>, LinkError> {
        Links::names(self)
    }
}

/// Links and addresses in this thread's network namespace.
pub struct Links {
    connection: Connection,
}

impl Links {
    /// Opens an rtnetlink socket.
    pub fn open() -> Result<Self, LinkError> {
        let connection =
            Connection::open(netlink_sys::protocols::NETLINK_ROUTE).map_err(|cause| LinkError {
                operation: "open rtnetlink".into(),
                cause,
            })?;
        Ok(Links { connection })
    }

    /// The names of every link (one dump of the links, a few hundred on a busy node).
    pub fn names(&mut self) -> Result<BTreeSet<String>, LinkError> {
        let replies = self
            .connection
            .request(RouteNetlinkMessage::GetLink(LinkMessage::default()), true)
            .map_err(|cause| LinkError {
                operation: "list links".into(),
                cause,
            })?;
        Ok(replies
            .into_iter()
            .filter_map(|reply| match reply {
                RouteNetlinkMessage::NewLink(link) => {
                    link.attributes.into_iter().find_map(|a| match a {
                        LinkAttribute::IfName(name) => Some(name),
                        _ => None,
                    })
                }
                _ => None,
            })
            .collect())
    }

    /// The index of the link called `name`, if it exists.
    pub fn index_of(&mut self, name: &str) -> Result<Option<u32>, LinkError> {
        let mut message = LinkMessage::default();
        message
            .attributes
            .push(LinkAttribute::IfName(name.to_string()));
        match self
            .connection
            .request(RouteNetlinkMessage::GetLink(message), false)
        {
            Ok(replies) => Ok(replies.into_iter().find_map(|reply| match reply {
                RouteNetlinkMessage::NewLink(link) => Some(link.header.index),
                _ => None,
            })),
            Err(err) if err.errno() == Some(ENODEV) => Ok(None),
            Err(cause) => Err(LinkError {
                operation: format!("look up link {name}"),
                cause,
            }),
        }
    }

    /// Creates a dummy link if there is none by that name; returns its index.
    pub fn ensure_dummy(&mut self, name: &str) -> Result<u32, LinkError> {
        if let Some(index) = self.index_of(name)? {
            return Ok(index);
        }
        let mut message = LinkMessage::default();
        message
            .attributes
            .push(LinkAttribute::IfName(name.to_string()));
        message
            .attributes
            .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(
                InfoKind::Dummy,
            )]));
        match self.connection.request_with_flags(
            RouteNetlinkMessage::NewLink(message),
            false,
            NLM_F_CREATE | NLM_F_EXCL,
        ) {
            Ok(_) => {}
            Err(err) if err.errno() == Some(EEXIST) => {}
            Err(cause) => {
                return Err(LinkError {
                    operation: format!("create dummy link {name}"),
                    cause,
                });
            }
        }
        self.index_of(name)?.ok_or_else(|| LinkError {
            operation: format!("create dummy link {name}"),
            cause: NetlinkError::Decode("link not found after creation".into()),
        })
    }

    /// Deletes a link by name; a missing link is not an error.
    pub fn delete(&mut self, name: &str) -> Result<bool, LinkError> {
        let Some(index) = self.index_of(name)? else {
            return Ok(false);
        };
        let mut message = LinkMessage::default();
        message.header.index = index;
        self.connection
            .request(RouteNetlinkMessage::DelLink(message), false)
            .map_err(|cause| LinkError {
                operation: format!("delete link {name}"),
                cause,
            })?;
        Ok(true)
    }

    /// The addresses on a link.
    pub fn addresses(&mut self, index: u32) -> Result<Vec<IpAddr>, LinkError> {
        let replies = self
            .connection
            .request(
                RouteNetlinkMessage::GetAddress(AddressMessage::default()),
                true,
            )
            .map_err(|cause| LinkError {
                operation: "list addresses".into(),
                cause,
            })?;
        let mut found = Vec::new();
        for reply in replies {
            if let RouteNetlinkMessage::NewAddress(address) = reply
                && address.header.index == index
            {
                found.extend(address.attributes.iter().find_map(|attr| match attr {
                    AddressAttribute::Local(ip) | AddressAttribute::Address(ip) => Some(*ip),
                    _ => None,
                }));
            }
        }
        found.sort();
        found.dedup();
        Ok(found)
    }

    fn address_message(index: u32, ip: IpAddr) -> AddressMessage {
        let mut message = AddressMessage::default();
        message.header.index = index;
        message.header.family = if ip.is_ipv4() {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        };
        message.header.prefix_len = if ip.is_ipv4() { 32 } else { 128 };
        message.attributes.push(AddressAttribute::Local(ip));
        message.attributes.push(AddressAttribute::Address(ip));
        message
    }

    /// Binds an address (/32 or /128) to a link; already bound is fine.
    pub fn add_address(&mut self, index: u32, ip: IpAddr) -> Result<(), LinkError> {
        let message = RouteNetlinkMessage::NewAddress(Self::address_message(index, ip));
        match self
            .connection
            .request_with_flags(message, false, NLM_F_CREATE | NLM_F_EXCL)
        {
            Ok(_) => Ok(()),
            Err(err) if err.errno() == Some(EEXIST) => Ok(()),
            Err(cause) => Err(LinkError {
                operation: format!("bind {ip}"),
                cause,
            }),
        }
    }

    /// Unbinds an address; not bound is fine.
    pub fn delete_address(&mut self, index: u32, ip: IpAddr) -> Result<(), LinkError> {
        match self.connection.request(
            RouteNetlinkMessage::DelAddress(Self::address_message(index, ip)),
            false,
        ) {
            Ok(_) => Ok(()),
            Err(err) if err.errno() == Some(EADDRNOTAVAIL) => Ok(()),
            Err(cause) => Err(LinkError {
                operation: format!("unbind {ip}"),
                cause,
            }),
        }
    }
}
