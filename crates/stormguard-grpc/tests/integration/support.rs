//! What the tests share: a scripted Inventory served by tonic on loopback, the `grpc`
//! crate's channel to it, and prost messages as the `grpc` crate's messages.

#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, Bytes};
use futures_core::Stream;
use grpc::client::{
    CallOptions, Channel, ChannelOptions, Invoke, RecvStream, ResponseStreamItem, SendOptions,
    SendStream,
};
use grpc::core::{RecvMessage, RequestHeaders, SendMessage, Trailers};
use grpc::credentials::LocalChannelCredentials;
use stormguard_core::{A6BudgetConfig, BudgetChoice, HedgeDelay, wire};
use stormguard_demo::{
    Inventory, InventoryServer, ReserveReply, ReserveRequest, StockLevel, WatchStockRequest,
};
use stormguard_grpc::{ClientConfig, HedgingPolicy, MethodScope};
use tokio::net::TcpListener;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

pub const RESERVE: &str = "/stormguard.demo.v1.Inventory/Reserve";
pub const WATCH: &str = "/stormguard.demo.v1.Inventory/WatchStock";

/// How the server answers one attempt.
#[derive(Clone, Debug)]
pub enum Answer {
    Ok,
    /// A trailers-only failure with `code`, and `grpc-retry-pushback-ms` when given.
    Fail(tonic::Code, Option<&'static str>),
    /// Never answers (the caller's deadline or timer ends the attempt).
    Hang,
    /// Answers `OK` after this long: a slow server.
    After(Duration),
}

/// What the server saw of one attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub previous: u32,
    pub timeout: Option<Duration>,
}

/// An Inventory that answers attempts from a script (then `Ok`), recording each one.
#[derive(Clone, Default)]
pub struct Scripted {
    answers: Arc<Mutex<VecDeque<Answer>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Scripted {
    pub fn script(&self, answers: impl IntoIterator<Item = Answer>) {
        let mut a = self.answers.lock().unwrap();
        a.clear();
        a.extend(answers);
    }

    pub fn take_seen(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.seen.lock().unwrap())
    }

    /// Records the attempt and says how to answer it.
    async fn next<T>(&self, request: &Request<T>) -> Result<Seen, Status> {
        let md = request.metadata();
        let previous = md
            .get(wire::GRPC_PREVIOUS_RPC_ATTEMPTS)
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(0);
        let timeout = md
            .get(wire::GRPC_TIMEOUT)
            .and_then(|v| wire::decode_grpc_timeout(v.as_bytes()).ok());
        let seen = Seen { previous, timeout };
        self.seen.lock().unwrap().push(seen.clone());
        let answer = self
            .answers
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Answer::Ok);
        match answer {
            Answer::Ok => Ok(seen),
            Answer::Fail(code, pushback) => {
                let mut status = Status::new(code, "scripted failure");
                if let Some(p) = pushback {
                    status
                        .metadata_mut()
                        .insert(wire::GRPC_RETRY_PUSHBACK_MS, p.parse().unwrap());
                }
                Err(status)
            }
            Answer::Hang => std::future::pending().await,
            Answer::After(wait) => {
                tokio::time::sleep(wait).await;
                Ok(seen)
            }
        }
    }
}

#[tonic::async_trait]
impl Inventory for Scripted {
    async fn reserve(
        &self,
        request: Request<ReserveRequest>,
    ) -> Result<Response<ReserveReply>, Status> {
        let seen = self.next(&request).await?;
        Ok(Response::new(ReserveReply {
            reserved: request.get_ref().quantity > 0,
            attempt: seen.previous + 1,
            timeout_ms: seen.timeout.map_or(0, |t| t.as_millis() as u64),
        }))
    }

    type WatchStockStream = Pin<Box<dyn Stream<Item = Result<StockLevel, Status>> + Send>>;

    async fn watch_stock(
        &self,
        request: Request<WatchStockRequest>,
    ) -> Result<Response<Self::WatchStockStream>, Status> {
        self.next(&request).await?;
        let WatchStockRequest { sku, count, .. } = request.into_inner();
        let levels = (0..count).map(move |seq| {
            Ok(StockLevel {
                sku: sku.clone(),
                level: 100 - u64::from(seq),
                seq,
            })
        });
        Ok(Response::new(Box::pin(futures_util::stream::iter(levels))))
    }
}

/// Serves `inventory` on 127.0.0.1:0 with tonic; the address.
pub async fn serve(inventory: Scripted) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let server = Server::builder()
        .add_service(InventoryServer::new(inventory))
        .serve_with_incoming(incoming);
    tokio::spawn(async move { server.await.expect("server runs") });
    addr
}

