//! The pure model: typed services and endpoints, change tracking, endpoint selection. No I/O.

pub mod address;
mod endpoints;
mod topology;
mod tracker;
mod types;
mod vec_map;

pub use endpoints::merge_slices;
pub use topology::{NodeContext, SelectedEndpoints, select_endpoints};
pub use tracker::{Change, ChangeSummary, ChangeTracker, Changes, PendingChanges, ProxyState};
pub use types::*;
pub use vec_map::VecMap;

#[cfg(test)]
pub(crate) mod fixtures;
