//! The idempotency middleware: a tower [`Layer`] for tonic servers that hands each call's
//! idempotency key to its handler and, with a store, runs each key once.
//!
//! # Why
//!
//! A write that is not idempotent cannot be retried once it may have run: if the answer
//! was lost, a retry would do it twice. With a key that the client sends on every attempt
//! of one logical call (stormguard's `RetryLayer` stamps `idempotency-key` for the methods
//! configured with `idempotency_key: true`), the server can tell a retry from a new call.
//! This layer:
//!
//! * reads the key ([`wire::IDEMPOTENCY_KEY`](stormguard_core::wire::IDEMPOTENCY_KEY)) and
//!   puts it in the request's extensions as an [`IdempotencyKey`], which a tonic handler
//!   reads with `request.extensions().get::<IdempotencyKey>()` (to write it in the
//!   transaction of its side effect, see [`IdempotencyStore`]); a key that is empty, longer
//!   than 128 bytes, not visible ASCII or repeated is refused with `INVALID_ARGUMENT`, and
//!   the handler does not run;
//! * with a store ([`with_store`](IdempotencyLayer::with_store), or
//!   [`in_memory`](IdempotencyLayer::in_memory)), deduplicates: a repeat of a call that
//!   completed gets the recorded answer again, a repeat that arrives while the first is
//!   still running gets `ABORTED` (see [`MESSAGE_IN_FLIGHT`]), and neither runs the
//!   handler.
//!
//! Calls without a key pass through untouched.
//!
//! # What is recorded
//!
//! The answer of a unary call: its response headers, its body's bytes and its trailers,
//! once the handler answered and the body was read to its end (which, for a unary tonic
//! handler, is at once). Recorded: an `OK`, and any status the handler returned but
//! `UNAVAILABLE`, which says the server did nothing a retry must not repeat (the key is
//! released, so a retry runs). Not recorded, the key released: a handler whose future or
//! body failed, or that was cancelled (the client went away). An answer larger than the
//! store's [`max_record_bytes`](IdempotencyStore::max_record_bytes) is sent as it is, and
//! the key is recorded with a short answer instead, `ALREADY_EXISTS` with
//! [`MESSAGE_NOT_KEPT`]: the call ran, its answer was not kept (counted as
//! [`IdempotencySnapshot::oversize`]). A streaming answer is read until it ends or passes
//! that bound, so keys are for unary methods.
//!
//! # The in-flight answer
//!
//! A duplicate that finds its key in flight is answered at once: `ABORTED`,
//! [`MESSAGE_IN_FLIGHT`], `stormguard-unprocessed: 1` (this call did not run) and
//! `grpc-retry-pushback-ms` set to the store's in-flight pushback (100 ms by default).
//! `ABORTED` is not a retryable code by default; a stormguard client calling a keyed
//! method reads this answer (an `ABORTED` its server did not run) as "the first run is
//! still going": it retries after the pushback, under every other rule (budget, attempts,
//! deadline), and the retry finds the recorded answer. A hedge of a keyed call that gets it
//! is a lost copy, never the call's answer.
//!
//! # Where it goes
//!
//! Inside the [`ShedLayer`](crate::ShedLayer) (`Server::builder().layer(shed).layer(idem)`):
//! a call the queue sheds never reaches the store, and a repeat answered from the record
//! still took its place in the queue for the moment it took. A layer of its own rather than
//! a part of the `ShedLayer`: a server that does not shed may still deduplicate, and each
//! layer keeps one job.
//!
//! ```
//! use stormguard_core::idempotency::IdempotencyConfig;
//! use stormguard_server::idempotency::IdempotencyLayer;
//! use stormguard_server::{AdmissionConfig, ShedLayer};
//!
//! let idempotency = IdempotencyLayer::in_memory(IdempotencyConfig::default())?;
//! let stats = idempotency.stats();
//! let server = tonic::transport::Server::builder()
//!     .layer(ShedLayer::from_config(AdmissionConfig::default())?)
//!     .layer(idempotency);
//! // server.add_service(...).serve(addr).await
//! # let _ = server;
//! assert_eq!(stats.snapshot().replayed, 0);
//! # Ok::<(), stormguard_core::ConfigError>(())
//! ```
//!
//! # Readiness contract
//!
//! `poll_ready` readies the inner service. A call answered by the layer itself (a refused
//! key, a repeat) does not call the inner service: the readiness it was given is unused,
//! which tonic's router and the `ShedLayer` allow.

