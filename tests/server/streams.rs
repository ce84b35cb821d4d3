//! A streaming call holds its worker while its handler works, and gives it back the first
//! time its response has nothing ready to send (it waits for its next message, or for the
//! caller to read), so open streams do not shut unary calls out; its ending is counted when
//! it comes. Both directions over real tonic streams: a server stream (`WatchStock`) and a client
//! stream (`InventoryBatch.ReserveBatch`), against one worker and no queue; and the
//! separate stream limit: a streaming service behind a layer of its own.

use crate::server_support;

use std::pin::Pin;
use std::task::{Context, Poll};

use server_support::{TestServer, channel, eventually, one_worker_no_queue, reserve, start_with};
use stormguard_demo::server::{DemoConfig, DemoInventory};
use stormguard_demo::{
    InventoryBatchClient, InventoryBatchServer, InventoryClient, ReserveRequest, WatchStockRequest,
};
use stormguard_server::ShedLayer;
use stormguard_server::shed::MESSAGE_QUEUE_FULL;
use tokio::sync::mpsc;
use tonic::Code;
use tonic::codegen::tokio_stream::Stream;
use tonic::transport::Server;
use tower::Layer;

async fn serve() -> TestServer {
    start_with(
        one_worker_no_queue(),
        DemoConfig::default(),
        false,
        |layer, inventory, incoming| {
            // The batch method keeps no state of its own: a second demo instance serves it.
            let batch = InventoryBatchServer::new(DemoInventory::new(DemoConfig::default()));
            Server::builder()
                .layer(layer)
                .add_service(inventory)
                .add_service(batch)
                .serve_with_incoming(incoming)
        },
    )
    .await
}

/// A `Reserve` that the server sheds, because the only worker is taken.
async fn assert_reserve_shed(client: &InventoryClient<tonic::transport::Channel>) {
    let status = client
        .clone()
        .reserve(reserve("", None))
        .await
        .expect_err("shed: the worker is held");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), MESSAGE_QUEUE_FULL);
}

/// Waits until the only worker is free again, then shows it with a served `Reserve`.
async fn assert_worker_freed(
    server: &TestServer,
    client: &InventoryClient<tonic::transport::Channel>,
) {
    eventually("worker given back", || {
        server.stats.snapshot().in_flight == 0
    })
    .await;
    client
        .clone()
        .reserve(reserve("", None))
        .await
        .expect("served on the freed worker");
}

