//! Idempotency records scoped by method, caller and message, over real tonic on loopback:
//! the key `order-123` on `/shop.Orders/Create` runs the handler once; the same key on
//! another method runs that method's handler, with another message is refused without
//! running, and from another caller runs for that caller; the honest repeat (same method,
//! caller and message) is answered from the record without running.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http::header::CONTENT_TYPE;
use http::uri::PathAndQuery;
use http_body::Frame;
use prost::Message;
use stormguard_demo::{ReserveReply, ReserveRequest};
use stormguard_server::idempotency::{IdempotencyLayer, MESSAGE_MISMATCH};
use stormguard_server::{AdmissionConfig, IdempotencyConfig, ShedLayer};
use tokio::net::TcpListener;
use tonic::body::Body;
use tonic::codegen::tokio_stream;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Status};

const KEY: &str = "order-123";
const CREATE: &str = "/shop.Orders/Create";
const GET: &str = "/shop.Orders/Get";
/// The header the test's stand-in for an authenticating layer reads the caller from.
const CALLER: &str = "x-test-caller";

/// `shop.Orders`: every method answers with its own call count (`attempt`), counted per
/// method.
#[derive(Clone, Default)]
struct Orders {
    calls: Arc<Mutex<HashMap<String, u32>>>,
}

impl Orders {
    fn calls(&self, method: &str) -> u32 {
        self.calls.lock().unwrap().get(method).copied().unwrap_or(0)
    }
}

impl tonic::server::NamedService for Orders {
    const NAME: &'static str = "shop.Orders";
}

type Answer = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

impl tower::Service<http::Request<Body>> for Orders {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Answer {
        let count = {
            let mut calls = self.calls.lock().unwrap();
            let n = calls.entry(request.uri().path().to_owned()).or_default();
            *n += 1;
            *n
        };
        let reply = ReserveReply {
            reserved: true,
            attempt: count,
            timeout_ms: 0,
        }
        .encode_to_vec();
        let mut frame = BytesMut::with_capacity(5 + reply.len());
        frame.put_u8(0);
        frame.put_u32(u32::try_from(reply.len()).unwrap());
        frame.put_slice(&reply);
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        let frames: [Result<Frame<Bytes>, Status>; 2] = [
            Ok(Frame::data(frame.freeze())),
            Ok(Frame::trailers(trailers)),
        ];
        let body = Body::new(http_body_util::StreamBody::new(tokio_stream::iter(frames)));
        let mut response = http::Response::new(body);
        response
            .headers_mut()
            .insert(CONTENT_TYPE, "application/grpc".parse().unwrap());
        Box::pin(async move { Ok(response) })
    }
}

/// Who the caller is, as an authenticating layer outside the idempotency layer leaves it in
/// the request's extensions.
#[derive(Clone)]
struct Principal(String);

/// Serves `orders` behind `idem` inside a `ShedLayer`, with, outside both, a stand-in for
/// authentication that names the caller from the `x-test-caller` header.
async fn serve(orders: Orders, idem: IdempotencyLayer) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let authenticate = tower::util::MapRequestLayer::new(|mut req: http::Request<Body>| {
        let caller = req
            .headers()
            .get(CALLER)
            .and_then(|v| v.to_str().ok())
            .map(|v| Principal(v.to_owned()));
        if let Some(caller) = caller {
            req.extensions_mut().insert(caller);
        }
        req
    });
    tokio::spawn(
        Server::builder()
            .layer(authenticate)
            .layer(ShedLayer::from_config(&AdmissionConfig::default()).unwrap())
            .layer(idem)
            .add_service(orders)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    addr
}

fn in_memory() -> IdempotencyLayer {
    IdempotencyLayer::in_memory(IdempotencyConfig::default()).unwrap()
}

fn scoped() -> IdempotencyLayer {
    in_memory().with_scope(|head| head.extensions.get::<Principal>().map(|p| p.0.clone()))
}

struct Shop {
    grpc: tonic::client::Grpc<Channel>,
}

impl Shop {
    async fn connect(addr: SocketAddr) -> Self {
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        Shop {
            grpc: tonic::client::Grpc::new(channel),
        }
    }

    /// Calls `method` with key `order-123`, the message `body`, as `caller` (if any): the
    /// handler's call count it answers with.
    async fn call(
        &mut self,
        method: &'static str,
        body: &str,
        caller: Option<&str>,
    ) -> Result<u32, Status> {
        let mut request = Request::new(ReserveRequest {
            sku: body.to_owned(),
            quantity: 1,
            request_id: String::new(),
            payload: Vec::new(),
        });
        request
            .metadata_mut()
            .insert("idempotency-key", KEY.parse().unwrap());
        if let Some(caller) = caller {
            request
                .metadata_mut()
                .insert(CALLER, caller.parse().unwrap());
        }
        self.grpc.ready().await.unwrap();
        let codec = tonic_prost::ProstCodec::<ReserveRequest, ReserveReply>::default();
        let reply = self
            .grpc
            .unary(request, PathAndQuery::from_static(method), codec)
            .await?;
        Ok(reply.into_inner().attempt)
    }
}