mod future;
mod store;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::HeaderValue;
use stormguard_core::error::ConfigError;
use stormguard_core::idempotency::IdempotencyConfig;
use stormguard_core::wire::http::IDEMPOTENCY_KEY;
use stormguard_core::wire::{IdempotencyKeyError, parse_idempotency_key};
use tower_layer::Layer;
use tower_service::Service;

pub use self::future::ResponseFuture;
pub use self::store::{Begin, IdempotencyStore, MemoryStore, Record};

/// The `grpc-message` of the `ABORTED` answer to a duplicate whose first run is in flight.
pub const MESSAGE_IN_FLIGHT: &str = "stormguard: idempotency-key in flight: a call with this key is still running; ask again after the pushback";
/// The `grpc-message` of the `ALREADY_EXISTS` answer recorded for a call whose answer was
/// too large to keep.
pub const MESSAGE_NOT_KEPT: &str = "stormguard: idempotency-key completed: the call ran, but its answer was larger than the record keeps";

/// A call's idempotency key, as its client sent it (validated): in the request's extensions
/// of every call that carries one, for its handler.
///
/// ```
/// use stormguard_server::idempotency::IdempotencyKey;
///
/// fn charge(request: &tonic::Request<()>) -> Option<&str> {
///     request.extensions().get::<IdempotencyKey>().map(IdempotencyKey::as_str)
/// }
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(Arc<str>);

impl IdempotencyKey {
    /// A key from a header's value, validated as
    /// [`parse_idempotency_key`] does.
    ///
    /// ```
    /// use stormguard_server::idempotency::IdempotencyKey;
    ///
    /// assert_eq!(IdempotencyKey::new("order-42").unwrap().as_str(), "order-42");
    /// assert!(IdempotencyKey::new("two words").is_err());
    /// ```
    pub fn new(key: &str) -> Result<Self, IdempotencyKeyError> {
        match parse_idempotency_key([key.as_bytes()])? {
            Some(key) => Ok(IdempotencyKey(Arc::from(key))),
            None => Err(IdempotencyKeyError::Empty),
        }
    }

    /// The key.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key of a request: `Ok(None)` without one.
    fn of(headers: &http::HeaderMap) -> Result<Option<Self>, IdempotencyKeyError> {
        let values = headers
            .get_all(&IDEMPOTENCY_KEY)
            .iter()
            .map(HeaderValue::as_bytes);
        Ok(parse_idempotency_key(values)?.map(|k| IdempotencyKey(Arc::from(k))))
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({:?})", self.as_str())
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Wraps a tonic server's routes in an [`Idempotency`] service: keys to handlers, and,
/// with a store, each key run once (see the [module docs](self)).
#[derive(Clone)]
pub struct IdempotencyLayer {
    store: Option<Arc<dyn IdempotencyStore>>,
    in_flight_pushback: Duration,
    stats: IdempotencyStats,
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("dedup", &self.store.is_some())
            .field("in_flight_pushback", &self.in_flight_pushback)
            .finish_non_exhaustive()
    }
}

impl Default for IdempotencyLayer {
    fn default() -> Self {
        IdempotencyLayer::new()
    }
}

impl IdempotencyLayer {
    /// A layer that checks keys and hands them to handlers, and deduplicates nothing.
    pub fn new() -> Self {
        IdempotencyLayer {
            store: None,
            in_flight_pushback: IdempotencyConfig::default().in_flight_pushback,
            stats: IdempotencyStats::default(),
        }
    }

    /// A layer that deduplicates with a [`MemoryStore`] of `config`'s bounds (validated),
    /// and `config`'s in-flight pushback.
    pub fn in_memory(config: IdempotencyConfig) -> Result<Self, ConfigError> {
        let pushback = config.in_flight_pushback;
        Ok(IdempotencyLayer::new()
            .with_store(Arc::new(MemoryStore::new(config)?))
            .with_in_flight_pushback(pushback))
    }

