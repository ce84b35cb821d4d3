//! The idempotency middleware: [`IdempotencyLayer`] hands each call's idempotency key to
//! its handler and, with a store, runs each key once.
//!
//! A write that is not idempotent cannot be retried once it may have run: if the answer
//! was lost, a retry would do it twice. With a key the client sends on every attempt of
//! one logical call (stormguard's `RetryLayer` stamps `idempotency-key` for the methods
//! configured with `idempotency_key: true`), the server tells a retry from a new call. The
//! layer refuses a malformed key with `INVALID_ARGUMENT` and puts a valid one in the
//! request's extensions as an [`IdempotencyKey`]. With a store, it reads a keyed request
//! whole and keys its record on the method, the caller's scope
//! ([`IdempotencyLayer::with_scope`]; one shared scope by default) and the key, with the
//! SHA-256 of the request's bytes beside it: a repeat of a completed call gets its
//! recorded answer, a repeat of a running one `ABORTED` and a pushback
//! ([`MESSAGE_IN_FLIGHT`]), the key with another message `FAILED_PRECONDITION`
//! ([`MESSAGE_MISMATCH`]); none runs the handler. Calls without a key pass through. It
//! goes inside the [`ShedLayer`](crate::ShedLayer), so a call the queue sheds never
//! reaches the store. The repository's `docs/idempotency.md` says what is recorded, what a
//! store must guarantee and why the default scope is what it is.
//!
//! ```
//! use stormguard_server::idempotency::IdempotencyLayer;
//! use stormguard_server::{AdmissionConfig, IdempotencyConfig, ShedLayer};
//!
//! let idempotency = IdempotencyLayer::in_memory(IdempotencyConfig::default())?;
//! let stats = idempotency.stats();
//! let server = tonic::transport::Server::builder()
//!     .layer(ShedLayer::from_config(&AdmissionConfig::default())?)
//!     .layer(idempotency);
//! // server.add_service(...).serve(addr).await
//! # let _ = server;
//! assert_eq!(stats.snapshot().replayed, 0);
//! # Ok::<(), stormguard_server::ConfigError>(())
//! ```
//!
//! # Readiness contract
//!
//! `poll_ready` readies the inner service. A call answered by the layer itself (a refused
//! key, a repeat) does not call the inner service: the readiness it was given is unused,
//! which tonic's router and the `ShedLayer` allow.

mod future;
mod store;

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::HeaderValue;
use stormguard_core::ConfigError;
use stormguard_core::IdempotencyConfig;
use stormguard_core::wire::http::IDEMPOTENCY_KEY;
use stormguard_core::wire::parse_idempotency_key;
use tonic::body::Body;
use tower_layer::Layer;
use tower_service::Service;

pub use self::future::ResponseFuture;
pub use self::store::{Begin, Digest, IdempotencyStore, MemoryStore, Record, ScopedKey};
pub use stormguard_core::DedupCounts;
pub use stormguard_core::wire::IdempotencyKeyError;

/// The `grpc-message` of the `ABORTED` answer to a duplicate whose first run is in flight.
pub const MESSAGE_IN_FLIGHT: &str = "stormguard: idempotency-key in flight: a call with this key is still running; ask again after the pushback";
/// How the `grpc-message` of the `FAILED_PRECONDITION` answer to a key used with another
/// request message begins; the message goes on to name the key (quoted), and says
/// nothing of the call that holds it.
pub const MESSAGE_MISMATCH: &str =
    "stormguard: idempotency-key used with another request message on this method";
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

/// A function of a request's head that names its caller (see
/// [`IdempotencyLayer::with_scope`]).
type ScopeFn = dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync;

