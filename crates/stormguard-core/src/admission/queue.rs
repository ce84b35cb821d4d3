//! The admission queue: workers, waiters and every decision about them, in one place.
//!
//! See [`AdmissionQueue`](crate::AdmissionQueue) for what it does and why.

use std::collections::{BTreeMap, BTreeSet};
#[cfg(test)]
use std::num::NonZeroUsize;
use std::time::Duration;

use tokio::time::Instant;

use super::config::{CallClass, WorkerLimit};
use super::limit::AdaptiveLimit;
use super::limit::Ended;
use super::{Admission, AdmissionController, Oldest, QueueLoad, Shed, ShedReason};
use crate::criticality::Criticality;
use crate::wire::AttemptClass;

/// The place of one queued call, unique for the life of its queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueuedId(u64);

impl QueuedId {}

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
/// [`AdmissionConfig::queue_capacity`](crate::AdmissionConfig::queue_capacity) waiters. Not shared: wrap it in a lock if
/// several tasks drive it.
///
/// [`AdmissionController`] answers one question at a time (admit, queue or shed this call;
/// which end of the queue to serve; when queued work expires). Something still has to
/// hold the workers and the waiters and ask those questions at the right moments, and
/// that part decides too: whether work too close to its deadline is refused before it
/// takes a free worker, whether expired waiters count as load, who gets a worker that
/// frees up. [`AdmissionQueue`] is that part. The tower layer in `stormguard-server` wraps
/// it in a mutex (with wakers and RAII permits), and the fleet simulator drives the very
/// same type on its virtual clock, so the two cannot decide differently.
///
/// It is runtime-agnostic: every operation takes `now` and nothing sleeps or spawns. The
/// driver keeps one timer per queued call (the `expiry` returned when it was queued) and
/// calls [`AdmissionQueue::withdraw_at`] when it fires, or when the caller goes away.
/// Expired waiters are also taken out at the start of every operation, so a decision
/// never counts work whose time is up, whichever of two events at the same instant the
/// driver happens to run first.
///
/// # What it decides
///
/// - [`AdmissionQueue::arrive_at`]: work whose deadline leaves less than
///   [`min_time_left`](crate::AdmissionConfig::min_time_left) is refused at once, even with a
///   worker free (it could not finish; running it takes a worker from a call that
///   can); otherwise the policy admits, queues or sheds it.
/// - [`AdmissionQueue::finish_at`] / [`AdmissionQueue::give_back_at`]: a worker turned
///   over; the next live waiter gets it, oldest or newest first as the policy says for
///   the depth of *live* waiters.
/// - Criticality ([`Criticality`](crate::Criticality)): sheddable calls are shed first, retries
///   next; and when the queue is full, a call takes the place of a waiter of a *lower
///   criticality* if there is one (the lowest-ranked by `CallClass::rank`, the oldest
///   of those), which is answered with the shed status ([`Dispatch::Shed`]). So a full
///   queue of default work does not turn away a critical call, nor one of sheddable
///   work a default one. Between calls of one criticality nothing changes: a full queue
///   sheds the arrival.
/// - The worker limit ([`AdmissionConfig::workers`](crate::AdmissionConfig::workers)): adaptive
///   ([`AdaptiveLimitConfig`](crate::AdaptiveLimitConfig)) or fixed: every call that leaves its
///   worker ([`AdmissionQueue::finish_at`], with the instant it started) is a latency
///   sample, and the limit follows them. `AdmissionQueue::set_worker_limit_at` sets it
///   from outside. Raising the limit hands the new workers to waiters at once; lowering
///   it takes effect as running calls finish.
///
/// Workers handed to waiters, waiters found expired and waiters that gave their place
/// up are reported to a `sink` closure as [`Dispatch`] values, in the order they happen.
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::Instant;
/// use stormguard_core::{AdmissionConfig, AdmissionController, WorkerLimit};
/// use stormguard_core::wire::AttemptClass;
/// use stormguard_core::{AdmissionQueue, Arrival, Dispatch};
///
/// let config = AdmissionConfig { workers: WorkerLimit::Fixed(1), queue_capacity: 16, ..AdmissionConfig::default() };
/// let mut queue = AdmissionQueue::new(AdmissionController::new(config).expect("valid config"));
/// let t0 = Instant::now();
/// let ignore = |_: Dispatch<&str>| {};
///
/// // The first call takes the worker, the second waits for it.
/// let first = queue.arrive_at(t0, AttemptClass::First, None, "a", ignore);
/// assert_eq!(first, Arrival::Run);
/// let Arrival::Queued { id, .. } = queue.arrive_at(t0, AttemptClass::First, None, "b", ignore)
/// else { panic!("queued") };
///
/// // Too little time left: refused at once, never queued.
/// let close = Some(t0 + Duration::from_millis(1));
/// assert_eq!(queue.arrive_at(t0, AttemptClass::First, close, "c", ignore), Arrival::Expired);
///
/// // When the first call finishes, the worker goes to "b".
/// let mut handed = Vec::new();
/// queue.finish_at(t0 + Duration::from_millis(5), t0, |d| handed.push(d));
/// assert!(matches!(handed.as_slice(), [Dispatch::Run(left)] if left.id == id && left.waiter == "b"));
/// ```
#[derive(Debug)]
pub struct AdmissionQueue<T> {
    policy: AdmissionController,
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
    /// adaptive limit, [`AdaptiveLimitConfig::initial_limit`](crate::AdaptiveLimitConfig::initial_limit) of them).
    pub fn new(policy: AdmissionController) -> Self {
        let config = policy.config();
        let adaptive = match &config.workers {
            // The policy validated its config, adaptive part included, and always has
            // its seed (drawn when none was set).
            WorkerLimit::Adaptive(adaptive) => {
                AdaptiveLimit::new(adaptive.clone(), config.seed.unwrap_or_default()).ok()
            }
            WorkerLimit::Fixed(_) => None,
        };
        let limit = adaptive
            .as_ref()
            .map_or(config.workers.initial(), AdaptiveLimit::limit);
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

    /// The adaptive limit's estimate of a call's latency without load (the base of its
    /// limit), once it has one; `None` for a fixed limit.
    pub fn min_latency(&self) -> Option<Duration> {
        self.adaptive.as_ref().and_then(AdaptiveLimit::min_latency)
    }

    /// The policy (its configuration, its completion-rate estimate).
    pub fn policy(&self) -> &AdmissionController {
        &self.policy
    }

    /// Calls that may run at once now (initially the fixed number, or where the adaptive
    /// limit starts).
    pub fn worker_limit(&self) -> usize {
        self.limit
    }

    /// Calls running now. Above [`AdmissionQueue::worker_limit`] for a while after the
    /// limit was lowered.
    pub fn running(&self) -> usize {
        self.running
    }

    #[cfg(test)]
    /// Whether the call queued as `id` is still waiting.
    pub(crate) fn is_waiting(&self, id: QueuedId) -> bool {
        self.waiting.contains_key(&id.0)
    }

    /// What the driver stored with the waiting call `id` (to update a waker, say).
    pub fn waiter_mut(&mut self, id: QueuedId) -> Option<&mut T> {
        self.waiting.get_mut(&id.0).map(|w| &mut w.waiter)
    }

    /// The state a decision is made against: workers free now (never above 0 while
    /// anyone waits), calls waiting now (expired ones included until the next operation
    /// takes them out) and since when the oldest has waited.
    pub fn load(&self) -> QueueLoad {
        QueueLoad {
            free_workers: self.limit.saturating_sub(self.running),
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
        self.release_at(now, started, Ended::Served, sink);
    }

    /// A running call that got its worker at `started` was abandoned at `now` (its caller
    /// left mid-run): as [`finish_at`](Self::finish_at), but its time on the worker is
    /// only a lower bound on its latency, which an adaptive limit reads as such.
    pub fn abandon_at(&mut self, now: Instant, started: Instant, sink: impl FnMut(Dispatch<T>)) {
        self.release_at(now, started, Ended::Abandoned, sink);
    }

    /// A running call that got its worker at `started` was answered at `now` without being
    /// served (its answer's code is an overload or expiry code,
    /// [`Code::is_overload`](crate::Code::is_overload)): as [`finish_at`](Self::finish_at),
    /// but an adaptive limit takes no latency sample from it (an answer that
    /// served nothing says nothing about how long serving takes).
    pub fn finish_not_served_at(
        &mut self,
        now: Instant,
        started: Instant,
        sink: impl FnMut(Dispatch<T>),
    ) {
        self.release_at(now, started, Ended::NotServed, sink);
    }

    /// A running call's response streams on, idle between messages, at `now`: its worker
    /// goes to the next live waiter, as for [`finish_at`](Self::finish_at), but an adaptive
    /// limit takes no latency sample (a stream's length is no call's latency). A stream
    /// holds a worker while its handler works, not while it waits for its next message.
    pub fn stream_idle_at(&mut self, now: Instant, sink: impl FnMut(Dispatch<T>)) {
        self.release_at(now, now, Ended::Streaming, sink);
    }

    fn release_at(
        &mut self,
        now: Instant,
        started: Instant,
        ended: Ended,
        sink: impl FnMut(Dispatch<T>),
    ) {
        self.running = self.running.saturating_sub(1);
        self.policy.record_completion_at(now);
        if let Some(adaptive) = &mut self.adaptive {
            self.limit = adaptive.record_at(now, started, self.running, ended);
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
    pub(crate) fn expire_due_at(&mut self, now: Instant, mut sink: impl FnMut(Dispatch<T>)) {
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

    #[cfg(test)]
    /// Sets the number of calls that may run at once, from `now` on. Raised: the new
    /// workers go to waiters at once (reported to `sink`). Lowered: no call is stopped;
    /// no waiter gets a worker until fewer than `limit` calls run. With an adaptive
    /// limit, the limit's next decision replaces this value.
    pub(crate) fn set_worker_limit_at(
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
            let oldest = self.waiting.first_key_value().map(|(_, w)| Oldest {
                enqueued_at: w.enqueued_at,
                expiry: w.expiry,
            });
            let newest = self.policy.serve_newest(now, self.waiting.len(), oldest);
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
mod tests;
