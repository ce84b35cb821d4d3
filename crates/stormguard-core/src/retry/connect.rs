//! The connection backoff: when a call may try to connect to a dependency that refused
//! its connections.
//!
//! A transparent retry is free (no budget, no attempt counted), which is right for a
//! stream refused by a server that is draining, and wrong against a dependency that
//! refuses connections: sent at once, it is one more connection attempt per call. And a
//! channel that reconnects for every request (tonic's does) dials once per call while the
//! dependency refuses, so a host dials as often as it calls. After a refused connection
//! the dependency is in backoff, gRPC's `TRANSIENT_FAILURE`: connection slots come 1 s
//! apart, then ×1.6 per refusal in a row, at most 10 s, ±20 % jitter (gRPC's connection
//! backoff, with a shorter cap). A transparent retry of a refused call waits for the next
//! free slot, one slot per refused call, and gives up when its slot is past its deadline;
//! a call's first attempt is refused at once ([`Refusal::ConnectBackoff`](crate::Refusal::ConnectBackoff): the layer
//! answers `UNAVAILABLE` without dialing), except one probe per slot, let through to find
//! the dependency back. The first attempt that gets an answer (a connection was made)
//! resets the backoff.
//!
//! ```text
//! refused at t0 ─ slot t0+1 s: one probe ─ refused ─ slot +1.6 s: one probe ─ answered: open
//!   first attempts in between: UNAVAILABLE at once, nothing dialed
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// The wait after the first refused connection.
const INITIAL: Duration = Duration::from_secs(1);
/// Growth per refusal in a row.
const MULTIPLIER: f64 = 1.6;
/// The longest wait.
const MAX: Duration = Duration::from_secs(10);
/// The jitter, a share of the wait either way.
const JITTER: f64 = 0.2;

/// The connection backoff of one dependency, shared by every call to it.
#[derive(Debug)]
pub(crate) struct ConnectBackoff {
    /// Whether the last connection attempt was refused (the lock is taken only then).
    down: AtomicBool,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Refusals in a row.
    refusals: u32,
    /// When the backoff allows the next connection attempt.
    next_at: Option<Instant>,
    /// When the next probe may go: one backoff step (for the probes refused so far) after
    /// the refusal that began the backoff or reported the last probe. The slots handed to
    /// refused calls do not move it: a burst of calls refused together is one refusal of
    /// the dependency, not many.
    probe_at: Option<Instant>,
    /// Probes refused in a row (the first refusal counts as one).
    probes_refused: u32,
    /// Until when the probe let through last holds its slot (it has not reported yet): no
    /// other first attempt goes through before then.
    probe_until: Option<Instant>,
    rng: fastrand::Rng,
}

impl State {
    /// A jitter factor, within 1 ± [`JITTER`].
    fn jitter(&mut self) -> f64 {
        1.0 + JITTER * (2.0 * self.rng.f64() - 1.0)
    }
}

/// The nominal wait after `refusals` refusals in a row, before jitter.
fn nominal(refusals: u32) -> f64 {
    let grown = INITIAL.as_secs_f64() * MULTIPLIER.powi(refusals.min(64) as i32);
    grown.min(MAX.as_secs_f64())
}

impl ConnectBackoff {
    pub(crate) fn new(seed: u64) -> Self {
        ConnectBackoff {
            down: AtomicBool::new(false),
            state: Mutex::new(State {
                refusals: 0,
                next_at: None,
                probe_at: None,
                probes_refused: 0,
                probe_until: None,
                rng: fastrand::Rng::with_seed(seed),
            }),
        }
    }

    /// Whether a call's first attempt may be sent at `now`: always while connections are
    /// made; while the dependency is in backoff, only as the slot's probe (the first one
    /// once a slot has come, and none other until it reports or one backoff step has
    /// passed, in case it never does). A refused probe makes the next slot one step later
    /// ([`refused_at`](Self::refused_at)); an answered one ends the backoff.
    pub(crate) fn admits_first_at(&self, now: Instant) -> bool {
        if !self.down.load(Ordering::Relaxed) {
            return true;
        }
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let slot_open = state.probe_at.is_none_or(|at| now >= at);
        let probe_out = state.probe_until.is_some_and(|until| now < until);
        if !slot_open || probe_out {
            return false;
        }
        state.probe_until = Some(now + Duration::from_secs_f64(nominal(state.probes_refused)));
        true
    }

    /// A connection attempt was refused at `now`: when its call may make the next one.
    /// Each refusal takes the next free instant, one backoff step after the last one
    /// handed out (or after `now`, when that has passed): the calls refused together
    /// connect again one at a time, not together. The probe out, if any, has reported.
    ///
    /// The slot is taken only when it comes by `limit` (the latest its call can use it):
    /// `Ok(slot)`; else `Err(slot)`, the slot the call would have had, left free, so a
    /// call that gives up puts no later call's slot off.
    pub(crate) fn refused_at(&self, now: Instant, limit: Instant) -> Result<Instant, Instant> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.down.store(true, Ordering::Relaxed);
        // The refusal that begins the backoff, or the one that reports the probe out:
        // the next probe is one (grown) step later.
        if state.probe_until.take().is_some() || state.probe_at.is_none() {
            let step = nominal(state.probes_refused) * state.jitter();
            state.probes_refused = state.probes_refused.saturating_add(1);
            state.probe_at = Some(now + Duration::from_secs_f64(step));
        }
        let from = state.next_at.filter(|&next| now < next).unwrap_or(now);
        let wait = nominal(state.refusals) * state.jitter();
        state.refusals = state.refusals.saturating_add(1);
        let next = from + Duration::from_secs_f64(wait);
        if next > limit {
            return Err(next);
        }
        state.next_at = Some(next);
        Ok(next)
    }

    /// The dependency answered: connections are made again.
    pub(crate) fn connected(&self) {
        if self.down.load(Ordering::Relaxed) {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            self.down.store(false, Ordering::Relaxed);
            state.refusals = 0;
            state.next_at = None;
            state.probe_at = None;
            state.probes_refused = 0;
            state.probe_until = None;
        }
    }
}

#[cfg(test)]
mod tests;
