//! nftables mode: upstream's `table ip kube-proxy` / `table ip6 kube-proxy` layout (1.37).
//!
//! Laid out as every mode: `settings` (what of the configuration it uses), `render` (pure: one
//! family's objects per service), `plan` (the transaction from what is programmed to what is
//! wanted), `proxier` (the stages the sync driver runs: full and partial syncs, `adopt` what
//! a restart finds, `apply` thinly, repair `drift`), `cleanup`, `setup` and `preview`. Its own
//! parts: `names`, `slots` (endpoint maps shared by services), `digests` (what the table keeps
//! of itself for restarts), `holders`, `elements`, `text`, `support` and `flowtable` (the
//! offload fast path's devices).

pub mod cleanup;
mod digests;
mod elements;
pub mod explain;
#[cfg(test)]
mod flows;
pub mod flowtable;
mod holders;
pub mod names;
pub mod plan;
pub mod preview;
mod proxier;
pub mod render;
pub mod settings;
pub mod setup;
pub mod slots;
pub mod support;
mod text;

pub use proxier::{NftablesMode, NftablesProxier};
pub use settings::NftablesSettings;
