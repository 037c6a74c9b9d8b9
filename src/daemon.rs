//! Wiring: the client, the watches, the change tracker, the runner and the proxier.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::config::{
    KUBERNETES_VERSION, KubeProxyConfiguration, ProxyMode, Settings, feature_gates,
};
use crate::k8s::{self, ClientError, NodeEvent, Synced, WatchSink};
use crate::model::{ChangeTracker, ProxyState};
use crate::node_setup;
use crate::proxier::Proxier;
use crate::proxier::cleanup::{self, Leftovers};
use crate::proxier::dry_run::DryRunProxier;
use crate::proxier::local::{
    LOCALHOST_NODE_PORTS_GATE, NodePortSelection, localhost_proxy_families,
};
use crate::proxier::modes::{self, SetupError};
use crate::proxier::profile::{KernelCounters, Profile, profile};
use crate::runner::{self, Intervals, SyncRequester};
use crate::servers::debug::DebugView;
use crate::servers::nft_counters::Exported;
use crate::servers::{
    ConnectionTable, LocalhostNodePorts, Metrics, MetricsPages, ProxyHealth, Relays, ServerError,
    ServiceHealthServers, bind, capacity_for_open_files, log_families, relay_capacity,
    serve_health, serve_metrics,
};
use crate::sync_failures::FailureLog;
use crate::sys::host::net::{LocalAddresses, ProcSysctl, SystemAddresses};
use crate::sys::nfacct::NetlinkNfacct;

/// Why the daemon stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// No API client could be built.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The configured mode cannot run on this node.
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// The health or metrics server could not listen and bindAddressHardFail is set.
    #[error("{0}")]
    Server(#[from] ServerError),
    /// The configuration file changed: exiting so the pod restarts with it, as upstream does.
    #[error("content of the proxy server's configuration file {0} was updated")]
    ConfigChanged(String),
    /// The metrics could not be registered (a programming error).
    #[error("metrics: {0}")]
    Metrics(String),
}

/// How the daemon runs besides its configuration.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOptions {
    /// Program nothing; log the service ports and endpoints each sync would program.
    pub dry_run: bool,
    /// When IPVS mode cannot run, use iptables (as older kube-proxy did) instead of exiting.
    pub ipvs_fallback: bool,
    /// Exit when the configuration file changes (so the DaemonSet restarts us with it).
    pub exit_on_config_change: bool,
    /// nftables mode offloads connections to ClusterIPs past this many packets (0: off).
    pub offload_packet_threshold: u32,
}

/// `--version`'s line: upstream's form, so that scripts reading the second word get a
/// Kubernetes version, and ours after it.
pub fn version_line() -> String {
    format!(
        "Kubernetes {KUBERNETES_VERSION} (kube-proxy-rs {})",
        env!("CARGO_PKG_VERSION")
    )
}

