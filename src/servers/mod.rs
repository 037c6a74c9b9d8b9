//! The daemon's listeners: the HTTP endpoints an operator's probes and Prometheus read (the
//! health server on healthzBindAddress, the metrics server on metricsBindAddress, one
//! health-check server per Service with externalTrafficPolicy Local), and the localhost
//! NodePort proxy's.

pub mod debug;
mod health;
mod http;
mod localhost_node_ports;
mod metrics;
mod nfacct;
pub mod nft_counters;
mod service_health;

pub use health::ProxyHealth;
pub use http::{
    ConnectionMetrics, ConnectionTable, Reply, ServerError, bind, capacity_for_open_files, serve,
};
pub use localhost_node_ports::{
    ListenerMetrics, LocalhostNodePorts, Relays, log_families, relay_capacity,
};
pub use metrics::Metrics;
pub use nfacct::NfacctCollector;
pub use service_health::ServiceHealthServers;
pub use service_health::wanted as health_check_ports;

use std::sync::Arc;

/// Starts the health server on `listener`: `/healthz` (readiness: 503 until the first sync, and
/// when updates are stale) and `/livez` (503 only when updates are stale).
/// Answers are counted by code (`kubeproxy_proxy_healthz_total`, `..._livez_total`).
pub fn serve_health(
    listener: tokio::net::TcpListener,
    connections: &ConnectionTable,
    health: Arc<ProxyHealth>,
    metrics: Arc<Metrics>,
) {
    serve(listener, connections, "healthz", move |path| {
        let livez = match path {
            "/healthz" => false,
            "/livez" => true,
            _ => return Reply::not_found(),
        };
        let reply = health.reply(!livez);
        metrics.health_answered(livez, reply.status.as_u16());
        reply
    });
}

/// What the metrics server answers besides the metrics: the mode, the configuration in force
/// (`/configz`, as JSON), and the debug endpoint `explain` reads (see [`debug`]).
pub struct MetricsPages {
    pub mode: &'static str,
    pub configz: String,
    pub debug: Option<Arc<debug::DebugView>>,
}

/// Starts the metrics server on `listener`: `/metrics`, `/healthz`, `/proxyMode`, `/configz`,
/// and the debug endpoint.
pub fn serve_metrics(
    listener: tokio::net::TcpListener,
    connections: &ConnectionTable,
    metrics: Arc<Metrics>,
    health: Arc<ProxyHealth>,
    pages: MetricsPages,
) {
    let MetricsPages {
        mode,
        configz,
        debug,
    } = pages;
    serve(listener, connections, "metrics", move |path| match path {
        "/metrics" => Reply::ok("text/plain; version=0.0.4; charset=utf-8", metrics.encode()),
        "/healthz" => health.reply(true),
        "/proxyMode" => Reply::ok("text/plain; charset=utf-8", mode.to_string()),
        "/configz" => Reply::ok("application/json", configz.clone()),
        _ => debug
            .as_ref()
            .and_then(|debug| debug.route(path))
            .unwrap_or_else(Reply::not_found),
    });
}
