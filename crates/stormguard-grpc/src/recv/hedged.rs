//! A hedged call: several copies in flight, the first useful answer wins; the same steps
//! as the tonic layer's, on the same engine calls.
//!
//! The first copy is the attempt the call started with; the hedges are further copies
//! sent while it runs, each one its own `invoke` on the channel. Until the call ends, in
//! this order:
//!
//! 1. the call's deadline: when it has passed, every copy is cancelled and the call ends
//!    with `DEADLINE_EXCEEDED`;
//! 2. a hedge that is due ([`CallRetry::next_hedge_at`]) is sent if the whole request is in
//!    the call's log (a request still streaming, or past the replay limit, is carried by
//!    one copy at a time: refused as `replay_limit`, as the tonic layer refuses a streaming
//!    body) and the call's retry state grants it ([`CallRetry::start_hedge_at`]: deadline,
//!    attempts, pushback, breaker, allowance, the budget's upper half); a refused hedge is
//!    counted and stops the call's hedges;
//! 3. the copies race to their first item; the first that ends decides: response headers
//!    (a commit) or `OK` wins (every other copy is dropped, which cancels its stream), a
//!    fatal status ends the call with that answer, a non-fatal one lets the others run and
//!    makes the next hedge due at once, or after the server's pushback
//!    ([`CallRetry::on_hedge_end_at`]);
//! 4. the call waits for the first copy to end, the deadline or the next hedge.
//!
//! A copy's first message, if it comes before any headers, is held as bytes and decoded
//! into the caller's message only for the copy that wins. Every copy that ends, whichever
//! way, tells the method's learned hedge delay how long it ran
//! ([`CallRetry::record_hedge_latency_at`]), the losers and those cut off included.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::Poll;

use bytes::{Buf, Bytes};
use grpc::client::{CallOptions, Invoke, RecvStream, ResponseStreamItem};
use grpc::core::{RecvMessage, RequestHeaders, Trailers};
use stormguard_core::{AttemptEnd, CallRetry, Code, Failure, HedgeDecision, Instant, Refusal};

use super::{Call, Phase};
use crate::send::{Log, Writer};
use crate::wire;

/// What a copy gave first, with its streams.
struct Ended<R> {
    recv: R,
    writer: Writer,
    item: ResponseStreamItem,
    /// The message's bytes, when the item is a message.
    message: Option<Bytes>,
}

/// A copy in flight: its first read, with its number in the call's log and when it began.
struct Copy<R> {
    first_item: Pin<Box<dyn Future<Output = Ended<R>> + Send>>,
    attempt: u64,
    started: Instant,
}

/// A message held as its bytes until a copy wins.
struct Held(Option<Bytes>);

impl RecvMessage for Held {
    fn decode(&mut self, data: &mut dyn Buf) -> Result<(), String> {
        self.0 = Some(data.copy_to_bytes(data.remaining()));
        Ok(())
    }
}

/// Reads the first item of a copy whose streams are `recv` and `writer`.
async fn first_item<R: RecvStream>(mut recv: R, writer: Writer) -> Ended<R> {
    let mut held = Held(None);
    let item = recv.recv(&mut held).await;
    Ended {
        recv,
        writer,
        item,
        message: held.0,
    }
}

/// Sends a hedge on `invoker`, its request written from `log`, and reads its first item.
async fn hedge<I: Invoke>(
    invoker: I,
    headers: RequestHeaders,
    options: CallOptions,
    log: Arc<Log>,
    attempt: u64,
) -> Ended<I::RecvStream>
where
    I::SendStream: Send,
{
    let (send, recv) = invoker.invoke(headers, options).await;
    let writer = log.start_copy(attempt, send);
    first_item(recv, writer).await
}