/// `--version=raw`'s line, in the shape of upstream's `version.Info`.
pub fn version_raw() -> String {
    let (major, minor) = crate::config::kubernetes_major_minor();
    format!(
        "version.Info{{Major:\"{major}\", Minor:\"{minor}\", GitVersion:\"{KUBERNETES_VERSION}\", Program:\"kube-proxy-rs\", ProgramVersion:\"{}\", Platform:\"{}/{}\"}}",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

/// `--init-only`: what upstream does with full privileges before it could run with
/// CAP_NET_ADMIN alone (the conntrack table and timeouts, the mode's sysctls), then nothing
/// more. No rule is programmed and no API server is needed.
pub fn init_only(settings: &Settings) {
    let config = &settings.config;
    node_setup::apply_conntrack(config, &mut ProcSysctl::default());
    let mut sysctl = ProcSysctl::default();
    let mode = config.proxy_mode().unwrap_or(ProxyMode::Iptables);
    for (name, value) in modes::init_sysctls(mode, config) {
        if let Err(err) = crate::sys::host::net::ensure_sysctl(&mut sysctl, name, value) {
            warn!(error = %err, sysctl = name, "Failed to set sysctl");
        }
    }
    info!("System initialized and --init-only specified");
}

/// Runs until `shutdown` turns true. Rules stay in place when it returns.
pub async fn run(
    settings: Settings,
    options: RunOptions,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), DaemonError> {
    let config = &settings.config;
    log_start(&settings);
    let open_files = node_setup::raise_open_files_limit();
    let mode = config.proxy_mode().unwrap_or(ProxyMode::Iptables);
    if config.mode.is_empty() {
        info!("Using iptables proxy");
        // Upstream 1.37 warns of the coming default (KEP-5343); its words were not published.
        warn!(
            "The proxy mode was not set: using iptables. The default becomes nftables in Kubernetes 1.40; set mode (or --proxy-mode) to keep iptables"
        );
    }
    let requester = SyncRequester::default();
    let (mode, proxier) = proxier_for(mode, config, options, &requester)?;
    // The mode that runs (iptables, after IPVS fell back) has its own periods.
    let profile = profile(mode);
    let (min_sync, sync_period) = profile.sync_periods(config);
    info!(
        mode = mode.as_str(),
        min_sync_period = ?min_sync,
        sync_period = ?sync_period,
        "Syncing proxy rules at most once per minSyncPeriod, at least once per syncPeriod"
    );
    let health = Arc::new(ProxyHealth::new(sync_period));
    let metrics = metrics_for(config, options, profile)?;
    // A dry run opens no ports for services either.
    let proxy_families = if options.dry_run {
        Vec::new()
    } else {
        localhost_proxy_families(config)
    };
    let connections = connection_table(open_files, &metrics, !proxy_families.is_empty());
    let tracker = Arc::new(Mutex::new(change_tracker(config)));
    let state = Arc::new(RwLock::new(ProxyState::default()));
    let relays = Relays::new(proxy_families);
    let debug = Arc::new(DebugView::new(
        state.clone(),
        tracker.clone(),
        settings.node_name.clone(),
        relays.clone(),
    ));
    let servers = Servers {
        connections: &connections,
        health: &health,
        metrics: &metrics,
        debug,
    };
    let failed_servers = start_servers(config, servers, proxier.mode()).await?;

    let client = k8s::build_client(
        settings.kubeconfig.as_deref(),
        settings.master.as_deref(),
        Some(request_observer(&metrics)),
    )
    .await?;
    // A dry run writes nothing, to the API server either.
    let events = (!options.dry_run).then(|| {
        let hostname = gethostname::gethostname().to_string_lossy().into_owned();
        k8s::NodeEvents::new(client.clone(), &settings.node_name, &hostname)
    });
    if profile.deprecated {
        error!("{}", k8s::IPVS_DEPRECATION);
        if let Some(events) = &events {
            events.post(NodeEvent::IpvsDeprecation);
        }
    }
    if let Some(events) = &events {
        failed_servers
            .into_iter()
            .for_each(|event| events.post(event));
    }
    let (synced_tx, mut synced_rx) = watch::channel(Synced::default());
    let sink = WatchSink {
        tracker: tracker.clone(),
        on_change: {
            let (requester, health, metrics) = (requester.clone(), health.clone(), metrics.clone());
            Arc::new(move || {
                health.queued();
                metrics.queued();
                requester.request();
            })
        },
        on_invalid: {
            let metrics = metrics.clone();
            Arc::new(move |kind: &'static str, what: k8s::InvalidInput| {
                metrics.invalid_input(kind, what.as_str())
            })
        },
        on_refused: {
            let metrics = metrics.clone();
            Arc::new(move |kind: &'static str, refusal: Option<k8s::Refusal>| {
                metrics.watch_refused(kind, refusal)
            })
        },
        synced: synced_tx,
    };
    let _watches = k8s::spawn_watches(client, &settings.node_name, profile.service_cidrs, sink);

    info!("Waiting for caches to sync");
    tokio::select! {
        result = synced_rx.wait_for(Synced::all) => {
            if result.is_err() {
                return Ok(());
            }
        }
        _ = shutdown.wait_for(|stop| *stop) => return Ok(()),
    }
    info!("Caches are synced");
    if let Some(events) = &events {
        events.post(NodeEvent::Starting);
    }

    let localhost_node_ports = localhost_node_ports(relays, open_files, &metrics);
    let sync_loop = SyncLoop {
        tracker,
        state,
        proxier,
        health,
        metrics,
        // A dry run opens no ports for services either.
        service_health: (!options.dry_run)
            .then(|| ServiceHealthServers::new(Vec::new(), connections.clone())),
        localhost_node_ports,
        conntrack: (!options.dry_run).then(open_conntrack).flatten(),
        node_port_addresses: NodePortSelection::new(&config.node_port_addresses),
        node_name: settings.node_name.clone(),
        // A dry run leaves the node alone, the other mode's state included.
        leftovers_removed: options.dry_run,
        failures: FailureLog::default(),
    };
    let intervals = sync_intervals(min_sync, sync_period);
    run_syncs(
        sync_loop, intervals, requester, shutdown, &settings, options,
    )
    .await
}

