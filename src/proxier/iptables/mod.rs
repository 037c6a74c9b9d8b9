//! iptables mode: upstream's KUBE-SERVICES -> KUBE-SVC -> KUBE-SEP layout.

pub mod names;
pub mod nfacct;
pub mod programmed;
mod proxier;
pub mod render;
pub mod restore;

pub use nfacct::NfacctCounters;
pub(crate) use proxier::missing_jumps;
pub use proxier::{IptablesProxier, IptablesSettings};

#[cfg(test)]
pub(crate) mod tests;
