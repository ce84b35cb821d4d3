//! The connection backoff: how long a transparent retry waits after a connection to the
//! dependency could not be made.
//!
//! A transparent retry is free (no budget, no attempt counted), which is right for a
//! stream refused by a server that is draining, and wrong against a dependency that
//! refuses connections: sent at once, it is one more connection attempt per call, on top
//! of the channel's own immediate reconnect. After a refused connection, a transparent
//! retry of the same call waits for the next free connection slot of the backoff (1 s,
//! then ×1.6 per refusal in a row, at most 10 s, ±20 % jitter: gRPC's connection backoff,
//! with a shorter cap), one slot per refused call, and gives up when its slot is past its
//! deadline. First attempts are not held: the first one that gets an answer (a connection
//! was made) resets the backoff, so a dependency that comes back is found at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::Instant;

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
    rng: fastrand::Rng,
}

impl ConnectBackoff {
    pub(crate) fn new(seed: u64) -> Self {
        ConnectBackoff {
            down: AtomicBool::new(false),
            state: Mutex::new(State {
                refusals: 0,
                next_at: None,
                rng: fastrand::Rng::with_seed(seed),
            }),
        }
    }

    /// A connection attempt was refused at `now`: when its call may make the next one.
    /// Each refusal takes the next free instant, one backoff step after the last one
    /// handed out (or after `now`, when that has passed): the calls refused together
    /// connect again one at a time, not together.
    pub(crate) fn refused_at(&self, now: Instant) -> Instant {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.down.store(true, Ordering::Relaxed);
        let from = state.next_at.filter(|&next| now < next).unwrap_or(now);
        let grown = INITIAL.as_secs_f64() * MULTIPLIER.powi(state.refusals.min(64) as i32);
        let wait = grown.min(MAX.as_secs_f64()) * (1.0 + JITTER * (2.0 * state.rng.f64() - 1.0));
        state.refusals = state.refusals.saturating_add(1);
        let next = from + Duration::from_secs_f64(wait);
        state.next_at = Some(next);
        next
    }

    /// The dependency answered: connections are made again.
    pub(crate) fn connected(&self) {
        if self.down.load(Ordering::Relaxed) {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            self.down.store(false, Ordering::Relaxed);
            state.refusals = 0;
            state.next_at = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_grow_per_refusal_in_a_row_up_to_the_cap_and_an_answer_resets_them() {
        let backoff = ConnectBackoff::new(7);
        let mut now = Instant::now();
        let mut waits = Vec::new();
        for _ in 0..10 {
            let next = backoff.refused_at(now);
            waits.push(next - now);
            now = next;
        }
        // Refused together, connecting one step apart.
        let first = backoff.refused_at(now);
        let second = backoff.refused_at(now);
        assert!(
            second - first >= MAX.mul_f64(1.0 - JITTER),
            "{:?}",
            second - first
        );
        now = second;
        for (n, wait) in waits.iter().enumerate() {
            let nominal = (MULTIPLIER.powi(n as i32)).min(MAX.as_secs_f64());
            let secs = wait.as_secs_f64();
            assert!(
                secs >= nominal * (1.0 - JITTER) && secs <= nominal * (1.0 + JITTER),
                "{n}: {wait:?}"
            );
        }
        backoff.connected();
        let wait = backoff.refused_at(now) - now;
        assert!(wait <= INITIAL.mul_f64(1.0 + JITTER), "{wait:?}");
    }
}