const ALICE: &str = "alice: 1 book";
const MALLORY: &str = "mallory: 1 car";

#[tokio::test]
async fn the_same_key_on_another_method_runs_that_method_s_handler() {
    let orders = Orders::default();
    let addr = serve(orders.clone(), in_memory()).await;
    let mut shop = Shop::connect(addr).await;
    assert_eq!(shop.call(CREATE, ALICE, None).await.unwrap(), 1);
    // Before, Get was answered with Create's recorded bytes, and its handler never ran.
    assert_eq!(
        shop.call(GET, MALLORY, None).await.unwrap(),
        1,
        "Get's own answer"
    );
    assert_eq!((orders.calls(CREATE), orders.calls(GET)), (1, 1));
    // The honest repeats are answered from their own method's record.
    assert_eq!(shop.call(CREATE, ALICE, None).await.unwrap(), 1);
    assert_eq!(shop.call(GET, MALLORY, None).await.unwrap(), 1);
    assert_eq!(
        (orders.calls(CREATE), orders.calls(GET)),
        (1, 1),
        "neither ran again"
    );
}

#[tokio::test]
async fn the_same_key_with_another_message_is_refused_and_never_runs() {
    let orders = Orders::default();
    let idem = in_memory();
    let stats = idem.stats();
    let addr = serve(orders.clone(), idem).await;
    let mut shop = Shop::connect(addr).await;
    assert_eq!(shop.call(CREATE, ALICE, None).await.unwrap(), 1);
    // Before, this got alice's recorded answer.
    let refused = shop.call(CREATE, MALLORY, None).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    let message = refused.message();
    assert!(message.starts_with(MESSAGE_MISMATCH), "{message}");
    assert!(message.contains(KEY), "names the key: {message}");
    assert!(
        !message.contains("alice") && !message.contains("book"),
        "{message}"
    );
    let md = refused.metadata();
    assert_eq!(
        md.get("grpc-retry-pushback-ms").unwrap(),
        "-1",
        "no retry can help"
    );
    assert_eq!(md.get("stormguard-unprocessed").unwrap(), "1");
    assert_eq!(orders.calls(CREATE), 1, "the handler did not run");
    // Refused again, never replayed; the honest repeat still gets the record.
    let again = shop.call(CREATE, MALLORY, None).await.unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition);
    assert_eq!(shop.call(CREATE, ALICE, None).await.unwrap(), 1);
    assert_eq!(orders.calls(CREATE), 1);
    let s = stats.snapshot();
    assert_eq!((s.recorded, s.replayed, s.mismatched), (1, 1, 2), "{s:?}");
}

#[tokio::test]
async fn the_same_key_from_another_caller_runs_for_that_caller() {
    let orders = Orders::default();
    let addr = serve(orders.clone(), scoped()).await;
    let mut shop = Shop::connect(addr).await;
    assert_eq!(shop.call(CREATE, ALICE, Some("alice")).await.unwrap(), 1);
    // The same key and the same message from another caller: its own run, not alice's
    // answer (without a scope it would have been answered with it).
    assert_eq!(shop.call(CREATE, ALICE, Some("mallory")).await.unwrap(), 2);
    assert_eq!(orders.calls(CREATE), 2);
    // Each caller's honest repeat gets its own record.
    assert_eq!(shop.call(CREATE, ALICE, Some("alice")).await.unwrap(), 1);
    assert_eq!(shop.call(CREATE, ALICE, Some("mallory")).await.unwrap(), 2);
    // A caller's other message under the key is refused in its scope only.
    let refused = shop
        .call(CREATE, MALLORY, Some("mallory"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert_eq!(orders.calls(CREATE), 2, "no run after the first two");
}

#[tokio::test]
async fn a_keyed_request_larger_than_the_layer_reads_is_refused_without_running() {
    let orders = Orders::default();
    let idem = IdempotencyLayer::in_memory(IdempotencyConfig {
        max_request_bytes: 8,
        ..IdempotencyConfig::default()
    })
    .unwrap();
    let addr = serve(orders.clone(), idem).await;
    let mut shop = Shop::connect(addr).await;
    let refused = shop.call(CREATE, ALICE, None).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(orders.calls(CREATE), 0, "the handler did not run");
}
