//! The bucket ring: counts over a sliding window of time, as [`BUCKETS`] buckets of two
//! counters each, expired by time. The breaker's window (successes, failures) and the
//! adaptive throttle's (requests, accepts) are each one ring; the retry budget keeps its
//! own lock-free ring of atomics (its hot path takes no lock).
//!
//! An outcome counts from the moment it is recorded until its bucket rotates out, which
//! happens between `(BUCKETS - 1) / BUCKETS` of the window and the window: never longer
//! than the configured window.

use std::time::Duration;

use crate::Instant;

/// Buckets per ring.
pub(crate) const BUCKETS: usize = 10;

/// Which bucket is current: indices count from the first instant the clock saw, and time
/// never runs backwards (an outcome reported with a slightly older `now` lands in the
/// newest bucket).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BucketClock {
    origin: Option<Instant>,
    newest: u64,
}

impl BucketClock {
    /// The current bucket index at `now`, buckets being `width` wide.
    pub(crate) fn advance(&mut self, now: Instant, width: Duration) -> u64 {
        let origin = *self.origin.get_or_insert(now);
        let elapsed = now.saturating_duration_since(origin);
        let index = u64::try_from(elapsed.as_nanos() / width.as_nanos().max(1)).unwrap_or(u64::MAX);
        self.newest = self.newest.max(index);
        self.newest
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    index: u64,
    counts: [u32; 2],
}

/// Two counters over the last [`BUCKETS`] buckets.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BucketRing {
    buckets: [Bucket; BUCKETS],
}

impl BucketRing {
    /// Adds `add` (one per counter, `true` counts 1) to the bucket `current`, first
    /// clearing it if it last held an older index.
    pub(crate) fn add(&mut self, current: u64, add: [bool; 2]) {
        let bucket = &mut self.buckets[(current % BUCKETS as u64) as usize];
        if bucket.index != current {
            *bucket = Bucket {
                index: current,
                ..Bucket::default()
            };
        }
        for (count, add) in bucket.counts.iter_mut().zip(add) {
            if add {
                *count = count.saturating_add(1);
            }
        }
    }

    /// Both counters summed over the buckets still in the window at `current`.
    pub(crate) fn sums(&self, current: u64) -> [u64; 2] {
        self.buckets
            .iter()
            .filter(|b| b.index <= current && current - b.index < BUCKETS as u64)
            .fold([0, 0], |[a, b], bucket| {
                [
                    a + u64::from(bucket.counts[0]),
                    b + u64::from(bucket.counts[1]),
                ]
            })
    }
}
