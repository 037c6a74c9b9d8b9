//! IPVS mode: the support check, the pure renderer and diff, and the proxier that applies them.

pub mod aggregate;
pub mod diff;
mod proxier;
pub mod render;
mod support;

pub use proxier::{DUMMY_LINK, IPVS_JUMP_RULES, IpvsProxier, IpvsSettings, sysctls};
pub use support::{IpvsUnsupported, check_support};
