//! The response half of a call, where the retry decision runs: each attempt's answer is
//! read, a failure before commit goes to the call's retry state (core's `CallRetry`, the
//! same object the tonic layer drives), and a granted retry is waited out and sent from
//! here. The caller sees one stream: the committed attempt's headers, messages and
//! trailers, or the last failure. A hedged call's copies race in [`hedged`].

mod hedged;

use std::fmt;
use std::sync::Arc;

use grpc::client::{CallOptions, Invoke, RecvStream, ResponseStreamItem};
use grpc::core::{RecvMessage, RequestHeaders, Trailers};
use stormguard_core::{
    AttemptEnd, AttemptPlan, CallRetry, Code, CommittedCall, Deadline, Decision, Failure, Instant,
    Pushback, Refusal,
};

use crate::interceptor::Settings;
use crate::metrics::CallMetrics;
use crate::send::{Log, Writer};
use crate::wire;

/// The response half of a call through a [`RetryInterceptor`](crate::RetryInterceptor).
///
/// Its first item comes from the attempt that commits (response headers) or ends the call:
/// attempts that failed before commit and were retried are never seen. A call that is not
/// retried ends with the last attempt's trailers, marked `grpc-retry-pushback-ms: -1` when
/// stormguard refused to retry a retryable failure (budget, breaker, attempts, deadline),
/// so that no caller above retries it either. Dropping it cancels the attempt in flight.
pub struct RetryRecvStream<I: Invoke> {
    call: Call<I>,
}

impl<I: Invoke> fmt::Debug for RetryRecvStream<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryRecvStream")
            .field("method", self.call.headers.method_name())
            .field("retry", &self.call.retry)
            .finish_non_exhaustive()
    }
}

struct Call<I: Invoke> {
    invoker: I,
    /// The request headers every attempt starts from (before its own stamps).
    headers: RequestHeaders,
    options: CallOptions,
    settings: Arc<Settings>,
    log: Arc<Log>,
    /// The call's retry state, until the call commits or ends.
    retry: Option<CallRetry>,
    /// Attempts started (the log's attempt number of the latest).
    started: u64,
    /// When the latest attempt was started.
    attempt_started: Instant,
    /// The call's metrics (nothing without a meter).
    metrics: CallMetrics,
    phase: Phase<I::RecvStream>,
}

enum Phase<R> {
    /// An attempt is in flight; `fire_at` ends it (the call's deadline or its own limit).
    Attempt {
        recv: R,
        _writer: Writer,
        fire_at: Option<Instant>,
    },
    /// An attempt ended without a stream (its `invoke` did not return before `fire_at`):
    /// decided on at the next read.
    Unstarted { end: AttemptEnd, last: Trailers },
    /// The call committed: the attempt's items pass through, held to the call's deadline;
    /// its end is recorded in `call`.
    Committed {
        recv: R,
        _writer: Writer,
        call: Option<CommittedCall>,
        deadline: Option<Instant>,
    },
    /// The call ended: `last` is returned once, then `StreamClosed`.
    Ended { last: Option<Trailers> },
}

/// What reading an attempt gave: an item for the caller, or a failure to decide on.
enum Read {
    Pass(ResponseStreamItem),
    Failed { end: AttemptEnd, last: Trailers },
}

impl<I: Invoke> RetryRecvStream<I> {
    /// A call admitted by its retry state: its first attempt is sent as `plan` says.
    pub(crate) async fn start(
        invoker: I,
        headers: RequestHeaders,
        options: CallOptions,
        (settings, metrics): (Arc<Settings>, CallMetrics),
        log: Arc<Log>,
        retry: CallRetry,
        plan: AttemptPlan,
    ) -> Self {
        let mut call = Call {
            invoker,
            headers,
            options,
            settings,
            log,
            retry: Some(retry),
            started: 0,
            attempt_started: Instant::now(),
            metrics,
            phase: Phase::Ended { last: None },
        };
        call.send(plan).await;
        RetryRecvStream { call }
    }

