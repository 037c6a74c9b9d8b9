//! kube-proxy-rs: a drop-in replacement for Kubernetes' kube-proxy.
#![forbid(unsafe_code)]

pub mod config;
pub mod k8s;
pub mod model;
pub mod runner;
