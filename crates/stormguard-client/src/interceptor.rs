//! [`ContextInterceptor`](crate::ContextInterceptor): a tonic interceptor for code that keeps its own retry loop.

use std::time::Duration;

use stormguard_core::Instant;
use stormguard_core::{
    wire::GRPC_PREVIOUS_RPC_ATTEMPTS, wire::GRPC_TIMEOUT, wire::decode_grpc_timeout,
    wire::encode_grpc_timeout,
};
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::context::CallContext;

/// Stamps `grpc-timeout` (the time left in the current [`CallContext`], or the request's
/// own timeout if that is shorter) and `grpc-previous-rpc-attempts` (when the context says
/// this is a retry) onto outgoing requests.
///
/// A request whose context deadline has already passed is not sent: it fails at once with
/// `DEADLINE_EXCEEDED`.
///
/// # When to use which
///
/// - Use the [`RetryLayer`](crate::RetryLayer) when stormguard should own the retries of
///   a channel: it decides each retry (budget, breaker, pushback, deadline), replays the
///   request body and stamps every attempt. This is the normal choice.
/// - Use this interceptor when your code already decides retries itself (or a
///   call must never be retried) but should still tell the server what it needs to shed
///   load well: the time left on the deadline of the work in scope (`grpc-timeout`) and
///   whether this attempt is a retry (`grpc-previous-rpc-attempts`). It reads both from the
///   current [`CallContext`]; set it with [`context::scope`](crate::context::scope) around
///   each attempt. It cannot see responses, so it cannot retry: tonic interceptors only see
///   the outgoing request.
///
/// Do not stack both on one channel: the layer already stamps what the interceptor would.
///
/// ```
/// use std::time::Duration;
/// use stormguard_client::{ContextInterceptor, context::{self, CallContext}};
/// use tonic::service::Interceptor;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let ctx = CallContext::new().with_timeout(Duration::from_secs(1)).with_previous_attempts(2);
/// let request = context::scope(ctx, async {
///     ContextInterceptor::new().call(tonic::Request::new(())).unwrap()
/// })
/// .await;
/// assert_eq!(request.metadata().get("grpc-previous-rpc-attempts").unwrap(), "2");
/// assert!(request.metadata().get("grpc-timeout").is_some());
/// # }
/// ```
///
/// With a generated client: `InventoryClient::with_interceptor(channel, ContextInterceptor::new())`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ContextInterceptor {
    _p: (),
}

impl ContextInterceptor {
    /// An interceptor that reads [`CallContext::current`].
    pub fn new() -> Self {
        ContextInterceptor { _p: () }
    }

    fn stamp(
        ctx: CallContext,
        now: Instant,
        mut request: Request<()>,
    ) -> Result<Request<()>, Status> {
        if let Some(left) = ctx.remaining_at(now) {
            if left.is_zero() {
                return Err(Status::deadline_exceeded(
                    "stormguard: the deadline of the calling context has passed",
                ));
            }
            let own: Option<Duration> = request
                .metadata()
                .get(GRPC_TIMEOUT)
                .and_then(|v| decode_grpc_timeout(v.as_bytes()).ok());
            let timeout = own.map_or(left, |own| own.min(left));
            let value = MetadataValue::try_from(encode_grpc_timeout(timeout).as_str())
                .map_err(|_| Status::internal("stormguard: unencodable grpc-timeout"))?;
            request.metadata_mut().insert(GRPC_TIMEOUT, value);
        }
        if ctx.previous_attempts() > 0 {
            request.metadata_mut().insert(
                GRPC_PREVIOUS_RPC_ATTEMPTS,
                MetadataValue::from(ctx.previous_attempts()),
            );
        }
        Ok(request)
    }
}

impl Interceptor for ContextInterceptor {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        match CallContext::current() {
            Some(ctx) => Self::stamp(ctx, Instant::now(), request),
            None => Ok(request),
        }
    }
}

#[cfg(test)]
mod tests;
