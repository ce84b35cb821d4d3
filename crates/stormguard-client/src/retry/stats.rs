//! Counters of one retry layer ([`RetryStats`], read as a [`RetrySnapshot`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use stormguard_core::Criticality;
use stormguard_core::Refusal;

/// A cloneable handle on a layer's counters; every clone of the layer and its services
/// counts into the same ones.
#[derive(Clone, Debug, Default)]
pub struct RetryStats {
    inner: Arc<Shards>,
}

/// Every call counts several events; with one set of counters, callers on every core would
/// write the same cache line several times per call. Each thread counts into a shard of its
/// own (by a per-thread index), on cache lines of its own; a snapshot sums the shards.
const SHARDS: usize = 16;

#[derive(Debug, Default)]
struct Shards {
    shards: [Counters; SHARDS],
}

/// The shard index of the current thread: threads are numbered as they first count.
fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    INDEX.with(|i| *i)
}

#[derive(Debug, Default)]
#[repr(align(128))]
struct Counters {
    logical: AtomicU64,
    attempts: AtomicU64,
    retries: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
    committed: AtomicU64,
    committed_failed: AtomicU64,
    committed_abandoned: AtomicU64,
    deadline_exceeded: AtomicU64,
    committed_deadline_exceeded: AtomicU64,
    attempt_timeouts: AtomicU64,
    delayed_by_backoff: AtomicU64,
    delayed_by_pushback: AtomicU64,
    transparent_retries: AtomicU64,
    hedges: AtomicU64,
    hedges_won: AtomicU64,
    load_reports: AtomicU64,
    load_reports_ignored: AtomicU64,
    refused: [AtomicU64; Refusal::ALL.len()],
    hedges_refused: [AtomicU64; Refusal::ALL.len()],
    /// Calls the adaptive throttle refused locally, by criticality (lowest first).
    throttled: [AtomicU64; Criticality::ALL.len()],
}

fn class_index(c: Criticality) -> usize {
    Criticality::ALL.iter().position(|x| *x == c).unwrap_or(0)
}

fn index(r: Refusal) -> usize {
    Refusal::ALL.iter().position(|x| *x == r).unwrap_or(0)
}

impl RetryStats {
    /// Fresh counters, all zero.
    pub fn new() -> Self {
        RetryStats::default()
    }

    /// The calling thread's counters.
    fn shard(&self) -> &Counters {
        &self.inner.shards[shard_index()]
    }

