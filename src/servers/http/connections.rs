//! The connections that every HTTP server of the daemon holds, bounded together. The bound comes
//! from the open-files limit, less a reserve that syncs, tools and netlink sockets keep whatever
//! a flood does. At the bound a new connection is still taken, and the connection that has gone
//! longest without a request answered is closed instead: a flood of idle or slow clients then
//! sheds its own oldest members, and a probe that sends its request at once is answered.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};
use tokio::sync::oneshot;

/// File descriptors never given to connections, at least: the process's own sockets, the
/// syncs' tools and netlink sockets, the API client's connections.
const RESERVED_AT_LEAST: u64 = 128;
/// Connections held at once whatever the open-files limit. An idle connection costs about 3 kB
/// of the daemon's memory before its first byte (benches/health_flood.rs), and hyper's 8 kB
/// read buffer more once it has sent one.
pub const MOST_CONNECTIONS: usize = 8192;

/// How many connections the servers hold together under an open-files limit of `limit`: what
/// is left after a quarter of the limit (at least [`RESERVED_AT_LEAST`]) is kept back, at most
/// [`MOST_CONNECTIONS`], at least one.
pub fn capacity_for_open_files(limit: u64) -> usize {
    let reserve = (limit / 4).max(RESERVED_AT_LEAST);
    let spare = usize::try_from(limit.saturating_sub(reserve)).unwrap_or(usize::MAX);
    spare.clamp(1, MOST_CONNECTIONS)
}

/// The connection metrics, by server (`healthz`, `metrics`, `healthcheck`) and port.
#[derive(Clone)]
pub struct ConnectionMetrics {
    pub open: IntGaugeVec,
    pub shed: IntCounterVec,
    pub timed_out: IntCounterVec,
    pub limit: IntGauge,
}

/// The names and help texts of one kind of connection's metrics: (name, help) each.
pub struct ConnectionNames {
    pub open: (&'static str, &'static str),
    pub shed: (&'static str, &'static str),
    pub timed_out: (&'static str, &'static str),
    pub limit: (&'static str, &'static str),
}

/// The HTTP servers' connection metrics.
const HTTP: ConnectionNames = ConnectionNames {
    open: (
        "kubeproxy_rs_http_connections_open",
        "HTTP connections a server of kube-proxy-rs holds open",
    ),
    shed: (
        "kubeproxy_rs_http_connections_shed_total",
        "HTTP connections closed to make room for a new one, the longest without an answered request first",
    ),
    timed_out: (
        "kubeproxy_rs_http_connections_timed_out_total",
        "HTTP connections closed because the client was idle or slow to send its request, or at the end of a connection's lifetime",
    ),
    limit: (
        "kubeproxy_rs_http_connections_limit",
        "HTTP connections the servers of kube-proxy-rs hold at most, together",
    ),
};

impl ConnectionMetrics {
    /// The HTTP servers' metrics, not yet registered anywhere.
    pub fn new() -> prometheus::Result<ConnectionMetrics> {
        ConnectionMetrics::named(&HTTP)
    }

    /// Metrics under `names`, not yet registered anywhere.
    pub fn named(names: &ConnectionNames) -> prometheus::Result<ConnectionMetrics> {
        let labels = ["server", "port"];
        let vec = |(name, help): (&str, &str)| Opts::new(name, help);
        Ok(ConnectionMetrics {
            open: IntGaugeVec::new(vec(names.open), &labels)?,
            shed: IntCounterVec::new(vec(names.shed), &labels)?,
            timed_out: IntCounterVec::new(vec(names.timed_out), &labels)?,
            limit: IntGauge::new(names.limit.0, names.limit.1)?,
        })
    }
}

/// One server's counters.
#[derive(Clone)]
pub struct ServerCounters {
    pub open: IntGauge,
    pub shed: IntCounter,
    pub timed_out: IntCounter,
}

/// Shared by every server of the process.
#[derive(Clone)]
pub struct ConnectionTable {
    shared: Arc<Shared>,
}

struct Shared {
    capacity: usize,
    metrics: ConnectionMetrics,
    open: Mutex<Open>,
}

/// Open connections by when they were accepted or last answered a request, oldest first. The
/// keys only grow, so a key names one connection at one time.
#[derive(Default)]
struct Open {
    next_key: u64,
    by_activity: BTreeMap<u64, oneshot::Sender<()>>,
}

impl Open {
    fn insert(&mut self, shed: oneshot::Sender<()>) -> u64 {
        let key = self.next_key;
        self.next_key += 1;
        self.by_activity.insert(key, shed);
        key
    }

    /// Closes the connection with the oldest activity; false when none is open.
    fn shed_oldest(&mut self) -> bool {
        match self.by_activity.pop_first() {
            // A connection that ended meanwhile has dropped its receiver: nothing to close.
            Some((_, shed)) => {
                let _ = shed.send(());
                true
            }
            None => false,
        }
    }
}

impl ConnectionTable {
    /// A table holding at most `capacity` connections.
    pub fn new(capacity: usize, metrics: ConnectionMetrics) -> ConnectionTable {
        let capacity = capacity.max(1);
        metrics
            .limit
            .set(i64::try_from(capacity).unwrap_or(i64::MAX));
        ConnectionTable {
            shared: Arc::new(Shared {
                capacity,
                metrics,
                open: Mutex::new(Open::default()),
            }),
        }
    }

