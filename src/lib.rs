//! kube-proxy-rs: a drop-in replacement for Kubernetes' kube-proxy.
#![forbid(unsafe_code)]

pub mod commands;
pub mod config;
pub mod daemon;
pub mod explain;
pub mod k8s;
pub mod logging;
pub mod model;
pub mod node_setup;
pub mod preview;
pub mod proxier;
pub mod runner;
pub mod servers;
pub mod sync_failures;
pub mod sys;
