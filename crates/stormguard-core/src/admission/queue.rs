//! The admission queue: workers, waiters and every decision about them, in one place.
//!
//! [`AdmissionPolicy`] answers one question at a time (admit, queue or shed this call;
//! which end of the queue to serve; when queued work expires). Something still has to
//! hold the workers and the waiters and ask those questions at the right moments, and
//! that part decides too: whether work too close to its deadline is refused before it
//! takes a free worker, whether expired waiters count as load, who gets a worker that
//! frees up. [`AdmissionQueue`] is that part. The tower layer in `stormguard-server` wraps
//! it in a mutex (with wakers and RAII permits), and the fleet simulator drives the very
//! same type on its virtual clock, so the two cannot decide differently.
//!
//! It is runtime-agnostic: every operation takes `now` and nothing sleeps or spawns. The
//! driver keeps one timer per queued call (the `expiry` returned when it was queued) and
//! calls [`AdmissionQueue::withdraw_at`] when it fires, or when the caller goes away.
//! Expired waiters are also taken out at the start of every operation, so a decision
//! never counts work whose time is up, whichever of two events at the same instant the
//! driver happens to run first.
//!
//! # What it decides
//!
//! - [`AdmissionQueue::arrive_at`]: work whose deadline leaves less than
//!   [`min_time_left`](AdmissionConfig::min_time_left) is refused at once, even with a
//!   worker free (it could not finish; running it takes a worker from a call that
//!   can); otherwise the policy admits, queues or sheds it.
//! - [`AdmissionQueue::finish_at`] / [`AdmissionQueue::give_back_at`]: a worker turned
//!   over; the next live waiter gets it, oldest or newest first as the policy says for
//!   the depth of *live* waiters.
//! - Criticality ([`crate::criticality`]): sheddable calls are shed first, retries
//!   next; and when the queue is full, a call takes the place of a waiter of a *lower
//!   criticality* if there is one (the lowest-ranked by [`CallClass::rank`], the oldest
//!   of those), which is answered with the shed status ([`Dispatch::Shed`]). So a full
//!   queue of default work does not turn away a critical call, nor one of sheddable
//!   work a default one. Between calls of one criticality nothing changes: a full queue
//!   sheds the arrival.
//! - The worker limit: fixed ([`AdmissionConfig::workers`]) or adaptive
//!   ([`AdmissionConfig::adaptive`], [`crate::limit`]): every call that leaves its
//!   worker ([`AdmissionQueue::finish_at`], with the instant it started) is a latency
//!   sample, and the limit follows them. [`AdmissionQueue::set_worker_limit_at`] sets it
//!   from outside. Raising the limit hands the new workers to waiters at once; lowering
//!   it takes effect as running calls finish.
//!
//! Workers handed to waiters, waiters found expired and waiters that gave their place
//! up are reported to a `sink` closure as [`Dispatch`] values, in the order they happen.
//!
//! ```
//! use std::time::Duration;
//! use stormguard_core::Instant;
//! use stormguard_core::admission::AdmissionConfig;
//! use stormguard_core::wire::AttemptClass;
//! use stormguard_core::queue::{AdmissionQueue, Arrival, Dispatch};
//!
//! let config = AdmissionConfig { workers: 1, queue_capacity: 16, ..AdmissionConfig::default() };
//! let mut queue = AdmissionQueue::from_config(config).expect("valid config");
//! let t0 = Instant::now();
//! let ignore = |_: Dispatch<&str>| {};
//!
//! // The first call takes the worker, the second waits for it.
//! let first = queue.arrive_at(t0, AttemptClass::First, None, "a", ignore);
//! assert_eq!(first, Arrival::Run);
//! let Arrival::Queued { id, .. } = queue.arrive_at(t0, AttemptClass::First, None, "b", ignore)
//! else { panic!("queued") };
//!
//! // Too little time left: refused at once, never queued.
//! let close = Some(t0 + Duration::from_millis(1));
//! assert_eq!(queue.arrive_at(t0, AttemptClass::First, close, "c", ignore), Arrival::Expired);
//!
//! // When the first call finishes, the worker goes to "b".
//! let mut handed = Vec::new();
//! queue.finish_at(t0 + Duration::from_millis(5), t0, |d| handed.push(d));
//! assert!(matches!(handed.as_slice(), [Dispatch::Run(left)] if left.id == id && left.waiter == "b"));
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroUsize;
use std::time::Duration;

use crate::Instant;
use crate::admission::{
    Admission, AdmissionConfig, AdmissionPolicy, CallClass, QueueLoad, Shed, ShedReason,
};
use crate::criticality::Criticality;
use crate::error::ConfigError;
use crate::limit::AdaptiveLimit;
use crate::wire::AttemptClass;

/// The place of one queued call, unique for the life of its queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueuedId(u64);

impl QueuedId {
    /// Arrival order: a later call has a larger value.
    pub fn get(self) -> u64 {
        self.0
    }
}

