//! A caller's plain loop over calls the layer refuses without I/O yields to the runtime, as
//! a loop over bare tonic does (tonic's buffer spends tokio's cooperative budget): one test
//! per cause of refusal. Each runs on a current-thread runtime, where a task beside the
//! loop runs only when the loop's task yields: it counts its turns while the loop makes
//! `CALLS` refused calls. A loop that never yields leaves it at 0; one that spends the
//! budget (128 units a turn) gives it a turn every 128 calls or so.
//!
//! The connection backoff's test is a user's fleet: callers in spawned tasks, each in a
//! plain loop on a client of its own, over a real tonic channel to an address where nothing
//! listens, with the README's 300 ms deadline; the same fleet over bare tonic, in the same
//! test, is the measure. "Every replica says NOT_SERVING" is real tonic-health servers on
//! loopback. Every wait is bounded (`PATIENCE`), so no test can hang.
#![allow(clippy::unwrap_used)]

use crate::turns_support::{TurnCounter, turns_beside_tasks};
use std::future::Future;
use std::time::Duration;

use http::Response;
use stormguard::client::{
    AdaptiveThrottle, AdaptiveThrottleConfig, BreakerConfig, ClientConfig, MethodScope,
    MethodTable, RetryController, RetryLayer, RetryPolicy,
};
use stormguard::engine::CircuitBreaker;
use stormguard_demo::InventoryClient;
use tonic::body::Body;
use tonic::{Code, Status};
use tower::ServiceBuilder;

use crate::client_support::{self, budget, idempotent_policy, reserve};

/// Refused calls per test.
const CALLS: u64 = 4_096;

/// The turns a task beside the loop must get: half of one per 128 calls.
const TURNS: u64 = CALLS / 256;

/// Runs `CALLS` calls made by `call`, each checked by `refused`, beside a task that counts
/// its turns; returns the turns it got.
async fn turns_beside<F, Fut, T>(mut call: F, refused: impl Fn(&Result<T, Status>) -> bool) -> u64
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    let counter = TurnCounter::spawn();
    let mut not_refused = 0;
    for _ in 0..CALLS {
        if !refused(&call().await) {
            not_refused += 1;
        }
    }
    let got = counter.turns();
    drop(counter);
    assert!(
        not_refused <= CALLS / 10,
        "{not_refused} of {CALLS} calls were not refused"
    );
    got
}

fn assert_yielded(cause: &str, turns: u64) {
    assert!(
        turns >= TURNS,
        "{cause}: the task beside the loop ran {turns} times in {CALLS} refused calls (want ≥ {TURNS})"
    );
}

/// A service answering every call at once, without I/O, with `code` (trailers-only).
fn answering(
    code: Code,
) -> impl tower::Service<
    http::Request<Body>,
    Response = Response<Body>,
    Error = std::convert::Infallible,
    Future = std::future::Ready<Result<Response<Body>, std::convert::Infallible>>,
> + Clone {
    tower::service_fn(move |_: http::Request<Body>| {
        std::future::ready(Ok(Status::new(code, "answered at once").into_http()))
    })
}

/// The generated client over `inner` through `layer`.
macro_rules! client {
    ($layer:expr, $inner:expr) => {
        InventoryClient::new(ServiceBuilder::new().layer($layer).service($inner))
    };
}

#[tokio::test(flavor = "current_thread")]
async fn a_loop_refused_by_an_open_breaker_yields() {
    let breaker = CircuitBreaker::new(
        BreakerConfig {
            min_requests: 1,
            open_for: Duration::from_secs(3600),
            ..BreakerConfig::default()
        },
        1,
    )
    .unwrap();
    let controller = RetryController::new(
        MethodTable::uniform(RetryPolicy::default()),
        budget(0, 0.01),
        Some(breaker),
        1,
    )
    .unwrap();
    let layer = RetryLayer::new(controller);
    let stats = layer.stats();
    let c = client!(layer, answering(Code::Unavailable));
    while stats.snapshot().refused.breaker == 0 {
        let _ = c.clone().reserve(reserve("warm-up")).await;
    }
    let turns = turns_beside(
        || {
            let mut c = c.clone();
            async move { c.reserve(reserve("r")).await }
        },
        |r| r.as_ref().is_err_and(|s| s.message().contains("breaker")),
    )
    .await;
    assert_yielded("breaker open", turns);
}

