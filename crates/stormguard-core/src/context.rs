//! The call context: the deadline and attempt number of the work a task is doing.
//!
//! A service that calls other services must not give its downstream calls more time than
//! its own caller gave it, and a downstream server sheds retries first, so it wants to know
//! which calls are retries. [`CallContext`] carries both in a tokio task-local:
//!
//! - the stormguard server layer (`ShedLayer`) sets it for each inbound call it runs (the
//!   deadline from the inbound `grpc-timeout`), so a handler's outgoing calls inherit it;
//! - code with its own call loop sets it with [`scope`] around each attempt;
//! - the client's `RetryLayer` reads the deadline, and its `ContextInterceptor` stamps
//!   deadline and attempt metadata onto outgoing requests.
//!
//! It lives in the policy crate so that both layers share one task-local without the
//! server depending on the client. A task-local is set by the future that polls the
//! handler, so work the handler spawns onto other tasks does not inherit it: scope those
//! futures explicitly.
//!
//! ```
//! use std::time::Duration;
//! use stormguard_core::{context, context::CallContext};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let ctx = CallContext::new().with_timeout(Duration::from_secs(2)).with_previous_attempts(1);
//! let seen = context::scope(ctx, async { CallContext::current() }).await;
//! assert_eq!(seen, Some(ctx));
//! assert_eq!(CallContext::current(), None);
//! # }
//! ```

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::deadline::Deadline;
use crate::wire::MAX_ALLOWANCE;
use crate::wire::parse_allowance;

tokio::task_local! {
    static CURRENT: CallContext;
    static REQUEST: RequestScope;
}

/// The deadline and attempt number that outgoing calls made in a scope inherit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallContext {
    deadline: Option<Instant>,
    previous_attempts: u32,
}

impl CallContext {
    /// A context with no deadline, on a first attempt.
    pub fn new() -> Self {
        CallContext::default()
    }

    /// The same context with `deadline`; an existing earlier deadline is kept, because a
    /// deadline may be shortened, never extended.
    pub fn with_deadline(self, deadline: Instant) -> Self {
        let deadline = match self.deadline {
            Some(d) if d <= deadline => d,
            _ => deadline,
        };
        CallContext {
            deadline: Some(deadline),
            ..self
        }
    }

    /// The same context with a deadline `timeout` from now (see [`with_deadline`](Self::with_deadline)).
    /// An absurdly long timeout saturates at about a century instead of overflowing.
    pub fn with_timeout(self, timeout: Duration) -> Self {
        self.with_deadline(Deadline::after(timeout).instant())
    }

    /// The same context marked as attempt `previous_attempts + 1` of its call: outgoing
    /// requests stamped by the client's `ContextInterceptor` carry
    /// `grpc-previous-rpc-attempts: previous_attempts` when it is above zero.
    pub fn with_previous_attempts(self, previous_attempts: u32) -> Self {
        CallContext {
            previous_attempts,
            ..self
        }
    }

    /// The deadline of the work in this scope, if it has one.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Attempts of this call made before the current one.
    pub fn previous_attempts(&self) -> u32 {
        self.previous_attempts
    }

    /// Time left at `now`, if there is a deadline (zero once it has passed).
    pub fn remaining_at(&self, now: Instant) -> Option<Duration> {
        self.deadline.map(|d| d.saturating_duration_since(now))
    }

    /// The context of the current task, if one is set.
    pub fn current() -> Option<CallContext> {
        CURRENT.try_with(|ctx| *ctx).ok()
    }
}

/// Runs `fut` with `ctx` as the current [`CallContext`]. Scopes nest: the innermost wins
/// (combine with [`CallContext::current`] and [`CallContext::with_deadline`] to keep an
/// outer, earlier deadline).
pub fn scope<F: Future>(ctx: CallContext, fut: F) -> Scoped<F> {
    CURRENT.scope(ctx, fut)
}

/// The future returned by [`scope`]: `fut`, polled with its [`CallContext`] set.
pub type Scoped<F> = tokio::task::futures::TaskLocalFuture<CallContext, F>;

/// Marks "no allowance" in [`RequestScope`]'s counter.
const UNLIMITED: u32 = u32::MAX;

