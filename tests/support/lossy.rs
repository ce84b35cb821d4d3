//! A server layer that loses a seeded share of answers *after the handler ran*, shared by
//! `tests/e2e/idempotency.rs` (on loopback) and `tests/e2e/faults.rs` (on turmoil): the client
//! sees `UNAVAILABLE`, as from a connection that broke on the way back, though the write
//! happened. It goes outermost on the server, outside the `ShedLayer` and the
//! `IdempotencyLayer`, so a lost answer is one the server recorded.
//!
//! Which attempts lose their answer depends only on the call's [`CALL_HEADER`] and its
//! `grpc-previous-rpc-attempts`, not on the order calls arrive in, so a seed gives the
//! same losses on every run. A request without [`CALL_HEADER`] never loses its answer: a
//! test marks the calls of the class it wants to lose answers.

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tonic::Status;
use tower::{Layer, Service};

/// The request header that names a logical call for the draw (the same on every
/// attempt); a request without it is never dropped.
pub const CALL_HEADER: &str = "x-call";

/// Loses the answer of `percent` % of the attempts that carry [`CALL_HEADER`], drawn from
/// `seed`, the header and the attempt number; `lost` counts them.
#[derive(Clone, Debug, Default)]
pub struct LoseAnswers {
    pub seed: u64,
    pub percent: u64,
    pub lost: Arc<AtomicU64>,
}

impl LoseAnswers {
    /// Answers lost so far.
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }
}

#[derive(Clone, Debug)]
pub struct Lossy<S> {
    inner: S,
    layer: LoseAnswers,
}

impl<S> Layer<S> for LoseAnswers {
    type Service = Lossy<S>;
    fn layer(&self, inner: S) -> Lossy<S> {
        Lossy {
            inner,
            layer: self.clone(),
        }
    }
}

pub fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, RB> Service<http::Request<B>> for Lossy<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    RB: tonic::codegen::Body<Data = bytes::Bytes> + Send + 'static,
    RB::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let h = |name: &str| {
            request
                .headers()
                .get(name)
                .map_or(&b""[..], |v| v.as_bytes())
                .iter()
                .fold(0u64, |h, b| splitmix64(h ^ u64::from(*b)))
        };
        let marked = request.headers().contains_key(CALL_HEADER);
        let draw = splitmix64(
            self.layer.seed ^ h(CALL_HEADER) ^ splitmix64(h("grpc-previous-rpc-attempts")),
        );
        let lose = marked && draw % 100 < self.layer.percent;
        let lost = Arc::clone(&self.layer.lost);
        let fut = self.inner.call(request);
        Box::pin(async move {
            let response = fut.await?;
            if !lose {
                return Ok(response.map(tonic::body::Body::new));
            }
            // The handler ran and answered; the answer does not arrive.
            lost.fetch_add(1, Ordering::Relaxed);
            Ok(Status::unavailable("answer lost on the way back").into_http())
        })
    }
}
