//! A minimal HTTP/1.1 server on hyper: GET a path, get a status, a content type and a body.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::debug;

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

/// Serves `handler` on `listener` until the runtime stops.
pub fn serve(listener: TcpListener, handler: impl Fn(&str) -> Reply + Send + Sync + 'static) {
    serve_until(listener, std::future::pending(), handler);
}

/// Serves `handler` on `listener` until `stop` completes (the listener closes then).
pub fn serve_until(
    listener: TcpListener,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
    handler: impl Fn(&str) -> Reply + Send + Sync + 'static,
) {
    let handler = std::sync::Arc::new(handler);
    tokio::spawn(async move {
        tokio::pin!(stop);
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = &mut stop => return,
            };
            let Ok((stream, _)) = accepted else {
                continue;
            };
            let handler = handler.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let reply = handler(request.uri().path());
                    async move {
                        Response::builder()
                            .status(reply.status)
                            .header("content-type", reply.content_type)
                            .body(Full::new(Bytes::from(reply.body)))
                    }
                });
                if let Err(err) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    debug!(error = %err, "HTTP connection ended with an error");
                }
            });
        }
    });
}
