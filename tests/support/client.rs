//! Scripted tonic servers and helpers shared by the client, end-to-end and examples tests.
//!
//! A [`Scripted`] server answers each call with the next [`Step`] of its script (or its
//! default step once the script is spent) and records what every attempt carried, so a
//! test can check the headers of each retry.

#![allow(dead_code, unreachable_pub, missing_docs, clippy::unwrap_used)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stormguard_client::RetryLayer;
use stormguard_core::RetryController;
use stormguard_core::{Budget, BudgetConfig, RetryBudget};
use stormguard_core::{MethodTable, RetryPolicy};
use stormguard_demo::{
    Inventory, InventoryClient, InventoryServer, ReserveReply, ReserveRequest, StockLevel,
    WatchStockRequest,
};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tonic::codegen::tokio_stream::{self, Stream};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Response, Status};
use tower::ServiceBuilder;

pub const RESERVE: &str = "/stormguard.demo.v1.Inventory/Reserve";

/// What the server does with one attempt.
#[derive(Clone, Debug)]
pub enum Step {
    /// Answer OK (Reserve) or stream `count` messages (WatchStock).
    Ok,
    /// Answer with this status before any message (trailers-only).
    Fail(Code),
    /// Answer with this status and these `grpc-retry-pushback-ms` values.
    Pushback(Code, Vec<&'static str>),
    /// Answer with this status, these `grpc-status-details-bin` bytes (tonic writes them
    /// in base64), as servers of the rich error model answer, and these
    /// `grpc-retry-pushback-ms` values.
    Details(Code, Vec<u8>, Vec<&'static str>),
    /// Sleep (tokio time), then take the next step.
    Sleep(Duration, Box<Step>),
    /// WatchStock only: send response headers and `messages` messages, then end with
    /// `then` in the trailers (OK when `None`).
    Stream { messages: u32, then: Option<Code> },
}

impl Step {
    pub fn pushback(code: Code, value: &'static str) -> Step {
        Step::Pushback(code, vec![value])
    }

    pub fn slow(d: Duration, then: Step) -> Step {
        Step::Sleep(d, Box::new(then))
    }
}

/// What one attempt carried.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: &'static str,
    pub previous_attempts: Option<String>,
    pub timeout: Option<String>,
    pub payload: Vec<u8>,
    pub request_id: String,
    pub at: Instant,
}

impl Seen {
    /// The received `grpc-timeout`, decoded.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout.as_deref().map(|v| {
            stormguard_core::wire::decode_grpc_timeout(v.as_bytes()).expect("valid grpc-timeout")
        })
    }
}

#[derive(Clone, Debug)]
pub struct Scripted {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Inner {
    script: VecDeque<Step>,
    default: Step,
    seen: Vec<Seen>,
    /// Handlers dropped before they answered (the client reset the stream).
    cancelled: usize,
}

/// Counts a handler dropped before it answered.
struct Running(Arc<Mutex<Inner>>, bool);

impl Drop for Running {
    fn drop(&mut self) {
        if !self.1 {
            self.0.lock().unwrap().cancelled += 1;
        }
    }
}

impl Scripted {
    /// Takes `script` step by step, then `default` forever.
    pub fn new(script: impl IntoIterator<Item = Step>, default: Step) -> Self {
        Scripted {
            inner: Arc::new(Mutex::new(Inner {
                script: script.into_iter().collect(),
                default,
                seen: Vec::new(),
                cancelled: 0,
            })),
        }
    }

    /// Always answers `step`.
    pub fn always(step: Step) -> Self {
        Scripted::new([], step)
    }

    /// Every attempt received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.inner.lock().unwrap().seen.clone()
    }

    /// Handlers that were dropped before they answered: attempts the client cancelled
    /// (reset) while the server was still working on them.
    pub fn cancelled(&self) -> usize {
        self.inner.lock().unwrap().cancelled
    }

    /// Appends steps to the script.
    pub fn push(&self, steps: impl IntoIterator<Item = Step>) {
        self.inner.lock().unwrap().script.extend(steps);
    }

