//! The admission gate of a [`ShedLayer`](crate::ShedLayer), driven by hand one step at a
//! time, for checking a model of the queue against the layer's own (feature `test-util`,
//! off by default; not for serving, and with no stability promise between versions).
//!
//! A [`ShedService`](crate::ShedService)'s response futures drive its gate: a waiting call
//! is polled whenever a worker frees up or the queue changes, and once more when its
//! expiry timer fires. A [`GateDriver`] drives the same gate as those futures do, at the
//! instants its caller gives: each step (a call arrives, finishes, goes away, or its timer
//! fires) returns every decision it made, for the call it names and for the waiting calls
//! the change decided. The repository's simulator runs its own server on the same steps
//! and must decide alike, decision by decision.
//!
//! The gate reads tokio's clock where the layer does (when a waiting call is polled, when
//! a worker is given back), so give each step the clock's time: on a paused clock
//! (`tokio::time::pause`, tokio's `test-util` feature), advance the clock to the instant
//! first.
//!
//! ```
//! use stormguard_server::test_util::{AttemptClass, CallClass, Decided, GateDriver, Instant};
//! use stormguard_server::{AdmissionConfig, AdmissionController, Criticality, WorkerLimit};
//!
//! let controller = AdmissionController::new(AdmissionConfig {
//!     workers: WorkerLimit::Fixed(1),
//!     ..AdmissionConfig::default()
//! })?;
//! let mut gate = GateDriver::new(controller);
//! let first = CallClass::new(AttemptClass::First, Criticality::Default);
//! let now = Instant::now();
//! assert_eq!(gate.arrive(now, 1, first, None), [(1, Decided::Run)]);
//! // The only worker is taken: call 2 waits, and runs once call 1 finishes.
//! let waits = gate.arrive(now, 2, first, None);
//! assert!(matches!(waits[..], [(2, Decided::Queued { .. })]));
//! assert_eq!(gate.finish(now, 1), [(2, Decided::Run)]);
//! assert_eq!(gate.worker_limit(), 1);
//! # Ok::<(), stormguard_server::ConfigError>(())
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::task::Waker;

use stormguard_core::AdmissionController;

use crate::shed::gate::{Entry, Gate, Ticket, Turn, WorkerPermit};

// What the driver's steps take and return, beside what is at the crate's root.
pub use stormguard_core::wire::AttemptClass;
pub use stormguard_core::{CallClass, Instant, Shed, ShedReason};

/// What the gate decided for one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decided {
    /// The call was given a worker: at once, or after waiting.
    Run,
    /// The call waits for a worker, until `expiry` at the latest.
    Queued {
        /// When the call stops being worth running: its timer fires then.
        expiry: Instant,
    },
    /// The call is answered with the shed status: on arrival, or displaced from a full
    /// queue by a call of a higher rank.
    Shed(Shed),
    /// The call is answered `DEADLINE_EXCEEDED` without running: on arrival, or while it
    /// waited.
    Expired,
    /// The call is answered `UNAVAILABLE`: the server is shutting down.
    Closing,
}

/// One admission gate, driven by hand: what a [`ShedLayer`](crate::ShedLayer) built from
/// the same controller would decide, step by step (see the [module docs](self)).
///
/// Calls are named by a number of the caller's choosing; each names one call.
#[derive(Debug)]
pub struct GateDriver {
    gate: Arc<Gate>,
    tickets: BTreeMap<u32, Ticket>,
    permits: BTreeMap<u32, WorkerPermit>,
}

impl GateDriver {
    /// A gate that admits calls as `controller` decides.
    pub fn new(controller: AdmissionController) -> Self {
        GateDriver {
            gate: Arc::new(Gate::new(controller)),
            tickets: BTreeMap::new(),
            permits: BTreeMap::new(),
        }
    }

    /// The worker limit now: where an adaptive limit stands, or the fixed number.
    pub fn worker_limit(&self) -> usize {
        self.gate.counters().workers()
    }

    /// Call `call` of `class` arrives at `now`, with `deadline` if it has one: its
    /// decision, then those of the waiting calls, each polled once.
    pub fn arrive(
        &mut self,
        now: Instant,
        call: u32,
        class: CallClass,
        deadline: Option<Instant>,
    ) -> Vec<(u32, Decided)> {
        let mut out = Vec::new();
        match self.gate.enter(now, class, deadline) {
            Entry::Admitted(permit) => {
                self.permits.insert(call, permit);
                out.push((call, Decided::Run));
            }
            Entry::Queued(ticket) => {
                let expiry = ticket.expiry();
                self.tickets.insert(call, ticket);
                out.push((call, Decided::Queued { expiry }));
            }
            Entry::Shed(s) => out.push((call, Decided::Shed(s))),
            Entry::Expired => out.push((call, Decided::Expired)),
            Entry::Closing => out.push((call, Decided::Closing)),
        }
        self.poll_all(now, &mut out);
        out
    }

    /// Call `call`, if it runs, finishes at `now` and gives its worker back: the
    /// decisions of the waiting calls, each polled once.
    pub fn finish(&mut self, now: Instant, call: u32) -> Vec<(u32, Decided)> {
        let mut out = Vec::new();
        if let Some(permit) = self.permits.remove(&call) {
            permit.finished();
        }
        self.poll_all(now, &mut out);
        out
    }

    /// The caller of `call` goes away at `now`, as a dropped response future does: a
    /// waiting call leaves the queue, a running one gives its worker back. The decisions
    /// of the waiting calls, each polled once.
    pub fn cancel(&mut self, now: Instant, call: u32) -> Vec<(u32, Decided)> {
        let mut out = Vec::new();
        // Dropping what the call holds is what a dropped response future does.
        drop(self.tickets.remove(&call));
        drop(self.permits.remove(&call));
        self.poll_all(now, &mut out);
        out
    }

    /// The expiry timer of waiting call `call` fires at `now`: its decision, then those
    /// of the waiting calls, each polled once.
    pub fn timer(&mut self, now: Instant, call: u32) -> Vec<(u32, Decided)> {
        let mut out = Vec::new();
        self.poll(now, call, &mut out);
        self.poll_all(now, &mut out);
        out
    }

    /// Polls every waiting ticket as its woken future would (its timer has fired once
    /// its expiry has come), recording what it learns.
    fn poll_all(&mut self, now: Instant, out: &mut Vec<(u32, Decided)>) {
        let calls: Vec<u32> = self.tickets.keys().copied().collect();
        for call in calls {
            self.poll(now, call, out);
        }
    }

    fn poll(&mut self, now: Instant, call: u32, out: &mut Vec<(u32, Decided)>) {
        let Some(ticket) = self.tickets.get_mut(&call) else {
            return;
        };
        let fired = ticket.expiry() <= now;
        match ticket.poll_turn(Waker::noop(), fired) {
            Turn::Wait => {}
            Turn::Run(permit) => {
                self.tickets.remove(&call);
                self.permits.insert(call, permit);
                out.push((call, Decided::Run));
            }
            Turn::Expired => {
                self.tickets.remove(&call);
                out.push((call, Decided::Expired));
            }
            Turn::Shed(s) => {
                self.tickets.remove(&call);
                out.push((call, Decided::Shed(s)));
            }
            Turn::Closing => {
                self.tickets.remove(&call);
                out.push((call, Decided::Closing));
            }
        }
    }
}
