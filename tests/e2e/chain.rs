//! Across three services over real tonic on loopback:
//! caller → (RetryLayer) → front (ShedLayer; handler calls on through a RetryLayer)
//! → middle (the same) → back (records what reaches it, answers `UNAVAILABLE`).
//!
//! - "Do not retry" survives a handler that answers with a status of its own: once a
//!   client layer inside a request gave up on a retryable failure, the server layer marks
//!   the handler's retryable answer `grpc-retry-pushback-ms: -1`, hop after hop, so only
//!   the hop next to the failure retries.
//! - A request-scoped retry allowance (`x-retry-budget`): each retry a client layer makes
//!   inside a request spends one, outgoing attempts carry what is left, a peer's value only
//!   lowers the allowance, and malformed values are ignored. Off unless the server layer
//!   sets it.
#![allow(clippy::unwrap_used)]

use crate::hops_support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use hops_support::{Client, client, retry_layer};
use stormguard_client::RetryStats;
use stormguard_core::AdmissionConfig;
use stormguard_demo::{
    Inventory, InventoryServer, ReserveReply, ReserveRequest, StockLevel, WatchStockRequest,
};
use stormguard_server::ShedLayer;
use tokio::net::TcpListener;
use tonic::codegen::tokio_stream::Stream;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Code, Request, Response, Status};

/// What the back saw of each attempt: its `x-retry-budget`, if any.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Option<String>>>>);

impl Seen {
    fn allowances(&self) -> Vec<Option<String>> {
        self.0.lock().unwrap().clone()
    }
}

/// The back: records each attempt and answers `UNAVAILABLE`.
#[derive(Clone)]
struct Back {
    seen: Seen,
}

/// How a hop's handler answers when its downstream call fails.
#[derive(Clone, Copy, PartialEq)]
enum OnFailure {
    /// Passes the downstream status up as it came.
    PassUp,
    /// Answers `UNAVAILABLE` with a status of its own (no downstream metadata).
    OwnUnavailable,
    /// Answers `INTERNAL` of its own (a code clients do not retry).
    OwnInternal,
    /// Does not call on: answers `UNAVAILABLE` by itself.
    FailAlone,
}

/// A hop: forwards `Reserve` to the next service through its own client.
#[derive(Clone)]
struct Hop {
    next: Client,
    on_failure: OnFailure,
    entered: Arc<Mutex<u32>>,
}

type Watch = std::pin::Pin<Box<dyn Stream<Item = Result<StockLevel, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Inventory for Back {
    async fn reserve(
        &self,
        request: Request<ReserveRequest>,
    ) -> Result<Response<ReserveReply>, Status> {
        let allowance = request
            .metadata()
            .get("x-retry-budget")
            .map(|v| v.to_str().unwrap().to_owned());
        self.seen.0.lock().unwrap().push(allowance);
        Err(Status::unavailable("back: down"))
    }

    type WatchStockStream = Watch;

    async fn watch_stock(
        &self,
        _request: Request<WatchStockRequest>,
    ) -> Result<Response<Watch>, Status> {
        Err(Status::unimplemented("not used here"))
    }
}

#[tonic::async_trait]
impl Inventory for Hop {
    async fn reserve(
        &self,
        request: Request<ReserveRequest>,
    ) -> Result<Response<ReserveReply>, Status> {
        *self.entered.lock().unwrap() += 1;
        if self.on_failure == OnFailure::FailAlone {
            return Err(Status::unavailable("hop: failed by itself"));
        }
        let mut next = self.next.clone();
        match next.reserve(request.into_inner()).await {
            Ok(reply) => Ok(reply),
            Err(status) => Err(match self.on_failure {
                OnFailure::PassUp => status,
                OnFailure::OwnUnavailable | OnFailure::FailAlone => {
                    Status::unavailable("hop: inventory unavailable")
                }
                OnFailure::OwnInternal => Status::internal("hop: inventory failed"),
            }),
        }
    }

    type WatchStockStream = Watch;

    async fn watch_stock(
        &self,
        _request: Request<WatchStockRequest>,
    ) -> Result<Response<Watch>, Status> {
        Err(Status::unimplemented("not used here"))
    }
}