/// The `grpc` crate's channel to `addr`.
pub fn channel(addr: SocketAddr) -> Channel {
    Channel::new(
        format!("dns:///{addr}"),
        Arc::new(LocalChannelCredentials::new()),
        ChannelOptions::default(),
    )
}

/// A prost message sent through the `grpc` crate.
pub struct Out<'a, M>(pub &'a M);

impl<M: prost::Message> SendMessage for Out<'_, M> {
    fn encode(&self) -> Result<Box<dyn Buf + Send + Sync>, String> {
        Ok(Box::new(Bytes::from(self.0.encode_to_vec())))
    }
}

/// A prost message received through the `grpc` crate.
pub struct In<M>(pub Option<M>);

impl<M: prost::Message + Default> RecvMessage for In<M> {
    fn decode(&mut self, data: &mut dyn Buf) -> Result<(), String> {
        self.0 = Some(M::decode(data).map_err(|e| e.to_string())?);
        Ok(())
    }
}

/// The end of a call as the caller saw it: its messages and trailers.
pub struct Answered<M> {
    pub messages: Vec<M>,
    pub headers: bool,
    pub trailers: Trailers,
}

impl<M> Answered<M> {
    pub fn code(&self) -> stormguard_core::Code {
        match self.trailers.status() {
            Ok(()) => stormguard_core::Code::Ok,
            Err(e) => stormguard_core::Code::from_i32(e.code() as i32).unwrap(),
        }
    }

    pub fn pushback(&self) -> Option<&str> {
        self.trailers
            .metadata()
            .get(wire::GRPC_RETRY_PUSHBACK_MS)
            .map(|v| v.to_str())
    }
}

/// One Reserve call through `invoker` with `options`.
pub async fn reserve<I: Invoke>(invoker: &I, options: CallOptions) -> Answered<ReserveReply> {
    call(invoker, RESERVE, &reserve_request(), options).await
}

/// One call of `method` on `invoker`: `request` sent as its one message, every item read
/// to the trailers.
pub async fn call<I: Invoke, Q: prost::Message, M: prost::Message + Default>(
    invoker: &I,
    method: &str,
    request: &Q,
    options: CallOptions,
) -> Answered<M> {
    let headers = RequestHeaders::new().with_method_name(method);
    let (mut tx, mut rx) = invoker.invoke(headers, options).await;
    // A send that fails means the call already ended: its trailers say how.
    let _ = tx
        .send(&Out(request), SendOptions::new().with_final_msg(true))
        .await;
    let mut messages = Vec::new();
    let mut headers = false;
    loop {
        let mut msg = In::<M>(None);
        match rx.recv(&mut msg).await {
            ResponseStreamItem::Headers(_) => headers = true,
            ResponseStreamItem::Message => messages.extend(msg.0),
            ResponseStreamItem::Trailers(trailers) => {
                return Answered {
                    messages,
                    headers,
                    trailers,
                };
            }
            ResponseStreamItem::StreamClosed => panic!("the stream closed before its trailers"),
        }
    }
}

pub fn reserve_request() -> ReserveRequest {
    ReserveRequest {
        sku: "sku-1".into(),
        quantity: 1,
        request_id: "r-1".into(),
        payload: Vec::new(),
    }
}

/// The hedge delay of the tests: long enough that a prompt answer is never hedged.
pub(crate) const HEDGE_DELAY: Duration = Duration::from_millis(100);

/// Reserve and WatchStock hedged (two copies, the second after [`HEDGE_DELAY`]), paid from
/// `budget`; a fixed seed.
pub(crate) fn hedged(budget: BudgetChoice) -> ClientConfig {
    let mut config = ClientConfig::default();
    let policy = HedgingPolicy {
        max_attempts: 2,
        delay: HedgeDelay::Fixed(HEDGE_DELAY),
        ..HedgingPolicy::default()
    };
    for method in ["Reserve", "WatchStock"] {
        config.methods.set_hedging(
            MethodScope::Method("stormguard.demo.v1.Inventory", method),
            Some(policy.clone()),
        );
    }
    config.budget = budget;
    config.seed = Some(7);
    config
}

/// gRPC A6's token bucket, full: it grants a hedge while it holds more than half its tokens.
pub(crate) fn a6() -> BudgetChoice {
    BudgetChoice::A6(A6BudgetConfig {
        max_tokens: 10.0,
        token_ratio: 0.1,
    })
}
