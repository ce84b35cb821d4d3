//! The admission queue shared by every clone of a [`ShedService`](super::ShedService).
//!
//! Why not `tokio::sync::Semaphore`? Its waiters are served strictly oldest-first and are
//! invisible from outside: it cannot serve the newest call first under overload, cannot
//! say how long the oldest call has waited (the retry threshold by queue delay), and
//! cannot skip expired waiters when a worker frees up. So the queue keeps its own
//! waiter list under one short-held mutex, and hands a freed worker directly to the
//! chosen waiter. Resources are still RAII: a [`WorkerPermit`] gives its worker back
//! when dropped, and a [`Ticket`] leaves the queue (or passes on a worker it was granted
//! but never used) when dropped, so a caller that goes away frees its slot at once.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::Duration;

use stormguard_core::Instant;
use stormguard_core::admission::{AdmissionPolicy, AttemptClass, Decision, QueueLoad, Shed};
use stormguard_core::code::Code;

use crate::stats::StatsSnapshot;

/// One server's admission queue: the policy, the free workers, the waiters, the counters.
#[derive(Debug)]
pub(crate) struct Queue {
    state: Mutex<State>,
    counters: Counters,
    workers: usize,
    shed_code: Code,
}

#[derive(Debug)]
struct State {
    policy: AdmissionPolicy,
    free: usize,
    /// Calls waiting for a worker, by arrival order (the first is the oldest).
    waiting: BTreeMap<u64, Waiter>,
    /// Calls taken out of `waiting` whose future has not yet seen the outcome.
    /// At most `workers` granted plus the expired ones; every entry was a waiter.
    decided: HashMap<u64, Outcome>,
    next_seq: u64,
}

#[derive(Debug)]
struct Waiter {
    waker: Option<Waker>,
    enqueued_at: Instant,
    expiry: Instant,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Granted,
    Expired,
}

#[derive(Debug, Default)]
struct Counters {
    admitted: AtomicU64,
    completed: AtomicU64,
    shed_first: AtomicU64,
    shed_retry: AtomicU64,
    expired: AtomicU64,
    cancelled_queued: AtomicU64,
    dequeued: AtomicU64,
    time_queued_us: AtomicU64,
    max_time_queued_us: AtomicU64,
    queue_depth: AtomicUsize,
    in_flight: AtomicUsize,
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
}