    /// A call that ends before any attempt, with `last`.
    pub(crate) fn ended(
        invoker: I,
        headers: RequestHeaders,
        settings: Arc<Settings>,
        log: Arc<Log>,
        last: Trailers,
    ) -> Self {
        log.end();
        RetryRecvStream {
            call: Call {
                invoker,
                headers,
                options: CallOptions::new(),
                settings,
                log,
                retry: None,
                started: 0,
                attempt_started: Instant::now(),
                metrics: CallMetrics::none(),
                phase: Phase::Ended { last: Some(last) },
            },
        }
    }
}

impl<I: Invoke> Call<I> {
    /// Sends an attempt as `plan` says: its headers stamped, its writer started. An
    /// `invoke` that does not return before the attempt's limit (the channel is still
    /// connecting, or has no stream to give) ends the attempt as timed out, never sent.
    async fn send(&mut self, plan: AttemptPlan) {
        let mut headers = self.headers.clone();
        wire::stamp(headers.metadata_mut(), &plan);
        let mut options = self.options.clone();
        if let Some(at) = plan.fire_at {
            options.set_deadline(at.into_std());
        }
        let retry = self.started > 0;
        self.started += 1;
        self.settings.stats.attempt(retry);
        if retry {
            self.metrics.retry(false);
        } else {
            self.metrics.attempt();
        }
        self.attempt_started = Instant::now();
        let invoked = self.invoker.invoke(headers, options);
        let streams = match plan.fire_at {
            Some(at) => tokio::time::timeout_at(at, invoked).await.ok(),
            None => Some(invoked.await),
        };
        self.phase = match streams {
            Some((send, recv)) => Phase::Attempt {
                recv,
                _writer: self.log.start_attempt(self.started, send),
                fire_at: plan.fire_at,
            },
            None => Phase::Unstarted {
                end: AttemptEnd::TimedOut {
                    replayable: self.log.replayable(),
                    unsent: true,
                },
                last: attempt_timed_out(),
            },
        };
    }

    async fn recv(&mut self, msg: &mut dyn RecvMessage) -> ResponseStreamItem
    where
        I: Clone + Send + 'static,
        I::SendStream: Send,
        I::RecvStream: Send,
    {
        if self.retry.as_ref().is_some_and(CallRetry::is_hedged) {
            return self.hedged(msg).await;
        }
        loop {
            let read = match &mut self.phase {
                Phase::Ended { last } => {
                    return last.take().map_or(
                        ResponseStreamItem::StreamClosed,
                        ResponseStreamItem::Trailers,
                    );
                }
                Phase::Committed {
                    recv,
                    call,
                    deadline,
                    ..
                } => {
                    let read = match *deadline {
                        Some(at) => tokio::time::timeout_at(at, recv.recv(msg)).await.ok(),
                        None => Some(recv.recv(msg).await),
                    };
                    return match read {
                        Some(ResponseStreamItem::Trailers(trailers)) => {
                            let code = wire::trailers_code(&trailers);
                            if let Some(mut call) = call.take() {
                                call.on_ended_at(code, Instant::now());
                            }
                            self.finish(code);
                            ResponseStreamItem::Trailers(trailers)
                        }
                        Some(item) => item,
                        // The deadline passed while the committed call ran: dropping the
                        // stream cancels it; nothing is recorded (the caller's deadline
                        // says nothing about the dependency).
                        None => self.expired(),
                    };
                }
                Phase::Unstarted { .. } => {
                    let Phase::Unstarted { end, last } =
                        std::mem::replace(&mut self.phase, Phase::Ended { last: None })
                    else {
                        unreachable!("the phase was Unstarted a moment ago");
                    };
                    Read::Failed { end, last }
                }
                Phase::Attempt { recv, fire_at, .. } => {
                    let read = match *fire_at {
                        Some(at) => tokio::time::timeout_at(at, recv.recv(msg)).await.ok(),
                        None => Some(recv.recv(msg).await),
                    };
                    self.read(read)
                }
            };
            match read {
                Read::Pass(item) => return item,
                Read::Failed { end, last } => {
                    if let Some(item) = self.failed(end, last).await {
                        return item;
                    }
                }
            }
        }
    }