/// What happens to an arriving call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// A worker is free and is now the call's: run it, then call
    /// [`AdmissionQueue::finish_at`].
    Run,
    /// The call waits for a worker. Its `expiry` is when the driver's timer should call
    /// [`AdmissionQueue::withdraw_at`] (answering `DEADLINE_EXCEEDED`) if it is still
    /// waiting.
    Queued {
        /// Its place.
        id: QueuedId,
        /// When it stops being worth running.
        expiry: Instant,
    },
    /// Answer at once with the shed status and this pushback.
    Shed(Shed),
    /// Its deadline leaves less than `min_time_left`: answer `DEADLINE_EXCEEDED` at once.
    Expired,
}

/// A call that left the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Left<T> {
    /// Its place.
    pub id: QueuedId,
    /// What the driver stored with it.
    pub waiter: T,
    /// How long it waited.
    pub waited: Duration,
    /// Its class, as it arrived.
    pub class: CallClass,
}

/// What the queue did with a waiter while handing out workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dispatch<T> {
    /// It was given a worker: run it, then call [`AdmissionQueue::finish_at`] (or
    /// [`AdmissionQueue::give_back_at`] if it will not run after all).
    Run(Left<T>),
    /// Its expiry passed while it waited: answer `DEADLINE_EXCEEDED` without running it.
    Expired(Left<T>),
    /// The queue was full and a call of a higher rank took its place: answer with the
    /// shed status and this pushback, without running it.
    Shed(Left<T>, Shed),
}

#[derive(Debug)]
struct Waiting<T> {
    waiter: T,
    enqueued_at: Instant,
    expiry: Instant,
    deadline: Option<Instant>,
    class: CallClass,
}

/// One server's workers and wait queue, and the policy that decides about both.
///
/// `T` is whatever the driver keeps with each waiter (a task's waker, a simulated job)
/// and gets back when the waiter leaves. Memory is bounded: at most
/// [`AdmissionConfig::queue_capacity`] waiters. Not shared: wrap it in a lock if
/// several tasks drive it.
#[derive(Debug)]
pub struct AdmissionQueue<T> {
    policy: AdmissionPolicy,
    limit: usize,
    running: usize,
    /// Waiters by arrival order: the first is the oldest.
    waiting: BTreeMap<u64, Waiting<T>>,
    /// The same waiters by expiry, to take out the expired ones first.
    by_expiry: BTreeSet<(Instant, u64)>,
    /// The same waiters by shed rank, then age: the first gives its place up first.
    by_rank: BTreeSet<(u8, u64)>,
    next_id: u64,
    adaptive: Option<AdaptiveLimit>,
}

impl<T> AdmissionQueue<T> {
    /// A queue with `policy.config().workers` free workers and nobody waiting (with an
    /// adaptive limit, that is where the limit starts, within its bounds).
    pub fn new(policy: AdmissionPolicy) -> Self {
        let config = policy.config();
        let adaptive = config.adaptive.clone().and_then(|adaptive| {
            // The policy validated its config, adaptive part included.
            // A policy's config always has its seed (drawn when none was set).
            AdaptiveLimit::new(adaptive, config.workers, config.seed.unwrap_or_default()).ok()
        });
        let limit = adaptive
            .as_ref()
            .map_or(config.workers, AdaptiveLimit::limit);
        AdmissionQueue {
            policy,
            limit,
            running: 0,
            waiting: BTreeMap::new(),
            by_expiry: BTreeSet::new(),
            by_rank: BTreeSet::new(),
            next_id: 0,
            adaptive,
        }
    }

    /// The adaptive limit's state (its limit, its no-load latency), if the limit is
    /// adaptive.
    pub fn adaptive(&self) -> Option<&AdaptiveLimit> {
        self.adaptive.as_ref()
    }

    /// A queue for a valid `config` (see [`AdmissionConfig::validate`]).
    pub fn from_config(config: AdmissionConfig) -> Result<Self, ConfigError> {
        AdmissionPolicy::new(config).map(Self::new)
    }

    /// The policy (its configuration, its completion-rate estimate).
    pub fn policy(&self) -> &AdmissionPolicy {
        &self.policy
    }

    /// Calls that may run at once now (initially [`AdmissionConfig::workers`]).
    pub fn worker_limit(&self) -> usize {
        self.limit
    }

    /// Calls running now. Above [`AdmissionQueue::worker_limit`] for a while after the
    /// limit was lowered.
    pub fn running(&self) -> usize {
        self.running
    }

    /// Workers free now. Never above 0 while anyone waits.
    pub fn free_workers(&self) -> usize {
        self.limit.saturating_sub(self.running)
    }

    /// Calls waiting now (expired ones included until the next operation takes them out).
    pub fn depth(&self) -> usize {
        self.waiting.len()
    }

    /// Whether the call queued as `id` is still waiting.
    pub fn is_waiting(&self, id: QueuedId) -> bool {
        self.waiting.contains_key(&id.0)
    }

