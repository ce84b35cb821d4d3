//! The admission queue shared by every clone of a [`ShedService`](super::ShedService).
//!
//! Why not `tokio::sync::Semaphore`? Its waiters are served strictly oldest-first and are
//! invisible from outside: it cannot serve the newest call first under overload, cannot
//! say how long the oldest call has waited (the retry threshold by queue delay), and
//! cannot skip expired waiters when a worker frees up. So the queue keeps its own
//! waiter list, hands a freed worker directly to the chosen waiter, and wakes it.
//!
//! Every decision (admit, queue, shed, expire, which waiter runs next, pushback) is
//! [`stormguard_core::queue::AdmissionQueue`]'s, the same type the fleet simulator
//! drives on its virtual clock. This module is only the synchronisation around it: one
//! short-held mutex, a waker per waiter, the outcomes its futures have not yet seen, and
//! lock-free counters. Resources are still RAII: a [`WorkerPermit`] gives its worker back
//! when dropped, and a [`Ticket`] leaves the queue (or passes on a worker it was granted
//! but never used) when dropped, so a caller that goes away frees its slot at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::Duration;

use stormguard_core::Instant;
use stormguard_core::admission::{AdmissionPolicy, AttemptClass, Shed, ShedReason};
use stormguard_core::code::Code;
use stormguard_core::criticality::{CallClass, Criticality};
use stormguard_core::queue::{AdmissionQueue, Arrival as Admission, Dispatch, QueuedId};

use crate::stats::StatsSnapshot;

/// One server's admission queue: the core queue (every decision), the outcomes its
/// waiters have not yet seen, and the counters.
#[derive(Debug)]
pub(crate) struct Queue {
    state: Mutex<State>,
    counters: Counters,
    shed_code: Code,
}

#[derive(Debug)]
struct State {
    /// Workers, waiters (each with the waker of its task) and the decisions about them.
    core: AdmissionQueue<Option<Waker>>,
    /// Calls taken out of the queue whose future has not yet seen the outcome.
    /// At most `workers` granted plus the expired ones; every entry was a waiter.
    decided: HashMap<QueuedId, Outcome>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Granted,
    Expired,
    /// A call of a higher rank took its place in a full queue.
    Shed(Shed),
}

#[derive(Debug, Default)]
struct Counters {
    admitted: AtomicU64,
    completed: AtomicU64,
    shed_first: AtomicU64,
    shed_retry: AtomicU64,
    shed_sheddable: AtomicU64,
    shed_displaced: AtomicU64,
    expired: AtomicU64,
    cancelled_queued: AtomicU64,
    dequeued: AtomicU64,
    time_queued_us: AtomicU64,
    max_time_queued_us: AtomicU64,
    queue_depth: AtomicUsize,
    in_flight: AtomicUsize,
    workers: AtomicUsize,
    /// Where each call's time queued is also recorded, once a meter is set.
    #[cfg(feature = "opentelemetry")]
    time_queued: std::sync::OnceLock<crate::metrics::QueueTime>,
    /// The adaptive limit's no-load latency in microseconds; 0 until measured.
    min_latency_us: AtomicU64,
    /// Calls shed by attempt class, criticality and reason (see `shed_index`).
    shed_by: [AtomicU64; SHED_CELLS],
}

const CRITICALITIES: [Criticality; 3] = [
    Criticality::Sheddable,
    Criticality::Default,
    Criticality::Critical,
];
const SHED_CELLS: usize = 2 * CRITICALITIES.len() * ShedReason::ALL.len();

/// The cell of `shed_by` that counts calls of `class` shed for `reason`.
fn shed_index(class: CallClass, reason: ShedReason) -> usize {
    let a = match class.attempt {
        AttemptClass::First => 0,
        AttemptClass::Retry => 1,
    };
    let c = CRITICALITIES
        .iter()
        .position(|x| *x == class.criticality)
        .unwrap_or(1);
    let r = ShedReason::ALL
        .iter()
        .position(|x| *x == reason)
        .unwrap_or(0);
    (a * CRITICALITIES.len() + c) * ShedReason::ALL.len() + r
}

