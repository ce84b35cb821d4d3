//! Idempotency keys: what lets a write be retried without being done twice.
//!
//! See [`DedupTable`](crate::DedupTable) for what it does and why.

use std::borrow::Borrow;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use tokio::time::Instant;

use crate::error::ConfigError;
use crate::field::check;
use crate::wire::MAX_PUSHBACK_MS;

/// The bounds of a server's record of idempotency keys, and what an in-flight duplicate is
/// told.
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::IdempotencyConfig;
///
/// let config = IdempotencyConfig::from_json(r#"{ "idempotency": {
///     "max_entries": 1000, "ttl": "2m", "max_record_bytes": 4096 } }"#)?;
/// assert_eq!(config.max_entries, 1000);
/// assert_eq!(config.ttl, Duration::from_secs(120));
/// let bad = IdempotencyConfig::from_json(r#"{ "idempotency": { "ttl": "0s" } }"#);
/// assert!(bad.unwrap_err().to_string().contains("idempotency.ttl"));
/// # Ok::<(), stormguard_core::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct IdempotencyConfig {
    /// The most keys remembered at once, running and completed. Default 10 000.
    pub max_entries: usize,
    /// The most bytes of recorded answers kept at once (headers, body and trailers).
    /// Default 16 MiB.
    pub max_bytes: usize,
    /// The largest answer recorded; a larger one is sent but not kept (a repeat is told
    /// that the call ran and its answer was not kept). Default 64 KiB.
    pub max_record_bytes: usize,
    /// How long a key is remembered from its first run. Must be longer than the longest a
    /// client retries one call (its deadline). Default 10 minutes.
    pub ttl: Duration,
    /// The `grpc-retry-pushback-ms` of the `ABORTED` answer to a duplicate that arrives
    /// while the first run is still in progress: how long a keyed stormguard client waits
    /// before asking again. Default 100 ms.
    pub in_flight_pushback: Duration,
    /// The largest request body a keyed call may have: the server reads a keyed request
    /// whole, to compare its message with the record's, before the handler runs; a larger
    /// one is refused without running. Default 4 MiB and 5 bytes: tonic's default largest
    /// message, in its gRPC frame.
    pub max_request_bytes: usize,
}

impl Default for IdempotencyConfig {
    /// 10 000 keys, 16 MiB of answers, 64 KiB per answer, 10 minutes, 100 ms, requests of
    /// 4 MiB and 5 bytes.
    fn default() -> Self {
        IdempotencyConfig {
            max_entries: 10_000,
            max_bytes: 16 << 20,
            max_record_bytes: 64 << 10,
            ttl: Duration::from_secs(600),
            in_flight_pushback: Duration::from_millis(100),
            max_request_bytes: (4 << 20) + 5,
        }
    }
}

impl IdempotencyConfig {
    /// Checks the ranges; errors name the field as `idempotency.<field>`.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        check::at_least_one("idempotency.max_entries", self.max_entries as u64)?;
        check::at_least_one("idempotency.max_record_bytes", self.max_record_bytes as u64)?;
        check::at_least_one(
            "idempotency.max_request_bytes",
            self.max_request_bytes as u64,
        )?;
        if self.max_record_bytes > self.max_bytes {
            return Err(ConfigError::invalid(
                "idempotency.max_record_bytes",
                format!(
                    "must be at most max_bytes ({}): one answer must fit in the record",
                    self.max_bytes
                ),
            ));
        }
        if self.ttl.is_zero() {
            return Err(ConfigError::invalid(
                "idempotency.ttl",
                "must be greater than zero (and longer than a client retries one call)",
            ));
        }
        if self.in_flight_pushback.as_millis() > u128::from(MAX_PUSHBACK_MS) {
            return Err(ConfigError::invalid(
                "idempotency.in_flight_pushback",
                "must fit a grpc-retry-pushback-ms value (at most 2147483647 ms)",
            ));
        }
        Ok(())
    }
}

/// What the record says of a key when a call with it begins.
#[derive(Debug)]
pub enum Begin<R> {
    /// Not seen (or forgotten): this call runs, and the key is now in flight.
    New,
    /// A call with this key and this message is running: this one must not run.
    InFlight,
    /// A call with this key and this message completed: this one gets its answer.
    Completed(Arc<R>),
    /// A call with this key ran, or runs, with another message: this one is refused. It
    /// never runs and never gets the other call's answer.
    Mismatch,
}