async fn listen() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

async fn serve_back() -> (SocketAddr, Seen) {
    let (listener, addr) = listen().await;
    let seen = Seen::default();
    let back = Back { seen: seen.clone() };
    tokio::spawn(
        Server::builder()
            .serve_with_incoming(InventoryServer::new(back), TcpIncoming::from(listener)),
    );
    (addr, seen)
}

/// A hop behind `shed`, forwarding to `next`; returns its address, its layer's counters
/// and how many calls its handler took.
async fn serve_hop(
    next: SocketAddr,
    shed: ShedLayer,
    on_failure: OnFailure,
) -> (SocketAddr, RetryStats, Arc<Mutex<u32>>) {
    let layer = retry_layer(5);
    let stats = layer.stats();
    let entered = Arc::new(Mutex::new(0));
    let hop = Hop {
        next: client(next, layer).await,
        on_failure,
        entered: entered.clone(),
    };
    let (listener, addr) = listen().await;
    tokio::spawn(
        Server::builder()
            .layer(shed)
            .serve_with_incoming(InventoryServer::new(hop), TcpIncoming::from(listener)),
    );
    (addr, stats, entered)
}

fn shed_layer() -> ShedLayer {
    ShedLayer::from_config(&AdmissionConfig::default()).unwrap()
}

fn pushback(status: &Status) -> Option<&str> {
    status
        .metadata()
        .get("grpc-retry-pushback-ms")
        .map(|v| v.to_str().unwrap())
}

struct Chain {
    caller: Client,
    caller_stats: RetryStats,
    front: RetryStats,
    front_entered: Arc<Mutex<u32>>,
    middle: RetryStats,
    middle_entered: Arc<Mutex<u32>>,
    back: Seen,
}

async fn chain(front_shed: ShedLayer, middle_shed: ShedLayer, on_failure: OnFailure) -> Chain {
    let (back_addr, back) = serve_back().await;
    let (middle_addr, middle, middle_entered) = serve_hop(back_addr, middle_shed, on_failure).await;
    let (front_addr, front, front_entered) = serve_hop(middle_addr, front_shed, on_failure).await;
    let layer = retry_layer(5);
    let caller_stats = layer.stats();
    Chain {
        caller: client(front_addr, layer).await,
        caller_stats,
        front,
        front_entered,
        middle,
        middle_entered,
        back,
    }
}

impl Chain {
    /// One call from the caller, which fails.
    async fn call(&mut self) -> Status {
        self.caller
            .reserve(ReserveRequest::default())
            .await
            .unwrap_err()
    }
}

#[tokio::test]
async fn do_not_retry_survives_handlers_that_answer_with_their_own_status() {
    let mut c = chain(shed_layer(), shed_layer(), OnFailure::OwnUnavailable).await;
    let status = c.call().await;
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "hop: inventory unavailable");
    assert_eq!(pushback(&status), Some("-1"));

    // Only the middle, next to the failure, retried: 5 attempts reach the back, not 5³.
    assert_eq!(c.back.allowances().len(), 5);
    let middle = c.middle.snapshot();
    assert_eq!((middle.logical, middle.attempts), (1, 5));
    assert_eq!(middle.refused.attempts, 1);
    // The middle's own answer went up marked, so the front made one attempt ...
    let front = c.front.snapshot();
    assert_eq!((front.logical, front.attempts), (1, 1));
    assert_eq!(front.refused.pushback, 1);
    // ... and so did the caller, through the front's own answer.
    let caller = c.caller_stats.snapshot();
    assert_eq!((caller.logical, caller.attempts), (1, 1));
    assert_eq!(caller.refused.pushback, 1);
    assert_eq!(*c.front_entered.lock().unwrap(), 1);
    assert_eq!(*c.middle_entered.lock().unwrap(), 1);
}

#[tokio::test]
async fn a_handlers_answer_is_marked_only_for_codes_clients_retry() {
    let mut c = chain(shed_layer(), shed_layer(), OnFailure::OwnInternal).await;
    let status = c.call().await;
    assert_eq!(status.code(), Code::Internal);
    assert_eq!(pushback(&status), None, "INTERNAL is not retried anyway");
    assert_eq!(c.back.allowances().len(), 5);
    assert_eq!(c.caller_stats.snapshot().refused.not_retryable, 1);
}

