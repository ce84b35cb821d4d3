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
//! use stormguard_core::context::{self, CallContext};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let ctx = CallContext::new().with_timeout(Duration::from_secs(2)).with_previous_attempts(1);
//! let seen = context::scope(ctx, async { CallContext::current() }).await;
//! assert_eq!(seen, Some(ctx));
//! assert_eq!(CallContext::current(), None);
//! # }
//! ```

use std::future::Future;
use std::time::Duration;

use crate::Instant;
use crate::deadline::Deadline;

tokio::task_local! {
    static CURRENT: CallContext;
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_can_be_shortened_but_not_extended() {
        let now = Instant::now();
        let ctx = CallContext::new().with_deadline(now + Duration::from_secs(5));
        let shorter = ctx.with_deadline(now + Duration::from_secs(1));
        assert_eq!(shorter.deadline(), Some(now + Duration::from_secs(1)));
        let longer = shorter.with_deadline(now + Duration::from_secs(9));
        assert_eq!(longer.deadline(), Some(now + Duration::from_secs(1)));
    }

    #[test]
    fn an_absurd_timeout_saturates_instead_of_panicking() {
        let ctx = CallContext::new().with_timeout(Duration::MAX);
        let left = ctx.remaining_at(Instant::now()).expect("a deadline is set");
        assert!(left > Duration::from_secs(365 * 24 * 3600));
        // An earlier deadline still wins over the far one.
        let soon = Instant::now() + Duration::from_secs(1);
        assert_eq!(ctx.with_deadline(soon).deadline(), Some(soon));
    }

    #[test]
    fn remaining_time_saturates_at_zero() {
        let now = Instant::now();
        let ctx = CallContext::new().with_deadline(now);
        assert_eq!(
            ctx.remaining_at(now + Duration::from_secs(1)),
            Some(Duration::ZERO)
        );
        assert_eq!(CallContext::new().remaining_at(now), None);
    }

    #[tokio::test]
    async fn scopes_nest_and_end() {
        let outer = CallContext::new().with_previous_attempts(1);
        let inner = CallContext::new().with_previous_attempts(2);
        let seen = scope(outer, async {
            let a = CallContext::current();
            let b = scope(inner, async { CallContext::current() }).await;
            (a, b, CallContext::current())
        })
        .await;
        assert_eq!(seen, (Some(outer), Some(inner), Some(outer)));
        assert_eq!(CallContext::current(), None);
    }
}
