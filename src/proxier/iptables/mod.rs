//! iptables mode: upstream's KUBE-SERVICES -> KUBE-SVC -> KUBE-SEP layout.
//!
//! Laid out as every mode: `settings`, `render` (pure: one family's rules per service), `plan`
//! (the restore input from what is programmed to what is wanted), `proxier` (the stages the
//! sync driver runs: full and partial syncs, `adopt` the chains a restart finds, `apply`
//! thinly, repair `drift`), `cleanup`, `setup`, `preview` and `explain`. Its own parts: `names`,
//! `programmed` (what memory keeps of each service), `nfacct` and `walk` (what KUBE-SERVICES'
//! length costs each connection, said in the log).

pub mod cleanup;
pub mod explain;
pub mod names;
pub mod nfacct;
pub mod plan;
pub mod preview;
pub mod programmed;
mod proxier;
pub mod render;
pub mod settings;
pub mod setup;
mod walk;

pub use nfacct::NfacctCounters;
pub use proxier::{IptablesMode, IptablesProxier};
pub use settings::IptablesSettings;

#[cfg(test)]
mod tests;
