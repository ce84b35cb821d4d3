//! Where a server remembers the idempotency keys it ran: the [`IdempotencyStore`] trait,
//! the recorded answer ([`Record`]) and the bounded in-memory store ([`MemoryStore`]).

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http::HeaderMap;
pub use stormguard_core::Begin;
use stormguard_core::ConfigError;
use stormguard_core::Instant;
use stormguard_core::{DedupCounts, DedupTable, IdempotencyConfig};

use super::IdempotencyKey;

/// The record of idempotency keys behind an [`IdempotencyLayer`](super::IdempotencyLayer).
///
/// For each call with a key the layer calls, in this order:
///
/// 1. [`begin`](Self::begin): what the store knows of the key. [`Begin::New`] means the
///    key was not held and is now *in flight*: the call runs. [`Begin::InFlight`] means a
///    call with the key is running: this one is answered `ABORTED` without running.
///    [`Begin::Completed`] means a call with the key completed: this one gets the recorded
///    answer without running. `begin` must decide atomically: two calls with one key must
///    never both get `New`.
/// 2. Exactly one of, for a call that got `New`:
///    * [`complete`](Self::complete) once the handler answered with something worth
///      repeating (an `OK`, or a status the application chose), with that answer;
///    * [`abandon`](Self::abandon) when the handler did not finish (its future or its
///      response body failed, the client went away and the call was cancelled) or answered
///      `UNAVAILABLE` (it says it did nothing that must not be repeated): the key is
///      released so that a retry runs the call.
///
/// # A store backed by a database
///
/// The in-memory store is lost when the process restarts and is not shared between
/// replicas: a retry that reaches another replica runs the call again. A team that needs
/// the guarantee across replicas and restarts puts its database behind this trait, and
/// then **the record must commit with the side effect, in the application's own
/// transaction**. If the side effect commits and the record does not (a crash between
/// the two), a retry runs the write twice; if the record commits and the side effect does
/// not, a retry is told the call completed when it did nothing. So the handler itself,
/// which sees the key in its request extensions ([`IdempotencyKey`]), writes the key and
/// its answer in the transaction of its write, and the store's `begin` reads that table
/// (`SELECT ... FOR UPDATE`, or an insert of an "in flight" row that fails on a duplicate
/// key). `complete` may then only cache what the transaction wrote, and `abandon` deletes
/// an "in flight" row that no transaction completed. The methods are called on the
/// server's tasks and must not block for long (a lookup by primary key, not a scan).
///
/// A key's record must outlive every retry of its call: keep it longer than the longest
/// deadline a client gives one logical call (see
/// [`IdempotencyConfig::ttl`](stormguard_core::IdempotencyConfig::ttl)).
pub trait IdempotencyStore: Send + Sync + 'static {
    /// A call with `key` begins: what the store knows of it (see the trait's docs).
    fn begin(&self, key: &IdempotencyKey) -> Begin<Record>;
    /// The call with `key` answered `record`: repeats get it.
    fn complete(&self, key: &IdempotencyKey, record: Record);
    /// The call with `key` ended without an answer worth repeating: a retry runs it.
    fn abandon(&self, key: &IdempotencyKey);
    /// The largest answer the store keeps ([`Record::size`]); the layer does not hold a
    /// larger one to record it. Default: the default
    /// [`max_record_bytes`](IdempotencyConfig::max_record_bytes), 64 KiB.
    fn max_record_bytes(&self) -> usize {
        IdempotencyConfig::default().max_record_bytes
    }
}

/// A recorded answer: the response headers, the body's bytes and the trailers of a unary
/// call, sent again as they were to a repeat of the call.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    headers: HeaderMap,
    body: Bytes,
    trailers: Option<HeaderMap>,
    not_kept: bool,
}

impl Record {
    /// An answer with these headers, body bytes (the gRPC-framed messages as they were
    /// sent) and trailers (`None` for a trailers-only answer, whose status is in
    /// `headers`).
    pub fn new(headers: HeaderMap, body: Bytes, trailers: Option<HeaderMap>) -> Self {
        Record {
            headers,
            body,
            trailers,
            not_kept: false,
        }
    }

