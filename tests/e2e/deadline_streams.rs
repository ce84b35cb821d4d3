//! End-to-end: a call is held to its deadline for its whole life, on both sides, after its
//! response headers too.
//!
//! Client side (`RetryLayer` over a plain tonic server): server-streaming, client-streaming
//! and bidirectional calls that committed (response headers arrived) and then outlive the
//! caller's deadline end with `DEADLINE_EXCEEDED` at the deadline, and the server's handler
//! sees its stream reset (its response stream is dropped; its sends fail).
//!
//! Server side (`ShedLayer`, one worker, a plain tonic client): a handler still running past
//! the deadline it was given (before it answered, or while its response streams) is cut
//! at the deadline less `min_time_left`, and the next queued call is admitted at that
//! moment rather than when the handler would have finished.
//!
//! Every test runs on paused tokio time (virtual time; nothing waits for the wall clock),
//! over an in-memory HTTP/2 connection between a real tonic client and server (see
//! `serve`).
//! The streaming services use the demo proto's messages (`WatchStock`, and the
//! `ReserveBatch` path with a handler that sends its response headers at once, as a
//! server-streaming handler does).
#![allow(clippy::unwrap_used)]

use crate::client_support;

use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use client_support::{controller, quick_policy};
use http::uri::PathAndQuery;
use stormguard_client::RetryLayer;
use stormguard_core::WorkerLimit;
use stormguard_core::{AdmissionConfig, RetryThreshold};
use stormguard_demo::{
    Inventory, InventoryBatchClient, InventoryClient, InventoryServer, ReserveBatchReply,
    ReserveReply, ReserveRequest, StockLevel, WatchStockRequest,
};
use stormguard_server::shed::MESSAGE_DEADLINE_CUT;
use stormguard_server::{ShedLayer, ShedStats};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::tokio_stream::{self, Stream, StreamExt};
use tonic::server::NamedService;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Response, Status, Streaming};
use tower::ServiceBuilder;

const BATCH_PATH: &str = "/stormguard.demo.v1.InventoryBatch/ReserveBatch";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Fails the test instead of hanging when a call that should end never does (without
/// the rule under test, the streams here run forever).
async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .unwrap_or_else(|_| panic!("{what}: still running after 60 s (virtual)"))
}

/// Asserts `at` is `expected` after `start`, within 5 ms of virtual time.
fn assert_at(what: &str, start: Instant, at: Instant, expected: Duration) {
    let elapsed = at - start;
    assert!(
        elapsed >= expected && elapsed <= expected + ms(5),
        "{what} at {elapsed:?}, expected {expected:?}"
    );
}

/// What the server saw: when each handler started, and when a handler's response stream
/// was dropped (the server learnt the call was over).
#[derive(Debug, Default)]
struct Probe {
    started: Mutex<Vec<(String, Instant)>>,
    dropped: Mutex<Vec<Instant>>,
    send_failed: Mutex<Vec<Instant>>,
    changed: Notify,
}

impl Probe {
    fn start(&self, what: &str) {
        let now = Instant::now();
        self.started.lock().unwrap().push((what.to_owned(), now));
        self.changed.notify_waiters();
    }

    fn started(&self, what: &str) -> Option<Instant> {
        let started = self.started.lock().unwrap();
        started.iter().find(|(w, _)| w == what).map(|(_, at)| *at)
    }

    /// Waits until `cond` holds on the probe (checked after every change).
    async fn until(&self, what: &str, cond: impl Fn(&Probe) -> bool) {
        within(what, async {
            loop {
                let changed = self.changed.notified();
                if cond(self) {
                    return;
                }
                changed.await;
            }
        })
        .await;
    }

    fn first_drop(&self) -> Option<Instant> {
        self.dropped.lock().unwrap().first().copied()
    }

    fn first_send_failure(&self) -> Option<Instant> {
        self.send_failed.lock().unwrap().first().copied()
    }
}

/// Records, when dropped, that the stream it is part of was dropped.
struct DropGuard(Arc<Probe>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        self.0.dropped.lock().unwrap().push(Instant::now());
        self.0.changed.notify_waiters();
    }
}

/// A response stream fed by a channel, with a guard dropped along with it.
struct Fed<T> {
    rx: mpsc::Receiver<Result<T, Status>>,
    _guard: DropGuard,
}

