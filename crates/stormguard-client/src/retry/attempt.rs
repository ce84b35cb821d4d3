//! The attempts of one logical call: what is kept of the request to send it again, and
//! what each attempt carries on the wire.
//!
//! The first attempt takes the caller's request itself. A retry is rebuilt from a
//! [`Template`] (method, URI, version, headers, extensions) and the request body as
//! [`Resend`] keeps it. Only a request whose body can be replayed is copied at all: the
//! parts of any other request go out once.
//!
//! Every attempt is *stamped* from the [`AttemptPlan`] the call's retry state made for it:
//! `grpc-timeout` (what is left of the call, or the attempt's own shorter limit),
//! `grpc-previous-rpc-attempts` on retries, and what is left of the request's retry
//! allowance as `x-retry-budget`.
//!
//! A keyed call's `idempotency-key` is written once, before the first attempt
//! ([`stamp_idempotency_key`]), so the headers every retry and hedge replays carry it.

use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body as HttpBody, Frame, SizeHint};
use pin_project_lite::pin_project;
use stormguard_core::Instant;
use tonic::Status;

use http::header::HeaderName;
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderValue, Method, Uri, Version};
use stormguard_core::AttemptPlan;
use stormguard_core::context;
use stormguard_core::wire::http::IDEMPOTENCY_KEY;
use stormguard_core::wire::http::first_values;
use stormguard_core::{
    wire::IdempotencyKeyError, wire::UuidKey, wire::decode_grpc_timeout, wire::encode_grpc_timeout,
    wire::parse_idempotency_key,
};
use stormguard_core::{
    wire::http::GRPC_PREVIOUS_RPC_ATTEMPTS, wire::http::GRPC_TIMEOUT, wire::http::X_RETRY_BUDGET,
};
use tonic::GrpcMethod;
use tonic::body::Body;

use super::replay::{Buffered, Resend, buffer, full};
use super::timer::Timer;

/// `grpc-timeout`, read or left out on every call: a static, as a `const` name is built and
/// dropped at each use.
static TIMEOUT: HeaderName = GRPC_TIMEOUT;

/// What a call keeps to send its retries.
pub(super) struct Attempts {
    template: Template,
    resend: Resend,
}

impl Attempts {
    /// Prepares `request` as the first attempt, as `plan` says. When the method may be
    /// retried (`retryable`), its body is made replayable within `replay_limit` bytes and
    /// the parts are kept for a retry.
    ///
    /// A streaming body (one not ready at once) is held to the call's `deadline` (see
    /// [`DeadlineBody`]).
    pub(super) fn first(
        request: &mut http::Request<Body>,
        plan: &AttemptPlan,
        retryable: bool,
        replay_limit: usize,
        stamps: &Stamps,
        deadline: Option<Instant>,
    ) -> Attempts {
        // The request is changed where it is (its headers stamped, its body replaced by a
        // replayable one): it is large, and every copy of it costs the call.
        stamps.stamp(request.headers_mut(), plan);
        let resend = if retryable {
            let body = std::mem::take(request.body_mut());
            let (resend, body) = match buffer(body, replay_limit) {
                Buffered::Whole(data, drained) => {
                    (Resend::Whole(data.clone()), full(data, drained))
                }
                Buffered::Stream(replay, first) => {
                    let body = match deadline {
                        Some(at) => Body::new(DeadlineBody::new(first, at)),
                        None => Body::new(first),
                    };
                    (Resend::Stream(replay), body)
                }
                // The body announced a length over the bound: sent once, never copied.
                Buffered::Once(body) => (Resend::Never, body),
            };
            *request.body_mut() = body;
            resend
        } else {
            Resend::Never
        };
        // Only a replayable body can be resent (see `Failure::replayable`): the parts of any
        // other request go out once and are not copied.
        let (headers, extensions) = if matches!(resend, Resend::Never) {
            (
                SavedHeaders::Few(Default::default()),
                SavedExtensions::Empty,
            )
        } else {
            // When every attempt has a limit, every retry writes its own `grpc-timeout`:
            // the first attempt's is not kept (nor cloned).
            let renewed = plan.fire_at.is_some().then_some(&TIMEOUT);
            (
                SavedHeaders::of(request.headers(), renewed),
                SavedExtensions::of(request.extensions()),
            )
        };
        // Built once, where it is returned: the kept request is large.
        Attempts {
            template: Template {
                method: request.method().clone(),
                uri: request.uri().clone(),
                version: request.version(),
                headers,
                extensions,
            },
            resend,
        }
    }

