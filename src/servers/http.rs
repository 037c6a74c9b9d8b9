//! A minimal HTTP/1.1 server on hyper: GET a path, get a status, a content type and a body.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tracing::trace;

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

/// Binds `host:port` as the configuration spells it.
pub async fn bind(address: &str) -> Result<TcpListener, ServerError> {
    let parsed: SocketAddr =
        address
            .parse()
            .map_err(|err: std::net::AddrParseError| ServerError::Address {
                address: address.to_string(),
                reason: err.to_string(),
            })?;
    TcpListener::bind(parsed)
        .await
        .map_err(|source| ServerError::Bind {
            address: parsed,
            source,
        })
}

/// How many connections one server holds at once; more wait in the kernel's accept queue. A
/// flood of idle connections can then never use up the process's file descriptors (which the
/// syncs need for their tools and sockets).
pub const MAX_CONNECTIONS: usize = 32;
/// A client must have sent its request headers within this long.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// No connection, kept alive or not, lasts longer than this.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);
/// After a failed accept (out of file descriptors, say), wait this long before the next.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Serves `handler` on `listener` until the runtime stops.
pub fn serve(listener: TcpListener, handler: impl Fn(&str) -> Reply + Send + Sync + 'static) {
    serve_until(listener, std::future::pending(), handler);
}

/// Serves `handler` on `listener` until `stop` completes (the listener closes then), with at
/// most [`MAX_CONNECTIONS`] connections, each bounded by [`HEADER_TIMEOUT`] and
/// [`CONNECTION_LIFETIME`].
pub fn serve_until(
    listener: TcpListener,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
    handler: impl Fn(&str) -> Reply + Send + Sync + 'static,
) {
    let handler = Arc::new(handler);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        tokio::pin!(stop);
        loop {
            let slot = tokio::select! {
                slot = slots.clone().acquire_owned() => slot,
                () = &mut stop => return,
            };
            let Ok(slot) = slot else { return };
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = &mut stop => return,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    trace!(error = %err, "Failed to accept an HTTP connection");
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                    continue;
                }
            };
            let handler = handler.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let service = hyper::service::service_fn(move |request| {
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
                match tokio::time::timeout(CONNECTION_LIFETIME, connection).await {
                    Ok(Err(err)) => trace!(error = %err, "HTTP connection ended with an error"),
                    Err(_) => trace!("HTTP connection closed at the end of its lifetime"),
                    Ok(Ok(())) => {}
                }
            });
        }
    });
}

#[cfg(test)]
mod tests;
