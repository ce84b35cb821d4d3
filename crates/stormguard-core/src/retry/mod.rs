//! The retry decision: may this failed attempt be tried again, and after how long?
//!
//! This is the one place where the pieces of the policy meet, so that the client layer and
//! the fleet simulator make exactly the same decisions. A failed attempt is retried only
//! when **all** of these hold, checked in this order (the first that fails names the
//! [`Refusal`]):
//!
//! 1. the caller's deadline has not passed (its own deadline running out is final, whatever
//!    code the server used: tonic answers an expired `grpc-timeout` with `CANCELLED`);
//! 2. the method has a retry policy and the status is one of its retryable codes (an
//!    attempt that timed out counts as retryable: the layer's timer fired, or the server
//!    answered `DEADLINE_EXCEEDED`/`CANCELLED` to an attempt whose `grpc-timeout` was its
//!    own per-attempt limit; see [`CallRetry::on_attempt_end_at`]);
//! 3. the server did not push back with "do not retry", nor ask for a wait longer than the
//!    policy's `max_pushback`;
//! 4. the method is idempotent, or it carries an idempotency key (its server recognises a
//!    repeated key and does not run the call twice; see [`CallRetry::idempotency_key`]),
//!    or the request never reached the server;
//! 5. the request can be replayed (its body was buffered);
//! 6. attempts so far < `maxAttempts`;
//! 7. the deadline leaves room for the delay plus a useful attempt (a pushback longer than
//!    the time left means no retry);
//! 8. the breaker is not open;
//! 9. the dependency's recent load reports (ORCA, when the layer reads them; see
//!    [`crate::orca`]) do not say that every endpoint is saturated;
//! 10. the request's retry allowance, when the call runs inside a
//!     [`RequestScope`](crate::context::RequestScope) that has one (`x-retry-budget`), has
//!     a retry left (it spends one);
//! 11. the budget grants a withdrawal (checked last, because it consumes).
//!
//! The delay is the server's pushback when it sent one (exactly, and the backoff restarts),
//! else the next backoff step.
//!
//! An attempt that never reached the server's application (a connection that could not be
//! made, a stream HTTP/2 refused with `REFUSED_STREAM` or above a `GOAWAY`'s last stream
//! id) is not a failure of the dependency: it is retried *transparently*, as gRPC A6 does,
//! at once and for free (no budget, no attempt counted, no breaker outcome), at most
//! [`TRANSPARENT_RETRIES`] times per call; see [`CallRetry::on_attempt_end_at`].
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use stormguard_core::{
//!     Budget, BudgetConfig, RetryBudget, Code, MethodTable, RetryPolicy, AttemptEnd, Decision,
//!     Failure, RetryController, Instant,
//! };
//!
//! let budget: Arc<dyn Budget> = Arc::new(RetryBudget::new(BudgetConfig::default()).unwrap());
//! let policy = RetryPolicy { idempotent: true, ..RetryPolicy::default() };
//! let controller = RetryController::new(MethodTable::uniform(policy), budget, None, 1);
//! let now = Instant::now();
//! let mut call = controller.begin_at("/pkg.Svc/Get", None, now).unwrap();
//! let failed = AttemptEnd::Failed(Failure::status(Code::Unavailable));
//! match call.on_attempt_end_at(failed, now).decision {
//!     Decision::Retry { delay } => {
//!         assert!(delay <= Duration::from_millis(50));
//!         let plan = call.start_retry_at(now + delay).unwrap();
//!         assert_eq!(plan.previous_attempts, 1);
//!     }
//!     other => panic!("no retry: {other:?}"),
//! }
//! ```

mod backoff;
mod breaker;
mod call;
mod controller;
mod decision;
mod delay;
mod policy;
mod saturation;
mod throttle;

pub use backoff::{Backoff, BackoffConfig};
pub use breaker::{
    BreakerConfig, BreakerOpen, BreakerPermit, BreakerState, BreakerTransition, CircuitBreaker,
    TransitionWatch, Transitions,
};
pub use call::{CallRetry, HedgeDecision, TRANSPARENT_RETRIES};
pub use controller::RetryController;
pub use decision::{AttemptEnd, AttemptPlan, Decision, Failure, Refusal, Verdict};
pub use delay::DelayEstimator;
pub use policy::{HedgeDelay, HedgingPolicy, LearnedDelay, MethodMap, MethodTable, RetryPolicy};
pub use saturation::{Saturation, SaturationConfig};
pub use throttle::{AdaptiveThrottle, AdaptiveThrottleConfig, Throttled, WindowCounts};

#[cfg(test)]
mod tests;