    pub(crate) fn logical(&self) {
        self.shard().logical.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn attempt(&self, retry: bool) {
        self.shard().attempts.fetch_add(1, Ordering::Relaxed);
        if retry {
            self.shard().retries.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A transparent retry was sent: an attempt, not a retry (see
    /// [`RetrySnapshot::transparent_retries`]).
    pub(crate) fn transparent_retry(&self) {
        let shard = self.shard();
        shard.attempts.fetch_add(1, Ordering::Relaxed);
        shard.transparent_retries.fetch_add(1, Ordering::Relaxed);
    }

    /// A hedge was sent: an attempt, not a retry (see [`RetrySnapshot::hedges`]).
    pub(crate) fn hedge(&self) {
        let shard = self.shard();
        shard.attempts.fetch_add(1, Ordering::Relaxed);
        shard.hedges.fetch_add(1, Ordering::Relaxed);
    }

    /// A hedged call was answered by a copy other than the first.
    pub(crate) fn hedge_won(&self) {
        self.shard().hedges_won.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn outcome(&self, ok: bool) {
        let shard = self.shard();
        let c = if ok { &shard.ok } else { &shard.failed };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn committed(&self) {
        self.shard().committed.fetch_add(1, Ordering::Relaxed);
    }

    /// A committed call's body ended; `ok` when its final status was `OK`.
    pub(crate) fn committed_ended(&self, ok: bool) {
        self.outcome(ok);
        if !ok {
            self.shard()
                .committed_failed
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A committed call's body was dropped before its end.
    pub(crate) fn committed_abandoned(&self) {
        self.shard()
            .committed_abandoned
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn deadline_exceeded(&self) {
        self.shard()
            .deadline_exceeded
            .fetch_add(1, Ordering::Relaxed);
    }

    /// A committed call's response body was cut at the call's deadline: a call that ended
    /// `DEADLINE_EXCEEDED` because its deadline ran out.
    pub(crate) fn committed_deadline_exceeded(&self) {
        let shard = self.shard();
        shard.deadline_exceeded.fetch_add(1, Ordering::Relaxed);
        shard
            .committed_deadline_exceeded
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn attempt_timed_out(&self) {
        self.shard()
            .attempt_timeouts
            .fetch_add(1, Ordering::Relaxed);
    }

    /// A retry was granted; its delay came from the server's pushback or the backoff.
    pub(crate) fn delayed(&self, by_pushback: bool) {
        let shard = self.shard();
        let c = if by_pushback {
            &shard.delayed_by_pushback
        } else {
            &shard.delayed_by_backoff
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn refused(&self, r: Refusal) {
        self.shard().refused[index(r)].fetch_add(1, Ordering::Relaxed);
    }

    /// The adaptive throttle refused a call of `class` locally.
    pub(crate) fn throttled(&self, class: Criticality) {
        self.shard().throttled[class_index(class)].fetch_add(1, Ordering::Relaxed);
    }

    /// A load report (ORCA) was read from an attempt's answer.
    pub(crate) fn load_report(&self) {
        self.shard().load_reports.fetch_add(1, Ordering::Relaxed);
    }

    /// A malformed or absurd load report was ignored.
    pub(crate) fn load_report_ignored(&self) {
        self.shard()
            .load_reports_ignored
            .fetch_add(1, Ordering::Relaxed);
    }

    /// A hedge that was due was not sent, because of `r`.
    pub(crate) fn hedge_refused(&self, r: Refusal) {
        self.shard().hedges_refused[index(r)].fetch_add(1, Ordering::Relaxed);
    }

    /// The counters now. Each counter is read atomically, the set is not (a call that ends
    /// while this runs may be half counted).
    pub fn snapshot(&self) -> RetrySnapshot {
        let shards = &self.inner.shards;
        let load = |f: fn(&Counters) -> &AtomicU64| {
            shards
                .iter()
                .map(|c| f(c).load(Ordering::Relaxed))
                .sum::<u64>()
        };
        let counts = |of: fn(&Counters) -> &[AtomicU64; Refusal::ALL.len()]| {
            let r = |x: Refusal| {
                shards
                    .iter()
                    .map(|c| of(c)[index(x)].load(Ordering::Relaxed))
                    .sum::<u64>()
            };
            RefusedCounts {
                not_retryable: r(Refusal::NotRetryable),
                not_idempotent: r(Refusal::NotIdempotent),
                pushback: r(Refusal::Pushback),
                attempts: r(Refusal::Attempts),
                deadline: r(Refusal::Deadline),
                breaker: r(Refusal::Breaker),
                budget: r(Refusal::Budget),
                key_budget: r(Refusal::KeyBudget),
                replay_limit: r(Refusal::ReplayLimit),
                allowance: r(Refusal::Allowance),
                saturated: r(Refusal::Saturated),
                connect_backoff: r(Refusal::ConnectBackoff),
            }
        };
        RetrySnapshot {
            logical: load(|c| &c.logical),
            attempts: load(|c| &c.attempts),
            retries: load(|c| &c.retries),
            ok: load(|c| &c.ok),
            failed: load(|c| &c.failed),
            committed: load(|c| &c.committed),
            committed_failed: load(|c| &c.committed_failed),
            committed_abandoned: load(|c| &c.committed_abandoned),
            deadline_exceeded: load(|c| &c.deadline_exceeded),
            committed_deadline_exceeded: load(|c| &c.committed_deadline_exceeded),
            attempt_timeouts: load(|c| &c.attempt_timeouts),
            delayed_by_backoff: load(|c| &c.delayed_by_backoff),
            delayed_by_pushback: load(|c| &c.delayed_by_pushback),
            transparent_retries: load(|c| &c.transparent_retries),
            hedges: load(|c| &c.hedges),
            hedges_won: load(|c| &c.hedges_won),
            load_reports: load(|c| &c.load_reports),
            load_reports_ignored: load(|c| &c.load_reports_ignored),
            refused: counts(|c| &c.refused),
            hedges_refused: counts(|c| &c.hedges_refused),
            throttled: {
                let t = |class| {
                    shards
                        .iter()
                        .map(|c| c.throttled[class_index(class)].load(Ordering::Relaxed))
                        .sum::<u64>()
                };
                ThrottledCounts {
                    sheddable: t(Criticality::Sheddable),
                    default: t(Criticality::Default),
                    critical: t(Criticality::Critical),
                }
            },
        }
    }
}

/// The counters of a layer at one moment: logical calls and physical attempts apart,
/// refusals by cause.
///
/// The number that tells whether retries amplify load is `attempts / logical`; a budget
/// keeps it near `1 + retry_ratio` however badly the dependency fails. The refusal counters
/// say which guard held the line.
///
/// A call's outcome (`ok` or `failed`) is counted when it is known. For most calls that is
/// when the layer returns the response or the error. A *committed* call (response headers
/// without `grpc-status`: every successful unary call from tonic, and every stream) is only
/// known when its response body ends, so it is counted then, from the `grpc-status` of its
/// trailers; a committed call whose body is dropped before its end is counted as
/// `committed_abandoned` instead. Once no call is in flight,
/// `ok + failed + committed_abandoned == logical`, less the calls whose response future
/// was dropped before it resolved (they count in `logical` only).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetrySnapshot {
    /// Logical calls started (what the caller asked for).
    pub logical: u64,
    /// Physical attempts sent (first attempts plus retries).
    pub attempts: u64,
    /// Attempts that were retries.
    pub retries: u64,
    /// Logical calls that ended in `OK`: a trailers-only `OK` (counted when the layer
    /// returns it), or a committed call whose trailers carried `grpc-status: 0` (counted
    /// when the caller reads them).
    pub ok: u64,
    /// Logical calls that ended in anything but `OK`: a status or error the layer returned
    /// (counted then), or a committed call whose body ended with a non-`OK` status, without
    /// a status, or with an error (counted then; these are also in `committed_failed`).
    pub failed: u64,
    /// Calls whose response headers arrived without a status: passed through, never
    /// retried. Counted when the headers arrive; the outcome follows when the body ends.
    pub committed: u64,
    /// Committed calls whose body ended without `OK`: a non-`OK` `grpc-status` in the
    /// trailers, no status at all, or a body error (a part of both `committed` and
    /// `failed`). These are failures the A6 commit rule forbids retrying; those the policy
    /// counts as failures of the dependency still cost budget and count for the breaker.
    pub committed_failed: u64,
    /// Committed calls whose body the caller dropped before its end (it lost interest):
    /// in neither `ok` nor `failed`, and recorded nowhere else.
    pub committed_abandoned: u64,
    /// Calls that ended with `DEADLINE_EXCEEDED` because the caller's deadline ran out:
    /// before the first attempt was sent, while an attempt was in flight or its failure was
    /// on its way, while the channel was being readied for a retry, or after the call
    /// committed, while its response was still streaming (those are also in
    /// `committed_deadline_exceeded`).
    pub deadline_exceeded: u64,
    /// Committed calls (response headers received) whose response body the layer cut at the
    /// call's deadline: the stream was reset and the caller read `DEADLINE_EXCEEDED` (a part
    /// of `deadline_exceeded`, `committed_failed` and `failed`).
    pub committed_deadline_exceeded: u64,
    /// Attempts abandoned because their per-attempt timeout ran out before the call's
    /// deadline (the layer's own timer, or a timer below it: `Endpoint::timeout`, a
    /// `tower::timeout` layer), or that the server answered `DEADLINE_EXCEEDED` or
    /// `CANCELLED` when their `grpc-timeout` was that per-attempt limit (a queue that cannot
    /// run them in time says so early). Each is a failure of the dependency; the call went
    /// on with a retry or ended with `DEADLINE_EXCEEDED`.
    pub attempt_timeouts: u64,
    /// Retries granted whose delay was the next backoff step (full jitter). A granted retry
    /// that never went out (the deadline ran out or the breaker opened during its delay)
    /// counts here too, so these can exceed `retries`.
    pub delayed_by_backoff: u64,
    /// Retries granted whose delay was the server's `grpc-retry-pushback-ms`.
    pub delayed_by_pushback: u64,
    /// Attempts sent again because the one before never reached the server's application
    /// (a connection that could not be made, a stream HTTP/2 refused: `REFUSED_STREAM`, or
    /// above a `GOAWAY`'s last stream id), at once and for free: counted in `attempts`, not
    /// in `retries`; not paid from the budget, not counted against `maxAttempts` (see
    /// [`CallRetry::on_attempt_end_at`](stormguard_core::CallRetry::on_attempt_end_at)).
    pub transparent_retries: u64,
    /// Copies of hedged calls sent after the first (see
    /// [`HedgingPolicy`](crate::HedgingPolicy)): counted in `attempts`, not in `retries`; each
    /// paid from the retry budget.
    pub hedges: u64,
    /// Hedged calls answered by a copy other than the first.
    pub hedges_won: u64,
    /// Load reports (ORCA, `endpoint-load-metrics-bin`) read from attempts' answers, when
    /// the layer reads them ([`RetryLayer::with_load_reports`](crate::RetryLayer::with_load_reports)).
    pub load_reports: u64,
    /// Load reports ignored as malformed or absurd: repeated, oversize, not base64, not the
    /// message, or a field out of range (see [`stormguard_core::LoadReport`]).
    pub load_reports_ignored: u64,
    /// Failures that were not retried, by cause. A first attempt rejected by an open
    /// breaker counts under `breaker` too, one rejected while the dependency's connection
    /// is in backoff under `connect_backoff`.
    pub refused: RefusedCounts,
    /// Hedges that were due and not sent, by cause (`budget`: the retry budget was spent;
    /// `pushback`: a server's pushback stopped them; `replay_limit`: the request could not
    /// be copied; ...).
    pub hedges_refused: RefusedCounts,
    /// Calls the adaptive throttle refused locally, never sent, by criticality (see
    /// [`RetryLayer::with_adaptive_throttle`](crate::RetryLayer::with_adaptive_throttle)):
    /// each is also a logical call that `failed`.
    pub throttled: ThrottledCounts,
}

impl RetrySnapshot {
    /// Attempts per logical call (1.0 when nothing was retried; 0.0 before any call).
    pub fn amplification(&self) -> f64 {
        if self.logical == 0 {
            0.0
        } else {
            self.attempts as f64 / self.logical as f64
        }
    }
}

/// Failures not retried, by [`Refusal`] cause.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RefusedCounts {
    /// The code was not retryable for the method (or the method has no policy).
    pub not_retryable: u64,
    /// The method is not idempotent and the request may have reached the server.
    pub not_idempotent: u64,
    /// The server's pushback said not to retry.
    pub pushback: u64,
    /// The attempt limit was reached.
    pub attempts: u64,
    /// Not enough time was left on the deadline.
    pub deadline: u64,
    /// The circuit breaker was open.
    pub breaker: u64,
    /// The retry budget was spent.
    pub budget: u64,
    /// The replica (or shard) the failed attempt went to had spent its own account
    /// ([`KeyedBudgets`](stormguard_core::KeyedBudgets)).
    pub key_budget: u64,
    /// The request body was larger than the replay buffer.
    pub replay_limit: u64,
    /// The request-scoped retry allowance (`x-retry-budget`) was spent.
    pub allowance: u64,
    /// The dependency's recent load reports said it was saturated.
    pub saturated: u64,
    /// The dependency refused connections and was in connection backoff: a first attempt
    /// not sent (only one probe per backoff slot dials).
    pub connect_backoff: u64,
}

/// Calls refused locally by the adaptive throttle, by the criticality they had.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThrottledCounts {
    /// `sheddable` calls.
    pub sheddable: u64,
    /// `default` calls (and calls without a criticality).
    pub default: u64,
    /// `critical` calls.
    pub critical: u64,
}

impl ThrottledCounts {
    /// Every class.
    pub fn total(&self) -> u64 {
        self.sheddable + self.default + self.critical
    }

    /// `(class, count)` for every class, lowest first, with the names of
    /// [`Criticality::as_str`].
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [
            (Criticality::Sheddable, self.sheddable),
            (Criticality::Default, self.default),
            (Criticality::Critical, self.critical),
        ]
        .into_iter()
        .map(|(c, n)| (c.as_str(), n))
    }
}

impl RefusedCounts {
    /// `(name, count)` for every cause, with the names of [`Refusal::as_str`].
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [
            (Refusal::NotRetryable, self.not_retryable),
            (Refusal::NotIdempotent, self.not_idempotent),
            (Refusal::Pushback, self.pushback),
            (Refusal::Attempts, self.attempts),
            (Refusal::Deadline, self.deadline),
            (Refusal::Breaker, self.breaker),
            (Refusal::Budget, self.budget),
            (Refusal::KeyBudget, self.key_budget),
            (Refusal::ReplayLimit, self.replay_limit),
            (Refusal::Allowance, self.allowance),
            (Refusal::Saturated, self.saturated),
            (Refusal::ConnectBackoff, self.connect_backoff),
        ]
        .into_iter()
        .map(|(r, n)| (r.as_str(), n))
    }
}

#[cfg(test)]
mod tests;
