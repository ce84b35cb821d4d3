//! What the layers tell operators, without a logging dependency: a layer's name and a
//! per-second summary of events that would flood a log if each were written.
//!
//! See [`EventSummary`](crate::EventSummary) for what it does and why.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

/// How often a layer writes a summary at most.
pub const DEFAULT_SUMMARY_INTERVAL: Duration = Duration::from_secs(1);

/// Counts events by cause (`N` causes, numbered `0..N`) and says when a summary is due.
///
/// A summary is due on the first event at least `interval` after the previous summary (or
/// after the counter was made). It holds every event counted since the previous one, the
/// event that made it due included, and the time since the previous one. So a lone event
/// after a quiet period is summarised at once, and a storm gives one summary per interval;
/// the events after the last summary wait for the next event (per-event detail, written at
/// DEBUG, has them at once).
///
/// Lock-free: counting is one atomic add and one load; the event that writes the summary
/// swaps the counts out. Under contention every event is counted in exactly one summary
/// and exactly one thread is handed each summary.
///
/// # Why a summary, and why here
///
/// During an incident a client refuses retries and a server sheds calls by the thousand
/// per second: one INFO line each is tens of thousands of lines a minute, exactly when
/// on-call reads the logs. So each event is written at DEBUG only, and an
/// [`EventSummary`] counts them by cause and says, at most once per interval (1 s by
/// default), "write a summary now, with these counts". The summary is written on the path
/// of the next event once the interval has passed: no background task, no timer.
///
/// This crate has no `tracing` dependency, and the summary does not need one: it only
/// counts (atomics, no lock, no allocation) and hands back the counts; the client and
/// server layers each write their own INFO event from them. Both layers share this one
/// counter, so the rule for when a summary is due lives in one place.
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::Instant;
/// use stormguard_core::EventSummary;
///
/// let t0 = Instant::now();
/// let summary: EventSummary<2> = EventSummary::new(Duration::from_secs(1), t0);
/// // Three events of cause 0 and one of cause 1 within the first second: nothing yet.
/// for ms in [0, 100, 200] {
///     assert!(summary.record_at(0, t0 + Duration::from_millis(ms)).is_none());
/// }
/// assert!(summary.record_at(1, t0 + Duration::from_millis(300)).is_none());
/// // The first event once the second is over writes the summary, itself included.
/// let due = summary.record_at(0, t0 + Duration::from_secs(1)).expect("a summary is due");
/// assert_eq!((due.counts, due.total()), ([4, 1], 5));
/// assert_eq!(due.elapsed, Duration::from_secs(1));
/// ```
#[derive(Debug)]
pub struct EventSummary<const N: usize> {
    origin: Instant,
    interval_ns: u64,
    /// When the last summary was handed out, in nanoseconds since `origin`.
    last: AtomicU64,
    counts: [AtomicU64; N],
}

/// The counts of one summary (see [`EventSummary`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Summary<const N: usize> {
    /// Events by cause since the previous summary.
    pub counts: [u64; N],
    /// Time since the previous summary (or since the counter was made).
    pub elapsed: Duration,
}

impl<const N: usize> Summary<N> {
    /// Events of every cause.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }
}

impl<const N: usize> EventSummary<N> {
    /// A counter made at `now` that hands out a summary at most once per `interval` (a zero
    /// interval makes every event its own summary).
    pub fn new(interval: Duration, now: Instant) -> Self {
        EventSummary {
            origin: now,
            interval_ns: u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX),
            last: AtomicU64::new(0),
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Counts one event of `cause` at `now`; returns the summary when one is due. A cause
    /// outside `0..N` is not counted.
    pub fn record_at(&self, cause: usize, now: Instant) -> Option<Summary<N>> {
        self.counts.get(cause)?.fetch_add(1, Ordering::Relaxed);
        let at = u64::try_from(now.saturating_duration_since(self.origin).as_nanos())
            .unwrap_or(u64::MAX);
        let last = self.last.load(Ordering::Acquire);
        if at.saturating_sub(last) < self.interval_ns {
            return None;
        }
        // One thread wins the summary; the others' events are in it or in the next one.
        self.last
            .compare_exchange(last, at, Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        let summary = Summary {
            counts: std::array::from_fn(|i| self.counts[i].swap(0, Ordering::AcqRel)),
            elapsed: Duration::from_nanos(at.saturating_sub(last)),
        };
        // Only a winner delayed a whole interval between its count and its swap can find
        // its own event already taken by the next winner.
        (summary.total() > 0).then_some(summary)
    }
}

/// `(service, method)` of a gRPC path: `("pkg.Svc", "Method")` for `/pkg.Svc/Method`; a
/// path without a service gives `("", path)`.
pub fn split_path(path: &str) -> (&str, &str) {
    let path = path.strip_prefix('/').unwrap_or(path);
    path.rsplit_once('/').unwrap_or(("", path))
}

/// A layer's name in its logs and metrics (the `stormguard.layer` attribute): the one it
/// was given, else the service (`pkg.Svc`) of the first call that names it.
///
/// Shared by the layer and the instruments that read it; set once, read with one atomic
/// load.
#[derive(Debug, Default)]
pub struct LayerName {
    name: OnceLock<Arc<str>>,
}

impl LayerName {
    /// A layer named `name`.
    pub fn named(name: impl Into<Arc<str>>) -> Self {
        let named = LayerName::default();
        let _ = named.name.set(name.into());
        named
    }

    /// The name, once it is known.
    pub fn get(&self) -> Option<&Arc<str>> {
        self.name.get()
    }

    /// The name; when it is not known yet, the service of `path` (`/pkg.Svc/Method`)
    /// becomes it (allocated once, on the first call).
    pub fn get_or_name_after(&self, path: &str) -> &Arc<str> {
        self.name.get_or_init(|| Arc::from(split_path(path).0))
    }
}

#[cfg(test)]
mod tests;
