//! The request half of a call: every message the caller sends goes into the call's
//! [`Log`], and one writer per attempt copies the log into that attempt's send stream. A
//! retry's writer starts from the first message, so every attempt carries the whole request
//! in order, whether the caller sent it before the retry began or while it runs.
//!
//! The log keeps what a retry would replay, at most the interceptor's replay limit in
//! bytes (encoded messages). Past the limit, or once the call committed, or for a method
//! that is never sent twice, nothing is kept: a message is dropped once written, and the
//! caller's `send` waits until its message is written (as it would on the attempt's own
//! stream).
//!
//! The copies of a hedged call are in flight at once: each has its own writer, all of them
//! copying the whole log, which is complete (the caller's last message in) and kept before
//! the first hedge starts; the copy that wins keeps writing, the others stop.

use std::collections::VecDeque;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::{Buf, Bytes};
use grpc::client::{SendOptions, SendStream};
use grpc::core::SendMessage;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// The messages of one call, shared by its send half and the writers of its attempts.
pub(crate) struct Log {
    state: Mutex<LogState>,
    /// A message was appended, the log was closed, or the attempt changed: writers look.
    grew: Notify,
    /// A writer wrote a message, or the call ended: senders waiting on a write look.
    progress: Notify,
}

struct LogState {
    /// The messages not dropped yet; `msgs[0]` is message number `first` of the stream.
    msgs: VecDeque<(Bytes, SendOptions)>,
    first: usize,
    /// Bytes of every message sent so far (the replay limit is checked against it).
    bytes: usize,
    limit: usize,
    /// Whether every message is kept for a retry.
    keep: bool,
    /// The caller's last message is in (sent with `final_msg`, or the send half dropped).
    closed: bool,
    /// The attempt whose writer may write (the copy that won, once a hedged call commits).
    attempt: u64,
    /// Copies of a hedged call are in flight: every writer may write.
    copying: bool,
    /// The call ended: nothing more is written, the caller's sends fail.
    over: bool,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("Log")
            .field("kept", &st.msgs.len())
            .field("bytes", &st.bytes)
            .field("keep", &st.keep)
            .field("closed", &st.closed)
            .field("over", &st.over)
            .finish()
    }
}

impl LogState {
    /// Drops the messages the current attempt's writer wrote, once none is kept for a retry.
    fn trim(&mut self, written: usize) {
        if self.keep {
            return;
        }
        while self.first < written && self.msgs.pop_front().is_some() {
            self.first += 1;
        }
    }
}

