//! The IPVS client: resolves the generic netlink family, then lists, adds, updates and deletes
//! virtual and real servers in this thread's network namespace.

use netlink_packet_generic::GenlMessage;
use netlink_packet_generic::ctrl::nlas::GenlCtrlAttrs;
use netlink_packet_generic::ctrl::{GenlCtrl, GenlCtrlCmd};

use super::codec::{self, IpvsMessage, RealServer, VirtualServer};
use crate::sys::netlink::{Connection, NetlinkError};

const ENOENT: i32 = 2;
const ESRCH: i32 = 3;

/// Why an IPVS operation failed.
#[derive(Debug, thiserror::Error)]
pub enum IpvsError {
    /// The kernel has no IPVS (the generic netlink family "IPVS" does not resolve).
    #[error(
        "the kernel has no IPVS: generic netlink family \"IPVS\" not found (is ip_vs built or loadable?)"
    )]
    NotAvailable,
    /// A netlink exchange failed.
    #[error("IPVS {operation}: {cause}")]
    Netlink {
        operation: String,
        cause: NetlinkError,
    },
    /// A reply could not be read.
    #[error("IPVS {operation}: {reason}")]
    Decode { operation: String, reason: String },
}

impl IpvsError {
    /// The errno the kernel answered with, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            IpvsError::Netlink { cause, .. } => cause.errno(),
            _ => None,
        }
    }
}

/// A connection to the kernel's IPVS.
pub struct IpvsClient {
    connection: Connection,
    family_id: u16,
}

impl IpvsClient {
    /// Opens a generic netlink socket and resolves the IPVS family.
    pub fn connect() -> Result<Self, IpvsError> {
        let netlink = |operation: &str| {
            let operation = operation.to_string();
            move |cause| IpvsError::Netlink { operation, cause }
        };
        let mut connection = Connection::open(netlink_sys::protocols::NETLINK_GENERIC)
            .map_err(netlink("connect"))?;
        let request = GenlMessage::from_payload(GenlCtrl {
            cmd: GenlCtrlCmd::GetFamily,
            nlas: vec![GenlCtrlAttrs::FamilyName("IPVS".into())],
        });
        let replies = match connection.request(request, false) {
            Err(err) if err.errno() == Some(ENOENT) => return Err(IpvsError::NotAvailable),
            other => other.map_err(netlink("resolve family"))?,
        };
        let family_id = replies
            .iter()
            .flat_map(|reply| &reply.payload.nlas)
            .find_map(|attr| match attr {
                GenlCtrlAttrs::FamilyId(id) => Some(*id),
                _ => None,
            })
            .ok_or(IpvsError::NotAvailable)?;
        Ok(IpvsClient {
            connection,
            family_id,
        })
    }

    /// The id the kernel gave the IPVS family (netlink message type of its messages).
    pub fn family_id(&self) -> u16 {
        self.family_id
    }

    fn request(
        &mut self,
        message: IpvsMessage,
        dump: bool,
        operation: &str,
    ) -> Result<Vec<IpvsMessage>, IpvsError> {
        let mut request = GenlMessage::from_payload(message);
        request.set_resolved_family_id(self.family_id);
        let replies =
            self.connection
                .request(request, dump)
                .map_err(|cause| IpvsError::Netlink {
                    operation: operation.to_string(),
                    cause,
                })?;
        Ok(replies.into_iter().map(|reply| reply.payload).collect())
    }

    /// Every virtual server (on an address; firewall-mark ones are skipped).
    pub fn services(&mut self) -> Result<Vec<VirtualServer>, IpvsError> {
        let replies = self.request(codec::list_services_message(), true, "list services")?;
        let mut services = Vec::new();
        for reply in &replies {
            match codec::decode_service(reply) {
                Ok(Some(service)) => services.push(service),
                Ok(None) => {}
                Err(err) => {
                    return Err(IpvsError::Decode {
                        operation: "list services".into(),
                        reason: err.to_string(),
                    });
                }
            }
        }
        Ok(services)
    }

    /// The virtual server on `address`, `protocol` and `port`, if there is one: one request
    /// for it alone, never a dump of every virtual server.
    pub fn service(
        &mut self,
        address: std::net::IpAddr,
        protocol: crate::model::Protocol,
        port: u16,
    ) -> Result<Option<VirtualServer>, IpvsError> {
        let key = VirtualServer {
            address,
            protocol,
            port,
            scheduler: String::new(),
            flags: 0,
            timeout: 0,
        };
        let operation = format!("get {}", key.key());
        let replies = match self.request(codec::get_service_message(&key), false, &operation) {
            // No such virtual server (ESRCH; ENOENT on older kernels).
            Err(err) if matches!(err.errno(), Some(ESRCH | ENOENT)) => return Ok(None),
            other => other?,
        };
        let mut found = None;
        for reply in &replies {
            found = found.or(
                codec::decode_service(reply).map_err(|err| IpvsError::Decode {
                    operation: operation.clone(),
                    reason: err.to_string(),
                })?,
            );
        }
        Ok(found)
    }

    /// Adds a virtual server.
    pub fn add_service(&mut self, vs: &VirtualServer) -> Result<(), IpvsError> {
        self.request(
            codec::service_message(codec::CMD_NEW_SERVICE, vs),
            false,
            &format!("add {}", vs.key()),
        )
        .map(drop)
    }

    /// Changes a virtual server's scheduler, flags or timeout.
    pub fn update_service(&mut self, vs: &VirtualServer) -> Result<(), IpvsError> {
        self.request(
            codec::service_message(codec::CMD_SET_SERVICE, vs),
            false,
            &format!("update {}", vs.key()),
        )
        .map(drop)
    }

    /// Deletes a virtual server and its real servers.
    pub fn delete_service(&mut self, vs: &VirtualServer) -> Result<(), IpvsError> {
        self.request(
            codec::delete_service_message(vs),
            false,
            &format!("delete {}", vs.key()),
        )
        .map(drop)
    }

    /// The real servers of a virtual server.
    pub fn destinations(&mut self, vs: &VirtualServer) -> Result<Vec<RealServer>, IpvsError> {
        let operation = format!("list real servers of {}", vs.key());
        let replies = self.request(codec::list_dests_message(vs), true, &operation)?;
        replies
            .iter()
            .map(|reply| codec::decode_dest(reply, &vs.address))
            .collect::<Result<_, _>>()
            .map_err(|err| IpvsError::Decode {
                operation,
                reason: err.to_string(),
            })
    }

    /// Adds, updates or deletes a real server (`cmd` is CMD_NEW_DEST, CMD_SET_DEST or CMD_DEL_DEST).
    pub fn change_destination(
        &mut self,
        cmd: u8,
        vs: &VirtualServer,
        rs: &RealServer,
    ) -> Result<(), IpvsError> {
        let operation = format!(
            "change real server {}:{} of {}",
            rs.address,
            rs.port,
            vs.key()
        );
        self.request(codec::dest_message(cmd, vs, rs), false, &operation)
            .map(drop)
    }

    /// Sets the connection timeouts (seconds; 0 keeps the kernel's).
    pub fn set_timeouts(&mut self, tcp: u32, tcp_fin: u32, udp: u32) -> Result<(), IpvsError> {
        self.request(
            codec::timeouts_message(tcp, tcp_fin, udp),
            false,
            "set timeouts",
        )
        .map(drop)
    }
}
