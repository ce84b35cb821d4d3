//! A request body that can be sent more than once, within a memory bound.
//!
//! A retry must resend the request, but an HTTP body is a stream that is consumed as it is
//! sent. [`ReplayBody`] copies the data frames of the original body into a shared buffer as
//! the first attempt sends them, up to a byte limit; a later attempt replays the buffer and
//! then goes on reading the original body where the previous attempt left it. If the body
//! outgrows the limit the buffer is dropped at once (memory stays bounded by the limit per
//! call) and the call is no longer replayable: it is sent once and not retried.
//!
//! A body that is ready at once (a unary request: tonic encodes the message as soon as the
//! body is polled) is read whole before the first attempt, without a shared buffer: every
//! attempt sends the same [`Bytes`] (see [`buffer`]). Any other body is buffered lazily, so
//! a streaming request body is never held back: data goes to the wire as soon as the caller
//! produces it.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker, ready};

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body as HttpBody, Frame, SizeHint};
use stormguard_core::HeldFrames;
use tonic::Status;
use tonic::body::Body;

/// The default bound on the bytes buffered per call for replay: 64 KiB.
pub const DEFAULT_REPLAY_LIMIT: usize = 64 * 1024;

/// A request body made ready for a retry by [`buffer`].
#[derive(Debug)]
pub(crate) enum Buffered {
    /// The whole body, read before the first attempt; every attempt sends these bytes.
    /// The drained body comes with them (see [`full`]).
    Whole(Bytes, Body),
    /// A body that was not ready at once, buffered as the first attempt sends it.
    Stream(Replay, ReplayBody),
    /// A body that announced a length over the limit: sent once, never copied.
    Once(Body),
}

/// Makes `body` replayable within `limit` bytes.
///
/// The body is first polled without waiting (a no-op waker): a unary request's body is
/// ready at once, and is then read whole into one [`Bytes`] (no copy for a single frame)
/// with no lock or shared buffer on the way. Whatever is not ready at once, or not plain
/// data, or over the limit, goes on through a [`Replay`], with the frames already read put
/// back in front.
pub(crate) fn buffer(mut body: Body, limit: usize) -> Buffered {
    if body.size_hint().lower() > limit as u64 {
        return Buffered::Once(body);
    }
    let mut cx = Context::from_waker(Waker::noop());
    let mut read = Read::default();
    loop {
        if body.is_end_stream() {
            return Buffered::Whole(read.into_bytes(), body);
        }
        let unread = match Pin::new(&mut body).poll_frame(&mut cx) {
            Poll::Ready(None) => return Buffered::Whole(read.into_bytes(), body),
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) if read.len + data.len() <= limit => {
                    read.push(data);
                    continue;
                }
                Ok(data) => Some(Ok(Frame::data(data))),
                Err(frame) => Some(Ok(frame)),
            },
            Poll::Ready(Some(Err(status))) => Some(Err(status)),
            Poll::Pending => None,
        };
        // What was read goes back in front of the rest. The limit was checked against the
        // body's announced length above; the frames read count against it as the first
        // attempt sends them again.
        let read = Some(read.into_bytes())
            .filter(|b| !b.is_empty())
            .map(|data| Ok(Frame::data(data)));
        let rest = Body::new(HeldFrames::new(read.into_iter().chain(unread), Some(body)));
        let (replay, first) = Replay::over(rest, limit);
        return Buffered::Stream(replay, first);
    }
}

/// Data read by [`buffer`] so far.
#[derive(Default)]
struct Read {
    first: Option<Bytes>,
    more: Option<BytesMut>,
    len: usize,
}

impl Read {
    fn push(&mut self, data: Bytes) {
        self.len += data.len();
        match (&mut self.first, &mut self.more) {
            (None, _) => self.first = Some(data),
            (Some(first), None) => {
                let mut all = BytesMut::with_capacity(first.len() + data.len());
                all.extend_from_slice(first);
                all.extend_from_slice(&data);
                self.more = Some(all);
            }
            (Some(_), Some(all)) => all.extend_from_slice(&data),
        }
    }

    fn into_bytes(self) -> Bytes {
        match (self.first, self.more) {
            (_, Some(all)) => all.freeze(),
            (Some(first), None) => first,
            (None, None) => Bytes::new(),
        }
    }
}