#[tokio::test(flavor = "current_thread")]
async fn a_loop_refused_by_the_adaptive_throttle_yields() {
    let throttle = AdaptiveThrottle::new(
        AdaptiveThrottleConfig {
            max_reject_probability: 0.95,
            ..AdaptiveThrottleConfig::default()
        },
        5,
    )
    .unwrap();
    let layer = RetryLayer::new(stormguard_support_controller()).with_adaptive_throttle(throttle);
    let stats = layer.stats();
    let c = client!(layer, answering(Code::ResourceExhausted));
    // Enough refusals recorded that the throttle refuses most calls.
    for _ in 0..2_000 {
        let _ = c.clone().reserve(reserve("warm-up")).await;
    }
    let before = stats.snapshot().throttled.total();
    let turns = turns_beside(
        || {
            let mut c = c.clone();
            async move { c.reserve(reserve("r")).await }
        },
        |r| r.as_ref().is_err_and(|s| s.code() == Code::Unavailable),
    )
    .await;
    assert!(stats.snapshot().throttled.total() - before >= CALLS * 8 / 10);
    assert_yielded("adaptive throttle", turns);
}

fn stormguard_support_controller() -> RetryController {
    RetryController::new(
        MethodTable::uniform(RetryPolicy::default()),
        budget(0, 0.01),
        None,
        3,
    )
    .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn a_loop_whose_retries_the_budget_refuses_yields() {
    // An empty budget: every retry of the dependency's immediate `UNAVAILABLE` is refused.
    let controller = RetryController::new(
        MethodTable::uniform(idempotent_policy()),
        budget(0, 0.01),
        None,
        2,
    )
    .unwrap();
    let layer = RetryLayer::new(controller);
    let stats = layer.stats();
    let c = client!(layer, answering(Code::Unavailable));
    let turns = turns_beside(
        || {
            let mut c = c.clone();
            async move { c.reserve(reserve("r")).await }
        },
        |r| r.as_ref().is_err_and(|s| s.code() == Code::Unavailable),
    )
    .await;
    assert_eq!(stats.snapshot().refused.budget, CALLS);
    assert_yielded("budget", turns);
}

#[tokio::test(flavor = "current_thread")]
async fn a_loop_of_calls_past_their_deadline_yields() {
    let layer = RetryLayer::new(stormguard_support_controller());
    let stats = layer.stats();
    let c = client!(layer, answering(Code::Ok));
    let turns = turns_beside(
        || {
            let mut request = tonic::Request::new(reserve("r"));
            request.set_timeout(Duration::ZERO);
            let mut c = c.clone();
            async move { c.reserve(request).await }
        },
        |r| {
            r.as_ref()
                .is_err_and(|s| s.code() == Code::DeadlineExceeded)
        },
    )
    .await;
    assert_eq!(stats.snapshot().deadline_exceeded, CALLS);
    assert_yielded("deadline already past", turns);
}

#[tokio::test(flavor = "current_thread")]
async fn a_loop_of_calls_with_a_bad_idempotency_key_yields() {
    let mut table = MethodTable::uniform(RetryPolicy::default());
    table.set_idempotency_key(MethodScope::Default, true);
    let controller = RetryController::new(table, budget(0, 0.01), None, 4).unwrap();
    let c = client!(RetryLayer::new(controller), answering(Code::Ok));
    let turns = turns_beside(
        || {
            let mut request = tonic::Request::new(reserve("r"));
            request
                .metadata_mut()
                .insert("idempotency-key", "not visible".parse().unwrap());
            let mut c = c.clone();
            async move { c.reserve(request).await }
        },
        |r| r.as_ref().is_err_and(|s| s.code() == Code::InvalidArgument),
    )
    .await;
    assert_yielded("bad idempotency key", turns);
}

#[tokio::test(flavor = "current_thread")]
async fn a_loop_over_replicas_with_none_yields() {
    use stormguard::client::replicas::Replicas;
    let replicas = Replicas::from_services(
        stormguard::client::ReplicaConfig::default(),
        std::iter::empty::<(String, tonic::transport::Channel)>(),
    )
    .unwrap();
    // Bare, and under the retry layer.
    let bare = InventoryClient::new(replicas.clone());
    let turns = turns_beside(
        || {
            let mut c = bare.clone();
            async move { c.reserve(reserve("r")).await }
        },
        refused_for_no_replica,
    )
    .await;
    assert_yielded("no replica (bare)", turns);
    let layer = RetryLayer::new(stormguard_support_controller()).over_replicas();
    let layered = client!(layer, replicas);
    let turns = turns_beside(
        || {
            let mut c = layered.clone();
            async move { c.reserve(reserve("r")).await }
        },
        refused_for_no_replica,
    )
    .await;
    assert_yielded("no replica (retry layer)", turns);
}

/// Whether a call was refused because no replica could take it.
fn refused_for_no_replica<T>(answer: &Result<T, Status>) -> bool {
    answer
        .as_ref()
        .is_err_and(|s| s.message().contains("no replica"))
}

/// Callers of a fleet test: spawned tasks, as a user's own, each in a plain loop.
const CALLERS: u64 = 16;

/// Every wait of a fleet test is bounded by this: a caller that does not finish fails the
/// test instead of hanging it.
const PATIENCE: Duration = Duration::from_secs(60);

/// An address where nothing listens: connections to it are refused.
fn refusing_address() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// A `Reserve` request with the README's 300 ms deadline.
fn with_deadline() -> tonic::Request<stormguard_demo::ReserveRequest> {
    let mut request = tonic::Request::new(reserve("r"));
    request.set_timeout(Duration::from_millis(300));
    request
}

/// Runs `CALLERS` spawned tasks, each the loop `caller(per_caller)` makes (a plain loop of
/// `per_caller` calls on a client of its own, without `yield_now`), beside a task that
/// counts its turns; returns the turns it got while they ran.
async fn turns_beside_callers<F, Fut>(caller: F, per_caller: u64) -> u64
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let callers = (0..CALLERS)
        .map(|_| tokio::spawn(caller(per_caller)))
        .collect();
    turns_beside_tasks(callers, PATIENCE).await
}

