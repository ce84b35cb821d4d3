//! When to resolve a replica set's name again, and what an answer changes: see
//! [`Refresh`](crate::Refresh).

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::ConfigError;
use crate::field::check::{share, within};

/// When [`Refresh`] resolves again.
#[derive(Debug, Clone, PartialEq)]
pub struct RefreshConfig {
    /// The shortest time between two resolutions, early ones included: how soon a refused
    /// replica's record is checked again. 10 ms to 1 h.
    pub min_interval: Duration,
    /// The longest time between two resolutions, whatever the records' TTL. At least
    /// `min_interval`, at most 1 h.
    pub max_interval: Duration,
    /// Each wait is drawn at random from the last `jitter` share of the interval (with 0.5
    /// and a 10 s TTL, from 5 s to 10 s), so that clients do not ask in step; where
    /// `min_interval` is above that share's start, from a range as wide that starts at
    /// `min_interval` (a 1 s TTL: from 1 s to 1.5 s). In [0, 1].
    pub jitter: f64,
    /// How long a resolution may take before it counts as failed. 10 ms to 1 min.
    pub timeout: Duration,
    /// The seed of the jitter; `None` draws one.
    pub seed: Option<u64>,
}

impl Default for RefreshConfig {
    /// At most once a second, at least every 30 s, jitter 0.5, a 5 s timeout.
    fn default() -> Self {
        RefreshConfig {
            min_interval: Duration::from_secs(1),
            max_interval: Duration::from_secs(30),
            jitter: 0.5,
            timeout: Duration::from_secs(5),
            seed: None,
        }
    }
}

impl RefreshConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        const HOUR: Duration = Duration::from_secs(3600);
        let ten_ms = Duration::from_millis(10);
        within("dns.min_interval", self.min_interval, ten_ms, HOUR)?;
        within(
            "dns.max_interval",
            self.max_interval,
            self.min_interval,
            HOUR,
        )?;
        share("dns.jitter", self.jitter, true)?;
        within("dns.timeout", self.timeout, ten_ms, Duration::from_secs(60))
    }
}

/// What a resolution gave.
#[derive(Debug, Clone, PartialEq)]
pub enum RefreshAnswer<K> {
    /// Records, valid for `ttl` (the smallest of theirs). No record counts as a failure.
    Found {
        /// The addresses (or whatever the set is keyed by) the name resolved to.
        records: Vec<K>,
        /// How long the answer may be cached.
        ttl: Duration,
    },
    /// The resolution failed or timed out.
    Failed,
}

/// The change between answering and failing, reported once per transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefreshHealth {
    /// Resolutions fail (or return nothing): the last good set is kept.
    Failing,
    /// A resolution answered again after failing.
    Recovered,
}

/// What an answer changes in the set.
#[derive(Debug, Clone, PartialEq)]
pub struct RefreshUpdate<K> {
    /// Records new in this answer: replicas to add.
    pub added: Vec<K>,
    /// Records this answer no longer lists: replicas to stop sending attempts to.
    pub removed: Vec<K>,
    /// Set when the name started failing or recovered with this answer.
    pub health: Option<RefreshHealth>,
}

/// What a [`Refresh`] has done since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RefreshCounts {
    /// Resolutions that ended (answered or failed).
    pub resolutions: u64,
    /// Resolutions that failed, timed out or returned no record.
    pub failures: u64,
    /// Records added to the set.
    pub added: u64,
    /// Records removed from the set.
    pub removed: u64,
}

/// The decisions of a replica set found by name: when to resolve, and what an answer
/// changes. `K` is what a record is keyed by (an address).
///
/// A client that finds its replicas through DNS (a Kubernetes headless Service answers
/// with one record per ready pod) must ask again as the records change, and must not turn
/// a DNS hiccup into an empty set. [`Refresh`] holds those decisions apart from the I/O,
/// on an injected clock and a seeded RNG, so that they are tested deterministically and a
/// thousand clients' timers can be run on a virtual clock:
///
/// - the next resolution is due on a timer bounded by the records' TTL, `min_interval` and
///   `max_interval`, drawn at random in its last `jitter` share so that clients started
///   together drift apart instead of asking in step;
/// - [`Refresh::early_at`] brings it forward (a replica refused a connection, or none is
///   healthy), never closer than `min_interval` to the last one;
/// - an answer is diffed against the current set: records that went away are
///   [`removed`](RefreshUpdate::removed), new ones [`added`](RefreshUpdate::added);
/// - an answer that fails, times out or holds no record keeps the last good set, is
///   counted, and is retried sooner (doubling from `min_interval`); the change between
///   answering and failing is reported once ([`RefreshUpdate::health`]).
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::{RefreshAnswer, Instant, Refresh, RefreshConfig};
///
/// let t0 = Instant::now();
/// let mut dns = Refresh::new(RefreshConfig { seed: Some(1), ..RefreshConfig::default() }, t0)?;
/// assert_eq!(dns.due_at(), t0); // the first resolution is due at once
/// dns.begin_at(t0);
/// let ttl = Duration::from_secs(5);
/// let update = dns.answer_at(RefreshAnswer::Found { records: vec!["10.0.0.1", "10.0.0.2"], ttl }, t0);
/// assert_eq!(update.added, ["10.0.0.1", "10.0.0.2"]);
/// // The next one is due within the TTL.
/// assert!(dns.due_at() <= t0 + ttl);
/// // The DNS server does not answer: the set is kept.
/// let t1 = dns.due_at();
/// dns.begin_at(t1);
/// let update = dns.answer_at(RefreshAnswer::Failed, t1);
/// assert!(update.removed.is_empty());
/// assert_eq!(dns.records().count(), 2);
/// # Ok::<(), stormguard_core::ConfigError>(())
/// ```
#[derive(Debug)]
pub struct Refresh<K> {
    config: RefreshConfig,
    rng: fastrand::Rng,
    set: BTreeSet<K>,
    due: Instant,
    /// When the last resolution began (for `min_interval`), and whether it is under way.
    last_begin: Option<Instant>,
    in_flight: bool,
    failures_in_row: u32,
    counts: RefreshCounts,
}