impl Queue {
    pub(crate) fn new(policy: AdmissionPolicy) -> Self {
        let workers = policy.config().workers;
        let shed_code = policy.config().shed_code;
        Queue {
            state: Mutex::new(State {
                policy,
                free: workers,
                waiting: BTreeMap::new(),
                decided: HashMap::new(),
                next_seq: 0,
            }),
            counters: Counters::default(),
            workers,
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
        class: AttemptClass,
        deadline: Option<Instant>,
    ) -> Arrival {
        let mut state = self.lock();
        // Work that cannot finish in time is answered now, whether or not a worker is free:
        // running it would only take a worker from a call that can finish (and tonic's own
        // timer would answer it CANCELLED a moment later).
        let expiry = state.policy.expiry(now, deadline);
        if expiry <= now {
            drop(state);
            self.counters.expired.fetch_add(1, Ordering::Relaxed);
            return Arrival::Expired;
        }
        let load = QueueLoad {
            free_workers: state.free,
            depth: state.waiting.len(),
            oldest_enqueued: state.waiting.first_key_value().map(|(_, w)| w.enqueued_at),
        };
        match state.policy.decide_at(now, load, class) {
            Decision::Admit => {
                state.free -= 1;
                self.set_in_flight(&state);
                drop(state);
                self.counters.admitted.fetch_add(1, Ordering::Relaxed);
                Arrival::Admitted(WorkerPermit {
                    queue: Arc::clone(self),
                })
            }
            Decision::Queue => {
                let seq = state.next_seq;
                state.next_seq += 1;
                state.waiting.insert(
                    seq,
                    Waiter {
                        waker: None,
                        enqueued_at: now,
                        expiry,
                    },
                );
                self.set_depth(&state);
                Arrival::Queued(Ticket {
                    queue: Arc::clone(self),
                    seq,
                    expiry,
                    settled: false,
                })
            }
            Decision::Shed(shed) => {
                drop(state);
                let counter = match class {
                    AttemptClass::First => &self.counters.shed_first,
                    AttemptClass::Retry => &self.counters.shed_retry,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                Arrival::Shed(shed)
            }
        }
    }

    /// Gives a worker back (a call finished or its caller left mid-run). Either way a
    /// worker turned over, so both feed the drain estimate.
    fn release(&self, now: Instant) {
        let mut state = self.lock();
        state.policy.record_completion_at(now);
        let wake = self.hand_off(&mut state, now);
        drop(state);
        if let Some(waker) = wake {
            waker.wake();
        }
    }

    /// Gives one free worker to the next live waiter (oldest or newest per the policy),
    /// marking the expired waiters met on the way; with no live waiter the worker
    /// becomes free. Returns the waker of the waiter to wake.
    fn hand_off(&self, state: &mut State, now: Instant) -> Option<Waker> {
        loop {
            let newest = state.policy.serve_newest(state.waiting.len());
            let next = if newest {
                state.waiting.pop_last()
            } else {
                state.waiting.pop_first()
            };
            let Some((seq, waiter)) = next else {
                state.free += 1;
                self.set_depth(state);
                self.set_in_flight(state);
                return None;
            };
            self.record_time_queued(now.saturating_duration_since(waiter.enqueued_at));
            if waiter.expiry <= now {
                state.decided.insert(seq, Outcome::Expired);
                self.counters.expired.fetch_add(1, Ordering::Relaxed);
                if let Some(waker) = waiter.waker {
                    waker.wake();
                }
                continue;
            }
            state.decided.insert(seq, Outcome::Granted);
            self.set_depth(state);
            return waiter.waker;
        }
    }

    /// Whether the call holding ticket `seq` may run, given that its expiry timer has
    /// (`timer_fired`) or has not fired.
    fn poll_turn(
        self: &Arc<Self>,
        seq: u64,
        expiry: Instant,
        waker: &Waker,
        timer_fired: bool,
        now: Instant,
    ) -> Turn {
        let mut state = self.lock();
        let expired = timer_fired || expiry <= now;
        match state.decided.remove(&seq) {
            Some(Outcome::Granted) if expired => {
                // Granted a worker, but too late to use it: pass it on.
                self.counters.expired.fetch_add(1, Ordering::Relaxed);
                let wake = self.hand_off(&mut state, now);
                drop(state);
                if let Some(waker) = wake {
                    waker.wake();
                }
                return Turn::Expired;
            }
            Some(Outcome::Granted) => {
                drop(state);
                self.counters.admitted.fetch_add(1, Ordering::Relaxed);
                return Turn::Run(WorkerPermit {
                    queue: Arc::clone(self),
                });
            }
            Some(Outcome::Expired) => return Turn::Expired,
            None => {}
        }
        if expired {
            if let Some(waiter) = state.waiting.remove(&seq) {
                self.set_depth(&state);
                drop(state);
                self.record_time_queued(now.saturating_duration_since(waiter.enqueued_at));
                self.counters.expired.fetch_add(1, Ordering::Relaxed);
            }
            return Turn::Expired;
        }
        match state.waiting.get_mut(&seq) {
            Some(waiter) => {
                if !waiter.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
                    waiter.waker = Some(waker.clone());
                }
                Turn::Wait
            }
            // Unreachable while the ticket lives (only it removes its own entry), but
            // answering "expired" is the safe reading of a lost entry.
            None => Turn::Expired,
        }
    }

    /// The caller of ticket `seq` went away before its turn was settled.
    fn leave(&self, seq: u64, now: Instant) {
        let mut state = self.lock();
        if let Some(waiter) = state.waiting.remove(&seq) {
            self.set_depth(&state);
            drop(state);
            self.record_time_queued(now.saturating_duration_since(waiter.enqueued_at));
            self.counters
                .cancelled_queued
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        if state.decided.remove(&seq) == Some(Outcome::Granted) {
            // Granted but never used: the worker goes to the next waiter. Counted as
            // cancelled; its queued time was recorded when it was granted.
            self.counters
                .cancelled_queued
                .fetch_add(1, Ordering::Relaxed);
            let wake = self.hand_off(&mut state, now);
            drop(state);
            if let Some(waker) = wake {
                waker.wake();
            }
        }
    }

    fn record_time_queued(&self, waited: Duration) {
        let us = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        let c = &self.counters;
        c.dequeued.fetch_add(1, Ordering::Relaxed);
        c.time_queued_us.fetch_add(us, Ordering::Relaxed);
        c.max_time_queued_us.fetch_max(us, Ordering::Relaxed);
    }

    fn set_depth(&self, state: &State) {
        self.counters
            .queue_depth
            .store(state.waiting.len(), Ordering::Relaxed);
    }

    fn set_in_flight(&self, state: &State) {
        self.counters
            .in_flight
            .store(self.workers - state.free, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            admitted: get(&c.admitted),
            completed: get(&c.completed),
            shed_first: get(&c.shed_first),
            shed_retry: get(&c.shed_retry),
            expired: get(&c.expired),
            cancelled_queued: get(&c.cancelled_queued),
            queue_depth: c.queue_depth.load(Ordering::Relaxed),
            in_flight: c.in_flight.load(Ordering::Relaxed),
            dequeued: get(&c.dequeued),
            time_queued_us: get(&c.time_queued_us),
            max_time_queued_us: get(&c.max_time_queued_us),
        }
    }

    /// Exact internal sizes, read under the lock: (free workers, waiting, decided).
    pub(crate) fn occupancy(&self) -> (usize, usize, usize) {
        let state = self.lock();
        (state.free, state.waiting.len(), state.decided.len())
    }

    pub(crate) fn workers(&self) -> usize {
        self.workers
    }
}

/// A worker, held while a call runs; given back (to the next waiter, or freed) on drop.
#[derive(Debug)]
pub(crate) struct WorkerPermit {
    queue: Arc<Queue>,
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
        self.queue.release(Instant::now());
    }
}

/// A place in the queue. Dropping it before its turn is settled leaves the queue (or
/// passes on a worker granted but not yet taken).
#[derive(Debug)]
pub(crate) struct Ticket {
    queue: Arc<Queue>,
    seq: u64,
    expiry: Instant,
    settled: bool,
}

impl Ticket {
    /// When the call stops being worth running.
    pub(crate) fn expiry(&self) -> Instant {
        self.expiry
    }

    /// Checks the call's turn; registers `waker` while it waits.
    pub(crate) fn poll_turn(&mut self, waker: &Waker, timer_fired: bool) -> Turn {
        let turn = self
            .queue
            .poll_turn(self.seq, self.expiry, waker, timer_fired, Instant::now());
        if !matches!(turn, Turn::Wait) {
            self.settled = true;
        }
        turn
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.settled {
            self.queue.leave(self.seq, Instant::now());
        }
    }
}