impl<T> Stream for Fed<T> {
    type Item = Result<T, Status>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

/// A stream fed by `produce`, which is handed the sender and runs as a task of its own;
/// a send that fails (the stream was dropped) is recorded.
fn fed<T, F, Fut>(probe: &Arc<Probe>, produce: F) -> Fed<T>
where
    T: Send + 'static,
    F: FnOnce(mpsc::Sender<Result<T, Status>>) -> Fut,
    Fut: std::future::Future<Output = Result<(), mpsc::error::SendError<Result<T, Status>>>>
        + Send
        + 'static,
{
    let (tx, rx) = mpsc::channel(4);
    let sends = produce(tx);
    let p = Arc::clone(probe);
    tokio::spawn(async move {
        if sends.await.is_err() {
            p.send_failed.lock().unwrap().push(Instant::now());
            p.changed.notify_waiters();
        }
    });
    Fed {
        rx,
        _guard: DropGuard(Arc::clone(probe)),
    }
}

/// The `Inventory` service of these tests. `Reserve` of sku `slow` takes 10 s, any other
/// answers at once. `WatchStock` of sku `stall` sends `count` levels and then nothing
/// (the stream stays open); of sku `forever`, a level every 100 ms for ever.
#[derive(Clone)]
struct Slow(Arc<Probe>);

fn level(sku: &str, seq: u32) -> StockLevel {
    StockLevel {
        sku: sku.to_owned(),
        level: u64::from(seq),
        seq,
    }
}

#[tonic::codegen::async_trait]
impl Inventory for Slow {
    async fn reserve(
        &self,
        req: Request<ReserveRequest>,
    ) -> Result<Response<ReserveReply>, Status> {
        let id = req.get_ref().request_id.clone();
        self.0.start(&id);
        if req.get_ref().sku == "slow" {
            let _guard = DropGuard(Arc::clone(&self.0));
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
        Ok(Response::new(ReserveReply {
            reserved: true,
            attempt: 1,
            timeout_ms: 0,
        }))
    }

    type WatchStockStream = Fed<StockLevel>;

    async fn watch_stock(
        &self,
        req: Request<WatchStockRequest>,
    ) -> Result<Response<Fed<StockLevel>>, Status> {
        let WatchStockRequest { sku, count, .. } = req.into_inner();
        self.0.start(&sku);
        let stream = fed(&self.0, move |tx| async move {
            if sku == "forever" {
                let mut seq = 0;
                loop {
                    tx.send(Ok(level(&sku, seq))).await?;
                    seq += 1;
                    tokio::time::sleep(ms(100)).await;
                }
            }
            for seq in 0..count {
                tx.send(Ok(level(&sku, seq))).await?;
            }
            // Keep the stream open; the send fails once the server drops it.
            tx.closed().await;
            tx.send(Ok(level(&sku, count))).await
        });
        Ok(Response::new(stream))
    }
}

/// prost messages over gRPC, for the hand-written `ReserveBatch` handler and bidirectional
/// calls (the demo's generated code has no bidirectional method).
#[derive(Debug)]
struct ProstCodec<E, D>(PhantomData<fn(E) -> D>);

impl<E, D> Default for ProstCodec<E, D> {
    fn default() -> Self {
        ProstCodec(PhantomData)
    }
}

#[derive(Debug)]
struct ProstEncoder<E>(PhantomData<fn(E)>);

#[derive(Debug)]
struct ProstDecoder<D>(PhantomData<fn() -> D>);

impl<E, D> Codec for ProstCodec<E, D>
where
    E: prost::Message + Send + 'static,
    D: prost::Message + Default + Send + 'static,
{
    type Encode = E;
    type Decode = D;
    type Encoder = ProstEncoder<E>;
    type Decoder = ProstDecoder<D>;

    fn encoder(&mut self) -> ProstEncoder<E> {
        ProstEncoder(PhantomData)
    }

    fn decoder(&mut self) -> ProstDecoder<D> {
        ProstDecoder(PhantomData)
    }
}

impl<E: prost::Message> Encoder for ProstEncoder<E> {
    type Item = E;
    type Error = Status;
    fn encode(&mut self, item: E, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(buf)
            .map_err(|e| Status::internal(e.to_string()))
    }
}

impl<D: prost::Message + Default> Decoder for ProstDecoder<D> {
    type Item = D;
    type Error = Status;
    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
        D::decode(buf)
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }
}

/// `ReserveBatch` served as a stream both ways: the response headers go out at once; a
/// request of sku `echo` is answered at once (one reply each), the others are summed and
/// answered when the caller ends its stream.
#[derive(Clone)]
struct Batch(Arc<Probe>);

impl NamedService for Batch {
    const NAME: &'static str = "stormguard.demo.v1.InventoryBatch";
}

impl tower::Service<http::Request<tonic::body::Body>> for Batch {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let probe = Arc::clone(&self.0);
        Box::pin(async move {
            let handler = tower::service_fn(move |req: Request<Streaming<ReserveRequest>>| {
                let probe = Arc::clone(&probe);
                async move {
                    probe.start("batch");
                    let mut inbound = req.into_inner();
                    let stream = fed(&probe, move |tx| async move {
                        let (mut reserved, mut quantity) = (0u32, 0u64);
                        while let Ok(Some(r)) = inbound.message().await {
                            if r.sku == "echo" {
                                let reply = ReserveBatchReply {
                                    reserved: 1,
                                    quantity: u64::from(r.quantity),
                                };
                                tx.send(Ok(reply)).await?;
                            } else {
                                reserved += 1;
                                quantity += u64::from(r.quantity);
                            }
                        }
                        tx.send(Ok(ReserveBatchReply { reserved, quantity })).await
                    });
                    Ok::<_, Status>(Response::new(stream))
                }
            });
            let mut grpc = tonic::server::Grpc::new(
                ProstCodec::<ReserveBatchReply, ReserveRequest>::default(),
            );
            Ok(grpc.streaming(handler, req).await)
        })
    }
}

