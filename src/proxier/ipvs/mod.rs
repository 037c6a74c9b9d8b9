//! IPVS mode. Today: the check that decides whether this node can run it.

pub mod diff;
pub mod render;
mod support;

pub use support::{IpvsUnsupported, check_support};
