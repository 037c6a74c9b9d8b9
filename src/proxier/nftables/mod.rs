//! nftables mode: upstream's `table ip kube-proxy` / `table ip6 kube-proxy` layout (1.34/1.35).

pub mod names;
pub mod render;