    /// Deduplicates with `store`.
    pub fn with_store(mut self, store: Arc<dyn IdempotencyStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// The `grpc-retry-pushback-ms` of the `ABORTED` answer to an in-flight duplicate
    /// (whole milliseconds). Default 100 ms.
    pub fn with_in_flight_pushback(mut self, pushback: Duration) -> Self {
        self.in_flight_pushback = pushback;
        self
    }

    /// The layer's counters, shared by every service it builds.
    pub fn stats(&self) -> IdempotencyStats {
        self.stats.clone()
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Idempotency<S> {
        Idempotency {
            inner,
            layer: self.clone(),
        }
    }
}

/// A tonic server's routes behind an [`IdempotencyLayer`].
#[derive(Clone)]
pub struct Idempotency<S> {
    inner: S,
    layer: IdempotencyLayer,
}

impl<S> Idempotency<S> {
    /// The layer's counters.
    pub fn stats(&self) -> IdempotencyStats {
        self.layer.stats()
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S> fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("layer", &self.layer)
            .finish_non_exhaustive()
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Idempotency<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, ReqBody, B> Service<http::Request<ReqBody>> for Idempotency<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<B>>,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<ReqBody>) -> Self::Future {
        let stats = &self.layer.stats;
        let key = match IdempotencyKey::of(request.headers()) {
            Ok(Some(key)) => key,
            Ok(None) => return ResponseFuture::passthrough(self.inner.call(request)),
            Err(error) => {
                stats.0.invalid.fetch_add(1, Ordering::Relaxed);
                return ResponseFuture::answer(future::invalid_key(&error));
            }
        };
        stats.0.keyed.fetch_add(1, Ordering::Relaxed);
        request.extensions_mut().insert(key.clone());
        let Some(store) = &self.layer.store else {
            return ResponseFuture::passthrough(self.inner.call(request));
        };
        match store.begin(&key) {
            Begin::New => ResponseFuture::running(
                self.inner.call(request),
                Arc::clone(store),
                key,
                stats.clone(),
            ),
            Begin::InFlight => {
                stats.0.in_flight.fetch_add(1, Ordering::Relaxed);
                ResponseFuture::answer(future::in_flight(self.layer.in_flight_pushback))
            }
            Begin::Completed(record) => {
                stats.0.replayed.fetch_add(1, Ordering::Relaxed);
                ResponseFuture::answer(future::replay(&record))
            }
        }
    }
}

/// The counters of an [`IdempotencyLayer`]: cumulative since it was built, read without a
/// lock. (A [`MemoryStore`] counts its own evictions: [`MemoryStore::counts`].)
#[derive(Clone, Debug, Default)]
pub struct IdempotencyStats(Arc<Counters>);

#[derive(Debug, Default)]
struct Counters {
    keyed: AtomicU64,
    invalid: AtomicU64,
    recorded: AtomicU64,
    replayed: AtomicU64,
    in_flight: AtomicU64,
    oversize: AtomicU64,
    released: AtomicU64,
}

/// What an [`IdempotencyLayer`] did, at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct IdempotencySnapshot {
    /// Calls that carried a valid key.
    pub keyed: u64,
    /// Calls refused for a malformed key (`INVALID_ARGUMENT`).
    pub invalid: u64,
    /// Answers recorded (each a first run that completed).
    pub recorded: u64,
    /// Repeats of a completed call, answered from the record (dedup hits).
    pub replayed: u64,
    /// Repeats that found their first run in flight (`ABORTED`).
    pub in_flight: u64,
    /// Answers too large to record (the key was recorded as "ran, not kept").
    pub oversize: u64,
    /// First runs whose key was released (failed, cancelled, or `UNAVAILABLE`): a retry
    /// runs them again.
    pub released: u64,
}

impl IdempotencyStats {
    /// The counters now.
    pub fn snapshot(&self) -> IdempotencySnapshot {
        let c = &self.0;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        IdempotencySnapshot {
            keyed: get(&c.keyed),
            invalid: get(&c.invalid),
            recorded: get(&c.recorded),
            replayed: get(&c.replayed),
            in_flight: get(&c.in_flight),
            oversize: get(&c.oversize),
            released: get(&c.released),
        }
    }
}