    /// What the driver stored with the waiting call `id` (to update a waker, say).
    pub fn waiter_mut(&mut self, id: QueuedId) -> Option<&mut T> {
        self.waiting.get_mut(&id.0).map(|w| &mut w.waiter)
    }

    /// The state a decision is made against.
    pub fn load(&self) -> QueueLoad {
        QueueLoad {
            free_workers: self.free_workers(),
            depth: self.waiting.len(),
            oldest_enqueued: self.waiting.first_key_value().map(|(_, w)| w.enqueued_at),
        }
    }

    /// Decides what to do with a call of `class` (an
    /// [`AttemptClass`], or a [`CallClass`] with its
    /// criticality), with `deadline`, arriving at `now`. `waiter` is kept with the call
    /// if it is queued, and dropped otherwise. Waiters whose expiry has passed are taken
    /// out first, and a waiter that gives its place up to this call is answered; both
    /// are reported to `sink`.
    pub fn arrive_at(
        &mut self,
        now: Instant,
        class: impl Into<CallClass>,
        deadline: Option<Instant>,
        waiter: T,
        mut sink: impl FnMut(Dispatch<T>),
    ) -> Arrival {
        let class = class.into();
        self.expire_due_at(now, &mut sink);
        // Work that cannot finish in time is answered now, whether or not a worker is
        // free: running it would only take a worker from a call that can finish.
        let expiry = self.policy.expiry(now, deadline);
        if expiry <= now {
            return Arrival::Expired;
        }
        let decision = self
            .policy
            .decide_with_deadline_at(now, self.load(), class, deadline);
        match decision {
            Admission::Admit => {
                self.running += 1;
                Arrival::Run
            }
            Admission::Queue => self.enqueue(now, class, expiry, deadline, waiter),
            Admission::Shed(shed) if shed.reason == ShedReason::QueueFull => {
                // A full queue: the lowest-ranked waiter of a lower criticality gives its
                // place up, if there is one.
                match self.displaceable(class) {
                    Some(id) => {
                        if let Some(out) = self.take(id) {
                            let depth = self.waiting.len();
                            let pushback = self.policy.shed_pushback_at(
                                now,
                                depth,
                                out.class.attempt,
                                out.deadline,
                            );
                            let reason = ShedReason::Sheddable;
                            sink(Dispatch::Shed(
                                Left {
                                    id: QueuedId(id),
                                    waiter: out.waiter,
                                    waited: now.saturating_duration_since(out.enqueued_at),
                                    class: out.class,
                                },
                                Shed { reason, pushback },
                            ));
                        }
                        self.enqueue(now, class, expiry, deadline, waiter)
                    }
                    None => Arrival::Shed(shed),
                }
            }
            Admission::Shed(shed) => Arrival::Shed(shed),
        }
    }

    fn enqueue(
        &mut self,
        now: Instant,
        class: CallClass,
        expiry: Instant,
        deadline: Option<Instant>,
        waiter: T,
    ) -> Arrival {
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.insert(
            id,
            Waiting {
                waiter,
                enqueued_at: now,
                expiry,
                deadline,
                class,
            },
        );
        self.by_expiry.insert((expiry, id));
        self.by_rank.insert((class.rank(), id));
        Arrival::Queued {
            id: QueuedId(id),
            expiry,
        }
    }

    /// The waiter that gives its place up to an arrival of `class` in a full queue: of
    /// the waiters of a lower criticality, the lowest-ranked, oldest first.
    fn displaceable(&self, class: CallClass) -> Option<u64> {
        let mut ranks: Vec<u8> = Criticality::ALL
            .into_iter()
            .filter(|c| *c < class.criticality)
            .flat_map(|c| {
                [AttemptClass::First, AttemptClass::Retry].map(|a| CallClass::new(a, c).rank())
            })
            .collect();
        ranks.sort_unstable();
        ranks.dedup();
        ranks.into_iter().find_map(|rank| {
            self.by_rank
                .range((rank, 0)..=(rank, u64::MAX))
                .next()
                .map(|(_, id)| *id)
        })
    }

    /// Takes waiter `id` out of every index.
    fn take(&mut self, id: u64) -> Option<Waiting<T>> {
        let waiting = self.waiting.remove(&id)?;
        self.by_expiry.remove(&(waiting.expiry, id));
        self.by_rank.remove(&(waiting.class.rank(), id));
        Some(waiting)
    }

    /// A running call that got its worker at `started` finished at `now`: its worker goes
    /// to the next live waiter, reported to `sink`. A worker turned over, so it feeds the
    /// drain estimate behind the pushback, and its time on the worker is a latency sample
    /// for an adaptive limit.
    pub fn finish_at(&mut self, now: Instant, started: Instant, sink: impl FnMut(Dispatch<T>)) {
        self.release_at(now, started, false, sink);
    }

    /// A running call that got its worker at `started` was abandoned at `now` (its caller
    /// left mid-run): as [`finish_at`](Self::finish_at), but its time on the worker is
    /// only a lower bound on its latency, which an adaptive limit reads as such.
    pub fn abandon_at(&mut self, now: Instant, started: Instant, sink: impl FnMut(Dispatch<T>)) {
        self.release_at(now, started, true, sink);
    }

