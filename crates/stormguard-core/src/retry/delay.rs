//! Hedging: more than one copy of a call in flight, the first useful answer wins.
//!
//! See [`HedgingPolicy`](crate::HedgingPolicy) for what it does and why.

use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::policy::LearnedDelay;

/// Buckets per doubling of latency: 8, so a percentile is read within 9 %.
const PER_OCTAVE: usize = 8;
/// The smallest bucket starts at 16 µs; 24 octaves reach past 4 minutes.
const BASE_MICROS: f64 = 16.0;
const BUCKETS: usize = PER_OCTAVE * 24;

/// The learned hedge delay of one method: a percentile of its recent attempt latency, the
/// attempts that lost or were cut off included (see [`HedgeDelay::Learned`](crate::HedgeDelay::Learned)).
///
/// Latencies go into log-spaced buckets (8 per doubling, so the percentile is read within
/// 9 %, rounded up), for the current window and the one before; memory is fixed (two arrays
/// of 192 counters) whatever the load. The delay is recomputed every 16 samples and when a
/// window turns, so reading it costs a lock and a copy.
pub(crate) struct DelayEstimator {
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
    pub(crate) fn new(config: LearnedDelay) -> Self {
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
    pub(crate) fn record_at(&self, elapsed: Duration, now: Instant) {
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
    pub(crate) fn delay_at(&self, now: Instant) -> Option<Duration> {
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