/// Serves both test services, behind `shed` when given, over an in-memory HTTP/2
/// connection, and returns a channel to them. (Over kernel sockets, paused time can jump to
/// the next timer while a frame is still on its way between the two sockets: the deadline
/// would fire early. In memory, a write wakes the reader at once, so virtual time moves
/// only when every task waits for a timer.)
async fn serve(probe: &Arc<Probe>, shed: Option<ShedLayer>) -> Channel {
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let incoming = tokio_stream::once(Ok::<_, std::io::Error>(server_io));
    let inventory = InventoryServer::new(Slow(Arc::clone(probe)));
    let batch = Batch(Arc::clone(probe));
    match shed {
        Some(layer) => tokio::spawn(
            Server::builder()
                .layer(layer)
                .add_service(inventory)
                .add_service(batch)
                .serve_with_incoming(incoming),
        ),
        None => tokio::spawn(
            Server::builder()
                .add_service(inventory)
                .add_service(batch)
                .serve_with_incoming(incoming),
        ),
    };
    let mut client_io = Some(client_io);
    Endpoint::from_static("http://in-memory.test")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let io = client_io.take();
            async move {
                io.map(hyper_util::rt::TokioIo::new)
                    .ok_or_else(|| std::io::Error::other("one connection only"))
            }
        }))
        .await
        .unwrap()
}

fn retry_layer() -> RetryLayer {
    RetryLayer::new(controller(quick_policy()))
}

fn timed<T>(message: T, timeout: Duration) -> Request<T> {
    let mut request = Request::new(message);
    request.set_timeout(timeout);
    request
}

fn reservation(sku: &str, quantity: u32) -> ReserveRequest {
    ReserveRequest {
        sku: sku.to_owned(),
        quantity,
        request_id: String::new(),
        payload: Vec::new(),
    }
}

/// `items`, then a stream that stays open.
fn open_stream(items: Vec<ReserveRequest>) -> impl Stream<Item = ReserveRequest> + Send + 'static {
    tokio_stream::iter(items).chain(tokio_stream::pending())
}

// ---- client side: the RetryLayer's response body carries the deadline ----