impl Counters {
    fn record_shed(&self, class: CallClass, reason: ShedReason) {
        let counter = match (class.criticality, class.attempt) {
            (Criticality::Sheddable, _) => &self.shed_sheddable,
            (_, AttemptClass::First) => &self.shed_first,
            (_, AttemptClass::Retry) => &self.shed_retry,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.shed_by[shed_index(class, reason)].fetch_add(1, Ordering::Relaxed);
    }

    fn record_time_queued(&self, waited: Duration) {
        let us = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        self.dequeued.fetch_add(1, Ordering::Relaxed);
        self.time_queued_us.fetch_add(us, Ordering::Relaxed);
        self.max_time_queued_us.fetch_max(us, Ordering::Relaxed);
        #[cfg(feature = "opentelemetry")]
        if let Some(histogram) = self.time_queued.get() {
            histogram.record(waited);
        }
    }
}

/// What happens to an arriving call.
#[derive(Debug)]
pub(crate) enum Arrival {
    /// Run now on this worker.
    Admitted(WorkerPermit),
    /// Wait; poll the ticket.
    Queued(Ticket),
    /// Answer with the shed status now.
    Shed(Shed),
    /// Its deadline is too close to be worth queuing: answer `DEADLINE_EXCEEDED` now.
    Expired,
}

/// A queued call's turn.
#[derive(Debug)]
pub(crate) enum Turn {
    /// Still waiting.
    Wait,
    /// A worker is yours.
    Run(WorkerPermit),
    /// Too late to run: answer `DEADLINE_EXCEEDED`.
    Expired,
    /// Gave its place to a call of a higher rank: answer with the shed status.
    Shed(Shed),
}

impl State {
    /// Runs `op` on the core queue and applies what it dispatched: a waiter given a
    /// worker or found expired is marked for its future and woken. Wakers are woken under
    /// the lock; a task's waker only schedules it.
    fn apply(
        &mut self,
        counters: &Counters,
        op: impl FnOnce(&mut AdmissionQueue<Option<Waker>>, &mut dyn FnMut(Dispatch<Option<Waker>>)),
    ) {
        let State { core, decided } = self;
        let mut sink = |dispatch: Dispatch<Option<Waker>>| {
            let (left, outcome) = match dispatch {
                Dispatch::Run(left) => (left, Outcome::Granted),
                Dispatch::Expired(left) => {
                    counters.expired.fetch_add(1, Ordering::Relaxed);
                    (left, Outcome::Expired)
                }
                Dispatch::Shed(left, shed) => {
                    counters.record_shed(left.class, shed.reason);
                    counters.shed_displaced.fetch_add(1, Ordering::Relaxed);
                    (left, Outcome::Shed(shed))
                }
            };
            counters.record_time_queued(left.waited);
            decided.insert(left.id, outcome);
            if let Some(waker) = left.waiter {
                waker.wake();
            }
        };
        op(core, &mut sink);
        counters.queue_depth.store(core.depth(), Ordering::Relaxed);
        counters.in_flight.store(core.running(), Ordering::Relaxed);
        counters
            .workers
            .store(core.worker_limit(), Ordering::Relaxed);
        if let Some(m) = core.adaptive().and_then(|a| a.min_latency()) {
            let us = u64::try_from(m.as_micros()).unwrap_or(u64::MAX).max(1);
            counters.min_latency_us.store(us, Ordering::Relaxed);
        }
    }
}

impl Queue {
    pub(crate) fn new(policy: AdmissionPolicy) -> Self {
        let shed_code = policy.config().shed_code;
        let counters = Counters::default();
        let core = AdmissionQueue::new(policy);
        counters
            .workers
            .store(core.worker_limit(), Ordering::Relaxed);
        Queue {
            state: Mutex::new(State {
                core,
                decided: HashMap::new(),
            }),
            counters,
            shed_code,
        }
    }

