//! upstream's metrics, by the same names, on a Prometheus registry of our own.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use self::register::*;
use super::http::ConnectionMetrics;
use super::localhost_node_ports::{self, ListenerMetrics};
use crate::k8s::Refusal;
use crate::model::IpFamily;
use crate::proxier::SyncReport;
use crate::proxier::profile::FailureCounter;

/// Every metric the daemon exports. Upstream runs one proxier per IP family and labels its sync
/// metrics `ip_family`; one sync of ours programs every family the node has, so a sync's
/// duration, timestamps and failures are recorded under each of them, and its rule counts per
/// family.
pub struct Metrics {
    registry: Registry,
    /// The families the last sync served (none before the Node is known).
    families: Mutex<Vec<IpFamily>>,
    /// When a change last arrived, for families not known yet at that time.
    last_queued_at: Mutex<Option<f64>>,
    sync_duration: HistogramVec,
    full_sync_duration: HistogramVec,
    partial_sync_duration: HistogramVec,
    last_sync: GaugeVec,
    last_queued: GaugeVec,
    network_programming: HistogramVec,
    endpoint_changes: IntCounter,
    endpoint_changes_pending: IntGauge,
    service_changes: IntCounter,
    service_changes_pending: IntGauge,
    iptables_rules: GaugeVec,
    restore_failures: IntCounterVec,
    nftables_sync_failures: IntCounterVec,
    nftables_cleanup_failures: IntCounterVec,
    no_local_endpoints: GaugeVec,
    conntrack_duration: HistogramVec,
    conntrack_deleted: IntCounterVec,
    invalid_input: IntCounterVec,
    watch_refused: IntGaugeVec,
    skipped_services: IntGauge,
    repaired_chains: IntCounter,
    partial_restore_failures: IntCounterVec,
    iptables_last: GaugeVec,
    healthz: IntCounterVec,
    livez: IntCounterVec,
    rest_requests: IntCounterVec,
    rest_duration: HistogramVec,
    tasks: IntGauge,
    connections: ConnectionMetrics,
    relayed: ConnectionMetrics,
    localhost_listeners: ListenerMetrics,
}