#[tokio::test(start_paused = true)]
async fn a_committed_server_stream_ends_deadline_exceeded_at_its_deadline() {
    let probe = Arc::new(Probe::default());
    let channel = serve(&probe, None).await;
    let layer = retry_layer();
    let stats = layer.stats();
    let mut client = InventoryClient::new(ServiceBuilder::new().layer(layer).service(channel));

    let start = Instant::now();
    let request = timed(
        WatchStockRequest {
            sku: "stall".into(),
            count: 2,
            interval_ms: 0,
        },
        ms(400),
    );
    let mut stream = client.watch_stock(request).await.unwrap().into_inner();
    assert_eq!(stream.message().await.unwrap().unwrap().seq, 0);
    assert_eq!(stream.message().await.unwrap().unwrap().seq, 1);
    let status = within("the stream", stream.message()).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_at("DEADLINE_EXCEEDED", start, Instant::now(), ms(400));
    // The stream was reset: the server dropped the handler's stream, and its send failed.
    probe
        .until("the server drops the stream", |p| {
            p.first_drop().is_some() && p.first_send_failure().is_some()
        })
        .await;
    assert_at(
        "the server's drop",
        start,
        probe.first_drop().unwrap(),
        ms(400),
    );
    let s = stats.snapshot();
    assert_eq!(
        (
            s.committed,
            s.committed_deadline_exceeded,
            s.deadline_exceeded
        ),
        (1, 1, 1)
    );
    assert_eq!((s.ok, s.failed, s.committed_failed), (0, 1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_committed_client_stream_ends_deadline_exceeded_at_its_deadline() {
    let probe = Arc::new(Probe::default());
    let channel = serve(&probe, None).await;
    let layer = retry_layer();
    let stats = layer.stats();
    let mut client = InventoryBatchClient::new(ServiceBuilder::new().layer(layer).service(channel));

    let start = Instant::now();
    // Two reservations, and the caller's stream stays open: the server answers only when
    // it ends, but sent its response headers at once (the call committed).
    let requests = open_stream(vec![reservation("a", 1), reservation("b", 2)]);
    let status = within("the call", client.reserve_batch(timed(requests, ms(300))))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_at("DEADLINE_EXCEEDED", start, Instant::now(), ms(300));
    probe
        .until("the server drops the stream", |p| p.first_drop().is_some())
        .await;
    assert_at(
        "the server's drop",
        start,
        probe.first_drop().unwrap(),
        ms(300),
    );
    let s = stats.snapshot();
    assert_eq!((s.committed, s.committed_deadline_exceeded), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_committed_bidi_stream_ends_deadline_exceeded_at_its_deadline() {
    let probe = Arc::new(Probe::default());
    let channel = serve(&probe, None).await;
    let layer = retry_layer();
    let stats = layer.stats();
    let svc = ServiceBuilder::new().layer(layer).service(channel);
    let mut grpc = tonic::client::Grpc::new(svc);
    grpc.ready().await.unwrap();

    let start = Instant::now();
    let requests = open_stream(vec![reservation("echo", 3), reservation("echo", 4)]);
    let mut replies = grpc
        .streaming(
            timed(requests, ms(250)),
            PathAndQuery::from_static(BATCH_PATH),
            ProstCodec::<ReserveRequest, ReserveBatchReply>::default(),
        )
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replies.message().await.unwrap().unwrap().quantity, 3);
    assert_eq!(replies.message().await.unwrap().unwrap().quantity, 4);
    let status = within("the stream", replies.message()).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_at("DEADLINE_EXCEEDED", start, Instant::now(), ms(250));
    probe
        .until("the server drops the stream", |p| p.first_drop().is_some())
        .await;
    assert_at(
        "the server's drop",
        start,
        probe.first_drop().unwrap(),
        ms(250),
    );
    assert_eq!(stats.snapshot().committed_deadline_exceeded, 1);
}

// ---- server side: the ShedLayer cuts a call still running past its deadline ----

/// One worker, a queue that waits as long as it must (so only the cut frees the worker).
fn one_worker() -> (ShedLayer, ShedStats) {
    let layer = ShedLayer::from_config(&AdmissionConfig {
        workers: WorkerLimit::Fixed(1),
        queue_capacity: 4,
        retry_threshold: RetryThreshold {
            depth: None,
            queue_delay: None,
        },
        max_time_queued: Duration::from_secs(3600),
        ..AdmissionConfig::default()
    })
    .unwrap();
    let stats = layer.stats();
    (layer, stats)
}

/// The instant the layer cuts a call whose deadline is `timeout` after `start`.
/// With one worker: the first call's handler was dropped at its cut (`timeout` after
/// `start`), the second call got the worker at that instant, and the layer counted two
/// admitted calls, one completed and one cut.
fn assert_worker_passed_on_at_the_cut(
    probe: &Probe,
    stats: &ShedStats,
    start: Instant,
    timeout: Duration,
) {
    let cut = cut_after(timeout);
    assert_at("the drop", start, probe.first_drop().unwrap(), cut);
    assert_at(
        "the second call",
        start,
        probe.started("second").unwrap(),
        cut,
    );
    let s = stats.snapshot();
    assert_eq!(
        (s.admitted, s.completed, s.cut_at_deadline),
        (2, 1, 1),
        "{s:?}"
    );
}

fn cut_after(timeout: Duration) -> Duration {
    timeout - AdmissionConfig::default().min_time_left
}

#[tokio::test(start_paused = true)]
async fn a_server_stream_running_past_its_deadline_is_cut_and_holds_no_worker_while_idle() {
    let probe = Arc::new(Probe::default());
    let (layer, stats) = one_worker();
    let channel = serve(&probe, Some(layer)).await;
    let mut client = InventoryClient::new(channel);

    let start = Instant::now();
    let request = timed(
        WatchStockRequest {
            sku: "forever".into(),
            count: 0,
            interval_ms: 0,
        },
        ms(500),
    );
    let mut stream = client.watch_stock(request).await.unwrap().into_inner();
    assert_eq!(stream.message().await.unwrap().unwrap().seq, 0);
    // The stream waits for its next message: its handler's work is done, and the only
    // worker is free for a second call, served while the stream stays open.
    let mut second = client.clone();
    let mut request = Request::new(reservation("now", 1));
    request.get_mut().request_id = "second".into();
    within("the second call", second.reserve(request))
        .await
        .expect("the second call is served beside the idle stream");
    assert!(
        probe.started("second").unwrap() < start + cut_after(ms(500)),
        "the second call ran before the stream's cut"
    );

    let mut seqs = vec![0];
    let status = within("the stream", async {
        loop {
            match stream.message().await {
                Ok(Some(level)) => seqs.push(level.seq),
                Ok(None) => panic!("the stream ended OK"),
                Err(status) => return status,
            }
        }
    })
    .await;
    // Still held to its deadline: cut, with the messages sent before the cut, in order.
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(status.message(), MESSAGE_DEADLINE_CUT);
    assert_at("the cut", start, Instant::now(), cut_after(ms(500)));
    assert_eq!(seqs, [0, 1, 2, 3, 4]);
    assert_at(
        "the drop",
        start,
        probe.first_drop().unwrap(),
        cut_after(ms(500)),
    );
    let s = stats.snapshot();
    assert_eq!(
        (s.admitted, s.completed, s.cut_at_deadline),
        (2, 1, 1),
        "{s:?}"
    );
    assert_eq!(stats.occupancy().free_workers, 1);
}

#[tokio::test(start_paused = true)]
async fn a_handler_running_past_its_deadline_is_cut_before_it_answers() {
    let probe = Arc::new(Probe::default());
    let (layer, stats) = one_worker();
    let channel = serve(&probe, Some(layer)).await;
    let client = InventoryClient::new(channel);

    let start = Instant::now();
    let mut first = client.clone();
    let slow = tokio::spawn(async move {
        let mut request = timed(reservation("slow", 1), ms(300));
        request.get_mut().request_id = "first".into();
        first.reserve(request).await
    });
    probe
        .until("the slow handler starts", |p| p.started("first").is_some())
        .await;
    let mut second = client.clone();
    let waiting = tokio::spawn(async move {
        let mut request = Request::new(reservation("now", 1));
        request.get_mut().request_id = "second".into();
        second.reserve(request).await
    });

    let status = within("the slow call", slow).await.unwrap().unwrap_err();
    // The layer's answer, not tonic's own `grpc-timeout` timer (which answers CANCELLED
    // at the deadline itself).
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(status.message(), MESSAGE_DEADLINE_CUT);
    assert_at("the cut", start, Instant::now(), cut_after(ms(300)));
    within("the second call", waiting)
        .await
        .unwrap()
        .expect("the second call is served");
    assert_worker_passed_on_at_the_cut(&probe, &stats, start, ms(300));
}

#[tokio::test(start_paused = true)]
async fn a_call_that_ends_before_its_deadline_is_not_cut() {
    let probe = Arc::new(Probe::default());
    let (layer, stats) = one_worker();
    let channel = serve(&probe, Some(layer)).await;
    let retry = retry_layer();
    let client_stats = retry.stats();
    let mut client = InventoryClient::new(ServiceBuilder::new().layer(retry).service(channel));
    let mut stream = client
        .watch_stock(timed(
            WatchStockRequest {
                sku: "done".into(),
                count: 0,
                interval_ms: 0,
            },
            ms(200),
        ))
        .await
        .unwrap()
        .into_inner();
    // `count: 0` of a stalling stream: no message, the stream stays open; the caller drops
    // it before the deadline (its own choice: no cut on either side).
    assert!(
        tokio::time::timeout(ms(100), stream.message())
            .await
            .is_err()
    );
    drop(stream);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let s = stats.snapshot();
    assert_eq!(s.cut_at_deadline, 0, "{s:?}");
    let c = client_stats.snapshot();
    assert_eq!(
        (c.committed_abandoned, c.committed_deadline_exceeded),
        (1, 0)
    );
}
