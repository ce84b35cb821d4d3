//! The response future of [`Idempotency`](super::Idempotency), and the layer's own answers.
//!
//! Five states, each with the data it alone needs:
//!
//! - `Answer`: the layer answers itself (a refused key, an in-flight repeat, a recorded
//!   answer, a key used with another message);
//! - `Passthrough`: a call the layer does not record (no key, or no store);
//! - `Request`: a keyed call's request is read (bounded), to fingerprint its message
//!   before the store is asked;
//! - `Running`: a first run of a key is in the handler;
//! - `Reading`: the handler answered; its body is read (bounded) to record it.
//!
//! A first run holds a [`Claim`] on its key from `Running` on: dropped before the answer is
//! recorded (the handler failed, the client went away), it releases the key.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{HeaderMap, response::Parts};
use http_body::{Body as _, Frame};
use pin_project_lite::pin_project;
use stormguard_core::Code;
use stormguard_core::HeldFrames;
use stormguard_core::Pushback;
use stormguard_core::{
    wire::IdempotencyKeyError, wire::encode_grpc_status, wire::encode_pushback,
    wire::http::grpc_status,
};
use stormguard_core::{
    wire::http::GRPC_MESSAGE, wire::http::GRPC_RETRY_PUSHBACK_MS, wire::http::GRPC_STATUS,
    wire::http::STORMGUARD_UNPROCESSED, wire::http::UNPROCESSED,
};
use tonic::Status;
use tonic::body::Body;
use tower_service::Service;

use super::store::header_bytes;
use super::{
    Begin, Digest, IdempotencyStats, IdempotencyStore, MESSAGE_IN_FLIGHT, MESSAGE_MISMATCH,
    MESSAGE_NOT_KEPT, Record, ScopedKey,
};