/// The start's first lines: the version, and what of the configuration was ignored.
fn log_start(settings: &Settings) {
    info!(version = env!("CARGO_PKG_VERSION"), node = %settings.node_name, "Starting kube-proxy-rs");
    if !settings.unknown_fields.is_empty() {
        warn!(
            fields = %settings.unknown_fields.join(","),
            "Using lenient decoding as strict decoding failed: unknown fields in the configuration file were ignored"
        );
    }
    if !settings.ignored_flags.is_empty() {
        warn!(flags = %settings.ignored_flags.join(","), "Flags ignored because --config was given");
    }
}

/// The proxier of `mode` (of the mode it fell back to), or a dry run's; then, as upstream
/// before the first sync, the process's OOM priority and the conntrack settings.
fn proxier_for(
    mode: ProxyMode,
    config: &KubeProxyConfiguration,
    options: RunOptions,
    requester: &SyncRequester,
) -> Result<(ProxyMode, Box<dyn Proxier>), DaemonError> {
    if options.dry_run {
        info!(
            mode = mode.as_str(),
            "Dry run: nothing is programmed; logging what each sync would program"
        );
        return Ok((mode, Box::new(DryRunProxier::new(mode))));
    }
    let wake = requester.clone();
    let chosen = modes::setup(
        mode,
        config,
        modes::SetupOptions {
            ipvs_fallback: options.ipvs_fallback,
            offload_packet_threshold: options.offload_packet_threshold,
        },
        Arc::new(move || wake.request()),
    )?;
    if let Some(value) = config.oom_score_adj {
        node_setup::apply_oom_score_adj(value);
    }
    node_setup::apply_conntrack(config, &mut ProcSysctl::default());
    Ok(chosen)
}

/// The metrics, with the feature gates and the kernel's counters: nfacct's in iptables mode,
/// the rejected localhost NodePort packets in nftables mode.
fn metrics_for(
    config: &KubeProxyConfiguration,
    options: RunOptions,
    profile: &Profile,
) -> Result<Arc<Metrics>, DaemonError> {
    let metrics = Arc::new(Metrics::new().map_err(|e| DaemonError::Metrics(e.to_string()))?);
    if let Err(err) = metrics.feature_gates(&config.feature_gates) {
        warn!(error = %err, "Cannot export the feature gates");
    }
    if options.dry_run {
        return Ok(metrics);
    }
    match profile.counters {
        KernelCounters::Absent => {}
        KernelCounters::Nfacct => {
            let exported = NetlinkNfacct::open()
                .map_err(|err| err.to_string())
                .and_then(|reader| {
                    metrics
                        .count_nfacct(Box::new(reader))
                        .map_err(|err| err.to_string())
                });
            if let Err(err) = exported {
                warn!(error = %err, "Cannot export the nfacct counters");
            }
        }
        KernelCounters::LocalhostRejects => {
            let exported = Exported {
                localhost_rejects: feature_gates::enabled(
                    &config.feature_gates,
                    LOCALHOST_NODE_PORTS_GATE,
                ),
                offload_requests: options.offload_packet_threshold > 0,
            };
            if exported != Exported::default()
                && let Err(err) = metrics.count_nft_counters(exported)
            {
                warn!(error = %err, "Cannot export the nftables counters");
            }
        }
    }
    Ok(metrics)
}

/// What the health and metrics servers serve from.
struct Servers<'a> {
    connections: &'a ConnectionTable,
    health: &'a Arc<ProxyHealth>,
    metrics: &'a Arc<Metrics>,
    debug: Arc<DebugView>,
}

/// The health and metrics servers, on their configured addresses; what failed to listen, as the
/// Events upstream posts about it.
async fn start_servers(
    config: &KubeProxyConfiguration,
    servers: Servers<'_>,
    mode: ProxyMode,
) -> Result<Vec<NodeEvent>, DaemonError> {
    let Servers {
        connections,
        health,
        metrics,
        debug,
    } = servers;
    let hard_fail = config.bind_address_hard_fail;
    let mut failed = Vec::new();
    let serve = {
        let (connections, health, metrics) = (connections.clone(), health.clone(), metrics.clone());
        move |listener| serve_health(listener, &connections, health, metrics)
    };
    if let Some(error) =
        start_server("health", &config.healthz_bind_address, hard_fail, serve).await?
    {
        failed.push(NodeEvent::HealthServerFailed(error));
    }
    let configz = crate::config::configz_json(&in_force(config, mode)).unwrap_or_else(|error| {
        warn!(%error, "Cannot write the configuration for /configz");
        "{}".into()
    });
    let pages = MetricsPages {
        mode: mode.as_str(),
        configz,
        debug: Some(debug),
    };
    let serve = {
        let (connections, health, metrics) = (connections.clone(), health.clone(), metrics.clone());
        move |listener| serve_metrics(listener, &connections, metrics, health, pages)
    };
    if let Some(error) =
        start_server("metrics", &config.metrics_bind_address, hard_fail, serve).await?
    {
        failed.push(NodeEvent::MetricsServerFailed(error));
    }
    Ok(failed)
}

