//! Tests of the pure iptables renderer: golden restore texts, jump-target consistency, the packet
//! tracer, and incremental syncs against the stateful fake.

mod adoption;
mod drift;
mod full_sync;
mod golden;
mod incremental;
mod quarantine;
mod tracer_cases;
mod upstream_flows;

use std::collections::BTreeMap;

use super::plan::{FullSyncExtras, full_restore};
use super::render::{
    LocalDetector, NodePortAddresses, RenderContext, ServiceRules, render_base, render_service,
};
use crate::model::{IpFamily, NamespacedName, Protocol};
pub use crate::proxier::fixtures::*;

/// The context upstream's tests use: cluster CIDR 10.0.0.0/8, mark 0x4000, localhost NodePorts on.
pub fn context() -> RenderContext {
    RenderContext {
        common: family_context(IpFamily::V4, NODE_IP, "10.0.0.0/8"),
        localhost_node_ports: true,
        localhost_proxy: false,
        node_port_addresses: NodePortAddresses::All,
        tcp_be_liberal: false,
        nfacct: Default::default(),
    }
}

/// Renders services in a context.
pub fn render_all(services: &[Svc], ctx: &RenderContext) -> BTreeMap<NamespacedName, ServiceRules> {
    services
        .iter()
        .map(|s| {
            (
                s.key.clone(),
                render_service(&s.ports, Some(&s.endpoints), ctx),
            )
        })
        .collect()
}

/// The full restore text for services in a context, on a node with none of our rules yet.
pub fn full_text(services: &[Svc], ctx: &RenderContext) -> String {
    let base = render_base(ctx);
    let extras = FullSyncExtras {
        missing_jumps: &base.jumps(),
        ..FullSyncExtras::default()
    };
    full_restore(&base, &render_all(services, ctx), &extras).0
}

/// Compares texts line by line with a readable diff.
pub fn assert_text_eq(got: &str, want: &str) {
    if got.trim() == want.trim() {
        return;
    }
    let got_lines: Vec<&str> = got.trim().lines().collect();
    let want_lines: Vec<&str> = want.trim().lines().map(str::trim).collect();
    let mut report = String::new();
    for line in &want_lines {
        if !got_lines.contains(line) {
            report.push_str(&format!("- {line}\n"));
        }
    }
    for line in &got_lines {
        if !want_lines.contains(line) {
            report.push_str(&format!("+ {line}\n"));
        }
    }
    if report.is_empty() {
        report.push_str("same lines, different order");
    }
    panic!("restore text differs (- missing, + unexpected):\n{report}\nfull text:\n{got}");
}
