//! IPVS over generic netlink, with no ipvsadm process.

mod client;
pub mod codec;

pub use client::{IpvsClient, IpvsError};
pub use codec::{RealServer, VirtualServer};
