//! Building the API client the way upstream does: a kubeconfig (from the config file's
//! `clientConnection.kubeconfig` or `--kubeconfig`), `--master` overriding its server, else in-cluster.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file could not be read or parsed.
    #[error("failed to load kubeconfig {path}: {reason}")]
    Kubeconfig { path: String, reason: String },
    /// `--master` is not a URL.
    #[error("invalid --master {master:?}: {reason}")]
    Master { master: String, reason: String },
    /// Neither a kubeconfig, `--master` nor the in-cluster environment was usable.
    #[error("no kubeconfig or --master given and not running in a cluster: {0}")]
    InCluster(String),
    /// The client itself could not be built (TLS settings, ...).
    #[error("failed to build the API client: {0}")]
    Build(String),
}

/// One request the client sent: what upstream's `rest_client_requests_total{code,host,method}`
/// and `rest_client_request_duration_seconds{verb,host}` count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRecord {
    pub method: String,
    /// The API server's host (and port), as client-go names it.
    pub host: String,
    /// The status code, or `<error>` when no response came.
    pub code: String,
    /// Until the response's headers arrived (a watch's whole stream is not counted).
    pub duration: Duration,
}

/// Told about every request the client sends.
pub type RequestObserver = Arc<dyn Fn(&RequestRecord) + Send + Sync>;

/// Builds the client; `observer` hears of every request it sends.
pub async fn build_client(
    kubeconfig: Option<&Path>,
    master: Option<&str>,
    observer: Option<RequestObserver>,
) -> Result<Client, ClientError> {
    let mut config = match kubeconfig {
        Some(path) => {
            let shown = path.display().to_string();
            let file = Kubeconfig::read_from(path).map_err(|err| ClientError::Kubeconfig {
                path: shown.clone(),
                reason: err.to_string(),
            })?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|err| ClientError::Kubeconfig {
                    path: shown,
                    reason: err.to_string(),
                })?
        }
        None if master.is_some() => Config::new(parse_master(master.unwrap_or_default())?),
        None => {
            tracing::warn!(
                "Neither --kubeconfig nor --master was specified. Using the inClusterConfig."
            );
            Config::incluster().map_err(|err| ClientError::InCluster(err.to_string()))?
        }
    };
    if let Some(master) = master {
        config.cluster_url = parse_master(master)?;
    }
    // kube's own retry of 429, 503 and 504 starts at 5 ms and tries 15 times, so a watch's
    // one list became 8 requests in its first second against a server that said it was
    // overloaded (and the request metric, outside that layer, counted one). The watches retry
    // on their own schedule (k8s/backoff.rs); an Event is posted once.
    config.default_retry = false;
    let host = config
        .cluster_url
        .authority()
        .map_or_else(|| "none".to_string(), |a| a.to_string());
    let builder =
        ClientBuilder::try_from(config).map_err(|err| ClientError::Build(err.to_string()))?;
    Ok(match observer {
        Some(observer) => builder.with_layer(&ObserveLayer { host, observer }).build(),
        None => builder.build(),
    })
}

/// The client's outermost layer: times each request and reports it.
#[derive(Clone)]
struct ObserveLayer {
    host: String,
    observer: RequestObserver,
}

impl<S> tower::Layer<S> for ObserveLayer {
    type Service = Observe<S>;

    fn layer(&self, inner: S) -> Observe<S> {
        Observe {
            inner,
            host: self.host.clone(),
            observer: self.observer.clone(),
        }
    }
}

#[derive(Clone)]
struct Observe<S> {
    inner: S,
    host: String,
    observer: RequestObserver,
}

impl<S, B> tower::Service<http::Request<kube::client::Body>> for Observe<S>
where
    S: tower::Service<http::Request<kube::client::Body>, Response = http::Response<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let method = request.method().to_string();
        let host = self.host.clone();
        let observer = self.observer.clone();
        let started = Instant::now();
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            let code = match &result {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "<error>".to_string(),
            };
            observer(&RequestRecord {
                method,
                host,
                code,
                duration: started.elapsed(),
            });
            result
        })
    }
}

fn parse_master(master: &str) -> Result<http::Uri, ClientError> {
    master
        .parse()
        .map_err(|err: http::uri::InvalidUri| ClientError::Master {
            master: master.to_string(),
            reason: err.to_string(),
        })
}