/// The configuration in force once `mode` runs: its mode is the one that runs, which upstream's
/// defaulting also writes for an empty mode (iptables), and which after the IPVS fallback is
/// iptables, as `/proxyMode` says.
fn in_force(
    config: &KubeProxyConfiguration,
    mode: ProxyMode,
) -> std::borrow::Cow<'_, KubeProxyConfiguration> {
    if config.mode == mode.as_str() {
        return std::borrow::Cow::Borrowed(config);
    }
    let mut running = config.clone();
    running.mode = mode.as_str().to_string();
    std::borrow::Cow::Owned(running)
}

/// Counts the API client's requests in the metrics.
fn request_observer(metrics: &Arc<Metrics>) -> k8s::RequestObserver {
    let metrics = metrics.clone();
    Arc::new(move |record: &k8s::RequestRecord| metrics.api_request(record))
}

/// Syncs on a thread of their own (they block on iptables-restore and netlink) until
/// `shutdown`, or until the config file changes when the daemon is to exit then.
async fn run_syncs(
    mut sync_loop: SyncLoop,
    intervals: Intervals,
    requester: SyncRequester,
    shutdown: watch::Receiver<bool>,
    settings: &Settings,
    options: RunOptions,
) -> Result<(), DaemonError> {
    let runtime = tokio::runtime::Handle::current();
    let sync_thread = tokio::task::spawn_blocking(move || {
        runtime.block_on(runner::run(intervals, requester, shutdown, &mut sync_loop));
    });
    let config_changed = async {
        match (&settings.config_file, options.exit_on_config_change) {
            (Some(path), true) => config_file_changed(path, CONFIG_POLL).await,
            _ => std::future::pending().await,
        }
    };
    tokio::select! {
        joined = sync_thread => {
            if let Err(err) = joined {
                error!(error = %err, "The sync loop stopped unexpectedly");
            }
        }
        path = config_changed => {
            info!(path = %path, "Config file changed, exiting so that it is read again; the programmed rules stay in place");
            return Err(DaemonError::ConfigChanged(path));
        }
    }
    info!("Shutting down; the programmed rules stay in place");
    Ok(())
}

/// How often the --config file is read to see whether it changed.
const CONFIG_POLL: Duration = Duration::from_secs(2);

/// Resolves when the file's content differs from what it was at start (polled every two seconds:
/// a ConfigMap update swaps a symlink, which a poll sees as surely as an inotify watch would).
/// A read that fails (out of file descriptors, the symlink swap caught half way) is no change:
/// it is logged once and the next poll reads again.
async fn config_file_changed(path: &std::path::Path, every: Duration) -> String {
    let mut initial = tokio::fs::read(path).await.ok();
    let mut failing = false;
    loop {
        tokio::time::sleep(every).await;
        match tokio::fs::read(path).await {
            Ok(now) => {
                failing = false;
                match &initial {
                    Some(content) if *content != now => return path.display().to_string(),
                    Some(_) => {}
                    None => initial = Some(now),
                }
            }
            Err(err) => {
                if !std::mem::replace(&mut failing, true) {
                    warn!(path = %path.display(), error = %err, "Cannot read the config file to check it for changes; trying again");
                }
            }
        }
    }
}

/// `--cleanup`: removes every chain, rule, ipset, virtual server and kube-ipvs0 of either mode, in
/// both families and back ends. Nothing else is touched; a second run finds nothing to do.
pub fn cleanup() {
    info!("Cleaning up iptables, IPVS and nftables state owned by kube-proxy");
    cleanup::cleanup(Leftovers::All, &SystemAddresses.addresses());
    info!("Cleanup done");
}

/// Open-files limit assumed when it cannot be read: the common default soft limit.
const ASSUMED_OPEN_FILES: u64 = 1024;

/// The bound on the HTTP servers' connections, together, under the open-files limit: the
/// files it leaves for connections, or half of them when the localhost NodePort proxy
/// (`relays`) takes the other half.
fn connection_table(open_files: Option<u64>, metrics: &Metrics, relays: bool) -> ConnectionTable {
    let limit = open_files.unwrap_or(ASSUMED_OPEN_FILES);
    let spare = capacity_for_open_files(limit);
    let capacity = if relays { spare / 2 } else { spare };
    let table = ConnectionTable::new(capacity, metrics.connections());
    info!(
        connections = table.capacity(),
        open_files = limit,
        "Limiting the HTTP servers' connections; the oldest idle ones are closed beyond that"
    );
    table
}