/// The shared buffer of one logical call; each attempt gets a [`ReplayBody`] over it.
#[derive(Debug, Clone)]
pub(crate) struct Replay {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    limit: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Data frames seen so far, while their total stays within the limit.
    chunks: Vec<Bytes>,
    /// Bytes in `chunks`.
    len: usize,
    /// The body outgrew the limit (or failed): the buffer is gone, no replay.
    broken: bool,
    /// The call committed: no attempt will follow, so what the live attempt reads from
    /// here on is passed through, not buffered.
    committed: bool,
    /// The rest of the original body, when no attempt holds it.
    rest: Option<Body>,
    /// The original body has ended.
    complete: bool,
    /// Trailers of the original body, if it had any.
    trailers: Option<HeaderMap>,
    /// Attempts waiting for the one that holds the original body to give it back, by
    /// body id. More than one can wait (an attempt the layer gave up on is still polled by
    /// its transport); all are woken. At most one entry per body, so at most one per attempt.
    waiting: Vec<(usize, Waker)>,
    /// Bodies handed out so far; the next body's id.
    bodies: usize,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Replay {
    /// Wraps `body` for replay of up to `limit` bytes and returns the first attempt's body.
    ///
    /// Gives the body back unchanged (`Err`) when the body announces a length
    /// over the limit: such a body is sent once without any copying.
    #[cfg(test)]
    pub(crate) fn new(body: Body, limit: usize) -> Result<(Replay, ReplayBody), Body> {
        if body.size_hint().lower() > limit as u64 {
            return Err(body);
        }
        Ok(Replay::over(body, limit))
    }

    /// Wraps `body` for replay of up to `limit` bytes, whatever length it announces, and
    /// returns the first attempt's body.
    fn over(body: Body, limit: usize) -> (Replay, ReplayBody) {
        let complete = body.is_end_stream();
        let state = State {
            rest: if complete { None } else { Some(body) },
            complete,
            ..State::default()
        };
        let replay = Replay {
            shared: Arc::new(Shared {
                limit,
                state: Mutex::new(state),
            }),
        };
        let first = replay.body();
        (replay, first)
    }

    /// A fresh body for the next attempt: replays what was buffered, then reads on.
    pub(crate) fn body(&self) -> ReplayBody {
        let id = {
            let mut state = lock(&self.shared.state);
            state.bodies += 1;
            state.bodies
        };
        ReplayBody {
            shared: self.shared.clone(),
            id,
            replayed: 0,
            replayed_bytes: 0,
            rest: None,
            passthrough: false,
            trailers_sent: false,
        }
    }

    /// The call committed: no retry can follow, so the buffer stops filling. The attempt
    /// reading the original body passes the rest of it straight through (and frees what
    /// was buffered once it gets there).
    pub(crate) fn commit(&self) {
        lock(&self.shared.state).committed = true;
    }

    /// Whether a new attempt can resend the body: it has stayed within the limit.
    pub(crate) fn is_replayable(&self) -> bool {
        !lock(&self.shared.state).broken
    }

    /// Bytes currently buffered for this call.
    #[cfg(test)]
    pub(crate) fn buffered(&self) -> usize {
        lock(&self.shared.state).len
    }
}

/// One attempt's view of a replayable request body.
///
/// It first yields the frames that earlier attempts buffered, then the rest of the
/// original body, buffering it for later attempts while it stays within the limit. When
/// dropped it hands the original body back so that the next attempt can continue it.
#[derive(Debug)]
pub(crate) struct ReplayBody {
    shared: Arc<Shared>,
    /// Which body of the call this is (for its entry among the waiting).
    id: usize,
    /// Buffered chunks this attempt has yielded.
    replayed: usize,
    /// Bytes of those chunks.
    replayed_bytes: usize,
    /// The original body, while this attempt is the one reading it.
    rest: Option<Body>,
    /// The buffer overflowed while this attempt read: it streams the rest straight through.
    passthrough: bool,
    trailers_sent: bool,
}

/// A frame of a request body, `None` at its end.
type Polled = Option<Result<Frame<Bytes>, Status>>;

impl State {
    /// The body can no longer be replayed: the buffer is freed.
    fn break_buffer(&mut self) {
        self.broken = true;
        self.chunks = Vec::new();
        self.len = 0;
    }
}

impl ReplayBody {
    /// What earlier attempts buffered: the next chunk, the end of a body read whole, or a
    /// wait for the attempt that holds the original body; `None` once this attempt holds
    /// it (its frames are read next).
    fn replay(&mut self, cx: &mut Context<'_>) -> Option<Poll<Polled>> {
        let mut state = lock(&self.shared.state);
        if state.broken && self.rest.is_none() {
            // Another attempt overflowed the buffer: this one cannot resend the body.
            return Some(Poll::Ready(Some(Err(Status::internal(
                "stormguard: request body exceeded the replay limit and cannot be resent",
            )))));
        }
        if let Some(chunk) = state.chunks.get(self.replayed) {
            let chunk = chunk.clone();
            self.replayed += 1;
            self.replayed_bytes += chunk.len();
            return Some(Poll::Ready(Some(Ok(Frame::data(chunk)))));
        }
        if state.complete {
            if !self.trailers_sent {
                self.trailers_sent = true;
                if let Some(trailers) = state.trailers.clone() {
                    return Some(Poll::Ready(Some(Ok(Frame::trailers(trailers)))));
                }
            }
            return Some(Poll::Ready(None));
        }
        if self.rest.is_none() {
            match state.rest.take() {
                Some(rest) => self.rest = Some(rest),
                None => {
                    // The previous attempt still holds the original body (its transport has
                    // not dropped it yet): wait until it hands it back.
                    let id = self.id;
                    match state.waiting.iter_mut().find(|(w, _)| *w == id) {
                        Some((_, waker)) => waker.clone_from(cx.waker()),
                        None => state.waiting.push((id, cx.waker().clone())),
                    }
                    return Some(Poll::Pending);
                }
            }
        }
        None
    }

