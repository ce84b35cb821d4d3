//! The retry middleware: a tower [`Layer`](tower_layer::Layer) for tonic channels.
//!
//! # Why a budget, not just an attempt cap
//!
//! An attempt cap bounds one call: at a 100 % failure rate, three attempts still triple the
//! load on a dependency that is already failing, and the retry load alone can keep it down
//! after the trigger is gone (a metastable failure). [`Retry`](crate::Retry) asks the shared
//! [`RetryController`](stormguard_core::RetryController) before each retry, whose
//! budget lets retries be at most a fraction of successes (plus a small floor), so the load
//! stays near `1.1 ×` however badly the dependency fails.
//!
//! # What is retried
//!
//! Per gRPC A6, only failures before the call is *committed*: a trailers-only response
//! (`grpc-status` in the response headers, which is how tonic answers a handler error), or a
//! transport error before any response headers (read as `UNAVAILABLE`). Once response
//! headers without a status arrive, the response is passed through untouched, streams
//! included, and never retried.
//!
//! # Readiness contract
//!
//! `poll_ready` readies the inner service, and `call` sends the first attempt on it, so the
//! first attempt is sent without waiting and costs no clone (a tonic `Channel` allocates
//! when it is cloned and when a clone is first readied). A retry, after its delay, takes a
//! clone of a spare kept by the layer's service, and calls `poll_ready` on that clone
//! inside the response future before sending. The inner service must therefore be
//! `Clone`, and clones must share the connection (tonic's `Channel` does).
//!
//! # Hedging
//!
//! A method given a [`HedgingPolicy`](stormguard_core::HedgingPolicy) instead of a
//! retry policy is hedged: its first copy goes at once, another follows each delay while
//! no answer has come, the first answer that is not a non-fatal failure wins and the other
//! copies are dropped (which resets their streams). Each hedge is an attempt under every
//! rule that bounds retries: paid from the same budget (refused, never queued, when it is
//! empty), only with a closed breaker, a retry left in the request's allowance and time
//! left on the deadline, marked with `grpc-previous-rpc-attempts`, stopped by pushback `-1`
//! and put off by pushback `N` (see [`CallRetry::start_hedge_at`] and
//! [`CallRetry::on_hedge_end_at`], where these are decided). Only a request whose body is
//! read whole (every unary call) within the replay limit is copied. Over
//! [`Replicas`](crate::replicas::Replicas) with
//! [`over_replicas`](crate::RetryLayer::over_replicas), each copy goes to a replica the call has
//! not used. A call that is answered before its delay allocates nothing more than a
//! retried call. The repository's `docs/hedging.md` says why a learned delay counts the
//! copies that lost.
//!
//! [`CallRetry::start_hedge_at`]: stormguard_core::CallRetry::start_hedge_at
//! [`CallRetry::on_hedge_end_at`]: stormguard_core::CallRetry::on_hedge_end_at
//!
//! # Success, for the budget and the breaker
//!
//! Only an `OK` answer is a success: it deposits into the budget (or adds to an A6
//! throttle) and counts for the breaker, as in gRPC A6 and its C-core and Java clients. A
//! status the policy retries is a failure: the breaker counts it and an A6 throttle takes a
//! token, whether or not the layer retries it; so is an attempt that ran out of its
//! per-attempt timeout. Any other status mints nothing and costs nothing. For the breaker,
//! an application answer (`NOT_FOUND`, `INVALID_ARGUMENT`, ...) is still a sign of life,
//! but an overload or expiry answer (`RESOURCE_EXHAUSTED`, `DEADLINE_EXCEEDED`, `CANCELLED`,
//! anything carrying a pushback) never is. The caller's own deadline running out is recorded
//! nowhere: a caller with a short deadline must not open the breaker every other method on
//! the channel shares.
//!
//! For a trailers-only answer the status is in the headers and is recorded at once. A
//! committed call (headers without a status: a stream, or a unary call whose status comes
//! in the trailers) is recorded when its body ends, by the [`ResponseBody`](crate::ResponseBody) the caller
//! reads: the `grpc-status` of the trailers; `UNAVAILABLE` when the body fails or ends
//! without a status (the stream broke before the server finished the call); nothing when
//! the caller drops the body before its end. So a stream that fails with `UNAVAILABLE` after
//! some messages is passed through and not retried, yet it mints no budget and counts
//! against the breaker. A call that began as a half-open probe has its probe settled as a
//! success when it commits, so long streams cannot hold every probe slot. Once a call
//! commits, its request body is no longer buffered for replay.
//!
//! A retry the budget granted but that never went out (the breaker opened or the deadline
//! ran out during its delay, the channel could not be readied, the caller went away) gives
//! its token back.
//!
//! # Deadlines
//!
//! The logical deadline of a call is the earliest of the caller's `grpc-timeout`
//! (`tonic::Request::set_timeout`), the deadline of the current
//! [`CallContext`](crate::context::CallContext) and the method's own limit (a service
//! config's `timeout`, which gRPC defines as a cap on what the application sets, not only
//! a default); when none is set, the layer's [default](crate::RetryLayer::with_default_timeout),
//! if any. The policy crate decides it, in one place
//! ([`resolve_deadline_at`](stormguard_core::resolve_deadline_at)). Every attempt carries what is left
//! of it as `grpc-timeout`. The layer also races each attempt against the deadline itself
//! (time spent waiting for the channel counts), and when it runs out the call ends with
//! `DEADLINE_EXCEEDED`, never retried, whatever code the server used: a failure that is
//! read at or after the deadline ends the same way, even when it won the race against the
//! layer's timer.
//!
//! An attempt may also have a per-attempt timeout; the crate docs ("Timeouts") say how it
//! and the other timeouts of tonic and tower meet the layer.
//!
//! # Keeping the connection healthy
//!
//! Each call whose deadline expires resets its HTTP/2 stream. h2 guards against reset
//! floods: a client connection that sees more than 1024 local error resets sends `GOAWAY
//! ENHANCE_YOUR_CALM`, and a server closes a connection whose peer resets many streams
//! before they are accepted. Either way every call in flight on the connection fails with
//! `RESOURCE_EXHAUSTED` ("h2 protocol error") or `UNAVAILABLE`, and the server's queue is
//! flushed, which looks like a recovery but is an artifact. Which h2 settings to change,
//! what each one costs in memory and what abuse each guard stops is in one place: the
//! repository's `docs/operating.md` ("HTTP/2 resets"). `tests/client/http2.rs` runs such a
//! storm (5 120 expiring calls on one connection) and checks that every call ends in its
//! own deadline and the connection still serves afterwards.

mod attempt;
pub(crate) mod body;
mod classify;
mod end;
mod events;
mod future;
pub(crate) mod layer;
mod load;
#[cfg(feature = "opentelemetry")]
pub mod metrics;
#[cfg(not(feature = "opentelemetry"))]
mod metrics {
    //! Without the `opentelemetry` feature a call counts nothing by method: this is empty.
    use stormguard_core::Code;

    #[derive(Debug, Default)]
    pub(crate) struct CallMetrics;

    impl CallMetrics {
        pub(crate) fn none() -> Self {
            CallMetrics
        }

        #[inline(always)]
        pub(crate) fn attempt(&mut self) {}

        #[inline(always)]
        pub(crate) fn ended(&mut self, _code: Code) {}
    }
}
mod record;
pub(crate) mod replay;
pub(crate) mod service;
pub(crate) mod stats;
mod throttle;
mod timer;

// The layer, its service and body, and its counters are at the crate's root (one path
// each); this module holds what is only read through them: the response future and, with
// the `opentelemetry` feature, the metrics.
pub use self::future::ResponseFuture;
