//! IPVS over generic netlink, with no ipvsadm process: the operations IPVS mode needs, behind
//! [`Ipvs`], which the kernel's client and a stateful fake implement.

mod client;
pub mod codec;
pub mod fake;

pub use client::{IpvsClient, IpvsError};
pub use codec::{RealServer, VirtualServer};

/// The IPVS operations IPVS mode makes.
pub trait Ipvs: Send {
    /// Every virtual server.
    fn services(&mut self) -> Result<Vec<VirtualServer>, IpvsError>;
    /// The virtual server at `vs`'s address, protocol and port, if there is one.
    fn service(&mut self, vs: &VirtualServer) -> Result<Option<VirtualServer>, IpvsError>;
    fn add_service(&mut self, vs: &VirtualServer) -> Result<(), IpvsError>;
    fn update_service(&mut self, vs: &VirtualServer) -> Result<(), IpvsError>;
    fn delete_service(&mut self, vs: &VirtualServer) -> Result<(), IpvsError>;
    /// The real servers of a virtual server.
    fn destinations(&mut self, vs: &VirtualServer) -> Result<Vec<RealServer>, IpvsError>;
    /// Adds, updates or deletes a real server (`cmd` is CMD_NEW_DEST, CMD_SET_DEST or
    /// CMD_DEL_DEST).
    fn change_destination(
        &mut self,
        cmd: u8,
        vs: &VirtualServer,
        rs: &RealServer,
    ) -> Result<(), IpvsError>;
    /// Sets the connection timeouts (seconds; 0 keeps the kernel's).
    fn set_timeouts(&mut self, tcp: u32, tcp_fin: u32, udp: u32) -> Result<(), IpvsError>;
}

impl Ipvs for IpvsClient {
    fn services(&mut self) -> Result<Vec<VirtualServer>, IpvsError> {
        IpvsClient::services(self)
    }

    fn service(&mut self, vs: &VirtualServer) -> Result<Option<VirtualServer>, IpvsError> {
        IpvsClient::service(self, vs.address, vs.protocol, vs.port)
    }

    fn add_service(&mut self, vs: &VirtualServer) -> Result<(), IpvsError> {
        IpvsClient::add_service(self, vs)
    }

    fn update_service(&mut self, vs: &VirtualServer) -> Result<(), IpvsError> {
        IpvsClient::update_service(self, vs)
    }

    fn delete_service(&mut self, vs: &VirtualServer) -> Result<(), IpvsError> {
        IpvsClient::delete_service(self, vs)
    }

    fn destinations(&mut self, vs: &VirtualServer) -> Result<Vec<RealServer>, IpvsError> {
        IpvsClient::destinations(self, vs)
    }

    fn change_destination(
        &mut self,
        cmd: u8,
        vs: &VirtualServer,
        rs: &RealServer,
    ) -> Result<(), IpvsError> {
        IpvsClient::change_destination(self, cmd, vs, rs)
    }

    fn set_timeouts(&mut self, tcp: u32, tcp_fin: u32, udp: u32) -> Result<(), IpvsError> {
        IpvsClient::set_timeouts(self, tcp, tcp_fin, udp)
    }
}