    fn release_at(
        &mut self,
        now: Instant,
        started: Instant,
        abandoned: bool,
        sink: impl FnMut(Dispatch<T>),
    ) {
        self.running = self.running.saturating_sub(1);
        self.policy.record_completion_at(now);
        if let Some(adaptive) = &mut self.adaptive {
            self.limit = if abandoned {
                adaptive.abandoned_at(now, started, self.running)
            } else {
                adaptive.sample_at(now, started, self.running)
            };
        }
        self.dispatch_at(now, sink);
    }

    /// A worker handed to a waiter (a [`Dispatch::Run`]) will not be used after all (the
    /// caller left, or its expiry passed before it could start): the worker goes to the
    /// next live waiter. No call completed, so the drain estimate is not fed.
    pub fn give_back_at(&mut self, now: Instant, sink: impl FnMut(Dispatch<T>)) {
        self.running = self.running.saturating_sub(1);
        self.dispatch_at(now, sink);
    }

    /// Takes the call `id` out of the queue at `now`: its caller went away, or its
    /// expiry timer fired. `None` if it no longer waits (it was given a worker or
    /// reported expired already).
    pub fn withdraw_at(&mut self, now: Instant, id: QueuedId) -> Option<Left<T>> {
        let waiting = self.take(id.0)?;
        Some(Left {
            id,
            waiter: waiting.waiter,
            waited: now.saturating_duration_since(waiting.enqueued_at),
            class: waiting.class,
        })
    }

    /// Takes out every waiter at `now`, oldest first, reporting each to `sink`: the server
    /// is shutting down, and none of them will get a worker.
    pub fn withdraw_all_at(&mut self, now: Instant, mut sink: impl FnMut(Left<T>)) {
        while let Some((&id, _)) = self.waiting.first_key_value() {
            if let Some(left) = self.withdraw_at(now, QueuedId(id)) {
                sink(left);
            }
        }
    }

    /// Takes out every waiter whose expiry is at or before `now`, reporting each to
    /// `sink` as [`Dispatch::Expired`], earliest expiry first.
    pub fn expire_due_at(&mut self, now: Instant, mut sink: impl FnMut(Dispatch<T>)) {
        while let Some(&(expiry, id)) = self.by_expiry.first() {
            if expiry > now {
                break;
            }
            if let Some(waiting) = self.take(id) {
                sink(Dispatch::Expired(Left {
                    id: QueuedId(id),
                    waiter: waiting.waiter,
                    waited: now.saturating_duration_since(waiting.enqueued_at),
                    class: waiting.class,
                }));
            }
        }
    }

    /// Sets the number of calls that may run at once, from `now` on. Raised: the new
    /// workers go to waiters at once (reported to `sink`). Lowered: no call is stopped;
    /// no waiter gets a worker until fewer than `limit` calls run. With an adaptive
    /// limit, the limit's next decision replaces this value.
    pub fn set_worker_limit_at(
        &mut self,
        now: Instant,
        limit: NonZeroUsize,
        sink: impl FnMut(Dispatch<T>),
    ) {
        self.limit = limit.get();
        self.dispatch_at(now, sink);
    }

