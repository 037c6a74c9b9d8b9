//! How each kind of metric is made and registered, and the buckets upstream gives its
//! histograms.

use std::time::SystemTime;

use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

/// How long syncs take: 1 ms doubling to 16 s, as upstream.
pub(super) fn sync_buckets() -> Vec<f64> {
    prometheus::exponential_buckets(0.001, 2.0, 15).unwrap_or_default()
}

/// Network programming latency, as upstream's buckets: 0, a quarter and a half second, every
/// second to 59, every 5 s to 115, every 30 s to 300.
pub(super) fn programming_buckets() -> Vec<f64> {
    let mut buckets = vec![0.0, 0.25, 0.5];
    buckets.extend((1..=59).map(f64::from));
    buckets.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    buckets.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    buckets
}

/// client-go's request latency buckets.
pub(super) fn request_buckets() -> Vec<f64> {
    vec![
        0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
    ]
}

pub(super) fn registered<M: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    metric: M,
) -> prometheus::Result<M> {
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

/// A kind of connection's metrics, registered.
pub(super) fn connection_metrics(
    registry: &Registry,
    metrics: super::ConnectionMetrics,
) -> prometheus::Result<super::ConnectionMetrics> {
    registry.register(Box::new(metrics.open.clone()))?;
    registry.register(Box::new(metrics.shed.clone()))?;
    registry.register(Box::new(metrics.timed_out.clone()))?;
    registry.register(Box::new(metrics.limit.clone()))?;
    Ok(metrics)
}

/// A histogram per `ip_family`.
pub(super) fn family_histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: Vec<f64>,
) -> prometheus::Result<HistogramVec> {
    let opts = HistogramOpts::new(name, help).buckets(buckets);
    registered(registry, HistogramVec::new(opts, &["ip_family"])?)
}

pub(super) fn family_counter(
    registry: &Registry,
    name: &str,
    help: &str,
) -> prometheus::Result<IntCounterVec> {
    counter_vec(registry, name, help, &["ip_family"])
}

pub(super) fn family_gauge(
    registry: &Registry,
    name: &str,
    help: &str,
) -> prometheus::Result<GaugeVec> {
    registered(
        registry,
        GaugeVec::new(Opts::new(name, help), &["ip_family"])?,
    )
}

pub(super) fn counter(
    registry: &Registry,
    name: &str,
    help: &str,
) -> prometheus::Result<IntCounter> {
    registered(registry, IntCounter::new(name, help)?)
}

pub(super) fn int_gauge(
    registry: &Registry,
    name: &str,
    help: &str,
) -> prometheus::Result<IntGauge> {
    registered(registry, IntGauge::new(name, help)?)
}

/// A gauge per `label` and `ip_family`.
pub(super) fn gauge_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    label: &str,
) -> prometheus::Result<GaugeVec> {
    registered(
        registry,
        GaugeVec::new(Opts::new(name, help), &[label, "ip_family"])?,
    )
}

pub(super) fn counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntCounterVec> {
    registered(registry, IntCounterVec::new(Opts::new(name, help), labels)?)
}

/// `kubernetes_build_info`: the Kubernetes release this program stands in for, and ours.
pub(super) fn build_info(registry: &Registry) -> prometheus::Result<()> {
    let info = registered(
        registry,
        GaugeVec::new(
            Opts::new(
                "kubernetes_build_info",
                "A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running.",
            ),
            &[
                "major",
                "minor",
                "git_version",
                "git_commit",
                "git_tree_state",
                "build_date",
                "go_version",
                "compiler",
                "platform",
            ],
        )?,
    )?;
    let platform = format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH);
    let (major, minor) = crate::config::kubernetes_major_minor();
    info.with_label_values(&[
        major,
        minor,
        crate::config::KUBERNETES_VERSION,
        "",
        "",
        "",
        "",
        concat!("rustc (kube-proxy-rs ", env!("CARGO_PKG_VERSION"), ")"),
        &platform,
    ])
    .set(1.0);
    Ok(())
}

/// The stability level upstream's metrics framework prints at the head of a metric's help, as
/// 1.37 gives it: `kubernetes_build_info` and `kubernetes_feature_enabled` are beta, every
/// kube-proxy and API client metric alpha (ours, `kubeproxy_rs_`, too: they carry no
/// promise). The process and runtime collectors' metrics carry none, and so does a name not
/// listed here (the metrics test fails on it, so that its level is looked up, not guessed).
pub(super) fn stability_level(name: &str) -> Option<&'static str> {
    match name {
        "kubernetes_build_info" | "kubernetes_feature_enabled" => Some("BETA"),
        _ if name.starts_with("kubeproxy_") || name.starts_with("rest_client_") => Some("ALPHA"),
        _ => None,
    }
}

pub(super) fn unix_seconds(time: SystemTime) -> f64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
