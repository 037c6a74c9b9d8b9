//! A minimal HTTP/1.1 server on hyper: GET a path, get a status, a content type and a body.
//! Every server's connections count in one [`ConnectionTable`], bounded by the open-files limit.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;
use tracing::trace;

mod connections;

pub use connections::{
    Admitted, ConnectionMetrics, ConnectionNames, ConnectionTable, ServerCounters,
    capacity_for_open_files,
};

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("invalid bind address {address:?}: {reason}")]
    Address { address: String, reason: String },
    #[error("can't listen on {address}: {source}")]
    Bind {
        address: SocketAddr,
        source: std::io::Error,
    },
}

/// What a path answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub status: StatusCode,
    pub content_type: &'static str,
    pub body: String,
}

impl Reply {
    pub fn ok(content_type: &'static str, body: String) -> Reply {
        Reply {
            status: StatusCode::OK,
            content_type,
            body,
        }
    }

    pub fn json(status: StatusCode, body: String) -> Reply {
        Reply {
            status,
            content_type: "application/json",
            body,
        }
    }

    pub fn not_found() -> Reply {
        Reply {
            status: StatusCode::NOT_FOUND,
            content_type: "text/plain; charset=utf-8",
            body: "404 page not found\n".into(),
        }
    }
}

/// Connections the kernel queues for a server until it accepts them (it caps this at
/// net.core.somaxconn): we accept at once, so the queue only has to absorb a burst.
const LISTEN_BACKLOG: u32 = 4096;

/// Binds `host:port` as the configuration spells it.
pub async fn bind(address: &str) -> Result<TcpListener, ServerError> {
    let parsed: SocketAddr =
        address
            .parse()
            .map_err(|err: std::net::AddrParseError| ServerError::Address {
                address: address.to_string(),
                reason: err.to_string(),
            })?;
    listen(parsed).map_err(|source| ServerError::Bind {
        address: parsed,
        source,
    })
}

/// Listens on `address` with a backlog of [`LISTEN_BACKLOG`]. Must run inside the runtime.
pub fn listen(address: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match address {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(LISTEN_BACKLOG)
}

/// A client must send its first byte within this long, and then its whole request head; a
/// kept-alive connection must start its next request within this long too.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// No connection, kept alive or not, lasts longer than this.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);
/// After a failed accept (out of file descriptors, say), wait this long before the next.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Serves `handler` on `listener` until the runtime stops, as `server` in `table`.
pub fn serve(
    listener: TcpListener,
    table: &ConnectionTable,
    server: &'static str,
    handler: impl Fn(&str) -> Reply + Send + Sync + 'static,
) {
    serve_until(listener, table, server, std::future::pending(), handler);
}

/// Serves `handler` on `listener` until `stop` completes; then the listener and every
/// connection it took close. Connections count in `table` (which sheds the oldest when full)
/// and under `server` in the metrics; each is bounded by [`HEADER_TIMEOUT`] and
/// [`CONNECTION_LIFETIME`].
pub fn serve_until(
    listener: TcpListener,
    table: &ConnectionTable,
    server: &'static str,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
    handler: impl Fn(&str) -> Reply + Send + Sync + 'static,
) {
    let handler = Arc::new(handler);
    let port = listener.local_addr().map_or(0, |a| a.port());
    let counters = table.counters(server, port);
    let table = table.clone();
    tokio::spawn(async move {
        // Every connection watches this; it closes them when the accept loop returns.
        let (_closing, closed) = watch::channel(());
        tokio::pin!(stop);
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = &mut stop => return,
            };
            match accepted {
                Ok((stream, _)) => {
                    let (admitted, shed) = table.admit(&counters);
                    let connection = Connection {
                        admitted: Arc::new(admitted),
                        shed,
                        closed: closed.clone(),
                    };
                    tokio::spawn(connection.serve(stream, handler.clone()));
                }
                Err(err) => {
                    trace!(error = %err, "Failed to accept an HTTP connection");
                    tokio::select! {
                        () = accept_failed(&table, &err) => {}
                        () = &mut stop => return,
                    }
                }
            }
        }
    });
}

/// After a failed accept: the oldest connection of `table` closed when the process ran out of
/// file descriptors, then a pause of [`ACCEPT_PAUSE`] before the next accept.
pub(super) async fn accept_failed(table: &ConnectionTable, err: &std::io::Error) {
    if out_of_files(err) {
        table.shed_oldest();
    }
    tokio::time::sleep(ACCEPT_PAUSE).await;
}

/// The process (or the system) ran out of file descriptors.
fn out_of_files(err: &std::io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(code) if code == nix::libc::EMFILE || code == nix::libc::ENFILE
    )
}

/// One accepted connection and what can end it early.
struct Connection {
    admitted: Arc<Admitted>,
    shed: oneshot::Receiver<()>,
    closed: watch::Receiver<()>,
}

/// How a connection ended.
enum Ended {
    /// The client closed it, or an error did.
    Done,
    /// The client was too slow or idle too long, or the lifetime was up.
    TimedOut,
    /// Closed to make room for a newer connection.
    Shed,
    /// Its server stopped.
    Closed,
}

impl Connection {
    async fn serve<H>(mut self, stream: TcpStream, handler: Arc<H>)
    where
        H: Fn(&str) -> Reply + Send + Sync + 'static,
    {
        let counters = self.admitted.counters().clone();
        let exchange = exchange(stream, self.admitted.clone(), handler);
        let ended = tokio::select! {
            ended = exchange => ended,
            shed = &mut self.shed => if shed.is_ok() { Ended::Shed } else { Ended::Closed },
            _ = self.closed.changed() => Ended::Closed,
        };
        match ended {
            Ended::TimedOut => counters.timed_out.inc(),
            Ended::Shed => counters.shed.inc(),
            Ended::Done | Ended::Closed => {}
        }
    }
}

/// Requests and answers on `stream` until the client closes it or a limit is reached.
async fn exchange<H>(stream: TcpStream, admitted: Arc<Admitted>, handler: Arc<H>) -> Ended
where
    H: Fn(&str) -> Reply + Send + Sync + 'static,
{
    let lifetime = Instant::now() + CONNECTION_LIFETIME;
    // hyper gives a connection its read buffer once it polls it; until the first byte comes, an
    // idle connection costs its task and its socket alone.
    match tokio::time::timeout(HEADER_TIMEOUT, stream.readable()).await {
        Err(_) => return Ended::TimedOut,
        Ok(Err(err)) => {
            trace!(error = %err, "HTTP connection failed before its request");
            return Ended::Done;
        }
        Ok(Ok(())) => {}
    }
    let service = hyper::service::service_fn(move |request| {
        admitted.answering();
        let reply = handler(request.uri().path());
        async move {
            Response::builder()
                .status(reply.status)
                .header("content-type", reply.content_type)
                .body(Full::new(Bytes::from(reply.body)))
        }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service);
    match tokio::time::timeout_at(lifetime, connection).await {
        Ok(Ok(())) => Ended::Done,
        Ok(Err(err)) if err.is_timeout() => Ended::TimedOut,
        Ok(Err(err)) => {
            trace!(error = %err, "HTTP connection ended with an error");
            Ended::Done
        }
        Err(_) => {
            trace!("HTTP connection closed at the end of its lifetime");
            Ended::TimedOut
        }
    }
}

#[cfg(test)]
mod tests;
