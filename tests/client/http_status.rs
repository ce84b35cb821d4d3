//! End-to-end: a proxy's HTTP error in front of a gRPC server (no `grpc-status`) is a
//! failure before commit, classified as tonic reports it, and retried when that code is
//! retryable.
#![allow(clippy::unwrap_used)]

use crate::client_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use client_support::*;
use stormguard_client::RetryLayer;
use tokio::net::TcpListener;
use tonic::Code;
use tonic::body::Body;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tower::{Layer, Service};

/// Answers the first `n` calls with a bare HTTP `status` (no gRPC headers), like a load
/// balancer with no healthy backend, then lets calls through.
#[derive(Clone)]
struct ProxyError {
    status: http::StatusCode,
    remaining: Arc<AtomicUsize>,
}

#[derive(Clone)]
struct ProxyErrorService<S> {
    inner: S,
    layer: ProxyError,
}

impl<S> Layer<S> for ProxyError {
    type Service = ProxyErrorService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ProxyErrorService {
            inner,
            layer: self.clone(),
        }
    }
}

impl<S> Service<http::Request<Body>> for ProxyErrorService<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>> + Send,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let take = self
            .layer
            .remaining
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if take {
            let status = self.layer.status;
            return Box::pin(async move {
                Ok(http::Response::builder()
                    .status(status)
                    .header("content-type", "text/html")
                    .body(Body::empty())
                    .unwrap())
            });
        }
        Box::pin(self.inner.call(req))
    }
}

async fn serve_behind_proxy(
    svc: Scripted,
    status: http::StatusCode,
    failures: usize,
) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let proxy = ProxyError {
        status,
        remaining: Arc::new(AtomicUsize::new(failures)),
    };
    tokio::spawn(Server::builder().layer(proxy).serve_with_incoming(
        stormguard_demo::InventoryServer::new(svc),
        TcpIncoming::from(listener),
    ));
    addr
}

#[tokio::test]
async fn a_proxy_503_is_retried_as_unavailable() {
    let svc = Scripted::always(Step::Ok);
    let addr = serve_behind_proxy(svc.clone(), http::StatusCode::SERVICE_UNAVAILABLE, 2).await;
    let layer = RetryLayer::new(controller(quick_policy()));
    let stats = layer.stats();
    let mut client = client(channel(addr).await, layer);

    let reply = client
        .reserve(reserve("a"))
        .await
        .expect("third attempt passes the proxy");
    assert_eq!(
        reply.get_ref().attempt,
        3,
        "the server saw the third attempt's header"
    );
    assert_eq!(
        svc.seen().len(),
        1,
        "the first two never reached the server"
    );
    let s = stats.snapshot();
    assert_eq!(
        (s.logical, s.attempts, s.retries, s.ok, s.committed),
        (1, 3, 2, 1, 1)
    );
}

#[tokio::test]
async fn a_proxy_404_is_not_retried() {
    let svc = Scripted::always(Step::Ok);
    let addr = serve_behind_proxy(svc.clone(), http::StatusCode::NOT_FOUND, 1).await;
    let layer = RetryLayer::new(controller(quick_policy()));
    let stats = layer.stats();
    let mut client = client(channel(addr).await, layer);

    let status = client.reserve(reserve("a")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented);
    assert!(svc.seen().is_empty());
    let s = stats.snapshot();
    assert_eq!((s.attempts, s.retries, s.failed), (1, 0, 1));
    assert_eq!(s.refused.not_retryable, 1);
}

#[tokio::test]
async fn a_persistent_proxy_503_gives_up_with_do_not_retry() {
    let svc = Scripted::always(Step::Ok);
    let addr = serve_behind_proxy(svc.clone(), http::StatusCode::BAD_GATEWAY, usize::MAX).await;
    let layer = RetryLayer::new(controller(quick_policy()));
    let mut client = client(channel(addr).await, layer);

    let status = client.reserve(reserve("a")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(pushback_of(&status).as_deref(), Some("-1"));
    assert!(svc.seen().is_empty());
}
