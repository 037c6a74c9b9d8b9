//! IPVS mode. Today: the check that decides whether this node can run it.

pub mod diff;
mod proxier;
pub mod render;
mod support;

pub use proxier::{DUMMY_LINK, IpvsProxier, IpvsSettings};
pub use support::{IpvsUnsupported, check_support};
