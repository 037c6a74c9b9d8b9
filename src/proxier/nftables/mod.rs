//! nftables mode: upstream's `table ip kube-proxy` / `table ip6 kube-proxy` layout (1.34/1.35).

pub mod cleanup;
mod digests;
mod elements;
mod holders;
pub mod names;
pub mod preview;
mod proxier;
pub mod render;
pub mod setup;
pub mod slots;
pub mod support;
mod text;
pub mod transaction;

pub use proxier::{NftablesMode, NftablesProxier, NftablesSettings};
