//! What the layers tell operators, without a logging dependency: a layer's name and a
//! per-second summary of events that would flood a log if each were written.
//!
//! # Why a summary, and why here
//!
//! During an incident a client refuses retries and a server sheds calls by the thousand
//! per second: one INFO line each is tens of thousands of lines a minute, exactly when
//! on-call reads the logs. So each event is written at DEBUG only, and an
//! [`EventSummary`] counts them by cause and says, at most once per interval (1 s by
//! default), "write a summary now, with these counts". The summary is written on the path
//! of the next event once the interval has passed: no background task, no timer.
//!
//! This crate has no `tracing` dependency, and the summary does not need one: it only
//! counts (atomics, no lock, no allocation) and hands back the counts; the client and
//! server layers each write their own INFO event from them. Both layers share this one
//! counter, so the rule for when a summary is due lives in one place.
//!
//! ```
//! use std::time::Duration;
//! use stormguard_core::Instant;
//! use stormguard_core::observe::EventSummary;
//!
//! let t0 = Instant::now();
//! let summary: EventSummary<2> = EventSummary::new(Duration::from_secs(1), t0);
//! // Three events of cause 0 and one of cause 1 within the first second: nothing yet.
//! for ms in [0, 100, 200] {
//!     assert!(summary.record_at(0, t0 + Duration::from_millis(ms)).is_none());
//! }
//! assert!(summary.record_at(1, t0 + Duration::from_millis(300)).is_none());
//! // The first event once the second is over writes the summary, itself included.
//! let due = summary.record_at(0, t0 + Duration::from_secs(1)).expect("a summary is due");
//! assert_eq!((due.counts, due.total()), ([4, 1], 5));
//! assert_eq!(due.elapsed, Duration::from_secs(1));
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::Instant;

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
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn one_summary_per_interval_with_every_event_counted_once() {
        let t0 = Instant::now();
        let s: EventSummary<3> = EventSummary::new(SEC, t0);
        let mut summaries = Vec::new();
        // 10 events a second for 5 s, causes in turn.
        for i in 0..50u32 {
            let at = t0 + 100 * MS * i;
            if let Some(summary) = s.record_at(i as usize % 3, at) {
                summaries.push((at, summary));
            }
        }
        let times: Vec<_> = summaries.iter().map(|(at, _)| *at - t0).collect();
        assert_eq!(times, [SEC, 2 * SEC, 3 * SEC, 4 * SEC]);
        // The first holds events 0..=10 (0 s to 1 s); each later one ten more.
        let totals: Vec<_> = summaries.iter().map(|(_, s)| s.total()).collect();
        assert_eq!(totals, [11, 10, 10, 10]);
        assert_eq!(summaries[0].1.counts, [4, 4, 3]);
        assert!(summaries.iter().all(|(_, s)| s.elapsed == SEC));
        // The 9 events after 4 s wait for the next event past 5 s.
        let next = s.record_at(0, t0 + 5 * SEC).unwrap();
        assert_eq!(next.total(), 10);
    }

    #[test]
    fn a_lone_event_after_quiet_is_summarised_at_once() {
        let t0 = Instant::now();
        let s: EventSummary<1> = EventSummary::new(SEC, t0);
        let lone = s.record_at(0, t0 + 3600 * SEC).unwrap();
        assert_eq!((lone.counts, lone.elapsed), ([1], 3600 * SEC));
        assert!(s.record_at(0, t0 + 3600 * SEC + MS).is_none());
    }

    #[test]
    fn unknown_causes_and_clocks_running_back_change_nothing() {
        let t0 = Instant::now() + 10 * SEC;
        let s: EventSummary<2> = EventSummary::new(SEC, t0);
        assert!(
            s.record_at(2, t0 + 2 * SEC).is_none(),
            "cause 2 is outside 0..2"
        );
        assert!(s.record_at(0, t0 - 5 * SEC).is_none(), "before the origin");
        let due = s.record_at(1, t0 + SEC).unwrap();
        assert_eq!(due.counts, [1, 1]);
    }

    #[test]
    fn a_zero_interval_summarises_every_event() {
        let t0 = Instant::now();
        let s: EventSummary<1> = EventSummary::new(Duration::ZERO, t0);
        for _ in 0..3 {
            assert_eq!(s.record_at(0, t0).unwrap().counts, [1]);
        }
    }

    #[test]
    fn threads_racing_lose_no_event_and_share_no_summary() {
        let t0 = Instant::now();
        let s = Arc::new(EventSummary::<2>::new(MS, t0));
        let threads: Vec<_> = (0..4)
            .map(|n| {
                let s = Arc::clone(&s);
                std::thread::spawn(move || {
                    let mut got = 0;
                    for i in 0..10_000u32 {
                        // Every thread walks the same virtual clock: many are due at once.
                        let at = t0 + Duration::from_micros(u64::from(i) * 10);
                        if let Some(summary) = s.record_at(n % 2, at) {
                            got += summary.total();
                        }
                    }
                    got
                })
            })
            .collect();
        let summarised: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        let rest = s.record_at(0, t0 + 3600 * SEC).unwrap().total() - 1;
        assert_eq!(summarised + rest, 40_000);
    }

    #[test]
    fn paths_split_into_service_and_method() {
        assert_eq!(split_path("/pkg.Svc/Get"), ("pkg.Svc", "Get"));
        assert_eq!(split_path("pkg.Svc/Get"), ("pkg.Svc", "Get"));
        assert_eq!(split_path("/odd"), ("", "odd"));
        assert_eq!(split_path(""), ("", ""));
    }

    #[test]
    fn a_layer_is_named_once_by_its_first_call_unless_given_a_name() {
        let unnamed = LayerName::default();
        assert!(unnamed.get().is_none());
        assert_eq!(
            &**unnamed.get_or_name_after("/pkg.Inventory/Get"),
            "pkg.Inventory"
        );
        assert_eq!(
            &**unnamed.get_or_name_after("/other.Svc/Get"),
            "pkg.Inventory"
        );
        let named = LayerName::named("checkout-db");
        assert_eq!(
            &**named.get_or_name_after("/pkg.Inventory/Get"),
            "checkout-db"
        );
    }
}