/// What the outgoing calls made for one inbound request share: an optional allowance of
/// retries for the whole logical operation, and whether one of them was refused a retry.
///
/// The server layer (`ShedLayer`) sets one around each handler it runs; every client
/// `RetryLayer` call the handler makes reads it:
///
/// - with an allowance, each retry spends one (checked after every other rule, just before
///   the budget; a retry refused for lack of it counts as [`Refusal::Allowance`]), and every
///   attempt carries what is left as `x-retry-budget`;
/// - when a client layer gives up on a retryable failure, it records it here, so that the
///   server layer can tell the caller not to retry the handler's own answer either.
///
/// The allowance is only ever lowered: [`with_allowance`](Self::with_allowance) on a peer's
/// value keeps the smaller.
///
/// [`Refusal::Allowance`]: crate::Refusal::Allowance
///
/// ```
/// use stormguard_core::{context, context::RequestScope};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let scope = RequestScope::new().with_allowance(2).with_peer_allowance(b"1");
/// let left = context::request_scope(scope, async { context::remaining_allowance() }).await;
/// assert_eq!(left, Some(1), "the smaller of the two");
/// # }
/// ```
#[derive(Debug)]
pub struct RequestScope {
    allowance: AtomicU32,
    refused: AtomicBool,
}

impl Default for RequestScope {
    fn default() -> Self {
        RequestScope {
            allowance: AtomicU32::new(UNLIMITED),
            refused: AtomicBool::new(false),
        }
    }
}

impl RequestScope {
    /// A scope without an allowance (retries are limited by the layers' own policies only).
    pub fn new() -> Self {
        RequestScope::default()
    }

    /// The same scope allowing at most `retries` retries in all (a scope that already
    /// allows fewer keeps its own count). Values above [`MAX_ALLOWANCE`] are capped.
    pub fn with_allowance(self, retries: u32) -> Self {
        let retries = retries.min(MAX_ALLOWANCE);
        let current = self.allowance.load(Ordering::Relaxed);
        self.allowance
            .store(current.min(retries), Ordering::Relaxed);
        self
    }

    /// The same scope lowered to the `x-retry-budget` value a peer sent, when it is
    /// well-formed (ASCII decimal digits, surrounding spaces allowed, at most
    /// [`MAX_ALLOWANCE`]); a malformed, negative or huge value is ignored.
    /// A peer's value never raises the allowance, and does not create one: a scope without
    /// an allowance (the feature is off) stays without.
    pub fn with_peer_allowance(self, value: &[u8]) -> Self {
        match (self.allowance(), parse_allowance(value)) {
            (Some(_), Some(peer)) => self.with_allowance(peer),
            _ => self,
        }
    }

    /// Retries left, if this scope has an allowance.
    pub(crate) fn allowance(&self) -> Option<u32> {
        match self.allowance.load(Ordering::Relaxed) {
            UNLIMITED => None,
            n => Some(n),
        }
    }

    /// Whether a client layer in this scope gave up on a retryable failure (its budget,
    /// breaker, attempt limit, deadline or this allowance refused a retry).
    pub fn downstream_refused(&self) -> bool {
        self.refused.load(Ordering::Relaxed)
    }

    fn spend(&self) -> bool {
        self.allowance
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| match n {
                UNLIMITED => Some(UNLIMITED),
                0 => None,
                n => Some(n - 1),
            })
            .is_ok()
    }

    fn refund(&self) {
        let _ = self
            .allowance
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| match n {
                UNLIMITED => None,
                n => Some(n.saturating_add(1).min(MAX_ALLOWANCE)),
            });
    }
}

/// Runs `fut` with `scope` as the current [`RequestScope`].
pub fn request_scope<F: Future>(scope: RequestScope, fut: F) -> RequestScoped<F> {
    REQUEST.scope(scope, fut)
}

/// The future returned by [`request_scope`]; once it is done,
/// [`take_value`](tokio::task::futures::TaskLocalFuture::take_value) gives the scope back.
pub type RequestScoped<F> = tokio::task::futures::TaskLocalFuture<RequestScope, F>;

/// Spends one retry of the current request's allowance. `true` when the retry may go
/// ahead: an allowance had one left, or there is no allowance (or no request scope).
pub(crate) fn spend_retry() -> bool {
    REQUEST.try_with(RequestScope::spend).unwrap_or(true)
}

/// Gives back a retry [`spend_retry`] took but that was not made.
pub(crate) fn refund_retry() {
    let _ = REQUEST.try_with(RequestScope::refund);
}

/// Retries left in the current request's allowance, if it has one.
pub fn remaining_allowance() -> Option<u32> {
    REQUEST.try_with(RequestScope::allowance).ok().flatten()
}

/// Records that a client layer in the current request gave up on a retryable failure.
pub fn mark_downstream_refused() {
    let _ = REQUEST.try_with(|r| r.refused.store(true, Ordering::Relaxed));
}

#[cfg(test)]
mod tests;