/// A SHA-256 digest: what an idempotency record keeps of a request's message (its
/// fingerprint), and what a bounded store may key on instead of the key's own text.
///
/// SHA-256 because a caller chooses the bytes: with a hash that is not
/// collision-resistant, a caller could craft a second message with the first one's
/// fingerprint and be answered with the first call's record.
///
/// ```
/// use stormguard_core::Digest;
///
/// let whole = Digest::of([b"alice: 1 book".as_slice()]);
/// let split = Digest::of([b"alice: ".as_slice(), b"1 book".as_slice()]);
/// assert_eq!(whole, split, "the bytes, however they arrived");
/// assert_ne!(whole, Digest::of([b"mallory: 1 car".as_slice()]));
/// assert_eq!(Digest::from_bytes(*whole.as_bytes()), whole);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest([u8; 32]);

impl Digest {
    /// The SHA-256 of `chunks`, one after the other.
    pub fn of<'a>(chunks: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut hasher = Sha256::new();
        for chunk in chunks {
            hasher.update(chunk);
        }
        Digest(hasher.finalize().into())
    }

    /// A digest read back (from a store's database, say).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Digest(bytes)
    }

    /// The digest's 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Digest(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("..)")
    }
}

/// The bounded, in-memory record of idempotency keys (`K`): which are running, which
/// completed and with what answer (`R`), each with the [`Digest`] of its call's message. Every bound of [`IdempotencyConfig`] holds after every
/// call; the oldest entry (by its first run) goes first. Not shared: a server wraps it in a
/// lock.
///
/// # Why
///
/// A method that is not idempotent (a payment, a reservation) is never retried once its
/// request may have reached the server: an `UNAVAILABLE` after the handler ran, or an answer
/// lost on the way back, would have it done twice. So writes get no retries at all, and a
/// blip fails them. The standard way out (AWS's "make retries safe with idempotent APIs",
/// the IETF `Idempotency-Key` draft) is a caller-provided request identifier: the client
/// sends one key per logical call, the same on every attempt, and the server remembers
/// which keys it ran and what it answered. A repeat of a call that completed gets the
/// recorded answer; a repeat that arrives while the first is still running is told so
/// (gRPC `ABORTED`, the analogue of the draft's HTTP 409) and does not run either.
///
/// This module holds the two pieces the layers share and the simulator can drive:
///
/// * [`IdempotencyConfig`]: the bounds of a server's record of keys (entries, bytes, one
///   record's bytes, time to live) and the pushback of an in-flight duplicate, read from
///   code, JSON, YAML or TOML (`{"idempotency": {...}}`), validated with errors that name
///   the field;
/// * [`DedupTable`]: the bounded, in-memory record itself, generic over the key (a server
///   keys on the key's method and caller scope as well as its text) and the answer it
///   keeps, with `*_at(now)` methods for injected time. Each entry keeps the [`Digest`] of
///   its call's message: a repeat with another message is [`Begin::Mismatch`], never
///   run and never answered from the record.
///
/// The header and its validation are in [`crate::wire`] ([`IDEMPOTENCY_KEY`]); which
/// methods are keyed is in the method table
/// ([`MethodTable::idempotency_key`](crate::MethodTable::idempotency_key)); the
/// retry decision that treats a keyed method as safe to retry is
/// [`CallRetry`](crate::CallRetry)'s.
///
/// [`IDEMPOTENCY_KEY`]: crate::wire::IDEMPOTENCY_KEY
///
/// # The record's bounds, and the time to live
///
/// A key is remembered from its first run for [`ttl`](IdempotencyConfig::ttl). A retry
/// that arrives later runs the call again, so the time to live must be longer than the
/// longest a client keeps retrying one logical call (its deadline; stormguard clients never
/// retry past it). The record holds at most [`max_entries`](IdempotencyConfig::max_entries)
/// keys (running ones included) and [`max_bytes`](IdempotencyConfig::max_bytes) of
/// answers; past either, the oldest entry is evicted (and counted): an evicted key runs
/// again if it is repeated, so size the bounds for the keyed calls of one time to live.
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::Instant;
/// use stormguard_core::{Begin, DedupTable, Digest, IdempotencyConfig};
///
/// let mut table = DedupTable::<String, _>::new(IdempotencyConfig::default())?;
/// let now = Instant::now();
/// let book = Digest::of([b"alice: 1 book".as_slice()]);
/// assert!(matches!(table.begin_at("key-1", book, now), Begin::New));
/// assert!(matches!(table.begin_at("key-1", book, now), Begin::InFlight));
/// table.complete_at("key-1", book, "the answer", 10, now);
/// assert!(matches!(table.begin_at("key-1", book, now), Begin::Completed(a) if *a == "the answer"));
/// // The same key with another message is refused, never answered from the record.
/// let car = Digest::of([b"mallory: 1 car".as_slice()]);
/// assert!(matches!(table.begin_at("key-1", car, now), Begin::Mismatch));
/// // After its time to live, the key is forgotten.
/// let later = now + Duration::from_secs(601);
/// assert!(matches!(table.begin_at("key-1", car, later), Begin::New));
/// # Ok::<(), stormguard_core::ConfigError>(())
/// ```
#[derive(Debug)]
pub struct DedupTable<K, R> {
    config: IdempotencyConfig,
    entries: HashMap<K, Entry<R>>,
    /// Keys by first run, oldest first, with the generation of the entry they were pushed
    /// for (an entry removed or replaced leaves a stale item, skipped when reached).
    order: VecDeque<(K, u64)>,
    generation: u64,
    bytes: usize,
    evictions: u64,
    expired: u64,
}