    /// A frame this attempt read from the original body: buffered for later attempts while
    /// the buffer stays within the limit (and the call has not committed).
    fn keep(&mut self, frame: Polled) -> Polled {
        let mut state = lock(&self.shared.state);
        if state.committed {
            // No attempt will follow: the buffer has no reader left.
            state.break_buffer();
            self.passthrough = true;
            return frame;
        }
        match &frame {
            Some(Ok(f)) => {
                if let Some(data) = f.data_ref() {
                    if state.len + data.len() > self.shared.limit {
                        // Over the bound: free the buffer now and stream the rest once.
                        state.break_buffer();
                        self.passthrough = true;
                    } else {
                        state.len += data.len();
                        state.chunks.push(data.clone());
                        self.replayed += 1;
                        self.replayed_bytes += data.len();
                    }
                } else if let Some(trailers) = f.trailers_ref() {
                    state.trailers = Some(trailers.clone());
                    state.complete = true;
                    self.trailers_sent = true;
                    self.rest = None;
                }
            }
            Some(Err(_)) => {
                state.break_buffer();
                self.rest = None;
            }
            None => {
                state.complete = true;
                self.rest = None;
                self.trailers_sent = true;
            }
        }
        frame
    }
}

impl HttpBody for ReplayBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Polled> {
        let this = self.get_mut();
        if !this.passthrough
            && let Some(replayed) = this.replay(cx)
        {
            return replayed;
        }
        let Some(rest) = this.rest.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = ready!(Pin::new(rest).poll_frame(cx));
        if this.passthrough {
            return Poll::Ready(frame);
        }
        Poll::Ready(this.keep(frame))
    }

    fn is_end_stream(&self) -> bool {
        if self.passthrough {
            return self.rest.as_ref().is_none_or(HttpBody::is_end_stream);
        }
        let state = lock(&self.shared.state);
        !state.broken
            && state.complete
            && self.replayed >= state.chunks.len()
            && (self.trailers_sent || state.trailers.is_none())
    }

    fn size_hint(&self) -> SizeHint {
        if self.passthrough {
            return self
                .rest
                .as_ref()
                .map_or_else(|| SizeHint::with_exact(0), HttpBody::size_hint);
        }
        let state = lock(&self.shared.state);
        if state.complete && !state.broken {
            return SizeHint::with_exact((state.len - self.replayed_bytes.min(state.len)) as u64);
        }
        let buffered = (state.len - self.replayed_bytes.min(state.len)) as u64;
        let rest = self
            .rest
            .as_ref()
            .or(state.rest.as_ref())
            .map(HttpBody::size_hint)
            .unwrap_or_default();
        let mut hint = SizeHint::new();
        hint.set_lower(buffered + rest.lower());
        if let Some(upper) = rest.upper() {
            hint.set_upper(buffered + upper);
        }
        hint
    }
}

impl Drop for ReplayBody {
    fn drop(&mut self) {
        if let Some(rest) = self.rest.take() {
            let mut state = lock(&self.shared.state);
            state.rest = Some(rest);
            for (_, waker) in state.waiting.drain(..) {
                waker.wake();
            }
        }
    }
}

/// A body that sends `data`, read from `drained`. The drained body goes with it, and is
/// dropped where the attempt's body is, as it would have been without the layer.
pub(super) fn full(data: Bytes, drained: Body) -> Body {
    if data.is_empty() {
        return Body::empty();
    }
    Body::new(OneChunk {
        data: Some(data),
        _drained: drained,
    })
}

/// A body that sends one chunk of data. Unlike `http_body_util::Full` it announces no
/// exact length, as tonic's own request body does not: hyper then adds no
/// `content-length`, and the attempt is framed exactly as it would be without the layer.
struct OneChunk {
    data: Option<Bytes>,
    // The body `data` was read from, kept only to be dropped with this one: where the
    // attempt's body is dropped is where the caller's would have been without the layer,
    // and the allocator's work depends on the order of frees.
    _drained: Body,
}

impl http_body::Body for OneChunk {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        Poll::Ready(
            self.get_mut()
                .data
                .take()
                .map(|d| Ok(http_body::Frame::data(d))),
        )
    }
}

/// How a retry resends the request body.
pub(super) enum Resend {
    /// It cannot: the method is not retried, or the body was too large to keep.
    Never,
    /// The whole body, read before the first attempt.
    Whole(Bytes),
    /// The body as buffered while the first attempt sent it.
    Stream(Replay),
}

impl Resend {
    pub(super) fn is_replayable(&self) -> bool {
        match self {
            Resend::Never => false,
            Resend::Whole(_) => true,
            Resend::Stream(replay) => replay.is_replayable(),
        }
    }

    pub(super) fn body(&self) -> Body {
        match self {
            Resend::Never => Body::empty(),
            Resend::Whole(data) => full(data.clone(), Body::empty()),
            Resend::Stream(replay) => Body::new(replay.body()),
        }
    }
}

#[cfg(test)]
mod tests;