/// The turns a task beside `CALLERS` callers must get in `calls` calls: half of one per
/// round of 128 calls (a task's budget) per caller.
fn fleet_turns(calls: u64) -> u64 {
    calls / (256 * CALLERS)
}

#[tokio::test(flavor = "current_thread")]
async fn callers_refused_by_the_connection_backoff_yield_as_over_bare_tonic() {
    let addr = refusing_address();
    // Bare tonic: every call dials, and is refused.
    let bare = InventoryClient::new(client_support::endpoint(addr).connect_lazy());
    let bare_calls = 64 * CALLERS;
    let bare_turns = turns_beside_callers(
        |calls| {
            let mut c = bare.clone();
            async move {
                for _ in 0..calls {
                    let _ = c.reserve(with_deadline()).await;
                }
            }
        },
        bare_calls / CALLERS,
    )
    .await;
    // The standard layer: the first calls dial and are refused; the dependency is then in
    // connection backoff, and the calls after them are refused without dialing.
    let layer = RetryLayer::from_config(&ClientConfig::default()).unwrap();
    let stats = layer.stats();
    let c = client!(layer, client_support::endpoint(addr).connect_lazy());
    let calls = 32 * 256 * CALLERS;
    let turns = turns_beside_callers(
        |calls| {
            let mut c = c.clone();
            async move {
                for _ in 0..calls {
                    let _ = c.reserve(with_deadline()).await;
                }
            }
        },
        calls / CALLERS,
    )
    .await;
    let refused = stats.snapshot().refused;
    assert!(
        refused.connect_backoff >= calls * 9 / 10,
        "{} of {calls} calls refused by the connection backoff: {refused:?}",
        refused.connect_backoff
    );
    // Over bare tonic every call waits for the channel, so the task beside the callers
    // gets a turn at least once per round of calls; through the layer, whose calls are
    // answered without I/O, at least half of one per round of the callers' budgets.
    assert!(
        bare_turns >= bare_calls / CALLERS,
        "bare tonic: {bare_turns} turns in {bare_calls} calls"
    );
    assert!(
        turns >= fleet_turns(calls),
        "connection backoff: the task beside {CALLERS} callers ran {turns} times in {calls} refused calls (want ≥ {}; {bare_turns} in {bare_calls} over bare tonic)",
        fleet_turns(calls)
    );
}