impl Log {
    /// A log that keeps what a retry replays (`keep`) within `limit` bytes.
    pub(crate) fn new(keep: bool, limit: usize) -> Arc<Log> {
        Arc::new(Log {
            state: Mutex::new(LogState {
                msgs: VecDeque::new(),
                first: 0,
                bytes: 0,
                limit,
                keep,
                closed: false,
                attempt: 0,
                copying: false,
                over: false,
            }),
            grew: Notify::new(),
            progress: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the whole request is kept, so that the call can be sent again.
    pub(crate) fn replayable(&self) -> bool {
        self.lock().keep
    }

    /// Whether the whole request is in the log and kept (the caller's last message is in,
    /// within the replay limit): another copy of the call can be sent while this one runs.
    pub(crate) fn can_copy(&self) -> bool {
        let st = self.lock();
        st.keep && st.closed && !st.over
    }

    /// The call committed on attempt `attempt`: no retry follows, so nothing is kept from
    /// here on, and only that attempt's writer writes.
    pub(crate) fn commit(&self, attempt: u64) {
        let mut st = self.lock();
        st.keep = false;
        st.copying = false;
        st.attempt = attempt;
        drop(st);
        self.grew.notify_waiters();
    }

    /// The call ended: writers stop, the caller's sends fail.
    pub(crate) fn end(&self) {
        self.lock().over = true;
        self.grew.notify_waiters();
        self.progress.notify_waiters();
    }

    /// Starts attempt number `attempt` on `stream`: the writers of earlier attempts stop,
    /// and a new one writes the whole log into `stream`. The writer stops when the
    /// returned handle drops.
    pub(crate) fn start_attempt<S: SendStream + Send + 'static>(
        self: &Arc<Self>,
        attempt: u64,
        stream: S,
    ) -> Writer {
        self.lock().attempt = attempt;
        self.grew.notify_waiters();
        Writer(tokio::spawn(write(Arc::clone(self), attempt, stream)))
    }
}

impl Log {
    /// Starts attempt number `attempt`, a copy of a hedged call, on `stream` beside the
    /// copies in flight: its writer writes the whole log into `stream` (see
    /// [`can_copy`](Self::can_copy)). The writer stops when the returned handle drops.
    pub(crate) fn start_copy<S: SendStream + Send + 'static>(
        self: &Arc<Self>,
        attempt: u64,
        stream: S,
    ) -> Writer {
        self.lock().copying = true;
        Writer(tokio::spawn(write(Arc::clone(self), attempt, stream)))
    }
}

/// The writer of one attempt: stopped when dropped.
#[derive(Debug)]
pub(crate) struct Writer(JoinHandle<()>);

impl Drop for Writer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A message already encoded, as the log keeps it.
struct Encoded(Bytes);

impl SendMessage for Encoded {
    fn encode(&self) -> Result<Box<dyn Buf + Send + Sync>, String> {
        Ok(Box::new(self.0.clone()))
    }
}

/// Copies the log into `stream`, the send stream of attempt `attempt`, from the first
/// message, until the caller's last message is written, the stream fails, another attempt
/// starts or the call ends. Dropping `stream` at the end closes the attempt's request.
async fn write<S: SendStream>(log: Arc<Log>, attempt: u64, mut stream: S) {
    let mut next = 0;
    loop {
        let mut grew = pin!(log.grew.notified());
        grew.as_mut().enable();
        let item = {
            let st = log.lock();
            let mine = st.attempt == attempt || st.copying;
            if st.over || !mine || next < st.first {
                return;
            }
            match st.msgs.get(next - st.first) {
                Some((data, options)) => Some((data.clone(), options.clone())),
                None if st.closed => return,
                None => None,
            }
        };
        let Some((data, options)) = item else {
            grew.await;
            continue;
        };
        if stream.send(&Encoded(data), options).await.is_err() {
            return;
        }
        next += 1;
        {
            let mut st = log.lock();
            if st.attempt == attempt {
                st.trim(next);
            }
        }
        log.progress.notify_waiters();
    }
}

/// The send half of a call through a [`RetryInterceptor`](crate::RetryInterceptor): what
/// the caller sends goes to every attempt of the call.
///
/// `send` fails once the call ended (as the `grpc` crate's own send stream fails once its
/// stream closed) and after the caller's last message. Dropping it ends the request.
#[derive(Debug)]
pub struct RetrySendStream {
    log: Arc<Log>,
}

impl RetrySendStream {
    pub(crate) fn new(log: Arc<Log>) -> Self {
        RetrySendStream { log }
    }
}

impl Drop for RetrySendStream {
    fn drop(&mut self) {
        self.log.lock().closed = true;
        self.log.grew.notify_waiters();
    }
}

impl SendStream for RetrySendStream {
    async fn send(&mut self, msg: &dyn SendMessage, options: SendOptions) -> Result<(), ()> {
        let mut buf = msg.encode().map_err(|_| ())?;
        let data = buf.copy_to_bytes(buf.remaining());
        let index = {
            let mut st = self.log.lock();
            if st.over || st.closed {
                return Err(());
            }
            st.bytes = st.bytes.saturating_add(data.len());
            if st.bytes > st.limit {
                st.keep = false;
            }
            st.closed = options.final_msg;
            let index = st.first + st.msgs.len();
            st.msgs.push_back((data, options));
            index
        };
        self.log.grew.notify_waiters();
        // A message kept for a retry is sent: the log holds it, within the replay limit.
        // Any other waits until an attempt's writer took it, as a send on the attempt's
        // own stream would.
        loop {
            let mut progress = pin!(self.log.progress.notified());
            progress.as_mut().enable();
            {
                let st = self.log.lock();
                if st.keep || st.first > index {
                    return Ok(());
                }
                if st.over {
                    return Err(());
                }
            }
            progress.await;
        }
    }
}