    pub(crate) fn shed_code(&self) -> Code {
        self.shed_code
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state half-updated in a way
        // that matters more than stopping the server would: keep serving.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Decides what to do with a call of `class`, with `deadline`, arriving at `now`.
    pub(crate) fn arrive(
        self: &Arc<Self>,
        now: Instant,
        class: impl Into<CallClass>,
        deadline: Option<Instant>,
    ) -> Arrival {
        let class = class.into();
        let mut admission = Admission::Expired;
        self.lock().apply(&self.counters, |core, sink| {
            admission = core.arrive_at(now, class, deadline, None, sink);
        });
        match admission {
            Admission::Run => {
                self.counters.admitted.fetch_add(1, Ordering::Relaxed);
                Arrival::Admitted(WorkerPermit {
                    queue: Arc::clone(self),
                    started: now,
                })
            }
            Admission::Queued { id, expiry } => Arrival::Queued(Ticket {
                queue: Arc::clone(self),
                id,
                expiry,
                settled: false,
            }),
            Admission::Shed(shed) => {
                self.counters.record_shed(class, shed.reason);
                Arrival::Shed(shed)
            }
            Admission::Expired => {
                self.counters.expired.fetch_add(1, Ordering::Relaxed);
                Arrival::Expired
            }
        }
    }

    /// Gives a worker back (a call that got it at `started` finished, or its caller
    /// left mid-run). Either way a worker turned over, so both feed the drain estimate
    /// and an adaptive limit.
    fn release(&self, now: Instant, started: Instant) {
        self.lock().apply(&self.counters, |core, sink| {
            core.finish_at(now, started, sink);
        });
    }

    /// Whether the call holding ticket `id` may run, given that its expiry timer has
    /// (`timer_fired`) or has not fired.
    fn poll_turn(
        self: &Arc<Self>,
        id: QueuedId,
        expiry: Instant,
        waker: &Waker,
        timer_fired: bool,
        now: Instant,
    ) -> Turn {
        let mut state = self.lock();
        let expired = timer_fired || expiry <= now;
        match state.decided.remove(&id) {
            Some(Outcome::Granted) if expired => {
                // Granted a worker, but too late to use it: pass it on.
                self.counters.expired.fetch_add(1, Ordering::Relaxed);
                state.apply(&self.counters, |core, sink| core.give_back_at(now, sink));
                return Turn::Expired;
            }
            Some(Outcome::Granted) => {
                drop(state);
                self.counters.admitted.fetch_add(1, Ordering::Relaxed);
                return Turn::Run(WorkerPermit {
                    queue: Arc::clone(self),
                    started: now,
                });
            }
            Some(Outcome::Expired) => return Turn::Expired,
            Some(Outcome::Shed(shed)) => return Turn::Shed(shed),
            None => {}
        }
        if expired {
            let mut left = None;
            state.apply(&self.counters, |core, _| left = core.withdraw_at(now, id));
            drop(state);
            if let Some(left) = left {
                self.counters.record_time_queued(left.waited);
                self.counters.expired.fetch_add(1, Ordering::Relaxed);
            }
            return Turn::Expired;
        }
        match state.core.waiter_mut(id) {
            Some(slot) => {
                if !slot.as_ref().is_some_and(|w| w.will_wake(waker)) {
                    *slot = Some(waker.clone());
                }
                Turn::Wait
            }
            // Unreachable while the ticket lives (only it removes its own entry), but
            // answering "expired" is the safe reading of a lost entry.
            None => Turn::Expired,
        }
    }

    /// The caller of ticket `id` went away before its turn was settled.
    fn leave(&self, id: QueuedId, now: Instant) {
        let mut state = self.lock();
        let mut left = None;
        state.apply(&self.counters, |core, _| left = core.withdraw_at(now, id));
        if let Some(left) = left {
            drop(state);
            self.counters.record_time_queued(left.waited);
            self.counters
                .cancelled_queued
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        if state.decided.remove(&id) == Some(Outcome::Granted) {
            // Granted but never used: the worker goes to the next waiter. Counted as
            // cancelled; its queued time was recorded when it was granted.
            self.counters
                .cancelled_queued
                .fetch_add(1, Ordering::Relaxed);
            state.apply(&self.counters, |core, sink| core.give_back_at(now, sink));
        }
    }

    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            admitted: get(&c.admitted),
            completed: get(&c.completed),
            shed_first: get(&c.shed_first),
            shed_retry: get(&c.shed_retry),
            shed_sheddable: get(&c.shed_sheddable),
            shed_displaced: get(&c.shed_displaced),
            expired: get(&c.expired),
            cancelled_queued: get(&c.cancelled_queued),
            queue_depth: c.queue_depth.load(Ordering::Relaxed),
            in_flight: c.in_flight.load(Ordering::Relaxed),
            dequeued: get(&c.dequeued),
            time_queued_us: get(&c.time_queued_us),
            max_time_queued_us: get(&c.max_time_queued_us),
            worker_limit: c.workers.load(Ordering::Relaxed),
            min_latency_us: Some(get(&c.min_latency_us)).filter(|us| *us > 0),
        }
    }