#[derive(Debug)]
struct Entry<R> {
    generation: u64,
    created: Instant,
    /// The digest of the message of the call that holds the key.
    fingerprint: Digest,
    state: State<R>,
}

#[derive(Debug)]
enum State<R> {
    InFlight,
    Done { answer: Arc<R>, bytes: usize },
}

/// What a [`DedupTable`] holds and has dropped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DedupCounts {
    /// Keys remembered, running and completed.
    pub entries: usize,
    /// Bytes of recorded answers held.
    pub bytes: usize,
    /// Entries evicted before their time to live to keep a bound.
    pub evictions: u64,
    /// Entries forgotten at the end of their time to live.
    pub expired: u64,
}

impl<K: Hash + Eq + Clone, R> DedupTable<K, R> {
    /// An empty record with `config`'s bounds (validated).
    pub fn new(config: IdempotencyConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(DedupTable {
            config,
            entries: HashMap::new(),
            order: VecDeque::new(),
            generation: 0,
            bytes: 0,
            evictions: 0,
            expired: 0,
        })
    }

    /// The bounds.
    pub fn config(&self) -> &IdempotencyConfig {
        &self.config
    }

    /// What the record holds and has dropped.
    pub fn counts(&self) -> DedupCounts {
        DedupCounts {
            entries: self.entries.len(),
            bytes: self.bytes,
            evictions: self.evictions,
            expired: self.expired,
        }
    }