pin_project! {
    /// The future of one call through the idempotency layer.
    pub struct ResponseFuture<S>
    where
        S: Service<http::Request<Body>>,
    {
        #[pin]
        state: State<S>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S>
    where
        S: Service<http::Request<Body>>,
    {
        Answer { response: Option<http::Response<Body>> },
        Passthrough { #[pin] fut: S::Future },
        Request { keyed: Option<Keyed<S>> },
        Running { #[pin] fut: S::Future, claim: Option<Claim> },
        Reading { read: Option<Reading> },
    }
}

/// A keyed call whose request is being read, with what it needs to begin: the service
/// readied for it, the request, and the store.
pub(super) struct Keyed<S> {
    pub(super) service: S,
    pub(super) parts: http::request::Parts,
    pub(super) body: Body,
    pub(super) key: ScopedKey,
    pub(super) store: Arc<dyn IdempotencyStore>,
    pub(super) stats: IdempotencyStats,
    pub(super) in_flight_pushback: Duration,
    pub(super) max_request_bytes: usize,
    pub(super) data: VecDeque<Bytes>,
    pub(super) size: usize,
}

impl<S: Service<http::Request<Body>>> std::fmt::Debug for ResponseFuture<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

/// A first run's hold on its key: released (abandoned) when dropped unrecorded.
struct Claim {
    store: Arc<dyn IdempotencyStore>,
    key: ScopedKey,
    fingerprint: Digest,
    stats: IdempotencyStats,
    done: bool,
}

impl Claim {
    fn complete(mut self, record: Record) {
        self.done = true;
        self.store.complete(&self.key, record);
        self.stats.0.recorded.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if !self.done {
            self.store.abandon(&self.key, &self.fingerprint);
            self.stats.0.released.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A handler's answer being read to record it.
struct Reading {
    parts: Parts,
    body: Body,
    data: VecDeque<Bytes>,
    size: usize,
    limit: usize,
    claim: Claim,
}

impl<S: Service<http::Request<Body>>> ResponseFuture<S> {
    pub(super) fn answer(response: http::Response<Body>) -> Self {
        ResponseFuture {
            state: State::Answer {
                response: Some(response),
            },
        }
    }

    pub(super) fn passthrough(fut: S::Future) -> Self {
        ResponseFuture {
            state: State::Passthrough { fut },
        }
    }

    pub(super) fn reading_request(keyed: Keyed<S>) -> Self {
        ResponseFuture {
            state: State::Request { keyed: Some(keyed) },
        }
    }
}

impl<S, B> Future for ResponseFuture<S>
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Output = Result<http::Response<Body>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Answer { response } => {
                    let response = response.take().expect("polled after completion");
                    return Poll::Ready(Ok(response));
                }
                StateProj::Passthrough { fut } => {
                    let response = ready!(fut.poll(cx))?;
                    return Poll::Ready(Ok(response.map(Body::new)));
                }
                StateProj::Request { keyed } => {
                    let reading = keyed.as_mut().expect("polled after completion");
                    let end = ready!(poll_request(reading, cx));
                    let keyed = keyed.take().expect("polled after completion");
                    match keyed.begin(end) {
                        Ok(response) => return Poll::Ready(Ok(response)),
                        Err((fut, claim)) => state.set(State::Running {
                            fut,
                            claim: Some(claim),
                        }),
                    }
                }
                StateProj::Running { fut, claim } => {
                    // An error drops the claim with the future: the key is released.
                    let response = ready!(fut.poll(cx))?;
                    let claim = claim.take().expect("claimed until answered");
                    let (parts, body) = response.into_parts();
                    let limit = claim.store.max_record_bytes();
                    let size = header_bytes(&parts.headers);
                    let read = Reading {
                        parts,
                        body: Body::new(body),
                        data: VecDeque::new(),
                        size,
                        limit,
                        claim,
                    };
                    state.set(State::Reading { read: Some(read) });
                }
                StateProj::Reading { read } => {
                    let reading = read.as_mut().expect("polled after completion");
                    let end = ready!(poll_read(reading, cx));
                    let reading = read.take().expect("polled after completion");
                    return Poll::Ready(Ok(reading.finish(end)));
                }
            }
        }
    }
}

/// How reading a keyed call's request ended.
enum RequestEnd {
    /// The body ended (with these trailers, if any).
    Whole(Option<HeaderMap>),
    /// The body passed `max_request_bytes`.
    TooLarge,
    /// The body failed (the caller went away, most often).
    Failed,
}

/// Reads a keyed call's request until it ends, fails or passes the bound.
fn poll_request<S>(keyed: &mut Keyed<S>, cx: &mut Context<'_>) -> Poll<RequestEnd> {
    loop {
        let frame = match ready!(Pin::new(&mut keyed.body).poll_frame(cx)) {
            None => return Poll::Ready(RequestEnd::Whole(None)),
            Some(Err(_)) => return Poll::Ready(RequestEnd::Failed),
            Some(Ok(frame)) => frame,
        };
        match frame.into_data() {
            Ok(data) => {
                keyed.size += data.len();
                if keyed.size > keyed.max_request_bytes {
                    return Poll::Ready(RequestEnd::TooLarge);
                }
                keyed.data.push_back(data);
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    return Poll::Ready(RequestEnd::Whole(Some(trailers)));
                }
            }
        }
    }
}

impl<S: Service<http::Request<Body>>> Keyed<S> {
    /// Asks the store about the whole request: the layer's own answer (`Ok`), or the first
    /// run, started, with its claim on the key (`Err`).
    fn begin(self, end: RequestEnd) -> Result<http::Response<Body>, (S::Future, Claim)> {
        let trailers = match end {
            RequestEnd::Whole(trailers) => trailers,
            RequestEnd::TooLarge => return Ok(request_too_large(self.max_request_bytes)),
            RequestEnd::Failed => return Ok(request_failed()),
        };
        let Keyed {
            mut service,
            parts,
            data,
            key,
            store,
            stats,
            ..
        } = self;
        let fingerprint = Digest::of(data.iter().map(|d| &d[..]));
        match store.begin(&key, &fingerprint) {
            Begin::New => {
                let body = held(data, None, trailers.map(Ok));
                let fut = service.call(http::Request::from_parts(parts, body));
                let claim = Claim {
                    store,
                    key,
                    fingerprint,
                    stats,
                    done: false,
                };
                Err((fut, claim))
            }
            Begin::InFlight => {
                stats.0.in_flight.fetch_add(1, Ordering::Relaxed);
                Ok(in_flight(self.in_flight_pushback))
            }
            Begin::Completed(record) => {
                stats.0.replayed.fetch_add(1, Ordering::Relaxed);
                Ok(replay(&record))
            }
            Begin::Mismatch => {
                stats.0.mismatched.fetch_add(1, Ordering::Relaxed);
                Ok(mismatch(&key))
            }
        }
    }
}

/// How reading a handler's answer ended.
enum End {
    /// The body ended (with these trailers, if any).
    Whole(Option<HeaderMap>),
    /// The body passed the record's bound: the rest is not read (`None`), or the trailers
    /// that ended it pushed it past (`Some`).
    TooLarge(Option<HeaderMap>),
    /// The body failed.
    Failed(tonic::Status),
}

/// Reads `reading`'s body until it ends, fails or passes the bound.
fn poll_read(reading: &mut Reading, cx: &mut Context<'_>) -> Poll<End> {
    loop {
        let frame = match ready!(Pin::new(&mut reading.body).poll_frame(cx)) {
            None => return Poll::Ready(End::Whole(None)),
            Some(Err(status)) => return Poll::Ready(End::Failed(status)),
            Some(Ok(frame)) => frame,
        };
        match frame.into_data() {
            Ok(data) => {
                reading.size += data.len();
                reading.data.push_back(data);
                if reading.size > reading.limit {
                    return Poll::Ready(End::TooLarge(None));
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    reading.size += header_bytes(&trailers);
                    if reading.size > reading.limit {
                        // Sent whole, not kept.
                        return Poll::Ready(End::TooLarge(Some(trailers)));
                    }
                    return Poll::Ready(End::Whole(Some(trailers)));
                }
            }
        }
    }
}

impl Reading {
    /// The response to send, having recorded (or released) the key as `end` says.
    fn finish(self, end: End) -> http::Response<Body> {
        let Reading {
            parts,
            body,
            data,
            claim,
            ..
        } = self;
        match end {
            End::Whole(trailers) => {
                let code = trailers
                    .as_ref()
                    .and_then(grpc_status)
                    .or_else(|| grpc_status(&parts.headers))
                    .unwrap_or(Code::Ok);
                let bytes = concat(&data);
                if code == Code::Unavailable {
                    // "Try again": nothing a retry must not repeat. Released by the drop.
                    drop(claim);
                } else {
                    let fingerprint = claim.fingerprint;
                    claim.complete(Record::new(
                        fingerprint,
                        parts.headers.clone(),
                        bytes.clone(),
                        trailers.clone(),
                    ));
                }
                let data = Some(bytes).filter(|b| !b.is_empty());
                http::Response::from_parts(parts, held(data, None, trailers.map(Ok)))
            }
            End::TooLarge(trailers) => {
                claim.stats.0.oversize.fetch_add(1, Ordering::Relaxed);
                let fingerprint = claim.fingerprint;
                claim.complete(not_kept(fingerprint));
                let rest = trailers.is_none() && !body.is_end_stream();
                let body = held(data, rest.then_some(body), trailers.map(Ok));
                http::Response::from_parts(parts, body)
            }
            End::Failed(status) => {
                drop(claim);
                http::Response::from_parts(parts, held(data, None, Some(Err(status))))
            }
        }
    }
}

/// The body of an answer the layer held: `data`, then the `rest` of a live answer (when the
/// layer stopped reading it), then `last` (trailers, or the error the live answer failed
/// with). A recorded answer sent again has no rest.
fn held(
    data: impl IntoIterator<Item = Bytes>,
    rest: Option<Body>,
    last: Option<Result<HeaderMap, Status>>,
) -> Body {
    let last = last.map(|last| last.map(Frame::trailers));
    let frames = data.into_iter().map(|d| Ok(Frame::data(d))).chain(last);
    Body::new(HeldFrames::new(frames, rest))
}

/// The frames read, as one buffer (no copy for the usual single frame).
fn concat(data: &VecDeque<Bytes>) -> Bytes {
    match data.len() {
        0 => Bytes::new(),
        1 => data[0].clone(),
        _ => {
            let mut all = BytesMut::with_capacity(data.iter().map(Bytes::len).sum());
            for d in data {
                all.extend_from_slice(d);
            }
            all.freeze()
        }
    }
}

/// A trailers-only gRPC answer of the layer's own: `code`, `message`, and the mark that
/// the handler did not run this call.
fn trailers_only(code: Code, message: HeaderValue) -> http::Response<Body> {
    let mut response = http::Response::new(Body::empty());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(
        GRPC_STATUS,
        HeaderValue::from_static(encode_grpc_status(code)),
    );
    headers.insert(GRPC_MESSAGE, message);
    headers.insert(STORMGUARD_UNPROCESSED, UNPROCESSED);
    response
}

/// The answer to a call whose key is malformed: `INVALID_ARGUMENT`, saying why.
pub(super) fn invalid_key(error: &IdempotencyKeyError) -> http::Response<Body> {
    // The error's text is visible ASCII without `%`, a valid grpc-message as it is.
    let message = HeaderValue::from_str(&format!("stormguard: {error}")).unwrap_or(
        HeaderValue::from_static("stormguard: malformed idempotency-key"),
    );
    trailers_only(Code::InvalidArgument, message)
}

/// The answer to a repeat whose first run is in flight: `ABORTED`, after `pushback`.
pub(super) fn in_flight(pushback: Duration) -> http::Response<Body> {
    let mut response = trailers_only(Code::Aborted, HeaderValue::from_static(MESSAGE_IN_FLIGHT));
    if let Ok(value) = HeaderValue::from_str(&encode_pushback(Pushback::RetryAfter(pushback))) {
        response.headers_mut().insert(GRPC_RETRY_PUSHBACK_MS, value);
    }
    response
}

/// What is recorded for a call whose answer was too large to keep.
fn not_kept(fingerprint: Digest) -> Record {
    let response = trailers_only(
        Code::AlreadyExists,
        HeaderValue::from_static(MESSAGE_NOT_KEPT),
    );
    Record::not_kept(fingerprint, response.headers().clone())
}

/// A trailers-only answer of the layer's own that no retry can change: `code`, `message`
/// and `grpc-retry-pushback-ms: -1`.
fn final_answer(code: Code, message: HeaderValue) -> http::Response<Body> {
    let mut response = trailers_only(code, message);
    if let Ok(value) = HeaderValue::from_str(&encode_pushback(Pushback::DoNotRetry)) {
        response.headers_mut().insert(GRPC_RETRY_PUSHBACK_MS, value);
    }
    response
}

/// The answer to a call whose key is held for another message, on its method in its
/// scope: `FAILED_PRECONDITION`, naming the key and nothing of the other call.
pub(super) fn mismatch(key: &ScopedKey) -> http::Response<Body> {
    let message = format!(
        "{MESSAGE_MISMATCH}: {:?}; a new request needs a new key",
        key.key().as_str()
    );
    // A key is visible ASCII: only its `%` needs encoding in a grpc-message.
    let message = HeaderValue::from_str(&message.replace('%', "%25"))
        .unwrap_or(HeaderValue::from_static(MESSAGE_MISMATCH));
    final_answer(Code::FailedPrecondition, message)
}

/// The answer to a keyed call whose request is larger than the layer reads.
fn request_too_large(limit: usize) -> http::Response<Body> {
    let message = format!(
        "stormguard: idempotency-key call not run: its request is larger than the {limit} bytes the server reads to compare it with the record's"
    );
    let message = HeaderValue::from_str(&message).unwrap_or(HeaderValue::from_static(
        "stormguard: idempotency-key call not run: its request is too large",
    ));
    final_answer(Code::ResourceExhausted, message)
}

/// The answer to a keyed call whose request failed before its end (its caller is gone,
/// most often): nothing stored, nothing run.
fn request_failed() -> http::Response<Body> {
    trailers_only(
        Code::Cancelled,
        HeaderValue::from_static(
            "stormguard: idempotency-key call not run: its request ended before its end",
        ),
    )
}

/// A recorded answer, sent again.
pub(super) fn replay(record: &Record) -> http::Response<Body> {
    let data = Some(record.body().clone()).filter(|b| !b.is_empty());
    let trailers = record.trailers().cloned().map(Ok);
    let mut response = http::Response::new(held(data, None, trailers));
    *response.headers_mut() = record.headers().clone();
    response
}