    /// Exact internal sizes, read under the lock: (free workers, waiting, decided).
    pub(crate) fn occupancy(&self) -> (usize, usize, usize) {
        let state = self.lock();
        (
            state.core.free_workers(),
            state.core.depth(),
            state.decided.len(),
        )
    }

    /// The number of workers (the concurrency limit) now.
    /// Records each call's time queued into `histogram` from now on (the first one set
    /// stays).
    #[cfg(feature = "opentelemetry")]
    pub(crate) fn record_time_queued_into(&self, histogram: crate::metrics::QueueTime) {
        let _ = self.counters.time_queued.set(histogram);
    }

    /// Calls shed so far by attempt class, criticality and reason (every combination, zeros
    /// included): `(attempt, criticality, reason, count)`.
    #[cfg(feature = "opentelemetry")]
    pub(crate) fn shed_breakdown(
        &self,
    ) -> impl Iterator<Item = (AttemptClass, Criticality, ShedReason, u64)> + '_ {
        [AttemptClass::First, AttemptClass::Retry]
            .into_iter()
            .flat_map(|a| CRITICALITIES.into_iter().map(move |c| (a, c)))
            .flat_map(|(a, c)| ShedReason::ALL.into_iter().map(move |r| (a, c, r)))
            .map(|(a, c, r)| {
                let n = self.counters.shed_by[shed_index(CallClass::new(a, c), r)]
                    .load(Ordering::Relaxed);
                (a, c, r, n)
            })
    }

    /// Calls waiting for a worker now (read without the lock).
    pub(crate) fn depth(&self) -> usize {
        self.counters.queue_depth.load(Ordering::Relaxed)
    }

    pub(crate) fn workers(&self) -> usize {
        self.counters.workers.load(Ordering::Relaxed)
    }
}

/// A worker, held while a call runs; given back (to the next waiter, or freed) on drop.
#[derive(Debug)]
pub(crate) struct WorkerPermit {
    queue: Arc<Queue>,
    /// When the call got the worker (its latency sample starts here).
    started: Instant,
}

impl WorkerPermit {
    /// The call finished on this worker: count it and give the worker back.
    pub(crate) fn finished(self) {
        self.queue
            .counters
            .completed
            .fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for WorkerPermit {
    fn drop(&mut self) {
        self.queue.release(Instant::now(), self.started);
    }
}

/// A place in the queue. Dropping it before its turn is settled leaves the queue (or
/// passes on a worker granted but not yet taken).
#[derive(Debug)]
pub(crate) struct Ticket {
    queue: Arc<Queue>,
    id: QueuedId,
    expiry: Instant,
    settled: bool,
}

impl Ticket {
    /// When the call stops being worth running.
    pub(crate) fn expiry(&self) -> Instant {
        self.expiry
    }

    /// The status of a shed answer.
    pub(crate) fn shed_code(&self) -> Code {
        self.queue.shed_code
    }

    /// Checks the call's turn; registers `waker` while it waits.
    pub(crate) fn poll_turn(&mut self, waker: &Waker, timer_fired: bool) -> Turn {
        let turn = self
            .queue
            .poll_turn(self.id, self.expiry, waker, timer_fired, Instant::now());
        if !matches!(turn, Turn::Wait) {
            self.settled = true;
        }
        turn
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.settled {
            self.queue.leave(self.id, Instant::now());
        }
    }
}

#[cfg(test)]
mod parity;