    fn next<T>(
        &self,
        method: &'static str,
        req: &Request<T>,
        payload: Vec<u8>,
        request_id: String,
    ) -> Step {
        let header = |name: &str| {
            req.metadata()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        let mut inner = self.inner.lock().unwrap();
        inner.seen.push(Seen {
            method,
            previous_attempts: header("grpc-previous-rpc-attempts"),
            timeout: header("grpc-timeout"),
            payload,
            request_id,
            at: Instant::now(),
        });
        match inner.script.pop_front() {
            Some(step) => step,
            None => inner.default.clone(),
        }
    }
}

fn status(code: Code, pushback: &[&'static str]) -> Status {
    let mut st = Status::new(code, "scripted failure");
    for v in pushback {
        st.metadata_mut()
            .append("grpc-retry-pushback-ms", v.parse().unwrap());
    }
    st
}

fn with_details(code: Code, details: Vec<u8>, pushback: &[&'static str]) -> Status {
    let mut st = Status::with_details(code, "scripted failure", details.into());
    for v in pushback {
        st.metadata_mut()
            .append("grpc-retry-pushback-ms", v.parse().unwrap());
    }
    st
}

/// Resolves sleeps; returns the final step.
async fn settle(mut step: Step) -> Step {
    while let Step::Sleep(d, next) = step {
        tokio::time::sleep(d).await;
        step = *next;
    }
    step
}

pub type LevelStream = std::pin::Pin<Box<dyn Stream<Item = Result<StockLevel, Status>> + Send>>;

#[tonic::codegen::async_trait]
impl Inventory for Scripted {
    async fn reserve(
        &self,
        req: Request<ReserveRequest>,
    ) -> Result<Response<ReserveReply>, Status> {
        let step = self.next(
            "Reserve",
            &req,
            req.get_ref().payload.clone(),
            req.get_ref().request_id.clone(),
        );
        let attempt = req
            .metadata()
            .get("grpc-previous-rpc-attempts")
            .and_then(|v| v.to_str().ok()?.parse::<u32>().ok())
            .unwrap_or(0)
            + 1;
        let mut running = Running(Arc::clone(&self.inner), false);
        let step = settle(step).await;
        running.1 = true;
        match step {
            Step::Ok | Step::Stream { .. } => Ok(Response::new(ReserveReply {
                reserved: true,
                attempt,
                timeout_ms: 0,
            })),
            Step::Fail(code) => Err(status(code, &[])),
            Step::Pushback(code, values) => Err(status(code, &values)),
            Step::Details(code, details, pushback) => Err(with_details(code, details, &pushback)),
            Step::Sleep(..) => unreachable!("settled"),
        }
    }

    type WatchStockStream = LevelStream;

    async fn watch_stock(
        &self,
        req: Request<WatchStockRequest>,
    ) -> Result<Response<LevelStream>, Status> {
        let sku = req.get_ref().sku.clone();
        let count = req.get_ref().count;
        let step = self.next("WatchStock", &req, Vec::new(), sku.clone());
        let mut running = Running(Arc::clone(&self.inner), false);
        let step = settle(step).await;
        running.1 = true;
        let (messages, then) = match step {
            Step::Ok => (count, None),
            Step::Stream { messages, then } => (messages, then),
            Step::Fail(code) => return Err(status(code, &[])),
            Step::Pushback(code, values) => return Err(status(code, &values)),
            Step::Details(code, details, pushback) => {
                return Err(with_details(code, details, &pushback));
            }
            Step::Sleep(..) => unreachable!("settled"),
        };
        let items = (0..messages)
            .map(move |seq| {
                Ok(StockLevel {
                    sku: sku.clone(),
                    level: u64::from(seq) * 10,
                    seq,
                })
            })
            .chain(then.map(|code| Err(status(code, &[]))));
        let items: Vec<_> = items.collect();
        Ok(Response::new(Box::pin(tokio_stream::iter(items))))
    }
}

/// Serves `svc` on a fresh loopback port (bound before this returns, so a client can
/// connect at once).
pub async fn serve(svc: Scripted) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        Server::builder()
            .serve_with_incoming(InventoryServer::new(svc), TcpIncoming::from(listener)),
    );
    addr
}

/// The server's end of one in-memory connection, for `serve_with_incoming`.
pub type MemoryIncoming = tokio_stream::Once<Result<tokio::io::DuplexStream, std::io::Error>>;

/// One in-memory HTTP/2 connection: `serve` starts a server on its incoming end; returns a
/// channel over the other. For tests that assert instants on paused time: over kernel
/// sockets the clock can jump to the next timer while a frame is still on its way between
/// the two sockets, while in memory a write wakes the reader at once, so virtual time moves
/// only when every task waits for a timer.
pub async fn in_memory(serve: impl FnOnce(MemoryIncoming)) -> Channel {
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    serve(tokio_stream::once(Ok(server_io)));
    let mut client_io = Some(client_io);
    Endpoint::from_static("http://in-memory.test")
        .http2_max_local_error_reset_streams(None)
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

/// Serves `svc` over one in-memory connection; returns a channel to it.
pub async fn serve_in_memory(svc: Scripted) -> Channel {
    in_memory(|incoming| {
        tokio::spawn(Server::builder().serve_with_incoming(InventoryServer::new(svc), incoming));
    })
    .await
}

pub fn endpoint(addr: SocketAddr) -> Endpoint {
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .http2_max_local_error_reset_streams(None)
}

pub async fn channel(addr: SocketAddr) -> Channel {
    endpoint(addr).connect().await.unwrap()
}

/// A budget with the given standing floor (retries per second over a 10 s window) and ratio.
pub fn budget(floor: u32, ratio: f64) -> Arc<dyn Budget> {
    Arc::new(
        RetryBudget::new(BudgetConfig {
            ttl: Duration::from_secs(10),
            min_retries_per_second: floor,
            retry_ratio: ratio,
            // The tests that use it are about other checks: a floor lent whatever the
            // answers.
            floor: stormguard_core::Floor::Always,
            ..BudgetConfig::default()
        })
        .unwrap(),
    )
}

/// A controller with `policy` for every method and a roomy budget.
pub fn controller(policy: RetryPolicy) -> RetryController {
    RetryController::new(MethodTable::uniform(policy), budget(100, 0.1), None, 42).unwrap()
}

/// The default policy for an idempotent method (`Reserve` carries a request id).
pub fn idempotent_policy() -> RetryPolicy {
    RetryPolicy {
        idempotent: true,
        ..RetryPolicy::default()
    }
}

/// The default policy for an idempotent method, with a tiny backoff, so tests on real
/// time stay quick.
pub fn quick_policy() -> RetryPolicy {
    RetryPolicy {
        backoff: stormguard_core::BackoffConfig::FullJitter {
            base: Duration::from_millis(1),
            cap: Duration::from_millis(5),
            multiplier: 2.0,
        },
        ..idempotent_policy()
    }
}

pub type Client = InventoryClient<stormguard_client::Retry<Channel>>;

/// A generated client over `channel` through `layer`, exactly as a user builds it.
pub fn client(channel: Channel, layer: RetryLayer) -> Client {
    InventoryClient::new(ServiceBuilder::new().layer(layer).service(channel))
}

/// A scripted server plus a client to it through `layer`.
pub async fn setup(svc: &Scripted, layer: RetryLayer) -> Client {
    let addr = serve(svc.clone()).await;
    client(channel(addr).await, layer)
}

/// A scripted server plus a client to it through `layer`, over one in-memory connection
/// (see [`in_memory`]): for tests that assert instants on paused time.
pub async fn setup_in_memory(svc: &Scripted, layer: RetryLayer) -> Client {
    client(serve_in_memory(svc.clone()).await, layer)
}

pub fn reserve(id: &str) -> ReserveRequest {
    ReserveRequest {
        sku: "sku-1".into(),
        quantity: 1,
        request_id: id.into(),
        payload: Vec::new(),
    }
}

/// The pushback the caller saw in a status's metadata.
pub fn pushback_of(status: &Status) -> Option<String> {
    status
        .metadata()
        .get("grpc-retry-pushback-ms")
        .map(|v| v.to_str().unwrap().to_owned())
}