impl<K: Ord + Clone> Refresh<K> {
    /// An empty set whose first resolution is due at `now`.
    pub fn new(config: RefreshConfig, now: Instant) -> Result<Self, ConfigError> {
        config.validate()?;
        let seed = config.seed.unwrap_or_else(|| fastrand::u64(..));
        Ok(Refresh {
            rng: fastrand::Rng::with_seed(seed),
            config,
            set: BTreeSet::new(),
            due: now,
            last_begin: None,
            in_flight: false,
            failures_in_row: 0,
            counts: RefreshCounts::default(),
        })
    }

    /// When the next resolution is due (while one is under way: when it times out).
    pub fn due_at(&self) -> Instant {
        self.due
    }

    /// A resolution begins at `now`; returns when it times out (and is due again).
    pub fn begin_at(&mut self, now: Instant) -> Instant {
        self.last_begin = Some(now);
        self.in_flight = true;
        self.due = now + self.config.timeout;
        self.due
    }

    /// Asks for a resolution sooner than the timer (a replica refused a connection, or no
    /// replica is healthy): due at once, or `min_interval` after the last one began.
    /// Returns whether that brought it forward (not while one is under way).
    pub fn early_at(&mut self, now: Instant) -> bool {
        if self.in_flight {
            return false;
        }
        let soonest = self
            .last_begin
            .map_or(now, |t| (t + self.config.min_interval).max(now));
        if soonest < self.due {
            self.due = soonest;
            return true;
        }
        false
    }

    /// Applies the answer of the resolution begun last, at `now`: the records added and
    /// removed, and the next resolution scheduled.
    pub fn answer_at(&mut self, answer: RefreshAnswer<K>, now: Instant) -> RefreshUpdate<K> {
        self.in_flight = false;
        self.counts.resolutions += 1;
        let records = match answer {
            RefreshAnswer::Found { records, ttl } if !records.is_empty() => Some((records, ttl)),
            _ => None,
        };
        let Some((records, ttl)) = records else {
            self.counts.failures += 1;
            self.failures_in_row = self.failures_in_row.saturating_add(1);
            let shift = (self.failures_in_row - 1).min(16);
            let backoff = self.config.min_interval.saturating_mul(1 << shift);
            self.due = now + self.wait(backoff);
            let health = (self.failures_in_row == 1).then_some(RefreshHealth::Failing);
            return RefreshUpdate {
                added: Vec::new(),
                removed: Vec::new(),
                health,
            };
        };
        let health = (self.failures_in_row > 0).then_some(RefreshHealth::Recovered);
        self.failures_in_row = 0;
        let new: BTreeSet<K> = records.into_iter().collect();
        let removed: Vec<K> = self.set.difference(&new).cloned().collect();
        let added: Vec<K> = new.difference(&self.set).cloned().collect();
        self.counts.added += added.len() as u64;
        self.counts.removed += removed.len() as u64;
        self.set = new;
        self.due = now + self.wait(ttl);
        RefreshUpdate {
            added,
            removed,
            health,
        }
    }

    /// A wait for an `interval` (a TTL or a backoff): bounded by `min_interval` and
    /// `max_interval`, drawn from a range as wide as the interval's last `jitter` share.
    /// Where `min_interval` is above the start of that share (a TTL under twice
    /// `min_interval` at jitter 0.5), the range starts at `min_interval` and keeps its
    /// width (up to `max_interval`): clients started together still drift apart.
    fn wait(&mut self, interval: Duration) -> Duration {
        let (min, max) = (self.config.min_interval, self.config.max_interval);
        let interval = interval.clamp(min, max);
        let width = interval.mul_f64(self.config.jitter);
        let shortest = interval.saturating_sub(width).max(min);
        let longest = (shortest + width).min(max.max(shortest));
        shortest + (longest - shortest).mul_f64(self.rng.f64())
    }

    /// The current set: the last good answer's records, in order.
    pub fn records(&self) -> impl Iterator<Item = &K> {
        self.set.iter()
    }

    #[cfg(test)]
    /// Whether `key` is in the current set.
    pub(crate) fn contains(&self, key: &K) -> bool {
        self.set.contains(key)
    }

    /// Whether any resolution has answered with records yet.
    pub fn resolved(&self) -> bool {
        !self.set.is_empty()
    }

    /// What it has done so far.
    pub fn counts(&self) -> RefreshCounts {
        self.counts
    }
}

#[cfg(test)]
#[path = "resolve_tests.rs"]
mod tests;