#[tokio::test]
async fn a_handlers_own_failure_without_a_refused_downstream_call_stays_retryable() {
    // The middle fails by itself, without calling the back: its answer is not marked, so
    // the front's layer retries it; the front's layer then gives up, and the front's
    // answer is marked.
    let (back_addr, back) = serve_back().await;
    let (middle_addr, _, middle_entered) =
        serve_hop(back_addr, shed_layer(), OnFailure::FailAlone).await;
    let (front_addr, front, _) =
        serve_hop(middle_addr, shed_layer(), OnFailure::OwnUnavailable).await;
    let layer = retry_layer(5);
    let caller_stats = layer.stats();
    let mut caller = client(front_addr, layer).await;

    let status = caller.reserve(ReserveRequest::default()).await.unwrap_err();
    assert_eq!(pushback(&status), Some("-1"));
    assert!(back.allowances().is_empty());
    assert_eq!(*middle_entered.lock().unwrap(), 5);
    assert_eq!(front.snapshot().attempts, 5);
    assert_eq!(caller_stats.snapshot().attempts, 1);
}

/// A request from the caller carrying `x-retry-budget: value`.
fn with_allowance(value: &str) -> Request<ReserveRequest> {
    let mut request = Request::new(ReserveRequest::default());
    request
        .metadata_mut()
        .insert("x-retry-budget", value.parse().unwrap());
    request
}

/// A chain whose front and middle give each request `front` and `middle` retries, and
/// whose hops pass failures up as they came.
async fn allowance_chain(front: u32, middle: u32) -> Chain {
    chain(
        shed_layer().with_retry_allowance(front),
        shed_layer().with_retry_allowance(middle),
        OnFailure::PassUp,
    )
    .await
}

fn allowances(values: &[&str]) -> Vec<Option<String>> {
    values.iter().map(|v| Some((*v).to_owned())).collect()
}

#[tokio::test]
async fn each_retry_spends_the_requests_allowance_and_attempts_carry_what_is_left() {
    let mut c = allowance_chain(10, 10).await;
    let status = c.caller.reserve(with_allowance("3")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(pushback(&status), Some("-1"));
    // The caller allowed 3 retries: the front passed 3 on, the middle spent them one by
    // one (each attempt says what is left) and was refused the 4th, though its policy
    // allows 5 attempts.
    assert_eq!(c.back.allowances(), allowances(&["3", "2", "1", "0"]));
    let middle = c.middle.snapshot();
    assert_eq!((middle.attempts, middle.refused.allowance), (4, 1));
    assert_eq!(c.front.snapshot().attempts, 1);
}

#[tokio::test]
async fn a_peer_can_lower_the_allowance_but_not_raise_it() {
    let mut c = allowance_chain(10, 1).await;
    // The caller asks for 50, the front allows 10, the middle only 1.
    c.caller.reserve(with_allowance("50")).await.unwrap_err();
    assert_eq!(c.back.allowances(), allowances(&["1", "0"]));
    assert_eq!(c.middle.snapshot().refused.allowance, 1);
}

#[tokio::test]
async fn malformed_negative_or_huge_allowances_are_ignored() {
    for bad in ["-1", "two", "1.5", "99999999999", "1001"] {
        let mut c = allowance_chain(2, 10).await;
        c.caller.reserve(with_allowance(bad)).await.unwrap_err();
        // The front's own allowance (2) is what went on.
        assert_eq!(c.back.allowances(), allowances(&["2", "1", "0"]), "{bad}");
    }
}

#[tokio::test]
async fn without_an_allowance_the_header_is_ignored_and_not_sent() {
    let mut c = chain(shed_layer(), shed_layer(), OnFailure::PassUp).await;
    c.caller.reserve(with_allowance("1")).await.unwrap_err();
    assert_eq!(c.back.allowances(), vec![None; 5]);
    assert_eq!(c.middle.snapshot().refused.allowance, 0);
}