/// The earlier of two optional instants.
fn earlier(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Waits for the first copy to end (`Some`, taken out of `copies`) or for `wake` (`None`).
async fn race<R>(copies: &mut Vec<Copy<R>>, wake: Option<Instant>) -> Option<(Copy<R>, Ended<R>)> {
    let mut timer = pin!(async move {
        match wake {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    });
    poll_fn(|cx| {
        for i in 0..copies.len() {
            if let Poll::Ready(ended) = copies[i].first_item.as_mut().poll(cx) {
                return Poll::Ready(Some((copies.swap_remove(i), ended)));
            }
        }
        timer.as_mut().poll(cx).map(|()| None)
    })
    .await
}

impl<I> Call<I>
where
    I: Invoke + Clone + Send + 'static,
    I::SendStream: Send,
    I::RecvStream: Send,
{
    /// Runs a hedged call to its commit or its end (see the module's docs).
    pub(super) async fn hedged(&mut self, msg: &mut dyn RecvMessage) -> ResponseStreamItem {
        let mut copies = Vec::new();
        // The latest non-fatal failure: the call's answer if every copy fails.
        let mut last = None;
        match std::mem::replace(&mut self.phase, Phase::Ended { last: None }) {
            Phase::Attempt { recv, _writer, .. } => copies.push(Copy {
                first_item: Box::pin(first_item(recv, _writer)),
                attempt: self.started,
                started: self.attempt_started,
            }),
            // The first copy's `invoke` did not return before its limit: never sent.
            Phase::Unstarted {
                end,
                last: trailers,
            } => {
                if let Some(item) = self.copy_failed(end, trailers, &mut copies, &mut last) {
                    return item;
                }
            }
            phase => {
                self.phase = phase;
                return ResponseStreamItem::StreamClosed;
            }
        }
        loop {
            let now = Instant::now();
            let Some(retry) = self.retry.as_mut() else {
                return ResponseStreamItem::StreamClosed;
            };
            if retry.deadline().is_some_and(|d| now >= d) {
                cancel_all(retry, &mut copies, now);
                return self.expired();
            }
            if retry.next_hedge_at().is_some_and(|at| at <= now) {
                self.send_hedge(&mut copies, now);
            }
            let Some(retry) = self.retry.as_ref() else {
                return ResponseStreamItem::StreamClosed;
            };
            if copies.is_empty() && retry.next_hedge_at().is_none() {
                let why = retry.hedges_stopped().unwrap_or(Refusal::Attempts);
                let last = last.take().unwrap_or_else(|| {
                    wire::failure(
                        Code::Unavailable,
                        "stormguard: no copy of the call was sent",
                    )
                });
                return self.give_up(why, last, false);
            }
            let wake = earlier(retry.deadline(), retry.next_hedge_at());
            let Some((copy, ended)) = race(&mut copies, wake).await else {
                continue;
            };
            if let Some(item) = self.copy_ended(copy, ended, &mut copies, &mut last, msg) {
                return item;
            }
        }
    }

    /// Sends the hedge that is due at `now`, if the request can be copied and the call's
    /// retry state grants it.
    fn send_hedge(&mut self, copies: &mut Vec<Copy<I::RecvStream>>, now: Instant) {
        let Some(retry) = self.retry.as_mut() else {
            return;
        };
        let plan = if self.log.can_copy() {
            retry.start_hedge_at(now)
        } else {
            // The caller's request is not all in the log (still streaming, or past the
            // replay limit): one copy at a time can carry it.
            retry.stop_hedges(Refusal::ReplayLimit);
            Err(Refusal::ReplayLimit)
        };
        let plan = match plan {
            Ok(plan) => plan,
            Err(refusal) => {
                self.settings.stats.hedge_refused(refusal);
                tracing::debug!(
                    rpc.method = self.headers.method_name().as_str(),
                    hedge.refused = refusal.as_str(),
                    hedge.copies = retry.hedges_sent(),
                    "stormguard: hedge refused"
                );
                return;
            }
        };
        let mut headers = self.headers.clone();
        wire::stamp(headers.metadata_mut(), &plan);
        let mut options = self.options.clone();
        if let Some(at) = plan.fire_at {
            options.set_deadline(at.into_std());
        }
        self.started += 1;
        self.settings.stats.hedge();
        self.metrics.hedge();
        let log = Arc::clone(&self.log);
        copies.push(Copy {
            first_item: Box::pin(hedge(
                self.invoker.clone(),
                headers,
                options,
                log,
                self.started,
            )),
            attempt: self.started,
            started: now,
        });
    }

    /// A copy ended with its first item: headers or `OK` win, a failure lets the others run
    /// or ends the call (`Some`: the caller's item).
    fn copy_ended(
        &mut self,
        copy: Copy<I::RecvStream>,
        ended: Ended<I::RecvStream>,
        copies: &mut Vec<Copy<I::RecvStream>>,
        last: &mut Option<Trailers>,
        msg: &mut dyn RecvMessage,
    ) -> Option<ResponseStreamItem> {
        let now = Instant::now();
        let retry = self.retry.as_mut()?;
        retry.record_hedge_latency_at(now.saturating_duration_since(copy.started), now);
        let replayable = self.log.replayable();
        let (end, trailers) = match ended.item {
            item @ (ResponseStreamItem::Headers(_) | ResponseStreamItem::Message) => {
                self.won(&copy, copies, now);
                self.phase = Phase::Attempt {
                    recv: ended.recv,
                    _writer: ended.writer,
                    fire_at: None,
                };
                self.commit(copy.attempt);
                return Some(match (item, ended.message) {
                    (ResponseStreamItem::Message, Some(mut bytes)) => {
                        match msg.decode(&mut bytes) {
                            Ok(()) => ResponseStreamItem::Message,
                            Err(e) => {
                                self.finish(Code::Internal);
                                ResponseStreamItem::Trailers(wire::failure(Code::Internal, e))
                            }
                        }
                    }
                    (item, _) => item,
                });
            }
            ResponseStreamItem::Trailers(trailers) => match trailers.status() {
                Ok(()) => {
                    self.won(&copy, copies, now);
                    if let Some(retry) = self.retry.as_mut() {
                        retry.on_success_at(now);
                    }
                    self.finish(Code::Ok);
                    return Some(ResponseStreamItem::Trailers(trailers));
                }
                Err(e) => {
                    let failure = Failure {
                        code: wire::code_from_grpc(e.code()),
                        pushback: wire::pushback(trailers.metadata()),
                        replayable,
                        unsent: false,
                        unprocessed: wire::unprocessed(trailers.metadata()),
                    };
                    (AttemptEnd::Failed(failure), trailers)
                }
            },
            ResponseStreamItem::StreamClosed => (
                AttemptEnd::Failed(Failure {
                    replayable,
                    ..Failure::status(Code::Unknown)
                }),
                wire::failure(Code::Unknown, "the stream closed without trailers"),
            ),
        };
        self.copy_failed(end, trailers, copies, last)
    }

    /// A copy failed (`end`; `trailers` is the caller's answer if the call ends now): the
    /// others go on (`None`), or the call ends with the item returned.
    fn copy_failed(
        &mut self,
        end: AttemptEnd,
        trailers: Trailers,
        copies: &mut Vec<Copy<I::RecvStream>>,
        last: &mut Option<Trailers>,
    ) -> Option<ResponseStreamItem> {
        let now = Instant::now();
        let retry = self.retry.as_mut()?;
        match retry.on_hedge_end_at(end, copies.len(), now) {
            HedgeDecision::Wait => {
                tracing::debug!(
                    code = wire::trailers_code(&trailers).name(),
                    "stormguard: copy failed, the others go on"
                );
                *last = Some(trailers);
                None
            }
            HedgeDecision::GiveUp(refusal) => {
                cancel_all(retry, copies, now);
                Some(self.give_up(refusal, trailers, false))
            }
            HedgeDecision::Expired => {
                cancel_all(retry, copies, now);
                Some(self.expired())
            }
        }
    }

    /// `copy` won at `now`: every other copy is cancelled.
    fn won(
        &mut self,
        copy: &Copy<I::RecvStream>,
        copies: &mut Vec<Copy<I::RecvStream>>,
        now: Instant,
    ) {
        if copy.attempt != 1 {
            self.settings.stats.hedge_won();
        }
        if let Some(retry) = self.retry.as_ref() {
            cancel_all(retry, copies, now);
        }
    }
}

/// Cancels every copy still in flight at `now` (dropping its streams cancels it), telling
/// the learned delay how long each ran.
fn cancel_all<R>(retry: &CallRetry, copies: &mut Vec<Copy<R>>, now: Instant) {
    for copy in copies.drain(..) {
        retry.record_hedge_latency_at(now.saturating_duration_since(copy.started), now);
    }
}
