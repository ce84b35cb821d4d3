//! The gate every call of a [`ShedService`](super::ShedService) (and of its clones)
//! enters: admitted, queued, shed or expired.
//!
//! A gate, not a queue: the queue, and every decision about it (admit, queue, shed,
//! expire, which waiter runs next, pushback), is [`stormguard_core::AdmissionQueue`],
//! the same type the fleet simulator drives on its virtual clock. The gate is only the
//! synchronisation around it: one short-held mutex, a waker per waiter, the outcomes its
//! futures have not yet seen, and the lock-free [`Counters`]. Resources are RAII: a
//! [`WorkerPermit`] gives its worker back when dropped, and a [`Ticket`] leaves the queue
//! (or passes on a worker it was granted but never used) when dropped, so a caller that
//! goes away frees its slot at once.
//!
//! Why not `tokio::sync::Semaphore`? Its waiters are served strictly oldest-first and are
//! invisible from outside: it cannot serve the newest call first under overload, cannot
//! say how long the oldest call has waited (the retry threshold by queue delay), and
//! cannot skip expired waiters when a worker frees up. So the gate keeps its own
//! waiter list, hands a freed worker directly to the chosen waiter, and wakes it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Waker;

use http::HeaderMap;
use tokio::sync::Notify;

use stormguard_core::Code;
use stormguard_core::Instant;
use stormguard_core::{AdmissionConfig, AdmissionController, CallClass, Shed, ShedPushback};
use stormguard_core::{AdmissionQueue, Arrival, Dispatch, QueuedId};

use crate::shed::counters::{Counters, Occupancy};

/// One server's admission gate: the core queue (every decision), the outcomes its
/// waiters have not yet seen, and the counters.
#[derive(Debug)]
pub(crate) struct Gate {
    state: Mutex<State>,
    counters: Counters,
    /// The status of a shed answer, and of one that says "do not retry".
    shed_code: Code,
    no_retry_code: Code,
    /// Whether shed answers carry a RetryInfo ([`AdmissionConfig::retry_info`]).
    retry_info: bool,
    /// The queue's configuration, for what is decided without the lock (when a running
    /// call is cut).
    config: AdmissionConfig,
    /// Whether the server is shutting down (set once, under the lock, never cleared).
    closing: AtomicBool,
    /// Wakes the futures of [`ShutdownHandle::begun`](crate::ShutdownHandle::begun).
    closed: Notify,
}

#[derive(Debug)]
struct State {
    /// Workers, waiters (each with the waker of its task) and the decisions about them.
    core: AdmissionQueue<Option<Waker>>,
    /// Calls taken out of the queue whose future has not yet seen the outcome.
    /// At most `workers` granted plus the expired ones; every entry was a waiter.
    decided: HashMap<QueuedId, Outcome>,
    /// The server is shutting down: no call enters, none waits.
    closing: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Granted,
    Expired,
    /// A call of a higher rank took its place in a full queue.
    Shed(Shed),
    /// The server began shutting down while it waited.
    Closing,
}

