//! Where a server remembers the idempotency keys it ran: the [`IdempotencyStore`] trait,
//! what it keys on ([`ScopedKey`]), the recorded answer ([`Record`]) and the bounded
//! in-memory store ([`MemoryStore`]).

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http::HeaderMap;
pub use stormguard_core::Begin;
use stormguard_core::ConfigError;
pub use stormguard_core::Digest;
use stormguard_core::Instant;
use stormguard_core::{DedupCounts, DedupTable, IdempotencyConfig};

use super::IdempotencyKey;

/// What a store keys a record on: the call's method (its request path), its caller scope
/// (what the layer's scope function returned, see
/// [`IdempotencyLayer::with_scope`](super::IdempotencyLayer::with_scope)) and its key. The
/// same key under another method or another scope is another record.
///
/// ```
/// use stormguard_server::idempotency::{IdempotencyKey, ScopedKey};
///
/// let key = IdempotencyKey::new("order-123")?;
/// let create = ScopedKey::new("/shop.Orders/Create", Some("alice"), key.clone());
/// let get = ScopedKey::new("/shop.Orders/Get", Some("alice"), key.clone());
/// let mallory = ScopedKey::new("/shop.Orders/Create", Some("mallory"), key);
/// assert_ne!(create.digest(), get.digest());
/// assert_ne!(create.digest(), mallory.digest());
/// assert_eq!(create.scope(), Some("alice"));
/// # Ok::<(), stormguard_server::idempotency::IdempotencyKeyError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ScopedKey {
    method: Box<str>,
    scope: Option<Box<str>>,
    key: IdempotencyKey,
}

impl ScopedKey {
    /// The key `key` of a call to `method` (`/package.Service/Method`) in `scope` (`None`:
    /// the one scope of the calls without one).
    pub fn new(method: &str, scope: Option<&str>, key: IdempotencyKey) -> Self {
        ScopedKey {
            method: method.into(),
            scope: scope.map(Into::into),
            key,
        }
    }

    /// The call's method: its request path.
    pub fn method(&self) -> &str {
        &self.method
    }

    /// The call's caller scope, if it has one.
    pub fn scope(&self) -> Option<&str> {
        self.scope.as_deref()
    }

    /// The idempotency key.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// A SHA-256 of the method, the scope and the key, each with its length (so no two
    /// scoped keys share one): 32 bytes to key on however long the parts, as
    /// [`MemoryStore`] does.
    pub fn digest(&self) -> Digest {
        let len = |part: &str| (part.len() as u64).to_be_bytes();
        let (method, key) = (self.method(), self.key.as_str());
        let (tag, scope) = match self.scope() {
            Some(scope) => ([1u8], scope),
            None => ([0u8], ""),
        };
        let (m, s, k) = (len(method), len(scope), len(key));
        Digest::of([
            &m[..],
            method.as_bytes(),
            &tag[..],
            &s[..],
            scope.as_bytes(),
            &k[..],
            key.as_bytes(),
        ])
    }
}

/// The record of idempotency keys behind an [`IdempotencyLayer`](super::IdempotencyLayer).
///
/// A record is keyed by a [`ScopedKey`] (method, caller scope, key) and keeps the
/// [`Digest`] of the message of the call that holds it (its fingerprint: the SHA-256 of
/// the request body's bytes). For each call with a key the layer reads the request whole,
/// then calls, in this order:
///
/// 1. [`begin`](Self::begin): what the store knows of the key. [`Begin::New`] means the
///    key was not held and is now *in flight*, for this fingerprint: the call runs.
///    [`Begin::InFlight`] means a call with the key and the same fingerprint is running:
///    this one is answered `ABORTED` without running. [`Begin::Completed`] means a call
///    with the key and the same fingerprint completed: this one gets the recorded answer
///    without running. [`Begin::Mismatch`] means the key is held with another fingerprint,
///    running or completed: this one is refused (`FAILED_PRECONDITION`), never run and
///    never answered from the record. `begin` must decide atomically: two calls with one
///    key must never both get `New`.
/// 2. Exactly one of, for a call that got `New`:
///    * [`complete`](Self::complete) once the handler answered with something worth
///      repeating (an `OK`, or a status the application chose), with that answer and its
///      fingerprint ([`Record::fingerprint`]);
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
/// which sees the key in its request extensions ([`IdempotencyKey`]), writes the key
/// and its answer in the transaction of its write, and the store's `begin` reads that table (`SELECT ... FOR
/// UPDATE`, or an insert of an "in flight" row that fails on a duplicate key), keyed by
/// method, scope and key (or by [`ScopedKey::digest`]), comparing the fingerprint column.
/// `complete` may then only cache what the transaction wrote, and `abandon` deletes an
/// "in flight" row of that fingerprint that no transaction completed. The methods are
/// called on the server's tasks and must not block for long (a lookup by primary key, not
/// a scan).
///
/// A key's record must outlive every retry of its call: keep it longer than the longest
/// deadline a client gives one logical call (see
/// [`IdempotencyConfig::ttl`](stormguard_core::IdempotencyConfig::ttl)).
pub trait IdempotencyStore: Send + Sync + 'static {
    /// A call with `key` and a message of digest `fingerprint` begins: what the store knows
    /// of it (see the trait's docs).
    fn begin(&self, key: &ScopedKey, fingerprint: &Digest) -> Begin<Record>;
    /// The call with `key` answered `record` (for the message of
    /// [`record.fingerprint()`](Record::fingerprint)): repeats of that message get it.
    fn complete(&self, key: &ScopedKey, record: Record);
    /// The call with `key` and a message of digest `fingerprint` ended without an answer
    /// worth repeating: a retry runs it.
    fn abandon(&self, key: &ScopedKey, fingerprint: &Digest);
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
    fingerprint: Digest,
    headers: HeaderMap,
    body: Bytes,
    trailers: Option<HeaderMap>,
    not_kept: bool,
}