    pub fn capacity(&self) -> usize {
        self.shared.capacity
    }

    fn lock(&self) -> MutexGuard<'_, Open> {
        self.shared.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The counters of `server` on `port`.
    pub fn counters(&self, server: &str, port: u16) -> ServerCounters {
        let port = port.to_string();
        let labels = [server, port.as_str()];
        let metrics = &self.shared.metrics;
        ServerCounters {
            open: metrics.open.with_label_values(&labels),
            shed: metrics.shed.with_label_values(&labels),
            timed_out: metrics.timed_out.with_label_values(&labels),
        }
    }

    /// Drops the counters of a server that closed for good.
    pub fn forget(&self, server: &str, port: u16) {
        let port = port.to_string();
        let labels = [server, port.as_str()];
        let metrics = &self.shared.metrics;
        let _ = metrics.open.remove_label_values(&labels);
        let _ = metrics.shed.remove_label_values(&labels);
        let _ = metrics.timed_out.remove_label_values(&labels);
    }

    /// Takes a new connection, closing the oldest first when the table is full. The receiver
    /// fires when this connection is shed in turn.
    pub fn admit(&self, counters: &ServerCounters) -> (Admitted, oneshot::Receiver<()>) {
        let (shed, shed_when) = oneshot::channel();
        let mut open = self.lock();
        while open.by_activity.len() >= self.shared.capacity && open.shed_oldest() {}
        let key = open.insert(shed);
        drop(open);
        counters.open.inc();
        let admitted = Admitted {
            table: self.clone(),
            key: AtomicU64::new(key),
            counters: counters.clone(),
        };
        (admitted, shed_when)
    }

    /// Closes the connection with the oldest activity (the process ran out of file
    /// descriptors); false when none is open.
    pub fn shed_oldest(&self) -> bool {
        self.lock().shed_oldest()
    }

    /// Connections open now, in every server.
    pub fn open(&self) -> usize {
        self.lock().by_activity.len()
    }
}

/// A connection in the table; leaves it when dropped.
pub struct Admitted {
    table: ConnectionTable,
    key: AtomicU64,
    counters: ServerCounters,
}

impl Admitted {
    /// The connection is answering a request: it becomes the newest, the last to be shed.
    pub fn answering(&self) {
        let mut open = self.table.lock();
        let key = self.key.load(Ordering::Relaxed);
        // Already shed: it closes once this answer's task sees the signal.
        if let Some(shed) = open.by_activity.remove(&key) {
            let key = open.insert(shed);
            self.key.store(key, Ordering::Relaxed);
        }
    }

    pub fn counters(&self) -> &ServerCounters {
        &self.counters
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let key = self.key.load(Ordering::Relaxed);
        self.table.lock().by_activity.remove(&key);
        self.counters.open.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(capacity: usize) -> (ConnectionTable, ServerCounters) {
        let table = ConnectionTable::new(capacity, ConnectionMetrics::new().unwrap());
        let counters = table.counters("healthz", 10256);
        (table, counters)
    }

    #[test]
    fn the_limit_keeps_a_reserve_of_file_descriptors() {
        assert_eq!(capacity_for_open_files(256), 128);
        assert_eq!(capacity_for_open_files(1024), 768);
        assert_eq!(capacity_for_open_files(4096), 3072);
        assert_eq!(capacity_for_open_files(1 << 20), MOST_CONNECTIONS);
        assert_eq!(capacity_for_open_files(100), 1, "a tiny limit still serves");
        assert_eq!(capacity_for_open_files(0), 1);
    }

    #[test]
    fn a_full_table_sheds_the_connection_longest_without_an_answer() {
        let (table, counters) = table(3);
        let (first, mut first_shed) = table.admit(&counters);
        let (second, mut second_shed) = table.admit(&counters);
        let (_third, mut third_shed) = table.admit(&counters);
        // The first answers a request: the second is now the oldest.
        first.answering();
        let (_fourth, _) = table.admit(&counters);
        assert!(second_shed.try_recv().is_ok(), "the oldest is shed");
        assert!(first_shed.try_recv().is_err());
        assert!(third_shed.try_recv().is_err());
        assert_eq!(table.open(), 3);
        assert_eq!(counters.open.get(), 4, "until the shed one's task ends");
        drop(second);
        assert_eq!(counters.open.get(), 3);
        drop(first);
        assert_eq!(table.open(), 2);
    }

    #[test]
    fn a_shed_connection_answering_does_not_come_back() {
        let (table, counters) = table(1);
        let (first, _shed) = table.admit(&counters);
        let (_second, _) = table.admit(&counters);
        first.answering();
        assert_eq!(table.open(), 1);
        drop(first);
        assert_eq!(table.open(), 1, "the second is still there");
    }

    #[test]
    fn forgotten_counters_leave_the_metrics() {
        let metrics = ConnectionMetrics::new().unwrap();
        let table = ConnectionTable::new(2, metrics.clone());
        let counters = table.counters("healthcheck", 30000);
        counters.shed.inc();
        assert_eq!(
            metrics
                .shed
                .with_label_values(&["healthcheck", "30000"])
                .get(),
            1
        );
        table.forget("healthcheck", 30000);
        assert_eq!(
            metrics
                .shed
                .with_label_values(&["healthcheck", "30000"])
                .get(),
            0
        );
        assert_eq!(metrics.limit.get(), 2);
    }
}
