//! One localhost NodePort's listener and the connections it relays. A connection is taken only
//! from a loopback address (with route_localnet on, a packet from off the node can carry
//! 127.0.0.1 as its destination: such a peer is never relayed), and goes only to an endpoint of
//! the port. Connections count in their own table, bounded under the open-files limit: when it
//! is full the connection longest without traffic is closed, so a flood of idle clients sheds
//! its own oldest members. Until its first byte either way, a connection holds no copy buffer;
//! after it, two of [`BUFFER`].

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;
use tracing::{debug, trace};

use super::balancer::{Balancer, locked};
use crate::servers::http::{Admitted, ConnectionTable, ServerCounters, accept_failed};

/// How long a connection to an endpoint may take (upstream's too).
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);
/// Each way's copy buffer: 32 kB relays 0.60x the kernel path's throughput where tokio's
/// default 8 kB relays 0.38x, and 64 kB 0.65x (docs/benchmarks.md).
pub const BUFFER: usize = 32 * 1024;
/// Traffic renews a connection's place in the table at most this often.
const ACTIVITY_GRAIN: Duration = Duration::from_secs(1);

/// The connections' name in the table's metrics.
pub const SERVER: &str = "localhost-nodeport";

/// Relays the connections `listener` accepts until `stop` says so; then the listener closes,
/// and the connections it took run on until either side ends them or the table sheds them.
pub fn serve(
    listener: TcpListener,
    balancer: Arc<Mutex<Balancer>>,
    table: ConnectionTable,
    mut stop: watch::Receiver<bool>,
) {
    let port = listener.local_addr().map_or(0, |a| a.port());
    tokio::spawn(async move {
        // A port's metrics appear with its first connection: most NodePorts never see one.
        let mut counters: Option<ServerCounters> = None;
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = stop.wait_for(|stop| *stop) => return,
            };
            match accepted {
                Ok((client, peer)) if peer.ip().is_loopback() => {
                    let endpoint = locked(&balancer).pick(peer.ip(), std::time::Instant::now());
                    let Some(endpoint) = endpoint else { continue };
                    let counters = counters.get_or_insert_with(|| table.counters(SERVER, port));
                    let (admitted, shed) = table.admit(counters);
                    tokio::spawn(Relay { admitted, shed }.run(client, endpoint));
                }
                Ok((_, peer)) => {
                    trace!(%peer, "Refused a localhost NodePort connection from off the node")
                }
                Err(err) => {
                    trace!(error = %err, "Failed to accept a localhost NodePort connection");
                    tokio::select! {
                        () = accept_failed(&table, &err) => {}
                        _ = stop.wait_for(|stop| *stop) => return,
                    }
                }
            }
        }
    });
}

/// One accepted connection, and the signal that sheds it.
struct Relay {
    admitted: Admitted,
    shed: oneshot::Receiver<()>,
}

impl Relay {
    async fn run(mut self, client: TcpStream, endpoint: SocketAddr) {
        let counters = self.admitted.counters().clone();
        let relayed = relay(client, endpoint, &self.admitted);
        tokio::select! {
            () = relayed => {}
            shed = &mut self.shed => if shed.is_ok() { counters.shed.inc() },
        }
    }
}

/// Connects to `endpoint` and copies both ways until both sides are done; each side's end of
/// input is passed on as a half close.
async fn relay(client: TcpStream, endpoint: SocketAddr, admitted: &Admitted) {
    let backend = match tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(endpoint)).await {
        Ok(Ok(backend)) => backend,
        Ok(Err(err)) => {
            debug!(%endpoint, error = %err, "Failed to connect to backend");
            return;
        }
        Err(_) => {
            debug!(%endpoint, "Failed to connect to backend: timed out");
            admitted.counters().timed_out.inc();
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = backend.set_nodelay(true);
    // The copy's buffers only once either side has something to say.
    tokio::select! {
        ready = client.readable() => if ready.is_err() { return },
        ready = backend.readable() => if ready.is_err() { return },
    }
    let mut client = Active {
        stream: client,
        admitted,
        marked: Instant::now(),
    };
    let mut backend = backend;
    let copied =
        tokio::io::copy_bidirectional_with_sizes(&mut client, &mut backend, BUFFER, BUFFER).await;
    if let Err(err) = copied {
        trace!(%endpoint, error = %err, "Localhost NodePort connection ended with an error");
    }
}

/// The client's side of a relay, which renews the connection's place in the table when bytes
/// pass either way.
struct Active<'a> {
    stream: TcpStream,
    admitted: &'a Admitted,
    marked: Instant,
}

impl Active<'_> {
    fn passed(&mut self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let now = Instant::now();
        if now.duration_since(self.marked) >= ACTIVITY_GRAIN {
            self.marked = now;
            self.admitted.answering();
        }
    }
}

impl AsyncRead for Active<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        self.passed(read);
        polled
    }
}

impl AsyncWrite for Active<'_> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        if let Poll::Ready(Ok(written)) = polled {
            self.passed(written);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
