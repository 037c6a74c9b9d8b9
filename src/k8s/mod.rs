//! Everything that speaks to the Kubernetes API: conversion of its objects, the client, the watches.
//! This is the only module that imports kube.

mod backoff;
mod client;
pub mod convert;
mod events;
pub mod files;
mod lenient;
mod retry;
pub mod rules;
mod watch;

pub use client::{ClientError, RequestObserver, RequestRecord, build_client};
pub use events::{IPVS_DEPRECATION, NodeEvent, NodeEvents};
pub use retry::Refusal;
pub use watch::{InvalidInput, Synced, WatchSink, proxy_label_selector, spawn_watches};