impl Metrics {
    /// Registers every metric (fails only on a programming error: a bad or repeated name).
    pub fn new() -> prometheus::Result<Metrics> {
        let r = Registry::new();
        Ok(Metrics {
            families: Mutex::new(Vec::new()),
            last_queued_at: Mutex::new(None),
            sync_duration: family_histogram(
                &r,
                "kubeproxy_sync_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds",
                sync_buckets(),
            )?,
            full_sync_duration: family_histogram(
                &r,
                "kubeproxy_sync_full_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds for full resyncs",
                sync_buckets(),
            )?,
            partial_sync_duration: family_histogram(
                &r,
                "kubeproxy_sync_partial_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds for partial resyncs",
                sync_buckets(),
            )?,
            last_sync: family_gauge(
                &r,
                "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
                "The last time proxy rules were successfully synced",
            )?,
            last_queued: family_gauge(
                &r,
                "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
                "The last time a sync of proxy rules was queued",
            )?,
            network_programming: family_histogram(
                &r,
                "kubeproxy_network_programming_duration_seconds",
                "In Cluster Network Programming Latency in seconds",
                programming_buckets(),
            )?,
            endpoint_changes: counter(
                &r,
                "kubeproxy_sync_proxy_rules_endpoint_changes_total",
                "Cumulative proxy rules Endpoint changes",
            )?,
            endpoint_changes_pending: int_gauge(
                &r,
                "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                "Pending proxy rules Endpoint changes",
            )?,
            service_changes: counter(
                &r,
                "kubeproxy_sync_proxy_rules_service_changes_total",
                "Cumulative proxy rules Service changes",
            )?,
            service_changes_pending: int_gauge(
                &r,
                "kubeproxy_sync_proxy_rules_service_changes_pending",
                "Pending proxy rules Service changes",
            )?,
            iptables_rules: gauge_vec(
                &r,
                "kubeproxy_sync_proxy_rules_iptables_total",
                "Total number of iptables rules owned by kube-proxy",
                "table",
            )?,
            restore_failures: family_counter(
                &r,
                "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
                "Cumulative proxy iptables restore failures",
            )?,
            nftables_sync_failures: family_counter(
                &r,
                "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
                "Cumulative proxy nftables sync failures",
            )?,
            nftables_cleanup_failures: family_counter(
                &r,
                "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
                "Cumulative proxy nftables cleanup failures",
            )?,
            no_local_endpoints: gauge_vec(
                &r,
                "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                "Number of services with a Local traffic policy and no endpoints",
                "traffic_policy",
            )?,
            conntrack_duration: registered(
                &r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "kubeproxy_conntrack_reconciler_sync_duration_seconds",
                        "ReconcileConntrackFlowsLatency latency in seconds",
                    )
                    .buckets(sync_buckets()),
                    &["ip_family"],
                )?,
            )?,
            conntrack_deleted: registered(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "kubeproxy_conntrack_reconciler_deleted_entries_total",
                        "Cumulative conntrack flows deleted by conntrack reconciler",
                    ),
                    &["ip_family"],
                )?,
            )?,
            invalid_input: registered(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "kubeproxy_rs_invalid_api_input_total",
                        "API objects skipped, and entries of objects ignored, because they were invalid (kube-proxy-rs)",
                    ),
                    &["kind", "outcome"],
                )?,
            )?,
            watch_refused: registered(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        "kubeproxy_rs_watch_refused",
                        "1 while the API server refuses to list or watch a kind with a status retrying soon will not change: not_found (not served) or forbidden (RBAC) (kube-proxy-rs)",
                    ),
                    &["kind", "reason"],
                )?,
            )?,
            skipped_services: int_gauge(
                &r,
                "kubeproxy_rs_sync_proxy_rules_skipped_services",
                "Services skipped because the kernel refused their rules (kube-proxy-rs)",
            )?,
            repaired_chains: counter(
                &r,
                "kubeproxy_rs_sync_proxy_rules_repaired_chains_total",
                "Chains of ours rewritten because another program changed them (kube-proxy-rs)",
            )?,
            partial_restore_failures: family_counter(
                &r,
                "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
                "Cumulative proxy iptables partial restore failures",
            )?,
            iptables_last: gauge_vec(
                &r,
                "kubeproxy_sync_proxy_rules_iptables_last",
                "Number of iptables rules written by kube-proxy in last sync",
                "table",
            )?,
            healthz: counter_vec(
                &r,
                "kubeproxy_proxy_healthz_total",
                "Cumulative proxy healthz HTTP status",
                &["code"],
            )?,
            livez: counter_vec(
                &r,
                "kubeproxy_proxy_livez_total",
                "Cumulative proxy livez HTTP status",
                &["code"],
            )?,
            rest_requests: counter_vec(
                &r,
                "rest_client_requests_total",
                "Number of HTTP requests, partitioned by status code, method, and host.",
                &["code", "method", "host"],
            )?,
            rest_duration: registered(
                &r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "rest_client_request_duration_seconds",
                        "Request latency in seconds. Broken down by verb, and host.",
                    )
                    .buckets(request_buckets()),
                    &["verb", "host"],
                )?,
            )?,
            tasks: int_gauge(
                &r,
                "go_goroutines",
                "Number of goroutines that currently exist (here: the async runtime's live tasks, the Rust counterpart)",
            )?,
            connections: connection_metrics(&r, ConnectionMetrics::new()?)?,
            relayed: connection_metrics(
                &r,
                ConnectionMetrics::named(&localhost_node_ports::CONNECTION_NAMES)?,
            )?,
            localhost_listeners: ListenerMetrics {
                listeners: registered(
                    &r,
                    IntGaugeVec::new(
                        Opts::new(
                            "kubeproxy_nftables_localhost_nodeport_listeners",
                            "Number of active localhost NodePort listeners",
                        ),
                        &["ip_family"],
                    )?,
                )?,
                creation_failures: family_counter(
                    &r,
                    "kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total",
                    "Number of localhost NodePort listeners that could not be created",
                )?,
            },
            registry: {
                r.register(Box::new(
                    prometheus::process_collector::ProcessCollector::for_self(),
                ))?;
                build_info(&r)?;
                r
            },
        })
    }

    /// Exports the kernel's nfacct counters (iptables mode), read at each scrape.
    pub fn count_nfacct(
        &self,
        reader: Box<dyn crate::sys::nfacct::Nfacct>,
    ) -> prometheus::Result<()> {
        self.registry
            .register(Box::new(super::nfacct::NfacctCollector::new(reader)?))
    }

    /// Exports nftables mode's named counters that `exported` names (rejected localhost
    /// NodePort packets, flow offload requests), read at each scrape.
    pub fn count_nft_counters(
        &self,
        exported: super::nft_counters::Exported,
    ) -> prometheus::Result<()> {
        let read: super::nft_counters::CounterReader =
            Box::new(crate::sys::nf_tables::read::counters);
        self.registry
            .register(Box::new(super::nft_counters::NftCountersCollector::new(
                read, exported,
            )?))
    }

    /// Records what the feature gates are, as `kubernetes_feature_enabled{name,stage}`.
    pub fn feature_gates(
        &self,
        set: &std::collections::BTreeMap<String, bool>,
    ) -> prometheus::Result<()> {
        let gauge = registered(
            &self.registry,
            GaugeVec::new(
                Opts::new(
                    "kubernetes_feature_enabled",
                    "This metric records the data about the stage and enablement of a k8s feature.",
                ),
                &["name", "stage"],
            )?,
        )?;
        for (name, stage, _, _) in crate::config::feature_gates::KNOWN {
            let on = crate::config::feature_gates::enabled(set, name);
            gauge
                .with_label_values(&[*name, stage.label()])
                .set(if on { 1.0 } else { 0.0 });
        }
        Ok(())
    }

    /// The HTTP servers' connection metrics, for their [`super::ConnectionTable`].
    pub fn connections(&self) -> ConnectionMetrics {
        self.connections.clone()
    }

    /// The localhost NodePort proxy's metrics: its connections', for their own
    /// [`super::ConnectionTable`], and its listeners'.
    pub fn localhost_node_ports(&self) -> (ConnectionMetrics, ListenerMetrics) {
        (self.relayed.clone(), self.localhost_listeners.clone())
    }

    /// The health server answered `path` with `code`.
    pub fn health_answered(&self, livez: bool, code: u16) {
        let vec = if livez { &self.livez } else { &self.healthz };
        vec.with_label_values(&[&code.to_string()]).inc();
    }

    /// The API client sent a request.
    pub fn api_request(&self, record: &crate::k8s::RequestRecord) {
        self.rest_requests
            .with_label_values(&[&record.code, &record.method, &record.host])
            .inc();
        self.rest_duration
            .with_label_values(&[&record.method, &record.host])
            .observe(record.duration.as_secs_f64());
    }

    /// An object of `kind` was skipped (`object_skipped`), or an entry of one ignored
    /// (`entry_ignored`), because it was invalid.
    pub fn invalid_input(&self, kind: &str, outcome: &str) {
        self.invalid_input.with_label_values(&[kind, outcome]).inc();
    }

    /// The API server started refusing `kind` for this reason, or (`None`) stopped.
    pub fn watch_refused(&self, kind: &str, refusal: Option<Refusal>) {
        for reason in Refusal::ALL {
            self.watch_refused
                .with_label_values(&[kind, reason.as_str()])
                .set(i64::from(refusal == Some(reason)));
        }
    }

    /// A change arrived from the API server.
    pub fn queued(&self) {
        let now = unix_seconds(SystemTime::now());
        *self
            .last_queued_at
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(now);
        for family in self.families() {
            self.last_queued
                .with_label_values(&[family.name()])
                .set(now);
        }
    }

    fn families(&self) -> Vec<IpFamily> {
        self.families
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Notes the families a sync served; a family seen for the first time gets its failure
    /// counters and histograms at 0 (shown before anything happens, as before the label) and
    /// the last change's time.
    fn serve(&self, families: &[IpFamily]) {
        let mut known = self.families.lock().unwrap_or_else(|p| p.into_inner());
        if known.as_slice() == families {
            return;
        }
        let queued_at = *self
            .last_queued_at
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for family in families {
            let label = [family.name()];
            for counter in [
                &self.restore_failures,
                &self.partial_restore_failures,
                &self.nftables_sync_failures,
                &self.nftables_cleanup_failures,
            ] {
                counter.with_label_values(&label);
            }
            for histogram in [
                &self.sync_duration,
                &self.full_sync_duration,
                &self.partial_sync_duration,
                &self.network_programming,
            ] {
                histogram.with_label_values(&label);
            }
            if let Some(at) = queued_at {
                self.last_queued.with_label_values(&label).set(at);
            }
        }
        *known = families.to_vec();
    }

    /// A sync is about to apply these many service and endpoint changes.
    pub fn pending(&self, services: usize, endpoints: usize) {
        self.service_changes_pending.set(services as i64);
        self.endpoint_changes_pending.set(endpoints as i64);
    }

    /// A sync of `families` that applied `changes` (service, endpoint) succeeded.
    pub fn synced(
        &self,
        families: &[IpFamily],
        report: &SyncReport,
        elapsed: Duration,
        changes: (usize, usize),
        trigger_times: &[SystemTime],
    ) {
        self.serve(families);
        let seconds = elapsed.as_secs_f64();
        let now = SystemTime::now();
        let synced_at = unix_seconds(now);
        for family in families {
            let label = [family.name()];
            self.sync_duration
                .with_label_values(&label)
                .observe(seconds);
            if report.full {
                self.full_sync_duration
                    .with_label_values(&label)
                    .observe(seconds);
            } else {
                self.partial_sync_duration
                    .with_label_values(&label)
                    .observe(seconds);
            }
            self.last_sync.with_label_values(&label).set(synced_at);
            for trigger in trigger_times {
                if let Ok(latency) = now.duration_since(*trigger) {
                    self.network_programming
                        .with_label_values(&label)
                        .observe(latency.as_secs_f64());
                }
            }
            let (internal, external) = report
                .no_local_endpoints
                .iter()
                .find(|(f, _)| f == family)
                .map(|(_, counts)| *counts)
                .unwrap_or_default();
            for (policy, count) in [("internal", internal), ("external", external)] {
                self.no_local_endpoints
                    .with_label_values(&[policy, label[0]])
                    .set(count as f64);
            }
        }
        self.service_changes.inc_by(changes.0 as u64);
        self.endpoint_changes.inc_by(changes.1 as u64);
        self.service_changes_pending.set(0);
        self.endpoint_changes_pending.set(0);
        for (family, table, rules) in &report.rules {
            self.iptables_rules
                .with_label_values(&[*table, family.name()])
                .set(*rules as f64);
        }
        for (family, table, rules) in &report.rules_written {
            self.iptables_last
                .with_label_values(&[*table, family.name()])
                .set(*rules as f64);
        }
        self.skipped_services.set(report.skipped_services as i64);
        self.repaired_chains.inc_by(report.repaired_chains as u64);
    }

    /// A UDP conntrack cleanup read the table and deleted `deleted` flows of one family.
    pub fn conntrack_reconciled(&self, family: IpFamily, elapsed: Duration, deleted: usize) {
        let label = family.name();
        self.conntrack_duration
            .with_label_values(&[label])
            .observe(elapsed.as_secs_f64());
        self.conntrack_deleted
            .with_label_values(&[label])
            .inc_by(deleted as u64);
    }

    /// A sync failed to program the kernel, counted as its mode counts it; `partial` when
    /// the failed sync was one of changes only.
    pub fn failed(&self, families: &[IpFamily], counter: FailureCounter, partial: bool) {
        self.serve(families);
        for family in families {
            let label = [family.name()];
            match counter {
                FailureCounter::NftablesSync => {
                    self.nftables_sync_failures.with_label_values(&label).inc()
                }
                FailureCounter::IptablesRestore { counts_partial } => {
                    self.restore_failures.with_label_values(&label).inc();
                    if partial && counts_partial {
                        self.partial_restore_failures
                            .with_label_values(&label)
                            .inc();
                    }
                }
            }
        }
    }

    /// Removing nftables mode's table of `family` failed.
    pub fn nftables_cleanup_failures(&self, family: IpFamily) {
        self.nftables_cleanup_failures
            .with_label_values(&[family.name()])
            .inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            self.tasks.set(runtime.metrics().num_alive_tasks() as i64);
        }
        let mut families = self.registry.gather();
        for family in &mut families {
            if let Some(level) = stability_level(family.name()) {
                let help = format!("[{level}] {}", family.help());
                family.set_help(help);
            }
        }
        let mut buffer = Vec::new();
        if TextEncoder::new().encode(&families, &mut buffer).is_err() {
            return String::new();
        }
        String::from_utf8(buffer).unwrap_or_default()
    }
}

mod register;

#[cfg(test)]
mod tests;