/// How an arriving call enters the gate.
#[derive(Debug)]
pub(crate) enum Entry {
    /// Run now on this worker.
    Admitted(WorkerPermit),
    /// Wait; poll the ticket.
    Queued(Ticket),
    /// Answer with the shed status now.
    Shed(Shed),
    /// Its deadline is too close to be worth queuing: answer `DEADLINE_EXCEEDED` now.
    Expired,
    /// The server is shutting down: answer `UNAVAILABLE` with a pushback now.
    Closing,
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
    /// The server began shutting down: answer `UNAVAILABLE` with a pushback.
    Closing,
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
        let State { core, decided, .. } = self;
        let mut sink = |dispatch: Dispatch<Option<Waker>>| {
            let (left, outcome) = match dispatch {
                Dispatch::Run(left) => (left, Outcome::Granted),
                Dispatch::Expired(left) => {
                    counters.record_expired();
                    (left, Outcome::Expired)
                }
                Dispatch::Shed(left, shed) => {
                    counters.record_displaced(left.class, shed.reason);
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
        counters.set_gauges(
            core.load().depth,
            core.running(),
            core.worker_limit(),
            core.min_latency(),
        );
    }
}

impl Gate {
    pub(crate) fn new(policy: AdmissionController) -> Self {
        let shed_code = policy.config().shed_code;
        let no_retry_code = policy.config().code_for(ShedPushback::DoNotRetry);
        let retry_info = policy.config().retry_info;
        let config = policy.config().clone();
        let counters = Counters::new(config.workers.is_adaptive());
        let core = AdmissionQueue::new(policy);
        counters.set_gauges(0, 0, core.worker_limit(), None);
        Gate {
            state: Mutex::new(State {
                core,
                decided: HashMap::new(),
                closing: false,
            }),
            counters,
            shed_code,
            no_retry_code,
            retry_info,
            config,
            closing: AtomicBool::new(false),
            closed: Notify::new(),
        }
    }

    /// The status of a shed answer carrying `pushback`
    /// ([`AdmissionConfig::code_for`](stormguard_core::AdmissionConfig::code_for)).
    pub(crate) fn shed_code(&self, pushback: ShedPushback) -> Code {
        match pushback {
            ShedPushback::DoNotRetry => self.no_retry_code,
            ShedPushback::After(_) => self.shed_code,
        }
    }

    /// Whether the layer's pushback answers carry a RetryInfo.
    pub(crate) fn sends_retry_info(&self) -> bool {
        self.retry_info
    }

    /// When a running call whose caller's deadline is `deadline` is cut
    /// ([`AdmissionConfig::cut_at`]).
    pub(crate) fn cut_at(&self, deadline: Instant) -> Instant {
        self.config.cut_at(deadline)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state half-updated in a way
        // that matters more than stopping the server would: keep serving.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The gate's counters.
    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Decides how a call of `class`, with `deadline`, arriving at `now` enters.
    pub(crate) fn enter(
        self: &Arc<Self>,
        now: Instant,
        class: impl Into<CallClass>,
        deadline: Option<Instant>,
    ) -> Entry {
        let class = class.into();
        let mut arrival = Arrival::Expired;
        {
            let mut state = self.lock();
            if state.closing {
                drop(state);
                self.counters.record_shutting_down();
                return Entry::Closing;
            }
            state.apply(&self.counters, |core, sink| {
                arrival = core.arrive_at(now, class, deadline, None, sink);
            });
        }
        match arrival {
            Arrival::Run => {
                self.counters.record_admitted();
                Entry::Admitted(WorkerPermit {
                    gate: Arc::clone(self),
                    started: now,
                    answered: None,
                    finished: false,
                    served: true,
                    released: false,
                })
            }
            Arrival::Queued { id, expiry } => Entry::Queued(Ticket {
                gate: Arc::clone(self),
                id,
                expiry,
                settled: false,
            }),
            Arrival::Shed(shed) => {
                self.counters.record_shed(class, shed.reason);
                Entry::Shed(shed)
            }
            Arrival::Expired => {
                self.counters.record_expired();
                Entry::Expired
            }
        }
    }

    /// Gives a worker back (a call that got it at `started` finished, served or not, or
    /// its caller left mid-run). Either way a worker turned over, so all feed the drain
    /// estimate and an adaptive limit, which reads an abandoned call's time as a lower
    /// bound and takes no latency from a call that was not served.
    /// A streaming call's worker goes back at `now` while its response streams on
    /// ([`WorkerPermit::idle`]).
    fn release_streaming(&self, now: Instant) {
        self.lock()
            .apply(&self.counters, |core, sink| core.stream_idle_at(now, sink));
    }

    fn release(&self, now: Instant, started: Instant, finished: bool, served: bool) {
        self.lock()
            .apply(&self.counters, |core, sink| match (finished, served) {
                (true, true) => core.finish_at(now, started, sink),
                (true, false) => core.finish_not_served_at(now, started, sink),
                (false, _) => core.abandon_at(now, started, sink),
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
                self.counters.record_expired();
                state.apply(&self.counters, |core, sink| core.give_back_at(now, sink));
                return Turn::Expired;
            }
            Some(Outcome::Granted) => {
                drop(state);
                self.counters.record_admitted();
                return Turn::Run(WorkerPermit {
                    gate: Arc::clone(self),
                    started: now,
                    answered: None,
                    finished: false,
                    served: true,
                    released: false,
                });
            }
            Some(Outcome::Expired) => return Turn::Expired,
            Some(Outcome::Shed(shed)) => return Turn::Shed(shed),
            Some(Outcome::Closing) => return Turn::Closing,
            None => {}
        }
        if expired {
            let mut left = None;
            state.apply(&self.counters, |core, _| left = core.withdraw_at(now, id));
            drop(state);
            if let Some(left) = left {
                self.counters.record_time_queued(left.waited);
                self.counters.record_expired();
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
            self.counters.record_cancelled_queued();
            return;
        }
        if state.decided.remove(&id) == Some(Outcome::Granted) {
            // Granted but never used: the worker goes to the next waiter. Counted as
            // cancelled; its queued time was recorded when it was granted.
            self.counters.record_cancelled_queued();
            state.apply(&self.counters, |core, sink| core.give_back_at(now, sink));
        }
    }

    /// Begins the shutdown at `now`: every waiter is taken out of the queue and woken to
    /// answer `UNAVAILABLE`, and every call that arrives from now on is answered the same
    /// at once. Calls that hold a worker (or were granted one) run to their end. Returns
    /// whether this call began it (false if it had begun already).
    pub(crate) fn begin_shutdown(&self, now: Instant) -> bool {
        let mut state = self.lock();
        if state.closing {
            return false;
        }
        state.closing = true;
        self.closing.store(true, Ordering::Release);
        let State { core, decided, .. } = &mut *state;
        core.withdraw_all_at(now, |left| {
            self.counters.record_time_queued(left.waited);
            self.counters.record_shutting_down();
            decided.insert(left.id, Outcome::Closing);
            if let Some(waker) = left.waiter {
                waker.wake();
            }
        });
        self.counters.set_gauges(
            core.load().depth,
            core.running(),
            core.worker_limit(),
            core.min_latency(),
        );
        drop(state);
        self.closed.notify_waiters();
        true
    }

    /// Whether the shutdown has begun.
    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Resolves once the shutdown has begun.
    pub(crate) async fn closed(&self) {
        loop {
            // Registered before the flag is read: a shutdown between the two still wakes it.
            let notified = self.closed.notified();
            if self.is_closing() {
                return;
            }
            notified.await;
        }
    }

    /// Exact occupancy, read under the lock.
    pub(crate) fn occupancy(&self) -> Occupancy {
        let state = self.lock();
        Occupancy {
            free_workers: state.core.load().free_workers,
            waiting: state.core.load().depth,
            unsettled: state.decided.len(),
        }
    }
}

/// A worker, held while a call runs; given back (to the next waiter, or freed) on drop.
#[derive(Debug)]
pub(crate) struct WorkerPermit {
    gate: Arc<Gate>,
    /// When the call got the worker (its latency sample starts here).
    started: Instant,
    /// When the handler answered (its response's headers), once it has.
    answered: Option<Instant>,
    /// Whether the call finished (rather than being dropped when its caller left).
    finished: bool,
    /// Whether its answer served the call (not an overload or expiry code).
    served: bool,
    /// Whether the worker was given back already, while the call's response streams on
    /// ([`WorkerPermit::idle`]).
    released: bool,
}

impl WorkerPermit {
    /// The handler answered now; its response's body may stream on, holding the worker.
    pub(crate) fn answered(&mut self) {
        self.answered.get_or_insert_with(Instant::now);
    }

    /// The call's answer carries `status` (in its headers for a trailers-only answer, else
    /// in its trailers): an overload or expiry code
    /// ([`Code::is_overload`](stormguard_core::Code::is_overload)) means the call was not
    /// served, and an adaptive limit takes no latency sample from it.
    pub(crate) fn answered_with(&mut self, status: &HeaderMap) {
        if super::response::is_not_served(status) {
            self.served = false;
        }
    }

    /// [`answered_with`](Self::answered_with), the answer's code read already.
    pub(crate) fn answered_with_code(&mut self, code: Code) {
        if code.is_overload() {
            self.served = false;
        }
    }

    /// The call finished on this worker: count it and give the worker back.
    pub(crate) fn finished(mut self) {
        self.gate.counters.record_completed();
        self.finished = true;
    }
}

impl WorkerPermit {
    /// The call was cut at its deadline while it still ran: count it and give the worker
    /// back, as for a caller that left mid-run.
    pub(crate) fn cut(self) {
        self.gate.counters.record_cut();
    }

    /// The call's response waits for its next message: the handler's work is done, and the
    /// stream holds no worker while it sits idle. The worker goes back now, with no
    /// latency sample (a stream's length is no call's latency); the permit still counts the
    /// call's ending (finished, cut) when it comes.
    pub(crate) fn idle(&mut self) {
        if !self.released {
            self.released = true;
            self.gate.release_streaming(Instant::now());
        }
    }
}

impl Drop for WorkerPermit {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let now = Instant::now();
        // A response that streams on after the handler answered holds its worker, but the
        // length of its stream is no latency: an adaptive limit reads the time to the
        // answer, as if the call had started that much later.
        let started = self.answered.map_or(self.started, |at| {
            self.started + now.saturating_duration_since(at)
        });
        self.gate.release(now, started, self.finished, self.served);
    }
}

/// A place in the queue. Dropping it before its turn is settled leaves the queue (or
/// passes on a worker granted but not yet taken).
#[derive(Debug)]
pub(crate) struct Ticket {
    gate: Arc<Gate>,
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
    pub(crate) fn shed_code(&self, pushback: ShedPushback) -> Code {
        self.gate.shed_code(pushback)
    }

    /// [`Gate::sends_retry_info`].
    pub(crate) fn sends_retry_info(&self) -> bool {
        self.gate.sends_retry_info()
    }

    /// Checks the call's turn; registers `waker` while it waits.
    pub(crate) fn poll_turn(&mut self, waker: &Waker, timer_fired: bool) -> Turn {
        let turn = self
            .gate
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
            self.gate.leave(self.id, Instant::now());
        }
    }
}