    /// What the layer records for a call whose answer was too large to keep: a
    /// trailers-only `ALREADY_EXISTS` with
    /// [`MESSAGE_NOT_KEPT`](super::MESSAGE_NOT_KEPT) (the call ran; a repeat is not run, and
    /// learns that). A store keeps it whatever its bound on one answer: it is small and
    /// fixed.
    pub fn not_kept(headers: HeaderMap) -> Self {
        Record {
            not_kept: true,
            ..Record::new(headers, Bytes::new(), None)
        }
    }

    /// Whether this is the record of an answer too large to keep ([`Record::not_kept`]).
    pub fn is_not_kept(&self) -> bool {
        self.not_kept
    }

    /// The response headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The body's bytes.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The trailers, if the answer had any.
    pub fn trailers(&self) -> Option<&HeaderMap> {
        self.trailers.as_ref()
    }

    /// What the record costs to keep, in bytes: the body, and every header and trailer's
    /// name and value.
    pub fn size(&self) -> usize {
        self.body.len()
            + header_bytes(&self.headers)
            + self.trailers.as_ref().map_or(0, header_bytes)
    }
}

/// The bytes of a header map's names and values.
pub(super) fn header_bytes(headers: &HeaderMap) -> usize {
    headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum()
}

/// The default [`IdempotencyStore`]: a bounded record in the server's memory (the core's
/// [`DedupTable`] behind a lock), with every bound of [`IdempotencyConfig`]: keys, bytes in
/// total and per answer, time to live. The oldest entry is evicted first, and evictions
/// are counted ([`counts`](Self::counts)). Time is `tokio::time::Instant`, so tests can
/// run it on paused time.
///
/// ```
/// use stormguard_server::idempotency::{IdempotencyLayer, MemoryStore};
/// use stormguard_core::IdempotencyConfig;
/// use std::sync::Arc;
///
/// let store = Arc::new(MemoryStore::new(IdempotencyConfig::default())?);
/// let layer = IdempotencyLayer::new().with_store(store.clone());
/// assert_eq!(store.counts().entries, 0);
/// # Ok::<(), stormguard_core::ConfigError>(())
/// ```
pub struct MemoryStore {
    table: Mutex<DedupTable<Record>>,
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("counts", &self.counts())
            .finish()
    }
}

impl MemoryStore {
    /// An empty store with `config`'s bounds (validated).
    pub fn new(config: IdempotencyConfig) -> Result<Self, ConfigError> {
        Ok(MemoryStore {
            table: Mutex::new(DedupTable::new(config)?),
        })
    }

    /// What the store holds and has evicted or let expire.
    pub fn counts(&self) -> DedupCounts {
        self.lock().counts()
    }

    /// The bounds it keeps.
    pub fn config(&self) -> IdempotencyConfig {
        self.lock().config().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DedupTable<Record>> {
        // Every update leaves the table consistent before it can panic: a poisoned lock
        // holds a usable table.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl IdempotencyStore for MemoryStore {
    fn begin(&self, key: &IdempotencyKey) -> Begin<Record> {
        self.lock().begin_at(key.as_str(), Instant::now())
    }

    fn complete(&self, key: &IdempotencyKey, record: Record) {
        let size = record.size();
        let mut table = self.lock();
        if record.is_not_kept() {
            table.record_at(key.as_str(), record, size, Instant::now());
        } else {
            table.complete_at(key.as_str(), record, size, Instant::now());
        }
    }

    fn abandon(&self, key: &IdempotencyKey) {
        self.lock().abandon(key.as_str());
    }

    fn max_record_bytes(&self) -> usize {
        self.lock().config().max_record_bytes
    }
}

impl<T: IdempotencyStore + ?Sized> IdempotencyStore for Arc<T> {
    fn begin(&self, key: &IdempotencyKey) -> Begin<Record> {
        (**self).begin(key)
    }

    fn complete(&self, key: &IdempotencyKey, record: Record) {
        (**self).complete(key, record)
    }

    fn abandon(&self, key: &IdempotencyKey) {
        (**self).abandon(key)
    }

    fn max_record_bytes(&self) -> usize {
        (**self).max_record_bytes()
    }
}