/// Wraps a tonic server's routes in an [`Idempotency`] service: keys to handlers, and,
/// with a store, each key run once per method, caller scope and message (see the
/// [module docs](self)).
#[derive(Clone)]
pub struct IdempotencyLayer {
    store: Option<Arc<dyn IdempotencyStore>>,
    scope: Option<Arc<ScopeFn>>,
    in_flight_pushback: Duration,
    max_request_bytes: usize,
    stats: IdempotencyStats,
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("dedup", &self.store.is_some())
            .field("scoped", &self.scope.is_some())
            .field("in_flight_pushback", &self.in_flight_pushback)
            .field("max_request_bytes", &self.max_request_bytes)
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
        let defaults = IdempotencyConfig::default();
        IdempotencyLayer {
            store: None,
            scope: None,
            in_flight_pushback: defaults.in_flight_pushback,
            max_request_bytes: defaults.max_request_bytes,
            stats: IdempotencyStats::default(),
        }
    }

    /// A layer that deduplicates with a [`MemoryStore`] of `config`'s bounds (validated),
    /// and `config`'s in-flight pushback and largest keyed request.
    pub fn in_memory(config: IdempotencyConfig) -> Result<Self, ConfigError> {
        let (pushback, max_request) = (config.in_flight_pushback, config.max_request_bytes);
        Ok(IdempotencyLayer::new()
            .with_store(Arc::new(MemoryStore::new(config)?))
            .with_in_flight_pushback(pushback)
            .with_max_request_bytes(max_request))
    }

    /// Keys each record on the caller `scope` names as well as the method and the key:
    /// `scope` reads the request's head (its headers, and its extensions as the layers
    /// outside this one left them) and returns the caller's name, typically the
    /// authenticated principal. The same key from two callers is then two records, and
    /// no caller can read, or block, another's.
    ///
    /// Without it (the default) every caller shares one scope: the method and the message
    /// are still part of the record, so a repeat is answered only with the answer to the
    /// same message on the same method, but a caller who knows another's key and message
    /// gets that answer, and one who knows only the key can take it first. That is safe
    /// when keys cannot be guessed (the `RetryLayer` stamps a UUID v4, 122 random bits);
    /// a server whose callers choose their keys (an order number) needs a scope. `None`
    /// from `scope` puts the call in that shared scope.
    ///
    /// The scope runs before the handler, so it reads what the layers *outside* this one
    /// put in the request (an authenticating tower layer added to
    /// `Server::builder()` before this one); a tonic interceptor on a service runs
    /// after it, and its extensions are not there yet.
    ///
    /// ```
    /// use stormguard_server::idempotency::IdempotencyLayer;
    /// use stormguard_server::IdempotencyConfig;
    ///
    /// /// What the server's authentication layer puts in each request's extensions.
    /// #[derive(Clone)]
    /// struct Principal(String);
    ///
    /// let layer = IdempotencyLayer::in_memory(IdempotencyConfig::default())?
    ///     .with_scope(|request| request.extensions.get::<Principal>().map(|p| p.0.clone()));
    /// # let _ = layer;
    /// # Ok::<(), stormguard_server::ConfigError>(())
    /// ```
    pub fn with_scope(
        mut self,
        scope: impl Fn(&http::request::Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.scope = Some(Arc::new(scope));
        self
    }

    /// The largest request body a keyed call may have when the layer has a store (it reads
    /// a keyed request whole, to compare its message with the record's, before the handler
    /// runs); a larger one is refused with `RESOURCE_EXHAUSTED` without running. Default
    /// 4 MiB and 5 bytes ([`IdempotencyConfig::max_request_bytes`]).
    pub fn with_max_request_bytes(mut self, bytes: usize) -> Self {
        self.max_request_bytes = bytes;
        self
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
    S: Service<http::Request<Body>, Response = http::Response<B>> + Clone,
    ReqBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    ReqBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let mut request = request.map(Body::new);
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
        let (parts, body) = request.into_parts();
        let scope = self.layer.scope.as_ref().and_then(|scope| scope(&parts));
        let key = ScopedKey::new(parts.uri.path(), scope.as_deref(), key);
        // The readied service waits in the future while the request is read; a clone takes
        // its place for the next `poll_ready`.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::reading_request(future::Keyed {
            service: ready,
            parts,
            body,
            key,
            store: Arc::clone(store),
            stats: stats.clone(),
            in_flight_pushback: self.layer.in_flight_pushback,
            max_request_bytes: self.layer.max_request_bytes,
            data: VecDeque::new(),
            size: 0,
        })
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
    mismatched: AtomicU64,
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
    /// Calls refused because their key, on their method in their scope, is held for
    /// another request message (`FAILED_PRECONDITION`).
    pub mismatched: u64,
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
            mismatched: get(&c.mismatched),
            oversize: get(&c.oversize),
            released: get(&c.released),
        }
    }
}