    /// A call that is not sent at all (refused before its first attempt): nothing is kept
    /// but its URI.
    pub(super) fn unsent(uri: Uri) -> Attempts {
        Attempts {
            template: Template {
                method: Method::POST,
                uri,
                version: Version::default(),
                headers: SavedHeaders::Few(Default::default()),
                extensions: SavedExtensions::Empty,
            },
            resend: Resend::Never,
        }
    }

    /// The request of a retry, stamped as `plan` says.
    pub(super) fn retry(&self, plan: &AttemptPlan, stamps: &Stamps) -> http::Request<Body> {
        let mut request = self.template.request(self.resend.body());
        stamps.stamp(request.headers_mut(), plan);
        request
    }

    /// Whether the request can be sent again (its body is held within the limit).
    pub(super) fn is_replayable(&self) -> bool {
        self.resend.is_replayable()
    }

    /// Whether copies of the request can be in flight at once (hedges): only a body read
    /// whole before the first attempt; a streaming body is read by one attempt at a time.
    pub(super) fn can_copy(&self) -> bool {
        matches!(self.resend, Resend::Whole(_))
    }

    /// The call committed: no retry can follow, so stop buffering the request body.
    pub(super) fn commit(&mut self) {
        if let Resend::Stream(replay) = std::mem::replace(&mut self.resend, Resend::Never) {
            replay.commit();
        }
    }

    /// The request's URI (`rpc.method` of events is its path).
    pub(super) fn uri(&self) -> &Uri {
        &self.template.uri
    }

    /// The request's path (a committed call's body names its method with it): a clone of
    /// its bytes, shared with the URI (tonic's are static).
    pub(super) fn path(&self) -> Option<PathAndQuery> {
        self.template.uri.path_and_query().cloned()
    }
}

pin_project! {
    /// A streaming request body held to the call's deadline. When the deadline passes while
    /// the caller's stream is still open, the body ends with `DEADLINE_EXCEEDED`, and hyper
    /// resets the HTTP/2 stream: dropping the response body (as the committed call's
    /// [`ResponseBody`](super::body::ResponseBody) does at the deadline) does not, while the
    /// request's half is still being sent. The timer is armed the first time the caller's
    /// stream has nothing ready.
    struct DeadlineBody<B> {
        #[pin]
        inner: B,
        deadline: Instant,
        #[pin]
        timer: Timer,
    }
}

impl<B> DeadlineBody<B> {
    fn new(inner: B, deadline: Instant) -> Self {
        DeadlineBody {
            inner,
            deadline,
            timer: Timer::at(None),
        }
    }
}