/// The tracker of the watches' changes; with AllowServiceExternalIPs off (upstream's answer to
/// CVE-2020-8554), it drops every Service's externalIPs, so that no mode programs them.
fn change_tracker(config: &KubeProxyConfiguration) -> ChangeTracker {
    let external_ips = feature_gates::enabled(
        &config.feature_gates,
        feature_gates::ALLOW_SERVICE_EXTERNAL_IPS,
    );
    if !external_ips {
        info!(
            "Services' externalIPs are not programmed: the AllowServiceExternalIPs feature gate is off"
        );
    }
    ChangeTracker::new(external_ips)
}

/// The localhost NodePort proxy, when it serves a family. Its connections count apart from the
/// HTTP servers', in the other half of the files left for connections.
fn localhost_node_ports(
    relays: Relays,
    open_files: Option<u64>,
    metrics: &Metrics,
) -> Option<LocalhostNodePorts> {
    let families = relays.families();
    if families.is_empty() {
        return None;
    }
    log_families(&families);
    let (connection_metrics, listener_metrics) = metrics.localhost_node_ports();
    let limit = open_files.unwrap_or(ASSUMED_OPEN_FILES);
    let capacity = relay_capacity(capacity_for_open_files(limit));
    let table = ConnectionTable::new(capacity, connection_metrics);
    Some(LocalhostNodePorts::new(table, listener_metrics, relays))
}

/// How often a server that could not listen tries again (upstream's too).
const LISTEN_RETRY: Duration = Duration::from_secs(5);

/// Binds a server's address and starts it with `serve`. A failure stops the daemon only with
/// bindAddressHardFail, as upstream; otherwise the server tries again every [`LISTEN_RETRY`]
/// in the background (a port still held by the kube-proxy this one replaces frees up soon),
/// and the error is returned.
async fn start_server(
    what: &'static str,
    address: &str,
    hard_fail: bool,
    serve: impl FnOnce(tokio::net::TcpListener) + Send + 'static,
) -> Result<Option<String>, DaemonError> {
    if address.is_empty() {
        info!("The {what} server is turned off");
        return Ok(None);
    }
    let err = match bind(address).await {
        Ok(listener) => {
            started(what, address, &listener);
            serve(listener);
            return Ok(None);
        }
        Err(err) if hard_fail => return Err(err.into()),
        Err(err) => err,
    };
    error!(error = %err, "Failed to start {what} server; retrying every {}s", LISTEN_RETRY.as_secs());
    let address = address.to_string();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(LISTEN_RETRY).await;
            if let Ok(listener) = bind(&address).await {
                started(what, &address, &listener);
                serve(listener);
                return;
            }
        }
    });
    Ok(Some(err.to_string()))
}

fn started(what: &str, address: &str, listener: &tokio::net::TcpListener) {
    let bound = listener
        .local_addr()
        .map_or_else(|_| address.to_string(), |a| a.to_string());
    info!(address = %bound, "Starting {what} server");
}

/// The runner's schedule for a mode's (minSyncPeriod, syncPeriod). A failed sync is retried after
/// a second (at least minSyncPeriod), doubling up to syncPeriod; upstream waits a whole syncPeriod.
fn sync_intervals(min_sync: Duration, sync: Duration) -> Intervals {
    Intervals {
        min_interval: min_sync,
        max_interval: sync,
        retry_interval: min_sync.max(Duration::from_secs(1)).min(sync),
    }
}

mod sync_loop;

use sync_loop::{SyncLoop, open_conntrack};

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_config_file_that_cannot_be_read_has_not_changed() {
        let every = Duration::from_millis(10);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.conf");
        std::fs::write(&path, "mode: iptables\n").unwrap();
        let watching = tokio::spawn({
            let path = path.clone();
            async move { config_file_changed(&path, every).await }
        });
        // Unreadable for twenty polls (a directory in its place), then back unchanged.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        tokio::time::sleep(every * 20).await;
        assert!(!watching.is_finished(), "a failed read is not a change");
        std::fs::remove_dir(&path).unwrap();
        std::fs::write(&path, "mode: iptables\n").unwrap();
        tokio::time::sleep(every * 20).await;
        assert!(!watching.is_finished(), "the same content is not a change");
        std::fs::write(&path, "mode: ipvs\n").unwrap();
        let changed = tokio::time::timeout(Duration::from_secs(30), watching).await;
        assert!(changed.is_ok_and(|r| r.is_ok()), "new content is");
    }
}
