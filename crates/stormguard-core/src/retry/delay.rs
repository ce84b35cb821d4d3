//! Hedging: more than one copy of a call in flight, the first useful answer wins.
//!
//! A retry answers a failure; a hedge answers slowness. The first attempt goes at once, and
//! while no answer has come the n-th copy follows `n × delay` later (gRPC A6's
//! `hedgingPolicy`); the first answer that is not a *non-fatal* failure wins and every other
//! copy is cancelled. A non-fatal status sends the next copy at once.
//!
//! # Why hedges can start a storm, and what stops them
//!
//! A hedge is extra load sent exactly when the server is slow, which is when it can least
//! afford it. stormguard treats every hedge as an attempt (see
//! [`CallRetry::start_hedge_at`](crate::CallRetry::start_hedge_at)): it is paid from
//! the same budget as retries (an A6 throttle lets hedges go only while it holds more than
//! half its tokens) and refused when that is empty, never queued; it needs a closed breaker
//! and a retry left in the request's allowance; it carries `grpc-previous-rpc-attempts`, so
//! a stormguard server sheds it before any first attempt; a server's pushback `-1` stops the
//! call's hedges and `N` ms puts the next one off by `N`.
//!
//! # A delay that does not feed a slowdown
//!
//! A fixed delay must be chosen by someone who knows the latency. The alternative, a
//! percentile of recent latency ([`HedgeDelay::Learned`]), has a trap: if only the answers
//! that *won* are measured (as tower's `hedge` middleware does), then during a slowdown the
//! hedges win, each measured as `delay + a fast answer`; the estimate falls, the layer
//! hedges sooner, more hedges win, and the estimate falls further: the hedge rate climbs
//! exactly while the server is slow. [`DelayEstimator`] counts **every** attempt, the ones
//! that lost or were cut off included, at least for the time they ran, so a slowdown raises
//! the estimate instead. A floor keeps hedges from firing on noise, a ceiling keeps the tail
//! bounded, and no hedge is sent before the estimator has enough samples to know the
//! latency.
//!
//! ```
//! use std::time::Duration;
//! use stormguard_core::{DelayEstimator, LearnedDelay};
//! use stormguard_core::Instant;
//!
//! let learned = LearnedDelay { min_samples: 10, ..LearnedDelay::default() };
//! let estimator = DelayEstimator::new(learned);
//! let now = Instant::now();
//! assert_eq!(estimator.delay_at(now), None, "too few samples to hedge yet");
//! // 2 % of attempts are slow: the p95 is the fast majority.
//! for i in 0..100u64 {
//!     estimator.record_at(Duration::from_millis(if i % 50 == 0 { 50 } else { 2 }), now);
//! }
//! let delay = estimator.delay_at(now).unwrap();
//! assert!(delay >= Duration::from_millis(2) && delay < Duration::from_millis(3), "{delay:?}");
//! ```

use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::{Instant, LearnedDelay};

/// Buckets per doubling of latency: 8, so a percentile is read within 9 %.
const PER_OCTAVE: usize = 8;
/// The smallest bucket starts at 16 µs; 24 octaves reach past 4 minutes.
const BASE_MICROS: f64 = 16.0;
const BUCKETS: usize = PER_OCTAVE * 24;

/// The learned hedge delay of one method: a percentile of its recent attempt latency, the
/// attempts that lost or were cut off included (see the [module docs](DelayEstimator)).
///
/// Latencies go into log-spaced buckets (8 per doubling, so the percentile is read within
/// 9 %, rounded up), for the current window and the one before; memory is fixed (two arrays
/// of 192 counters) whatever the load. The delay is recomputed every 16 samples and when a
/// window turns, so reading it costs a lock and a copy.
pub struct DelayEstimator {
    config: LearnedDelay,
    state: Mutex<Window>,
}

struct Window {
    started: Option<Instant>,
    current: [u32; BUCKETS],
    previous: [u32; BUCKETS],
    since_estimate: u32,
    estimate: Option<Duration>,
}

impl fmt::Debug for DelayEstimator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DelayEstimator")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl DelayEstimator {
    /// An estimator with no samples (it gives no delay until it has `min_samples`).
    pub fn new(config: LearnedDelay) -> Self {
        DelayEstimator {
            config,
            state: Mutex::new(Window {
                started: None,
                current: [0; BUCKETS],
                previous: [0; BUCKETS],
                since_estimate: 0,
                estimate: None,
            }),
        }
    }

    /// An attempt ran for `elapsed` (until its answer, or until it was cancelled because
    /// another copy won or the call's deadline ran out).
    pub fn record_at(&self, elapsed: Duration, now: Instant) {
        let mut w = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.turn(&mut w, now);
        let b = bucket(elapsed);
        w.current[b] = w.current[b].saturating_add(1);
        w.since_estimate += 1;
        if w.since_estimate >= 16 || w.estimate.is_none() {
            self.estimate(&mut w);
        }
    }

    /// The delay to hedge after, at `now`; `None` while there are too few samples.
    pub fn delay_at(&self, now: Instant) -> Option<Duration> {
        let mut w = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if self.turn(&mut w, now) {
            self.estimate(&mut w);
        }
        w.estimate
    }

    /// Starts a new window when the current one is over; whether it did.
    fn turn(&self, w: &mut Window, now: Instant) -> bool {
        let Some(started) = w.started else {
            w.started = Some(now);
            return false;
        };
        let age = now.saturating_duration_since(started);
        if age < self.config.window {
            return false;
        }
        if age >= self.config.window.saturating_mul(2) {
            // Nothing recent at all: both windows are stale.
            w.previous = [0; BUCKETS];
        } else {
            w.previous = w.current;
        }
        w.current = [0; BUCKETS];
        w.started = Some(now);
        true
    }

    fn estimate(&self, w: &mut Window) {
        w.since_estimate = 0;
        let counts = || {
            w.current
                .iter()
                .zip(&w.previous)
                .map(|(a, b)| u64::from(*a) + u64::from(*b))
        };
        let total: u64 = counts().sum();
        if total < u64::from(self.config.min_samples.max(1)) {
            w.estimate = None;
            return;
        }
        let rank = (self.config.percentile * total as f64).ceil() as u64;
        let mut seen = 0;
        let mut at = BUCKETS - 1;
        for (i, n) in counts().enumerate() {
            seen += n;
            if seen >= rank {
                at = i;
                break;
            }
        }
        let upper = Duration::from_secs_f64(bucket_upper_micros(at) / 1e6);
        // Not `clamp`: it panics when floor > ceiling, which `HedgingPolicy::validate`
        // refuses but a config built by hand may still hold (the ceiling wins).
        w.estimate = Some(upper.max(self.config.floor).min(self.config.ceiling));
    }
}

/// The bucket of a latency: `floor(log2(micros / 16) × 8)`, clamped to the range.
fn bucket(elapsed: Duration) -> usize {
    let micros = elapsed.as_secs_f64() * 1e6;
    if micros <= BASE_MICROS {
        return 0;
    }
    let i = ((micros / BASE_MICROS).log2() * PER_OCTAVE as f64) as usize;
    i.min(BUCKETS - 1)
}

/// Where bucket `i` ends, in microseconds.
fn bucket_upper_micros(i: usize) -> f64 {
    BASE_MICROS * 2f64.powf((i + 1) as f64 / PER_OCTAVE as f64)
}

#[cfg(test)]
mod tests;