    /// Sorts what the attempt in flight gave (`None`: its limit ran out first).
    fn read(&mut self, read: Option<ResponseStreamItem>) -> Read {
        let replayable = self.log.replayable();
        match read {
            None => Read::Failed {
                end: AttemptEnd::TimedOut {
                    replayable,
                    unsent: false,
                },
                last: attempt_timed_out(),
            },
            // Response headers (or a message, which only follows them): the call commits.
            Some(item @ (ResponseStreamItem::Headers(_) | ResponseStreamItem::Message)) => {
                self.commit(self.started);
                Read::Pass(item)
            }
            Some(ResponseStreamItem::Trailers(trailers)) => match trailers.status() {
                Ok(()) => {
                    // A trailers-only OK.
                    if let Some(retry) = self.retry.as_mut() {
                        retry.on_success_at(Instant::now());
                    }
                    self.finish(Code::Ok);
                    Read::Pass(ResponseStreamItem::Trailers(trailers))
                }
                Err(e) => Read::Failed {
                    end: AttemptEnd::Failed(Failure {
                        code: wire::code_from_grpc(e.code()),
                        pushback: wire::pushback(trailers.metadata()),
                        replayable,
                        unsent: false,
                        unprocessed: wire::unprocessed(trailers.metadata()),
                    }),
                    last: trailers,
                },
            },
            // The stream closed without trailers: a broken attempt, as `UNKNOWN`.
            Some(ResponseStreamItem::StreamClosed) => Read::Failed {
                end: AttemptEnd::Failed(Failure {
                    replayable,
                    ..Failure::status(Code::Unknown)
                }),
                last: wire::failure(Code::Unknown, "the stream closed without trailers"),
            },
        }
    }

    /// The call commits: the attempt in flight (number `attempt`) is the call's from here
    /// on, never retried.
    fn commit(&mut self, attempt: u64) {
        let phase = std::mem::replace(&mut self.phase, Phase::Ended { last: None });
        let Phase::Attempt { recv, _writer, .. } = phase else {
            self.phase = phase;
            return;
        };
        self.log.commit(attempt);
        self.settings.stats.committed();
        let call = self.retry.take().map(|r| r.commit_at(Instant::now()));
        let deadline = call.as_ref().and_then(CommittedCall::deadline);
        self.phase = Phase::Committed {
            recv,
            _writer,
            call,
            deadline,
        };
    }

    /// The call ends with `code`: counted, recorded, and ended.
    fn finish(&mut self, code: Code) {
        self.settings.stats.outcome(code == Code::Ok);
        self.metrics.ended(code);
        self.end(None);
    }

    /// The call's deadline ran out: it ends `DEADLINE_EXCEEDED` (nothing is recorded in the
    /// budget or the breaker: the caller's deadline says nothing about the dependency).
    fn expired(&mut self) -> ResponseStreamItem {
        self.settings.stats.deadline_exceeded();
        self.finish(Code::DeadlineExceeded);
        ResponseStreamItem::Trailers(call_expired())
    }

    /// The call ends (the attempt in flight, if any, is dropped: its stream is cancelled).
    fn end(&mut self, last: Option<Trailers>) {
        self.phase = Phase::Ended { last };
        self.retry = None;
        self.log.end();
    }

