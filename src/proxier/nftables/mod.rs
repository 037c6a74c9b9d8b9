//! nftables mode: upstream's `table ip kube-proxy` / `table ip6 kube-proxy` layout (1.34/1.35).

mod digests;
mod elements;
mod holders;
pub mod names;
mod proxier;
pub mod render;
pub mod slots;
pub mod support;
mod text;
pub mod transaction;

pub use proxier::{NftablesProxier, NftablesSettings};