/// Opens a stream of 10 000 levels of 1 KiB each: far more than HTTP/2's flow-control
/// windows hold, so the server cannot finish sending before the caller reads it.
async fn open_long_watch(
    client: &InventoryClient<tonic::transport::Channel>,
) -> tonic::Streaming<stormguard_demo::StockLevel> {
    let request = WatchStockRequest {
        sku: "x".repeat(1024),
        count: 10_000,
        interval_ms: 0,
    };
    client
        .clone()
        .watch_stock(request)
        .await
        .expect("admitted")
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stream_gives_its_worker_back_while_it_waits_and_counts_its_drop() {
    let server = serve().await;
    let client = InventoryClient::new(channel(server.addr).await);
    let mut stream = open_long_watch(&client).await;
    stream
        .message()
        .await
        .expect("stream")
        .expect("first level");
    // The handler has returned and the response waits for the caller to read (HTTP/2's
    // flow-control window is full): the only worker is free for a unary call.
    assert_worker_freed(&server, &client).await;
    // The caller drops the stream: not counted as a completion.
    drop(stream);
    eventually("the stream's end seen", || {
        server.stats.drains().active == 0 && server.stats.snapshot().in_flight == 0
    })
    .await;
    let s = server.stats.snapshot();
    assert_eq!((s.admitted, s.completed, s.shed()), (2, 1, 0), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stream_read_to_its_end_is_counted_as_completed() {
    let server = serve().await;
    let client = InventoryClient::new(channel(server.addr).await);
    let mut stream = open_long_watch(&client).await;
    let mut levels = 0;
    while stream.message().await.expect("stream").is_some() {
        levels += 1;
        if levels == 5_000 {
            // Half read, the rest waiting on the caller: a unary call is served meanwhile.
            assert_worker_freed(&server, &client).await;
        }
    }
    assert_eq!(levels, 10_000);
    let s = server.stats.snapshot();
    assert_eq!((s.admitted, s.completed, s.shed()), (2, 2, 0), "{s:?}");
}

/// The receiving end of a channel as a request stream: the test decides when each
/// message goes and when the stream ends.
struct Trickle(mpsc::Receiver<ReserveRequest>);

impl Stream for Trickle {
    type Item = ReserveRequest;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

fn item(quantity: u32) -> ReserveRequest {
    ReserveRequest {
        sku: "sku-1".into(),
        quantity,
        request_id: String::new(),
        payload: Vec::new(),
    }
}

/// A second client stream, shed at once because the limit is taken.
async fn assert_batch_shed(batch: &InventoryBatchClient<tonic::transport::Channel>) {
    let (_send, receive) = mpsc::channel(1);
    let status = batch
        .clone()
        .reserve_batch(Trickle(receive))
        .await
        .expect_err("shed");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), MESSAGE_QUEUE_FULL);
}

type BatchCall = tokio::task::JoinHandle<
    Result<tonic::Response<stormguard_demo::ReserveBatchReply>, tonic::Status>,
>;

/// Starts a `ReserveBatch` whose first message is `first`; the test sends the rest, and
/// ends the stream by dropping the sender.
async fn start_batch(
    batch: &InventoryBatchClient<tonic::transport::Channel>,
    first: ReserveRequest,
) -> (mpsc::Sender<ReserveRequest>, BatchCall) {
    let (send, receive) = mpsc::channel(1);
    let mut batch = batch.clone();
    let call = tokio::spawn(async move { batch.reserve_batch(Trickle(receive)).await });
    send.send(first).await.expect("first item");
    (send, call)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickling_client_stream_holds_its_worker_until_its_answer_ends() {
    let server = serve().await;
    let channel = channel(server.addr).await;
    let client = InventoryClient::new(channel.clone());
    let batch = InventoryBatchClient::new(channel);

    let (send, call) = start_batch(&batch, item(2)).await;
    eventually("client stream admitted", || {
        server.stats.snapshot().in_flight == 1
    })
    .await;
    // While the caller takes its time, its call holds the only worker: a unary call
    // and a second client stream are both shed.
    assert_reserve_shed(&client).await;
    assert_batch_shed(&batch).await;
    send.send(item(3)).await.expect("second item");
    assert_eq!(server.stats.snapshot().in_flight, 1);
    // The caller ends its stream: the answer comes and the worker is given back.
    drop(send);
    let reply = call.await.expect("task").expect("served").into_inner();
    assert_eq!((reply.reserved, reply.quantity), (2, 5));
    assert_worker_freed(&server, &client).await;
    let s = server.stats.snapshot();
    assert_eq!((s.admitted, s.completed, s.shed_first), (2, 2, 2), "{s:?}");
}

/// The separate stream limit: the client-streaming service behind a `ShedLayer` of its
/// own. Its trickling streams hold that layer's worker and leave the unary service's
/// worker alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_of_its_own_gives_client_streams_a_separate_limit() {
    let streams = ShedLayer::from_config(&one_worker_no_queue()).expect("valid config");
    let stream_stats = streams.stats();
    let server = start_with(
        one_worker_no_queue(),
        DemoConfig::default(),
        false,
        move |unary, inventory, incoming| {
            let batch = InventoryBatchServer::new(DemoInventory::new(DemoConfig::default()));
            Server::builder()
                .add_service(unary.layer(inventory))
                .add_service(streams.layer(batch))
                .serve_with_incoming(incoming)
        },
    )
    .await;
    let channel = channel(server.addr).await;
    let client = InventoryClient::new(channel.clone());
    let batch = InventoryBatchClient::new(channel);

    let (send, call) = start_batch(&batch, item(1)).await;
    eventually("client stream admitted", || {
        stream_stats.snapshot().in_flight == 1
    })
    .await;
    // The stream limit is taken: a second stream is shed...
    assert_batch_shed(&batch).await;
    // ...while unary calls still have their worker.
    for _ in 0..3 {
        client
            .clone()
            .reserve(reserve("", None))
            .await
            .expect("served beside the stream");
    }
    drop(send);
    let reply = call.await.expect("task").expect("served").into_inner();
    assert_eq!(reply.reserved, 1);
    assert_eq!(server.stats.snapshot().completed, 3);
    assert_eq!(stream_stats.snapshot().shed_first, 1);
}
