//! What a [`RetryInterceptor`](crate::RetryInterceptor) counts: logical calls, attempts,
//! retries and why retries were refused, shared by every clone of the interceptor.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use stormguard_core::Refusal;

/// The counters of a [`RetryInterceptor`](crate::RetryInterceptor) and of every clone of
/// it. Read them with [`snapshot`](Self::snapshot).
///
/// ```
/// use stormguard_grpc::{ClientConfig, RetryInterceptor};
///
/// let interceptor = RetryInterceptor::from_config(&ClientConfig::default())?;
/// let snapshot = interceptor.stats().snapshot();
/// assert_eq!((snapshot.logical, snapshot.attempts), (0, 0));
/// # Ok::<(), stormguard_grpc::ConfigError>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct InterceptorStats {
    inner: Arc<Counters>,
}

#[derive(Debug, Default)]
struct Counters {
    logical: AtomicU64,
    attempts: AtomicU64,
    retries: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
    committed: AtomicU64,
    deadline_exceeded: AtomicU64,
    attempts_timed_out: AtomicU64,
    delayed_by_pushback: AtomicU64,
    delayed_by_backoff: AtomicU64,
    hedges: AtomicU64,
    hedges_won: AtomicU64,
    refused: [AtomicU64; Refusal::ALL.len()],
    hedges_refused: [AtomicU64; Refusal::ALL.len()],
}

/// The counters at one moment (see [`InterceptorStats::snapshot`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct InterceptorSnapshot {
    /// Logical calls begun.
    pub logical: u64,
    /// Attempts sent (first attempts, retries and hedges).
    pub attempts: u64,
    /// Retries sent (each paid by the budget).
    pub retries: u64,
    /// Calls that ended `OK`.
    pub ok: u64,
    /// Calls that ended with any other status.
    pub failed: u64,
    /// Calls committed (response headers arrived; never retried after).
    pub committed: u64,
    /// Calls that ran out of their deadline.
    pub deadline_exceeded: u64,
    /// Attempts abandoned at their own per-attempt timeout.
    pub attempts_timed_out: u64,
    /// Retries whose delay was the server's pushback.
    pub delayed_by_pushback: u64,
    /// Retries whose delay was the backoff's (full jitter).
    pub delayed_by_backoff: u64,
    /// Copies of hedged calls sent after the first (attempts, not retries).
    pub hedges: u64,
    /// Hedged calls a copy other than the first answered.
    pub hedges_won: u64,
    /// Retries refused, by [`Refusal`], in the order of [`Refusal::ALL`].
    pub refused: [u64; Refusal::ALL.len()],
    /// Hedges that were due and not sent, by [`Refusal`], in the order of [`Refusal::ALL`].
    pub hedges_refused: [u64; Refusal::ALL.len()],
}

impl InterceptorSnapshot {
    /// Retries refused for `refusal`.
    pub fn refused(&self, refusal: Refusal) -> u64 {
        index(refusal).map_or(0, |i| self.refused[i])
    }

    /// Hedges refused for `refusal`.
    pub fn hedges_refused(&self, refusal: Refusal) -> u64 {
        index(refusal).map_or(0, |i| self.hedges_refused[i])
    }

    /// Attempts per logical call (1.0 when nothing was retried; 0.0 before any call).
    pub fn amplification(&self) -> f64 {
        if self.logical == 0 {
            return 0.0;
        }
        self.attempts as f64 / self.logical as f64
    }
}

/// Where `refusal` is in [`Refusal::ALL`].
fn index(refusal: Refusal) -> Option<usize> {
    Refusal::ALL.iter().position(|r| *r == refusal)
}

fn add(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl InterceptorStats {
    /// The counters now.
    pub fn snapshot(&self) -> InterceptorSnapshot {
        let c = &*self.inner;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        InterceptorSnapshot {
            logical: get(&c.logical),
            attempts: get(&c.attempts),
            retries: get(&c.retries),
            ok: get(&c.ok),
            failed: get(&c.failed),
            committed: get(&c.committed),
            deadline_exceeded: get(&c.deadline_exceeded),
            attempts_timed_out: get(&c.attempts_timed_out),
            delayed_by_pushback: get(&c.delayed_by_pushback),
            delayed_by_backoff: get(&c.delayed_by_backoff),
            hedges: get(&c.hedges),
            hedges_won: get(&c.hedges_won),
            refused: std::array::from_fn(|i| get(&c.refused[i])),
            hedges_refused: std::array::from_fn(|i| get(&c.hedges_refused[i])),
        }
    }

    pub(crate) fn logical(&self) {
        add(&self.inner.logical);
    }

    pub(crate) fn attempt(&self, retry: bool) {
        add(&self.inner.attempts);
        if retry {
            add(&self.inner.retries);
        }
    }

    pub(crate) fn outcome(&self, ok: bool) {
        add(if ok {
            &self.inner.ok
        } else {
            &self.inner.failed
        });
    }

    pub(crate) fn committed(&self) {
        add(&self.inner.committed);
    }

    pub(crate) fn deadline_exceeded(&self) {
        add(&self.inner.deadline_exceeded);
    }

    pub(crate) fn attempt_timed_out(&self) {
        add(&self.inner.attempts_timed_out);
    }

    pub(crate) fn delayed_by_pushback(&self) {
        add(&self.inner.delayed_by_pushback);
    }

    pub(crate) fn delayed_by_backoff(&self) {
        add(&self.inner.delayed_by_backoff);
    }

    /// A hedge was sent: an attempt, not a retry.
    pub(crate) fn hedge(&self) {
        add(&self.inner.attempts);
        add(&self.inner.hedges);
    }

    pub(crate) fn hedge_won(&self) {
        add(&self.inner.hedges_won);
    }

    pub(crate) fn refused(&self, refusal: Refusal) {
        if let Some(i) = index(refusal) {
            add(&self.inner.refused[i]);
        }
    }

    pub(crate) fn hedge_refused(&self, refusal: Refusal) {
        if let Some(i) = index(refusal) {
            add(&self.inner.hedges_refused[i]);
        }
    }
}
