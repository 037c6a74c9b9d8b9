//! IPVS mode: the support check, the pure renderer and diff, and the proxier that applies them.

pub mod aggregate;
pub mod cleanup;
pub mod diff;
pub mod preview;
mod proxier;
pub mod render;
pub mod setup;
mod support;

pub use proxier::{DUMMY_LINK, IPVS_JUMP_RULES, IpvsMode, IpvsProxier, IpvsSettings, sysctls};
pub use support::{IpvsUnsupported, check_support};
