//! The HTTP/1.1 endpoints of `fovea serve` (metrics, the Iceberg REST
//! catalog): one accept loop on hyper, with bounded connections and
//! bounded time per connection, so a slow or idle client cannot hold one.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;

/// How many connections an endpoint serves at once and for how long.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections at once (more wait to be accepted).
    pub connections: usize,
    /// Time a client has to send its request head.
    pub head_timeout: Duration,
    /// Time a connection lasts in all.
    pub connection_timeout: Duration,
    /// Whether a connection serves more than one request.
    pub keep_alive: bool,
}

/// Serves `answer` to every request on `listener` until the runtime stops;
/// `name` names the endpoint in logs.
pub async fn serve_http<F>(listener: tokio::net::TcpListener, name: &'static str, limits: Limits, answer: F)
where
    F: Fn(&hyper::Request<hyper::body::Incoming>) -> hyper::Response<Full<Bytes>> + Send + Sync + 'static,
{
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.connections));
    let answer = Arc::new(answer);
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else { return };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: wait instead of
                // spinning on the error.
                tracing::warn!("{name}: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let answer = Arc::clone(&answer);
        let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            std::future::ready(Ok::<_, std::convert::Infallible>(answer(&request)))
        });
        tokio::spawn(async move {
            let _slot = slot;
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.head_timeout)
                .keep_alive(limits.keep_alive)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            match tokio::time::timeout(limits.connection_timeout, connection).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!("{name}: {e}"),
                Err(_) => tracing::debug!("{name}: a connection took longer than {:?}", limits.connection_timeout),
            }
        });
    }
}