    /// A call with `key` and a message of digest `fingerprint` begins at `now`: what the
    /// record says of it. A key held with another fingerprint is [`Begin::Mismatch`]. A
    /// key not held (or held past its time to live) becomes in flight, evicting the oldest
    /// entry when the record is full.
    pub fn begin_at<Q>(&mut self, key: &Q, fingerprint: Digest, now: Instant) -> Begin<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.expire_at(now);
        if let Some(entry) = self.entries.get(key) {
            if entry.fingerprint != fingerprint {
                return Begin::Mismatch;
            }
            return match &entry.state {
                State::InFlight => Begin::InFlight,
                State::Done { answer, .. } => Begin::Completed(Arc::clone(answer)),
            };
        }
        while self.entries.len() >= self.config.max_entries {
            if !self.evict_oldest() {
                break;
            }
        }
        self.insert(key.to_owned(), fingerprint, State::InFlight, now);
        Begin::New
    }

    /// The call with `key` and a message of digest `fingerprint` completed at `now` with
    /// `answer` (`bytes` long, at most
    /// [`max_record_bytes`](IdempotencyConfig::max_record_bytes)): repeats of that message
    /// get it until the key's time to live ends. Returns `false`, keeping nothing, for an
    /// answer over that bound, or when the key is now held for another message. A key
    /// evicted while it ran is held again, from `now`.
    pub fn complete_at<Q>(
        &mut self,
        key: &Q,
        fingerprint: Digest,
        answer: R,
        bytes: usize,
        now: Instant,
    ) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if bytes > self.config.max_record_bytes {
            self.abandon(key, fingerprint);
            return false;
        }
        self.record_at(key, fingerprint, answer, bytes, now)
    }

    /// [`complete_at`](Self::complete_at) without the bound on one answer (the total
    /// bound still holds): for a fixed, small answer of the server's own, such as the one
    /// that says "the call ran, its answer was too large to keep", which must be kept
    /// however small `max_record_bytes` is. Returns `false`, keeping nothing, when the key
    /// is held for another message (it was evicted while this call ran, and another call
    /// took it).
    pub fn record_at<Q>(
        &mut self,
        key: &Q,
        fingerprint: Digest,
        answer: R,
        bytes: usize,
        now: Instant,
    ) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.expire_at(now);
        let done = State::Done {
            answer: Arc::new(answer),
            bytes,
        };
        match self.entries.get_mut(key) {
            Some(entry) if entry.fingerprint != fingerprint => return false,
            Some(entry) => {
                if let State::Done { bytes: old, .. } = &entry.state {
                    self.bytes -= old;
                }
                entry.state = done;
            }
            None => {
                while self.entries.len() >= self.config.max_entries {
                    if !self.evict_oldest() {
                        break;
                    }
                }
                self.insert(key.to_owned(), fingerprint, done, now);
            }
        }
        self.bytes += bytes;
        while self.bytes > self.config.max_bytes {
            if !self.evict_oldest() {
                break;
            }
        }
        true
    }

    /// The call with `key` and a message of digest `fingerprint` ended without an answer
    /// worth keeping (it failed in transport, was cancelled, or answered "try again"): the
    /// key is forgotten, so a retry runs. A completed key, or one held for another
    /// message, is left as it is.
    pub fn abandon<Q>(&mut self, key: &Q, fingerprint: Digest)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self
            .entries
            .get(key)
            .is_some_and(|e| e.fingerprint == fingerprint && matches!(e.state, State::InFlight))
        {
            self.entries.remove(key);
        }
    }

    fn insert(&mut self, key: K, fingerprint: Digest, state: State<R>, now: Instant) {
        self.generation += 1;
        let generation = self.generation;
        self.order.push_back((key.clone(), generation));
        self.entries.insert(
            key,
            Entry {
                generation,
                created: now,
                fingerprint,
                state,
            },
        );
        // Stale items (entries abandoned) are dropped once they outnumber live ones.
        if self.order.len() > 2 * self.entries.len() + 16 {
            let entries = &self.entries;
            self.order
                .retain(|(k, g)| entries.get(k).is_some_and(|e| e.generation == *g));
        }
    }

    /// Removes the oldest live entry; `false` when there is none.
    fn evict_oldest(&mut self) -> bool {
        while let Some((key, generation)) = self.order.pop_front() {
            if self.remove_if(&key, generation) {
                self.evictions += 1;
                return true;
            }
        }
        false
    }

    /// Forgets the entries whose time to live has ended at `now` (the oldest are first).
    fn expire_at(&mut self, now: Instant) {
        while let Some((key, generation)) = self.order.front() {
            let live = self
                .entries
                .get(key)
                .filter(|e| e.generation == *generation);
            match live {
                Some(e) if now.saturating_duration_since(e.created) < self.config.ttl => break,
                Some(_) => {
                    let (key, generation) = (key.clone(), *generation);
                    self.order.pop_front();
                    self.remove_if(&key, generation);
                    self.expired += 1;
                }
                None => {
                    self.order.pop_front();
                }
            }
        }
    }

    /// Removes `key`'s entry if it is of `generation`.
    fn remove_if(&mut self, key: &K, generation: u64) -> bool {
        if self
            .entries
            .get(key)
            .is_some_and(|e| e.generation == generation)
        {
            if let Some(Entry {
                state: State::Done { bytes, .. },
                ..
            }) = self.entries.remove(key)
            {
                self.bytes -= bytes;
            }
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests;