impl Record {
    /// The answer to a request of digest `fingerprint`, with these headers, body bytes (the
    /// gRPC-framed messages as they were sent) and trailers (`None` for a trailers-only
    /// answer, whose status is in `headers`).
    pub fn new(
        fingerprint: Digest,
        headers: HeaderMap,
        body: Bytes,
        trailers: Option<HeaderMap>,
    ) -> Self {
        Record {
            fingerprint,
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
    pub fn not_kept(fingerprint: Digest, headers: HeaderMap) -> Self {
        Record {
            not_kept: true,
            ..Record::new(fingerprint, headers, Bytes::new(), None)
        }
    }

    /// The digest of the request message this is the answer to: a repeat with another
    /// message never gets it.
    pub fn fingerprint(&self) -> &Digest {
        &self.fingerprint
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
/// total and per answer, time to live. It keys on [`ScopedKey::digest`], so an entry costs
/// the same however long its method, scope and key. The oldest entry is evicted first, and evictions
/// are counted ([`counts`](Self::counts)). Time is `tokio::time::Instant`, so tests can
/// run it on paused time.
///
/// ```
/// use stormguard_server::idempotency::{IdempotencyLayer, MemoryStore};
/// use stormguard_server::IdempotencyConfig;
/// use std::sync::Arc;
///
/// let store = Arc::new(MemoryStore::new(IdempotencyConfig::default())?);
/// let layer = IdempotencyLayer::new().with_store(store.clone());
/// assert_eq!(store.counts().entries, 0);
/// # Ok::<(), stormguard_server::ConfigError>(())
/// ```
pub struct MemoryStore {
    table: Mutex<DedupTable<Digest, Record>>,
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

    fn lock(&self) -> std::sync::MutexGuard<'_, DedupTable<Digest, Record>> {
        // Every update leaves the table consistent before it can panic: a poisoned lock
        // holds a usable table.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl IdempotencyStore for MemoryStore {
    fn begin(&self, key: &ScopedKey, fingerprint: &Digest) -> Begin<Record> {
        self.lock()
            .begin_at(&key.digest(), *fingerprint, Instant::now())
    }

    fn complete(&self, key: &ScopedKey, record: Record) {
        let (size, fingerprint) = (record.size(), *record.fingerprint());
        let (key, now) = (key.digest(), Instant::now());
        let mut table = self.lock();
        if record.is_not_kept() {
            table.record_at(&key, fingerprint, record, size, now);
        } else {
            table.complete_at(&key, fingerprint, record, size, now);
        }
    }

    fn abandon(&self, key: &ScopedKey, fingerprint: &Digest) {
        self.lock().abandon(&key.digest(), *fingerprint);
    }

    fn max_record_bytes(&self) -> usize {
        self.lock().config().max_record_bytes
    }
}

impl<T: IdempotencyStore + ?Sized> IdempotencyStore for Arc<T> {
    fn begin(&self, key: &ScopedKey, fingerprint: &Digest) -> Begin<Record> {
        (**self).begin(key, fingerprint)
    }

    fn complete(&self, key: &ScopedKey, record: Record) {
        (**self).complete(key, record)
    }

    fn abandon(&self, key: &ScopedKey, fingerprint: &Digest) {
        (**self).abandon(key, fingerprint)
    }

    fn max_record_bytes(&self) -> usize {
        (**self).max_record_bytes()
    }
}
