//! The bucket ring: counts over a sliding window of time, as [`BUCKETS`] buckets of two
//! counters each, expired by time. The breaker's window (successes, failures) and the
//! adaptive throttle's (requests, accepts) are each one ring; the retry budget keeps its
//! own lock-free ring of atomics (its hot path takes no lock).
//!
//! An outcome counts from the moment it is recorded until its bucket rotates out, which
//! happens between `(BUCKETS - 1) / BUCKETS` of the window and the window: never longer
//! than the configured window.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::{SLOTS, STALE_LIMIT};

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
        // In 64-bit arithmetic (nanoseconds fit for 584 years, saturating past that): every
        // outcome lands here, and a 128-bit division costs tens of instructions.
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let index = nanos(elapsed) / nanos(width).max(1);
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

/// The retry budget's ring: the same idea without a lock, one atomic word per slot holding
/// the slot's epoch and its count, so that a deposit or a withdrawal never waits.
///
/// A ring of `SLOTS` counters, each `epoch << 32 | count` in one atomic word, on cache
/// lines of its own (so writes do not evict the read-mostly fields next to it).
#[repr(align(64))]
pub(crate) struct Ring {
    pub(crate) slots: [AtomicU64; SLOTS],
}

pub(crate) fn pack(epoch: u32, count: u32) -> u64 {
    (u64::from(epoch) << 32) | u64::from(count)
}

pub(crate) fn unpack(word: u64) -> (u32, u32) {
    ((word >> 32) as u32, word as u32)
}

impl Ring {
    pub(crate) fn new() -> Self {
        Ring {
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Counts one event in `epoch`'s slot, starting the slot afresh if it holds an older
    /// epoch. `false` (nothing counted) if the slot is full or already holds a newer epoch
    /// (the caller is more than a window late).
    pub(crate) fn add(&self, epoch: u32) -> bool {
        let slot = &self.slots[epoch as usize % SLOTS];
        let mut current = slot.load(Ordering::SeqCst);
        loop {
            let (e, n) = unpack(current);
            let next = if e == epoch {
                match n.checked_add(1) {
                    Some(n) => pack(epoch, n),
                    None => return false,
                }
            } else if e.wrapping_sub(epoch) <= STALE_LIMIT {
                return false;
            } else {
                pack(epoch, 1)
            };
            match slot.compare_exchange_weak(current, next, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }

    /// Undoes one [`Ring::add`] in `epoch`; nothing (`false`) if the slot has moved on
    /// (the event has expired with it) or holds nothing.
    pub(crate) fn remove(&self, epoch: u32) -> bool {
        let slot = &self.slots[epoch as usize % SLOTS];
        let mut current = slot.load(Ordering::SeqCst);
        loop {
            let (e, n) = unpack(current);
            if e != epoch || n == 0 {
                return false;
            }
            match slot.compare_exchange_weak(
                current,
                pack(e, n - 1),
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }
}
