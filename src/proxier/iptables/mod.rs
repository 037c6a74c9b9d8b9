//! iptables mode: upstream's KUBE-SERVICES -> KUBE-SVC -> KUBE-SEP layout.

pub mod cleanup;
pub mod names;
pub mod nfacct;
pub mod preview;
pub mod programmed;
mod proxier;
pub mod render;
pub mod restore;
pub mod setup;

pub use nfacct::NfacctCounters;
pub use proxier::{IptablesMode, IptablesProxier, IptablesSettings};

#[cfg(test)]
mod tests;