    /// An attempt failed (`end`; `last` is the caller's answer if nothing follows): the
    /// retry state grants a retry, which is waited out and sent (`None`), or the call ends
    /// with the item returned. An attempt that cannot be sent before its limit is another
    /// failure, decided on in turn.
    async fn failed(
        &mut self,
        mut end: AttemptEnd,
        mut last: Trailers,
    ) -> Option<ResponseStreamItem> {
        loop {
            // The ended attempt's stream is dropped: cancelled, if it still runs.
            self.phase = Phase::Ended { last: None };
            let Some(retry) = self.retry.as_mut() else {
                self.end(None);
                return Some(ResponseStreamItem::Trailers(last));
            };
            let now = Instant::now();
            let verdict = retry.on_attempt_end_at(end, now);
            if verdict.attempt_timed_out {
                self.settings.stats.attempt_timed_out();
            }
            match verdict.decision {
                Decision::Retry { delay } => {
                    if !verdict.transparent
                        && matches!(
                            end,
                            AttemptEnd::Failed(Failure {
                                pushback: Some(Pushback::RetryAfter(_)),
                                ..
                            })
                        )
                    {
                        self.settings.stats.delayed_by_pushback();
                    } else if !verdict.transparent {
                        self.settings.stats.delayed_by_backoff();
                    }
                    self.metrics.waiting(now);
                    // A granted delay ends before the call's deadline (the retry state
                    // grants none that does not leave room for an attempt).
                    tokio::time::sleep_until(Deadline::after_at(now, delay).instant()).await;
                    let Some(retry) = self.retry.as_mut() else {
                        return Some(self.give_up(Refusal::Deadline, last, false));
                    };
                    let plan = match retry.start_retry_at(Instant::now()) {
                        Ok(plan) => plan,
                        Err(refusal) => return Some(self.give_up(refusal, last, false)),
                    };
                    self.send(plan).await;
                    match std::mem::replace(&mut self.phase, Phase::Ended { last: None }) {
                        Phase::Unstarted { end: e, last: l } => {
                            (end, last) = (e, l);
                        }
                        phase => {
                            self.phase = phase;
                            return None;
                        }
                    }
                }
                Decision::GiveUp(refusal) => {
                    return Some(self.give_up(refusal, last, verdict.attempt_timed_out));
                }
                Decision::Expired => return Some(self.expired()),
            }
        }
    }

    /// The retry state refused a retry (`timed_out`: the failed attempt ran out of its own
    /// limit). A timed-out attempt answers `DEADLINE_EXCEEDED`; any other failure goes to
    /// the caller as it came; either is marked "do not retry" when stormguard refused to
    /// retry a retryable failure.
    fn give_up(
        &mut self,
        refusal: Refusal,
        mut last: Trailers,
        timed_out: bool,
    ) -> ResponseStreamItem {
        self.settings.stats.refused(refusal);
        if timed_out {
            last = wire::failure(
                Code::DeadlineExceeded,
                format!("stormguard: the attempt timed out and was not retried ({refusal})"),
            );
            wire::mark_do_not_retry(&mut last);
        } else if refusal.is_retryable_but_refused() {
            wire::mark_do_not_retry(&mut last);
        } else if refusal == Refusal::Pushback {
            // The server said not to retry: its answer goes up as it came, and the request
            // scope learns that this call was refused.
            stormguard_core::context::mark_downstream_refused();
        }
        tracing::debug!(
            rpc.method = self.headers.method_name().as_str(),
            retry.refused = refusal.as_str(),
            "stormguard: retry refused"
        );
        self.finish(wire::trailers_code(&last));
        ResponseStreamItem::Trailers(last)
    }
}

/// The answer of an attempt that ran out of its own limit (what the caller gets if the
/// retry state gives up on it).
fn attempt_timed_out() -> Trailers {
    wire::failure(
        Code::DeadlineExceeded,
        "stormguard: the attempt's timeout ran out",
    )
}

/// The answer of a call whose deadline ran out.
fn call_expired() -> Trailers {
    wire::failure(
        Code::DeadlineExceeded,
        "stormguard: the call's deadline was exceeded",
    )
}

impl<I: Invoke> Drop for RetryRecvStream<I> {
    /// The caller dropped the call: the attempt in flight is cancelled (its streams drop
    /// with the call), and the caller's sends fail from here on.
    fn drop(&mut self) {
        self.call.log.end();
    }
}

impl<I> RecvStream for RetryRecvStream<I>
where
    I: Invoke + Clone + Send + 'static,
    I::SendStream: Send,
    I::RecvStream: Send,
{
    async fn recv(&mut self, msg: &mut dyn RecvMessage) -> ResponseStreamItem {
        self.call.recv(msg).await
    }
}
