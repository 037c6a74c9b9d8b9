//! IPVS mode: virtual servers over netlink, kube-ipvs0, ipsets and upstream's constant rules.
//!
//! Laid out as every mode: `settings`, `render` (pure: one service's fragment per family),
//! `plan` (the operations from what the kernel holds to what is wanted), `proxier` (the stages
//! the sync driver runs: `adopt` reads the kernel, `apply` takes a family to its state, a
//! `partial` sync of a few services), `cleanup`, `setup`, `preview` and `explain`. Its own parts:
//! `aggregate` (the fragments summed per family) and `support` (the node check).

pub mod aggregate;
pub mod cleanup;
pub mod explain;
#[cfg(test)]
mod flows;
pub mod plan;
pub mod preview;
mod proxier;
pub mod render;
pub mod settings;
pub mod setup;
mod support;

pub use proxier::{DUMMY_LINK, IPVS_JUMP_RULES, IpvsKernel, IpvsMode, IpvsProxier, sysctls};
pub use settings::IpvsSettings;
pub use support::{IpvsUnsupported, check_support};
