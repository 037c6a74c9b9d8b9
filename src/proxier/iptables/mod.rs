//! iptables mode: upstream's KUBE-SERVICES -> KUBE-SVC -> KUBE-SEP layout.

pub mod names;
pub mod render;
pub mod restore;

#[cfg(test)]
mod tests;