/// A tonic server on loopback serving the demo Inventory beside a tonic-health service that
/// says `NOT_SERVING` for the whole server; stopped when the handle is dropped.
struct NotServingReplica {
    addr: std::net::SocketAddr,
    _health: tonic_health::server::HealthReporter,
    task: tokio::task::JoinHandle<()>,
}

impl NotServingReplica {
    async fn start() -> NotServingReplica {
        use stormguard_demo::server::{DemoConfig, DemoInventory};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (health, service) = tonic_health::server::health_reporter();
        health
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        let router = tonic::transport::Server::builder()
            .add_service(service)
            .add_service(stormguard_demo::InventoryServer::new(DemoInventory::new(
                DemoConfig::default(),
            )));
        // Bound before the client exists: its connections are accepted from the start.
        let task = tokio::spawn(async move {
            let incoming = tonic::transport::server::TcpIncoming::from(listener);
            let _ = router.serve_with_incoming(incoming).await;
        });
        NotServingReplica {
            addr,
            _health: health,
            task,
        }
    }
}

impl Drop for NotServingReplica {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_loop_over_replicas_that_all_say_not_serving_yields() {
    use stormguard::client::replicas::Replicas;
    use stormguard::client::{HealthCheckConfig, ReplicaConfig, ServingStatus};
    let servers = [
        NotServingReplica::start().await,
        NotServingReplica::start().await,
        NotServingReplica::start().await,
    ];
    let config = ReplicaConfig {
        health_check: Some(HealthCheckConfig::service("")),
        ..ReplicaConfig::default()
    };
    let replicas = Replicas::from_endpoints(
        config,
        servers.iter().map(|s| client_support::endpoint(s.addr)),
    )
    .unwrap();
    // Every replica's health check has answered NOT_SERVING (the channel's health changes,
    // waited on within `PATIENCE`): calls now fail at once, without I/O.
    let mut changes = replicas.health_changes();
    let all_said = tokio::time::timeout(PATIENCE, async {
        while !replicas
            .snapshot()
            .iter()
            .all(|r| r.snapshot.serving == ServingStatus::NotServing)
        {
            if changes.changed().await.is_err() {
                return;
            }
        }
    })
    .await;
    assert!(
        all_said.is_ok(),
        "not every replica said NOT_SERVING within {PATIENCE:?}"
    );
    let not_serving = |r: &Result<_, Status>| {
        r.as_ref()
            .is_err_and(|s| s.message().contains("no replica serving"))
    };
    // Bare, and under the standard retry layer.
    let bare = InventoryClient::new(replicas.clone());
    let turns = turns_beside(
        || {
            let mut c = bare.clone();
            async move { c.reserve(reserve("r")).await }
        },
        not_serving,
    )
    .await;
    assert_yielded("every replica NOT_SERVING (bare)", turns);
    let layer = RetryLayer::from_config(&ClientConfig::default())
        .unwrap()
        .over_replicas();
    let layered = client!(layer, replicas);
    let turns = turns_beside(
        || {
            let mut c = layered.clone();
            async move { c.reserve(reserve("r")).await }
        },
        not_serving,
    )
    .await;
    assert_yielded("every replica NOT_SERVING (retry layer)", turns);
}
