//! The retry decision: may this failed attempt be tried again, and after how long? The
//! checks and their order are documented on [`RetryController`]; the pieces each have a
//! file (settings, backoff, breaker, throttle, saturation, per-call state).

mod backoff;
mod breaker;
mod call;
mod connect;
mod controller;
mod decision;
mod delay;
mod policy;
mod saturation;
mod shared;
mod throttle;

pub use backoff::{Backoff, BackoffConfig};
pub use breaker::{
    BreakerConfig, BreakerOpen, BreakerPermit, BreakerState, BreakerTransition, CircuitBreaker,
    TransitionWatch, Transitions,
};
pub use call::{CONNECT_SLOT_WAIT, CallRetry, CommittedCall, HedgeDecision, TRANSPARENT_RETRIES};
pub use controller::RetryController;
pub use decision::{AttemptEnd, AttemptPlan, Decision, Failure, Refusal, Verdict};
pub use policy::{
    HedgeDelay, HedgingPolicy, LearnedDelay, MAX_ATTEMPTS_CAP, MethodMap, MethodScope, MethodTable,
    RetryPolicy,
};
pub use saturation::{Saturation, SaturationConfig};
pub use throttle::{AdaptiveThrottle, AdaptiveThrottleConfig, Throttled, WindowCounts};

#[cfg(test)]
mod tests;