impl<B: HttpBody<Error = Status>> HttpBody for DeadlineBody<B> {
    type Data = B::Data;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, Status>>> {
        let mut this = self.project();
        let expired = || {
            Poll::Ready(Some(Err(Status::deadline_exceeded(
                "stormguard: the call's deadline was exceeded while its request streamed",
            ))))
        };
        if this.timer.as_mut().poll_fired(cx) {
            return expired();
        }
        match this.inner.poll_frame(cx) {
            Poll::Pending => {
                if !this.timer.is_armed() {
                    this.timer.as_mut().arm(Some(*this.deadline));
                    if this.timer.as_mut().poll_fired(cx) {
                        return expired();
                    }
                }
                Poll::Pending
            }
            ready => ready,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Gives a keyed call its idempotency key: the caller's own when it set one (kept as it
/// is, once it is one a server accepts), else `generated`. A key the caller set that a
/// server would refuse is the caller's error, returned before anything is sent.
pub(super) fn stamp_idempotency_key(
    headers: &mut HeaderMap,
    generated: &UuidKey,
) -> Result<(), IdempotencyKeyError> {
    let values = headers
        .get_all(&IDEMPOTENCY_KEY)
        .iter()
        .map(HeaderValue::as_bytes);
    if parse_idempotency_key(values)?.is_none() {
        // A UUID is always a valid header value.
        if let Ok(value) = HeaderValue::from_str(generated.as_str()) {
            headers.insert(IDEMPOTENCY_KEY, value);
        }
    }
    Ok(())
}

/// The caller's own timeout: the request's `grpc-timeout` (from `Request::set_timeout`), if
/// it has a well-formed one.
pub(super) fn caller_timeout(headers: &HeaderMap) -> Option<Duration> {
    let [timeout] = first_values(headers, [&TIMEOUT]);
    timeout.and_then(|v| decode_grpc_timeout(v.as_bytes()).ok())
}

/// How a layer stamps its attempts, with the `grpc-timeout` value of a per-attempt limit
/// encoded once.
#[derive(Debug, Default)]
pub(super) struct Stamps {
    /// The last per-attempt limit encoded, and its header value: an attempt that has its
    /// whole per-attempt timeout (not cut short by the call's deadline) sends this clone
    /// instead of encoding and allocating a value of its own.
    limit: Mutex<Option<(Duration, HeaderValue)>>,
}

impl Stamps {
    /// Writes what `plan` says an attempt carries: its `grpc-timeout` (when it must
    /// change), its attempt number (on retries) and what is left of the request's retry
    /// allowance.
    fn stamp(&self, headers: &mut HeaderMap, plan: &AttemptPlan) {
        if let Some(left) = plan.grpc_timeout
            && let Some(value) = self.timeout_value(left, plan.attempt_limit)
        {
            headers.insert(GRPC_TIMEOUT, value);
        }
        if plan.previous_attempts > 0 {
            headers.insert(
                GRPC_PREVIOUS_RPC_ATTEMPTS,
                HeaderValue::from(plan.previous_attempts),
            );
        }
        if let Some(left) = context::remaining_allowance() {
            headers.insert(X_RETRY_BUDGET, HeaderValue::from(left));
        }
    }

    /// The `grpc-timeout` value for `left`: the cached one when `left` is the whole
    /// per-attempt limit (`limit`), else encoded now.
    fn timeout_value(&self, left: Duration, limit: Option<Duration>) -> Option<HeaderValue> {
        let encode = |d| HeaderValue::from_str(encode_grpc_timeout(d).as_str()).ok();
        if limit != Some(left) {
            return encode(left);
        }
        // Never waits: a contended cache is skipped, not queued on.
        let Ok(mut cached) = self.limit.try_lock() else {
            return encode(left);
        };
        match &*cached {
            Some((d, value)) if *d == left => Some(value.clone()),
            _ => {
                let value = encode(left)?;
                *cached = Some((left, value.clone()));
                Some(value)
            }
        }
    }
}

/// What is kept of a request to build a retry.
struct Template {
    method: Method,
    uri: Uri,
    version: Version,
    headers: SavedHeaders,
    extensions: SavedExtensions,
}

impl Template {
    /// A retry's request, with `body`.
    fn request(&self, body: Body) -> http::Request<Body> {
        let mut request = http::Request::new(body);
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = self.uri.clone();
        *request.version_mut() = self.version;
        *request.headers_mut() = self.headers.to_map();
        *request.extensions_mut() = self.extensions.to_extensions();
        request
    }
}

/// Headers kept for a retry: a handful inline (a gRPC request usually carries `te`,
/// `content-type` and little else), more in a copied map.
enum SavedHeaders {
    Few([Option<(HeaderName, HeaderValue)>; FEW_HEADERS]),
    Many(HeaderMap),
}

const FEW_HEADERS: usize = 4;

impl SavedHeaders {
    /// The headers to keep, less `renewed` (a header every retry writes anew).
    fn of(headers: &HeaderMap, renewed: Option<&HeaderName>) -> Self {
        // One pass: fill the inline slots, and copy the map only when they overflow.
        let mut few: [Option<(HeaderName, HeaderValue)>; FEW_HEADERS] = Default::default();
        let mut slots = few.iter_mut();
        for (name, value) in headers.iter().filter(|(name, _)| renewed != Some(*name)) {
            let Some(slot) = slots.next() else {
                let mut map = headers.clone();
                if let Some(name) = renewed {
                    map.remove(name);
                }
                return SavedHeaders::Many(map);
            };
            *slot = Some((name.clone(), value.clone()));
        }
        SavedHeaders::Few(few)
    }

    fn to_map(&self) -> HeaderMap {
        match self {
            SavedHeaders::Few(few) => {
                let mut map = HeaderMap::with_capacity(FEW_HEADERS + 2);
                for (name, value) in few.iter().flatten() {
                    map.append(name.clone(), value.clone());
                }
                map
            }
            SavedHeaders::Many(map) => map.clone(),
        }
    }
}

/// Extensions kept for a retry. tonic's generated clients add one, the method's name
/// ([`GrpcMethod`]), which is kept as it is; any other set is cloned whole.
enum SavedExtensions {
    Empty,
    Method(GrpcMethod<'static>),
    All(http::Extensions),
}

impl SavedExtensions {
    fn of(extensions: &http::Extensions) -> Self {
        if extensions.is_empty() {
            return SavedExtensions::Empty;
        }
        if extensions.len() == 1
            && let Some(method) = extensions.get::<GrpcMethod<'static>>()
        {
            return SavedExtensions::Method(method.clone());
        }
        SavedExtensions::All(extensions.clone())
    }

    fn to_extensions(&self) -> http::Extensions {
        match self {
            SavedExtensions::Empty => http::Extensions::new(),
            SavedExtensions::Method(method) => {
                let mut extensions = http::Extensions::new();
                extensions.insert(method.clone());
                extensions
            }
            SavedExtensions::All(extensions) => extensions.clone(),
        }
    }
}

#[cfg(test)]
mod tests;