    /// Hands free workers to live waiters, in the policy's order.
    fn dispatch_at(&mut self, now: Instant, mut sink: impl FnMut(Dispatch<T>)) {
        self.expire_due_at(now, &mut sink);
        while self.running < self.limit {
            let newest = self.policy.serve_newest(self.waiting.len());
            let next = if newest {
                self.waiting.pop_last()
            } else {
                self.waiting.pop_first()
            };
            let Some((id, waiting)) = next else {
                return;
            };
            self.by_expiry.remove(&(waiting.expiry, id));
            self.by_rank.remove(&(waiting.class.rank(), id));
            self.running += 1;
            sink(Dispatch::Run(Left {
                id: QueuedId(id),
                waiter: waiting.waiter,
                waited: now.saturating_duration_since(waiting.enqueued_at),
                class: waiting.class,
            }));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::admission::{QueueOrder, RetryThreshold};
    use crate::limit::AdaptiveLimitConfig;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    fn config(workers: usize, capacity: usize) -> AdmissionConfig {
        AdmissionConfig {
            workers,
            queue_capacity: capacity,
            retry_threshold: RetryThreshold {
                depth: Some(capacity / 2),
                queue_delay: None,
            },
            queue_order: QueueOrder::Fifo,
            max_time_queued: 100 * MS,
            min_time_left: 2 * MS,
            ..AdmissionConfig::default()
        }
    }

    fn queue(config: AdmissionConfig) -> AdmissionQueue<u32> {
        AdmissionQueue::from_config(config).unwrap()
    }

    /// Everything reported to a sink, as (waiter, ran).
    fn collect(into: &mut Vec<(u32, bool)>) -> impl FnMut(Dispatch<u32>) + '_ {
        |d| match d {
            Dispatch::Run(l) => into.push((l.waiter, true)),
            Dispatch::Expired(l) | Dispatch::Shed(l, _) => into.push((l.waiter, false)),
        }
    }

    fn none(_: Dispatch<u32>) {
        panic!("nothing should leave the queue here");
    }

    fn queued(a: Arrival) -> QueuedId {
        match a {
            Arrival::Queued { id, .. } => id,
            other => panic!("not queued: {other:?}"),
        }
    }

    #[test]
    fn runs_up_to_the_limit_then_queues_then_sheds() {
        let mut q = queue(config(2, 4));
        let t0 = Instant::now();
        let first = AttemptClass::First;
        let retry = AttemptClass::Retry;
        assert_eq!(q.arrive_at(t0, first, None, 0, none), Arrival::Run);
        assert_eq!(q.arrive_at(t0, retry, None, 1, none), Arrival::Run);
        assert_eq!((q.running(), q.free_workers()), (2, 0));
        queued(q.arrive_at(t0, first, None, 2, none));
        queued(q.arrive_at(t0, retry, None, 3, none));
        // Depth 2 is the retry threshold: retries are shed, first attempts still queue.
        let shed = q.arrive_at(t0, retry, None, 4, none);
        assert!(
            matches!(shed, Arrival::Shed(s) if s.reason == ShedReason::RetryThreshold),
            "{shed:?}"
        );
        queued(q.arrive_at(t0, first, None, 5, none));
        queued(q.arrive_at(t0, first, None, 6, none));
        let full = q.arrive_at(t0, first, None, 7, none);
        assert!(
            matches!(full, Arrival::Shed(s) if s.reason == ShedReason::QueueFull),
            "{full:?}"
        );
        assert_eq!(q.depth(), 4);
    }

    #[test]
    fn work_without_time_left_is_refused_even_with_a_worker_free() {
        let mut q = queue(config(2, 4));
        let t0 = Instant::now();
        let close = Some(t0 + MS);
        assert_eq!(
            q.arrive_at(t0, AttemptClass::First, close, 0, none),
            Arrival::Expired
        );
        assert_eq!(q.running(), 0);
        let ok = Some(t0 + 3 * MS);
        assert_eq!(
            q.arrive_at(t0, AttemptClass::First, ok, 1, none),
            Arrival::Run
        );
    }

    #[test]
    fn a_freed_worker_goes_to_the_oldest_live_waiter_fifo() {
        let mut q = queue(config(1, 8));
        let t0 = Instant::now();
        q.arrive_at(t0, AttemptClass::First, None, 0, none);
        for i in 1..=3 {
            queued(q.arrive_at(t0 + i * MS, AttemptClass::First, None, i, none));
        }
        let mut out = Vec::new();
        q.finish_at(t0 + 10 * MS, t0, collect(&mut out));
        assert_eq!(out, [(1, true)]);
        assert_eq!((q.running(), q.depth()), (1, 2));
    }

    #[test]
    fn adaptive_lifo_serves_the_newest_while_deep() {
        let mut q = queue(AdmissionConfig {
            queue_order: QueueOrder::AdaptiveLifo { from_depth: 3 },
            ..config(1, 8)
        });
        let t0 = Instant::now();
        q.arrive_at(t0, AttemptClass::First, None, 0, none);
        for i in 1..=4 {
            queued(q.arrive_at(t0, AttemptClass::First, None, i, none));
        }
        let mut out = Vec::new();
        for _ in 0..4 {
            q.finish_at(t0 + MS, t0, collect(&mut out));
        }
        // Depths 4, 3: newest first; then 2, 1: oldest first.
        assert_eq!(out, [(4, true), (3, true), (1, true), (2, true)]);
    }

    #[test]
    fn expired_waiters_are_not_load_and_never_get_a_worker() {
        // One worker, retries shed from 2 queued (capacity 4).
        let mut q = queue(config(1, 4));
        let t0 = Instant::now();
        q.arrive_at(t0, AttemptClass::First, None, 0, none);
        queued(q.arrive_at(t0, AttemptClass::First, None, 1, none));
        // Expires at 10 ms - 2 ms.
        queued(q.arrive_at(t0, AttemptClass::First, Some(t0 + 10 * MS), 2, none));
        // At 20 ms the second waiter's time is up: it is reported and the retry sees
        // depth 1, under the threshold.
        let mut out = Vec::new();
        let a = q.arrive_at(
            t0 + 20 * MS,
            AttemptClass::Retry,
            None,
            3,
            collect(&mut out),
        );
        queued(a);
        assert_eq!(out, [(2, false)]);
        // The worker goes to waiter 1, then 3.
        out.clear();
        q.finish_at(t0 + 30 * MS, t0, collect(&mut out));
        q.finish_at(t0 + 30 * MS, t0, collect(&mut out));
        assert_eq!(out, [(1, true), (3, true)]);
    }

    #[test]
    fn expired_waiters_are_skipped_when_a_worker_frees_up() {
        let mut q = queue(config(1, 4));
        let t0 = Instant::now();
        q.arrive_at(t0, AttemptClass::First, None, 0, none);
        queued(q.arrive_at(t0, AttemptClass::First, Some(t0 + 5 * MS), 1, none));
        queued(q.arrive_at(t0, AttemptClass::First, None, 2, none));
        let mut out = Vec::new();
        q.finish_at(t0 + 4 * MS, t0, collect(&mut out));
        assert_eq!(out, [(1, false), (2, true)]);
        // max_time_queued (100 ms) applies without a deadline.
        let id = queued(q.arrive_at(t0 + 4 * MS, AttemptClass::First, None, 3, none));
        assert!(q.is_waiting(id));
        out.clear();
        q.expire_due_at(t0 + 103 * MS, collect(&mut out));
        assert!(out.is_empty());
        q.expire_due_at(t0 + 104 * MS, collect(&mut out));
        assert_eq!(out, [(3, false)]);
        assert!(!q.is_waiting(id));
    }

    #[test]
    fn withdrawn_waiters_leave_and_given_back_workers_move_on() {
        let mut q = queue(config(1, 4));
        let t0 = Instant::now();
        q.arrive_at(t0, AttemptClass::First, None, 0, none);
        let a = queued(q.arrive_at(t0, AttemptClass::First, None, 1, none));
        queued(q.arrive_at(t0, AttemptClass::First, None, 2, none));
        let left = q.withdraw_at(t0 + 3 * MS, a).unwrap();
        assert_eq!((left.waiter, left.waited), (1, 3 * MS));
        assert!(q.withdraw_at(t0 + 3 * MS, a).is_none());
        // The running call finishes; waiter 2 is handed the worker but never uses it.
        let mut out = Vec::new();
        q.finish_at(t0 + 5 * MS, t0, collect(&mut out));
        assert_eq!(out, [(2, true)]);
        assert!(q.policy().completion_rate().mean_gap_at(t0).is_none());
        q.give_back_at(t0 + 6 * MS, none);
        assert_eq!((q.running(), q.free_workers(), q.depth()), (0, 1, 0));
        // One completion so far: a give-back is not one.
        q.arrive_at(t0 + 7 * MS, AttemptClass::First, None, 3, none);
        q.finish_at(t0 + 9 * MS, t0, none);
        assert_eq!(
            q.policy().completion_rate().mean_gap_at(t0 + 9 * MS),
            Some(4 * MS)
        );
    }

    #[test]
    fn the_worker_limit_changes_at_run_time() {
        let mut q = queue(config(1, 8));
        let t0 = Instant::now();
        q.arrive_at(t0, AttemptClass::First, None, 0, none);
        for i in 1..=4 {
            queued(q.arrive_at(t0, AttemptClass::First, None, i, none));
        }
        // Raised to 3: two waiters run at once.
        let mut out = Vec::new();
        q.set_worker_limit_at(t0 + MS, NonZeroUsize::new(3).unwrap(), collect(&mut out));
        assert_eq!(out, [(1, true), (2, true)]);
        assert_eq!((q.worker_limit(), q.running(), q.depth()), (3, 3, 2));
        // Lowered to 1: nothing stops, and finishing calls hand out no worker until
        // fewer than one runs.
        q.set_worker_limit_at(t0 + MS, NonZeroUsize::MIN, none);
        q.finish_at(t0 + 2 * MS, t0, none);
        q.finish_at(t0 + 3 * MS, t0, none);
        assert_eq!((q.running(), q.free_workers(), q.depth()), (1, 0, 2));
        out.clear();
        q.finish_at(t0 + 4 * MS, t0, collect(&mut out));
        assert_eq!(out, [(3, true)]);
        // A new arrival queues behind the remaining waiter: no free worker.
        queued(q.arrive_at(t0 + 4 * MS, AttemptClass::First, None, 5, none));
    }

    fn class(attempt: AttemptClass, criticality: Criticality) -> CallClass {
        CallClass::new(attempt, criticality)
    }

    #[test]
    fn sheddable_work_is_shed_first_then_retries_then_the_rest() {
        // Retries shed from 2 queued; sheddable as soon as no worker is free.
        let mut q = queue(config(1, 4));
        let t0 = Instant::now();
        let shed = |a: Arrival| match a {
            Arrival::Shed(s) => s.reason,
            other => panic!("not shed: {other:?}"),
        };
        let (first, retry) = (AttemptClass::First, AttemptClass::Retry);
        let sheddable = class(first, Criticality::Sheddable);
        let critical = class(first, Criticality::Critical);
        // A free worker: even sheddable work runs.
        assert_eq!(q.arrive_at(t0, sheddable, None, 0, none), Arrival::Run);
        // No worker free, nothing queued: sheddable is shed, a retry still queues.
        assert_eq!(
            shed(q.arrive_at(t0, sheddable, None, 1, none)),
            ShedReason::Sheddable
        );
        queued(q.arrive_at(t0, retry, None, 2, none));
        queued(q.arrive_at(t0, class(retry, Criticality::Critical), None, 3, none));
        // Depth 2: retries are shed, critical or not; first attempts queue.
        assert_eq!(
            shed(q.arrive_at(t0, class(retry, Criticality::Critical), None, 4, none)),
            ShedReason::RetryThreshold
        );
        queued(q.arrive_at(t0, first, None, 5, none));
        queued(q.arrive_at(t0, first, None, 6, none));
        assert_eq!(q.depth(), 4);
        // Full. Between calls of one criticality nothing gives way.
        assert_eq!(
            shed(q.arrive_at(t0, first, None, 7, none)),
            ShedReason::QueueFull
        );
        // A critical call takes the place of the lowest-ranked waiter of a lower
        // criticality: the default retry (2); the critical retry (3) is not one, so then
        // the oldest default first attempt (5), then the next (6).
        for (i, want) in [(8, 2), (9, 5), (10, 6)] {
            let mut out = Vec::new();
            queued(q.arrive_at(t0, critical, None, i, collect(&mut out)));
            assert_eq!(out, [(want, false)]);
        }
        // Now only critical calls wait: a critical arrival is shed like any other.
        assert_eq!(
            shed(q.arrive_at(t0, critical, None, 11, none)),
            ShedReason::QueueFull
        );
        assert_eq!(q.depth(), 4);
        let mut out = Vec::new();
        for _ in 0..5 {
            q.finish_at(t0 + MS, t0, collect(&mut out));
        }
        assert_eq!(out, [(3, true), (8, true), (9, true), (10, true)]);
    }

    #[test]
    fn a_displaced_waiter_is_told_when_to_come_back() {
        // Sheddable work may queue here: its threshold is off.
        let mut q = queue(AdmissionConfig {
            sheddable_threshold: RetryThreshold {
                depth: None,
                queue_delay: None,
            },
            ..config(1, 2)
        });
        let t0 = Instant::now();
        let sheddable = |a| class(a, Criticality::Sheddable);
        q.arrive_at(t0, AttemptClass::First, None, 0, none);
        queued(q.arrive_at(t0, sheddable(AttemptClass::First), None, 1, none));
        queued(q.arrive_at(t0, AttemptClass::First, None, 2, none));
        let mut seen = Vec::new();
        queued(q.arrive_at(t0 + MS, AttemptClass::First, None, 3, |d| seen.push(d)));
        match seen.as_slice() {
            [Dispatch::Shed(left, shed)] => {
                assert_eq!((left.waiter, left.waited), (1, MS));
                assert_eq!(left.class, sheddable(AttemptClass::First));
                assert_eq!(shed.reason, ShedReason::Sheddable);
                assert!(shed.pushback.millis() >= 1);
            }
            other => panic!("{other:?}"),
        }
        // The displaced waiter never gets a worker.
        let mut out = Vec::new();
        q.finish_at(t0 + 2 * MS, t0, collect(&mut out));
        q.finish_at(t0 + 3 * MS, t0, collect(&mut out));
        assert_eq!(out, [(2, true), (3, true)]);
    }

    #[test]
    fn an_adaptive_limit_is_fed_by_finishing_calls() {
        let mut q = queue(AdmissionConfig {
            workers: 8,
            adaptive: Some(AdaptiveLimitConfig {
                min_limit: 2,
                max_limit: 64,
                min_window_samples: 4,
                ..AdaptiveLimitConfig::default()
            }),
            ..config(8, 64)
        });
        assert_eq!(q.worker_limit(), 8);
        let t0 = Instant::now();
        for i in 0..8 {
            assert_eq!(
                q.arrive_at(t0, AttemptClass::First, None, i, none),
                Arrival::Run
            );
        }
        for i in 8..20 {
            queued(q.arrive_at(t0, AttemptClass::First, None, i, none));
        }
        // The first finish starts a probe: the limit drops to the floor and no waiter
        // gets the freed worker.
        q.finish_at(t0 + 10 * MS, t0, none);
        assert_eq!(q.worker_limit(), 2);
        assert!(q.adaptive().unwrap().probing());
        // Calls drain to the floor; then 4 clean calls of 10 ms measure the no-load
        // latency and the limit returns to 8.
        let mut now = t0 + 10 * MS;
        for _ in 0..5 {
            q.finish_at(now, t0, none);
        }
        assert_eq!(q.running(), 2);
        // Two calls that started before the floor was reached: not clean samples.
        let mut out = Vec::new();
        q.finish_at(now, t0, collect(&mut out));
        q.finish_at(now, t0, collect(&mut out));
        assert_eq!(out, [(8, true), (9, true)]);
        assert!(q.adaptive().unwrap().probing());
        // Four clean ones (two rounds of two) end the probe; the limit is back at 8 and
        // the freed workers go to waiters at once.
        for _ in 0..2 {
            now += 10 * MS;
            q.finish_at(now, now - 10 * MS, |_| {});
            q.finish_at(now, now - 10 * MS, |_| {});
        }
        assert!(!q.adaptive().unwrap().probing());
        assert_eq!(q.adaptive().unwrap().min_latency(), Some(10 * MS));
        assert_eq!(q.worker_limit(), 8);
        assert_eq!(q.running(), 8);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Arrive {
            retry: bool,
            deadline_ms: Option<u64>,
            criticality: Criticality,
        },
        Finish,
        Withdraw(usize),
        GiveBack,
        Limit(usize),
        Wait(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (any::<bool>(), proptest::option::of(0u64..60), 0usize..3)
                .prop_map(|(retry, deadline_ms, c)| Op::Arrive {
                    retry,
                    deadline_ms,
                    criticality: Criticality::ALL[c],
                }),
            2 => Just(Op::Finish),
            1 => (0usize..16).prop_map(Op::Withdraw),
            1 => Just(Op::GiveBack),
            1 => (1usize..6).prop_map(Op::Limit),
            2 => (0u64..30).prop_map(Op::Wait),
        ]
    }

    proptest! {
        /// Whatever the driver does: the queue never exceeds its capacity, never leaves a
        /// worker free while someone waits, never keeps a waiter past its expiry after
        /// an operation, and every queued call leaves exactly once.
        #[test]
        fn invariants_hold(ops in proptest::collection::vec(op(), 1..200), lifo in any::<bool>()) {
            let mut q = queue(AdmissionConfig {
                queue_order: if lifo {
                    QueueOrder::AdaptiveLifo { from_depth: 3 }
                } else {
                    QueueOrder::Fifo
                },
                max_time_queued: 40 * MS,
                ..config(2, 6)
            });
            let mut now = Instant::now();
            let mut queued_ids: Vec<QueuedId> = Vec::new();
            let mut expiries = std::collections::HashMap::new();
            let mut left = std::collections::HashSet::new();
            let mut granted = 0usize;
            for op in ops {
                // Operations that take a sink take the expired waiters out first.
                let mut purged = matches!(op, Op::Arrive { .. } | Op::Limit(_));
                let mut seen = Vec::new();
                let mut sink = |d: Dispatch<u32>| seen.push(d);
                match op {
                    Op::Arrive { retry, deadline_ms, criticality } => {
                        let attempt = if retry { AttemptClass::Retry } else { AttemptClass::First };
                        let class = CallClass::new(attempt, criticality);
                        let deadline = deadline_ms.map(|d| now + Duration::from_millis(d));
                        let before = q.depth();
                        match q.arrive_at(now, class, deadline, 0, &mut sink) {
                            Arrival::Queued { id, expiry } => {
                                prop_assert!(expiry > now);
                                queued_ids.push(id);
                                expiries.insert(id, expiry);
                            }
                            Arrival::Expired => {
                                prop_assert!(deadline.is_some_and(|d| d <= now + 2 * MS));
                            }
                            Arrival::Run | Arrival::Shed(_) => {}
                        }
                        prop_assert!(q.depth() <= before + 1);
                    }
                    Op::Finish => {
                        if q.running() > 0 {
                            purged = true;
                            q.finish_at(now, now, &mut sink);
                        }
                    }
                    Op::Withdraw(i) => {
                        if let Some(&id) = queued_ids.get(i)
                            && let Some(l) = q.withdraw_at(now, id)
                        {
                            prop_assert!(left.insert(l.id), "left twice: {:?}", l.id);
                        }
                    }
                    Op::GiveBack => {
                        if granted > 0 && q.running() > 0 {
                            granted -= 1;
                            purged = true;
                            q.give_back_at(now, &mut sink);
                        }
                    }
                    Op::Limit(n) => {
                        q.set_worker_limit_at(now, NonZeroUsize::new(n).unwrap(), &mut sink);
                    }
                    Op::Wait(ms) => now += Duration::from_millis(ms),
                }
                for d in seen {
                    let l = match d {
                        Dispatch::Run(l) => {
                            granted += 1;
                            prop_assert!(expiries[&l.id] > now, "ran after its expiry");
                            l
                        }
                        Dispatch::Expired(l) => {
                            prop_assert!(expiries[&l.id] <= now, "expired early");
                            l
                        }
                        Dispatch::Shed(l, shed) => {
                            prop_assert_eq!(shed.reason, ShedReason::Sheddable);
                            l
                        }
                    };
                    prop_assert!(left.insert(l.id), "left twice: {:?}", l.id);
                }
                prop_assert!(q.depth() <= 6);
                if q.free_workers() > 0 {
                    prop_assert_eq!(q.depth(), 0);
                }
                if purged {
                    let first = q.by_expiry.first().map(|(e, _)| *e);
                    prop_assert!(first.is_none_or(|e| e > now), "an expired waiter stayed");
                }
                prop_assert_eq!(q.by_expiry.len(), q.waiting.len());
            }
        }
    }
}
