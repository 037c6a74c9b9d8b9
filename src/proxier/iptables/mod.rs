//! iptables mode: upstream's KUBE-SERVICES -> KUBE-SVC -> KUBE-SEP layout.

pub mod names;
mod proxier;
pub mod render;
pub mod restore;

pub(crate) use proxier::missing_jumps;
pub use proxier::{IptablesProxier, IptablesSettings};

#[cfg(test)]
pub(crate) mod tests;
