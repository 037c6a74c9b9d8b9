//! The kernel's extended accounting objects (nfnetlink_acct): named packet counters that an
//! iptables rule bumps with `-m nfacct --nfacct-name NAME`. Upstream counts conntrack-INVALID
//! drops and localhost NodePort packets this way; we create the objects and read them over
//! netlink, with no `nfacct` process.

use std::collections::BTreeMap;

use netlink_packet_core::{DefaultNla, NLM_F_CREATE, Nla};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
    NetfilterSubsystem,
};
use netlink_sys::protocols::NETLINK_NETFILTER;
use nix::libc;

use super::netlink::{Connection, NetlinkError};

/// NFNL_SUBSYS_ACCT.
const SUBSYS_ACCT: u8 = 7;
/// NFNL_MSG_ACCT_NEW and NFNL_MSG_ACCT_GET.
const MSG_NEW: u8 = 0;
const MSG_GET: u8 = 1;
/// NFACCT_NAME (a NUL-terminated string) and NFACCT_PKTS (a big-endian u64).
const ATTR_NAME: u16 = 1;
const ATTR_PKTS: u16 = 2;
/// The kernel's NFACCT_NAME_MAX, with the terminating NUL.
pub const NAME_MAX: usize = 32;

/// Why an accounting object could not be created or read.
#[derive(Debug, thiserror::Error)]
pub enum NfacctError {
    #[error("nfacct {name:?}: {source}")]
    Netlink { name: String, source: NetlinkError },
    #[error("nfacct {0:?}: the name is longer than the kernel's {NAME_MAX} bytes")]
    NameTooLong(String),
    #[error("nfacct {0:?}: the kernel's answer has no packet count")]
    NoCount(String),
    #[error("nfacct {0:?}: no such object")]
    Missing(String),
}

/// Named packet counters in the kernel.
pub trait Nfacct: Send {
    /// Creates the counter unless it exists (an existing one keeps its count).
    fn ensure(&mut self, name: &str) -> Result<(), NfacctError>;
    /// How many packets the counter has seen.
    fn packets(&mut self, name: &str) -> Result<u64, NfacctError>;
}

/// Accounting objects over a NETLINK_NETFILTER socket in the calling thread's namespace.
pub struct NetlinkNfacct {
    connection: Connection,
}

impl NetlinkNfacct {
    /// Opens the socket.
    pub fn open() -> Result<Self, NetlinkError> {
        Ok(NetlinkNfacct {
            connection: Connection::open(NETLINK_NETFILTER)?,
        })
    }
}

fn message(message_type: u8, name: &str) -> Result<NetfilterMessage, NfacctError> {
    if name.len() >= NAME_MAX {
        return Err(NfacctError::NameTooLong(name.to_string()));
    }
    let mut value = name.as_bytes().to_vec();
    value.push(0);
    Ok(NetfilterMessage::new(
        NetfilterHeader::new(NetfilterProtoFamily::Unspec, 0, 0),
        NetfilterMessageInner::Other {
            subsys: NetfilterSubsystem::Other(SUBSYS_ACCT),
            message_type,
            attributes: vec![DefaultNla::new(ATTR_NAME, value)],
        },
    ))
}

/// The packet count in a GET answer.
pub fn decode_packets(reply: &NetfilterMessage) -> Option<u64> {
    let NetfilterMessageInner::Other { attributes, .. } = &reply.inner else {
        return None;
    };
    let attribute = attributes.iter().find(|a| a.kind() == ATTR_PKTS)?;
    let mut value = vec![0u8; attribute.value_len()];
    attribute.emit_value(&mut value);
    Some(u64::from_be_bytes(value.get(..8)?.try_into().ok()?))
}

impl Nfacct for NetlinkNfacct {
    fn ensure(&mut self, name: &str) -> Result<(), NfacctError> {
        let request = message(MSG_NEW, name)?;
        match self
            .connection
            .request_with_flags(request, false, NLM_F_CREATE)
        {
            Ok(_) => Ok(()),
            // An object of that name exists already: EBUSY to a create without NLM_F_REPLACE.
            Err(err) if matches!(err.errno(), Some(libc::EEXIST | libc::EBUSY)) => Ok(()),
            Err(source) => Err(NfacctError::Netlink {
                name: name.to_string(),
                source,
            }),
        }
    }

    fn packets(&mut self, name: &str) -> Result<u64, NfacctError> {
        let request = message(MSG_GET, name)?;
        let replies =
            self.connection
                .request(request, false)
                .map_err(|source| match source.errno() {
                    Some(libc::ENOENT) => NfacctError::Missing(name.to_string()),
                    _ => NfacctError::Netlink {
                        name: name.to_string(),
                        source,
                    },
                })?;
        replies
            .iter()
            .find_map(decode_packets)
            .ok_or_else(|| NfacctError::NoCount(name.to_string()))
    }
}

/// Counters in memory; `unsupported` makes every call fail as on a kernel without nfnetlink_acct.
#[derive(Clone, Debug, Default)]
pub struct FakeNfacct {
    pub counters: BTreeMap<String, u64>,
    pub unsupported: bool,
}

impl Nfacct for FakeNfacct {
    fn ensure(&mut self, name: &str) -> Result<(), NfacctError> {
        if self.unsupported {
            return Err(NfacctError::Netlink {
                name: name.to_string(),
                source: NetlinkError::Errno(libc::EOPNOTSUPP),
            });
        }
        self.counters.entry(name.to_string()).or_insert(0);
        Ok(())
    }

    fn packets(&mut self, name: &str) -> Result<u64, NfacctError> {
        self.counters
            .get(name)
            .copied()
            .ok_or_else(|| NfacctError::Missing(name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::{Emitable, ParseableParametrized};

    use super::*;

    #[test]
    fn requests_name_the_counter_as_the_kernel_reads_it() {
        let request = message(MSG_NEW, "ct_state_invalid_dropped_pkts").unwrap();
        let mut buffer = vec![0u8; request.buffer_len()];
        request.emit(&mut buffer);
        // nfgenmsg (family, version, res_id), then NFACCT_NAME with its NUL.
        assert_eq!(&buffer[..4], &[0, 0, 0, 0]);
        assert_eq!(u16::from_ne_bytes([buffer[6], buffer[7]]), ATTR_NAME);
        assert_eq!(&buffer[8..38], b"ct_state_invalid_dropped_pkts\0");
        let long = "x".repeat(NAME_MAX);
        assert!(matches!(
            message(MSG_NEW, &long),
            Err(NfacctError::NameTooLong(_))
        ));
    }

    #[test]
    fn answers_give_the_packet_count() {
        let mut answer = NetfilterMessage::new(
            NetfilterHeader::new(NetfilterProtoFamily::Unspec, 0, 0),
            NetfilterMessageInner::Other {
                subsys: NetfilterSubsystem::Other(SUBSYS_ACCT),
                message_type: MSG_NEW,
                attributes: vec![
                    DefaultNla::new(ATTR_NAME, b"localhost_nps_accepted_pkts\0".to_vec()),
                    DefaultNla::new(ATTR_PKTS, 42u64.to_be_bytes().to_vec()),
                    DefaultNla::new(3, 4200u64.to_be_bytes().to_vec()),
                ],
            },
        );
        let mut buffer = vec![0u8; answer.buffer_len()];
        answer.emit(&mut buffer);
        let parsed = NetfilterMessage::parse_with_param(
            &buffer[..],
            (u16::from(SUBSYS_ACCT) << 8) | u16::from(MSG_NEW),
        )
        .unwrap();
        assert_eq!(decode_packets(&parsed), Some(42));
        answer.inner = NetfilterMessageInner::Other {
            subsys: NetfilterSubsystem::Other(SUBSYS_ACCT),
            message_type: MSG_NEW,
            attributes: vec![],
        };
        assert_eq!(decode_packets(&answer), None);
    }
}
