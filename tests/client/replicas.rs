//! End-to-end: the `RetryLayer` over the endpoint-aware `Replicas` channel, with several
//! real tonic servers on loopback (each bound before the client connects).
//!
//! - a retry goes to a replica the call has not tried, and a replica that fails every call
//!   is ejected;
//! - a failing replica spends only its own retries: calls that failed on a healthy replica
//!   keep theirs;
//! - a replica whose server is gone (connections refused) costs no call, not even a
//!   non-idempotent one;
//! - a replica added while the channel serves starts with a small share (slow start);
//! - a removed replica gets no more attempts;
//! - budgets keyed by a function of the request: a failing shard spends its own retries.
#![allow(clippy::unwrap_used)]

use crate::client_support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use client_support::{Scripted, Step, in_memory, quick_policy, reserve, serve, serve_in_memory};
use stormguard_client::RetryLayer;
use stormguard_client::replicas::{Change, EndpointKey, Replicas};
use stormguard_client::{ReplicaConfig, SlowStartConfig};
use stormguard_core::RetryController;
use stormguard_core::{Budget, BudgetConfig, Floor, KeyedBudgets, RetryBudget};
use stormguard_core::{EjectionConfig, LoadConfig};
use stormguard_core::{MethodTable, RetryPolicy};
use stormguard_demo::InventoryClient;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};
use tower::ServiceBuilder;

type Client = InventoryClient<stormguard_client::Retry<Replicas<Channel, EndpointKey>>>;

fn endpoint(addr: std::net::SocketAddr) -> Endpoint {
    Endpoint::from_shared(format!("http://{addr}")).unwrap()
}

fn config(seed: u64) -> ReplicaConfig {
    ReplicaConfig {
        seed: Some(seed),
        ..ReplicaConfig::default()
    }
}

fn roomy(policy: RetryPolicy) -> RetryController {
    let budget: Arc<dyn Budget> = Arc::new(
        RetryBudget::new(BudgetConfig {
            min_retries_per_second: 100,
            ..BudgetConfig::default()
        })
        .unwrap(),
    );
    RetryController::new(MethodTable::uniform(policy), budget, None, 7).unwrap()
}

fn client(replicas: &Replicas<Channel, EndpointKey>, layer: RetryLayer) -> Client {
    InventoryClient::new(ServiceBuilder::new().layer(layer).service(replicas.clone()))
}

/// The key of the `i`-th replica of [`in_memory_replicas`].
fn in_memory_key(i: usize) -> EndpointKey {
    format!("http://replica-{i}.in-memory.test")
        .parse::<http::Uri>()
        .unwrap()
        .into()
}

/// A replica per server, each over one in-memory connection, keyed by
/// [`in_memory_key`] of its place in `servers`.
async fn in_memory_replicas<'a>(
    config: ReplicaConfig,
    servers: impl IntoIterator<Item = &'a Scripted>,
) -> Replicas<Channel, EndpointKey> {
    let mut channels = Vec::new();
    for (i, server) in servers.into_iter().enumerate() {
        channels.push((in_memory_key(i), serve_in_memory(server.clone()).await));
    }
    Replicas::from_services(config, channels).unwrap()
}

/// A retry policy for a method that is not idempotent: only an attempt that provably never
/// reached a server, or that a server says it never ran, is retried.
fn non_idempotent() -> RetryPolicy {
    RetryPolicy {
        idempotent: false,
        ..quick_policy()
    }
}

/// `n` calls one after the other, request ids `{prefix}-{i}`; each must succeed.
async fn call_all<S>(c: &mut InventoryClient<S>, prefix: &str, n: usize)
where
    S: tonic::client::GrpcService<tonic::body::Body>,
    S::Error: Into<stormguard_client::BoxError>,
    S::ResponseBody: tonic::codegen::Body<Data = bytes::Bytes> + Send + 'static,
    <S::ResponseBody as tonic::codegen::Body>::Error: Into<stormguard_client::BoxError> + Send,
{
    for i in 0..n {
        c.reserve(reserve(&format!("{prefix}-{i}"))).await.unwrap();
    }
}

/// How many times each request id reached `server`.
fn ids_seen(server: &Scripted) -> HashMap<String, usize> {
    let mut ids = HashMap::new();
    for seen in server.seen() {
        *ids.entry(seen.request_id).or_default() += 1;
    }
    ids
}

/// Paused time, in-memory connections: every figure is the same on every machine.
#[tokio::test(start_paused = true)]
async fn retries_avoid_tried_replicas_and_a_failing_replica_is_ejected() {
    // The bad replica fails at once; the good ones answer in 1 ms.
    let bad = Scripted::always(Step::Fail(Code::Unavailable));
    let ok = || Scripted::always(Step::slow(Duration::from_millis(1), Step::Ok));
    let good = [ok(), ok()];
    // Failures are forgotten over 10 ms, and the calls are 10 ms apart: the bad replica
    // stays in the choice until ejection takes it out.
    let config = ReplicaConfig {
        load: LoadConfig {
            failure_decay: Duration::from_millis(10),
            ..LoadConfig::default()
        },
        ..config(1)
    };
    let replicas = in_memory_replicas(config, [&bad, &good[0], &good[1]]).await;
    let layer = RetryLayer::new(roomy(quick_policy())).over_replicas();
    let stats = layer.stats();
    let mut c = client(&replicas, layer);
    for i in 0..200 {
        c.reserve(reserve(&format!("call-{i}"))).await.unwrap();
        tokio::time::advance(Duration::from_millis(10)).await;
    }
    // No call went to the same replica twice.
    for server in std::iter::once(&bad).chain(&good) {
        assert!(ids_seen(server).values().all(|&n| n == 1));
    }
    // The bad replica was ejected at its fifth failure in a row, and at most probed since:
    // its one probe, after the first ejection, failed and ejected it again.
    let report = replicas.snapshot();
    let bad_report = report.iter().find(|r| r.key == in_memory_key(0)).unwrap();
    let attempts = bad.seen().len();
    assert!(
        bad_report.snapshot.ejections >= 1 && attempts >= 5,
        "{attempts} attempts, {} ejections",
        bad_report.snapshot.ejections
    );
    assert!(attempts <= 10, "{attempts}");
    assert_eq!(
        (attempts, bad_report.snapshot.ejections),
        (6, 2),
        "{bad_report:?}"
    );
    let s = stats.snapshot();
    assert_eq!((s.logical, s.ok), (200, 200));
    assert_eq!(s.retries as usize, bad.seen().len());
}

/// Paused time, in-memory connections: every figure is the same on every machine.
#[tokio::test(start_paused = true)]
async fn a_failing_replica_spends_its_own_retries_not_the_healthy_ones() {
    // The bad replica fails every call; the healthy ones fail one call in twenty. Ejection is
    // off and failures are forgotten between calls (50 ms apart, five times the decay), so
    // the bad replica keeps a third of the first attempts (the shared budget's worst case).
    // Every answer takes 1 ms, so only health tells the replicas apart.
    let after_1ms = |step| Step::slow(Duration::from_millis(1), step);
    let bad = Scripted::always(Step::Fail(Code::Unavailable));
    let flaky = || {
        let pattern = std::iter::once(after_1ms(Step::Fail(Code::Unavailable)))
            .chain(std::iter::repeat_n(after_1ms(Step::Ok), 19));
        Scripted::new(pattern.cycle().take(4000), after_1ms(Step::Ok))
    };
    let good = [flaky(), flaky()];
    let replicas = in_memory_replicas(
        ReplicaConfig {
            ejection: EjectionConfig {
                max_ejected_share: 0.0,
                ..EjectionConfig::default()
            },
            load: LoadConfig {
                failure_decay: Duration::from_millis(10),
                ..LoadConfig::default()
            },
            seed: Some(2),
            ..ReplicaConfig::default()
        },
        [&bad, &good[0], &good[1]],
    )
    .await;
    // 1 retry/s of floor over a window that holds the whole 30 s run (60 retries), and 1
    // retry per 5 successes, shared and per key.
    let budget_config = BudgetConfig {
        ttl: Duration::from_secs(60),
        min_retries_per_second: 1,
        retry_ratio: 0.2,
        // About the per-key accounts: the floor lent whatever the answers.
        floor: Floor::Always,
        ..BudgetConfig::default()
    };
    let shared: Arc<dyn Budget> = Arc::new(RetryBudget::new(budget_config.clone()).unwrap());
    let controller = RetryController::new(MethodTable::uniform(quick_policy()), shared, None, 3)
        .unwrap()
        .with_key_budgets(KeyedBudgets::new(budget_config, 16).unwrap());
    let layer = RetryLayer::new(controller).over_replicas();
    let stats = layer.stats();
    let mut c = client(&replicas, layer);
    let mut failed = Vec::new();
    for i in 0..600 {
        let id = format!("call-{i}");
        if c.reserve(reserve(&id)).await.is_err() {
            failed.push(id);
        }
        tokio::time::advance(Duration::from_millis(50)).await;
    }
    let s = stats.snapshot();
    let on_bad = ids_seen(&bad);
    // It keeps taking first attempts (80 of 600: failing at once, it looks quick), and
    // what they cost:
    assert!(
        on_bad.len() > 50,
        "the bad replica took {} calls",
        on_bad.len()
    );
    assert_eq!(on_bad.len(), 80);
    assert!(s.refused.key_budget > 0, "{s:?}");
    // The healthy replicas' failures were all paid: every failed call met the bad replica,
    // whose own account refused the retry after it (it spent its floor, 60, and no more).
    assert_eq!(s.refused.budget, 0, "{s:?}");
    assert_eq!(s.refused.key_budget, 17, "{s:?}");
    assert!(!failed.is_empty());
    assert!(failed.iter().all(|id| on_bad.contains_key(id)));
}

#[tokio::test]
async fn a_replica_whose_server_is_gone_costs_no_call() {
    let good = [Scripted::always(Step::Ok), Scripted::always(Step::Ok)];
    // A port that was bound and released: connections to it are refused.
    let gone = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let mut endpoints = vec![endpoint(gone)];
    for g in &good {
        endpoints.push(endpoint(serve(g.clone()).await));
    }
    let replicas = Replicas::from_endpoints(config(3), endpoints).unwrap();
    let layer = RetryLayer::new(roomy(non_idempotent())).over_replicas();
    let stats = layer.stats();
    let mut c = client(&replicas, layer);
    call_all(&mut c, "call", 100).await;
    let dead = replicas
        .snapshot()
        .into_iter()
        .find(|r| r.key == endpoint(gone).uri().clone())
        .unwrap();
    // Its refused connections are failures: its health falls and the choice avoids it
    // (or ejects it) after a few.
    assert!(dead.snapshot.attempts <= 10, "{dead:?}");
    assert_eq!(dead.snapshot.failures, dead.snapshot.attempts);
    let s = stats.snapshot();
    assert_eq!(s.ok, 100);
    // Refused connections were retried for free, on another replica.
    assert_eq!(s.retries, 0, "{s:?}");
    assert_eq!(s.transparent_retries, dead.snapshot.attempts);
}

#[tokio::test]
async fn a_replica_added_while_serving_starts_small_and_a_removed_one_gets_nothing() {
    let servers = [
        Scripted::always(Step::Ok),
        Scripted::always(Step::Ok),
        Scripted::always(Step::Ok),
    ];
    let mut addrs = Vec::new();
    for s in &servers {
        addrs.push(serve(s.clone()).await);
    }
    // The longest ramp there is (10 min): the newcomer's share stays near its first weight
    // however slowly a loaded machine runs the calls below (with the default 5 s ramp, a
    // machine that took 5 s over them gave the newcomer its full third). That first weight
    // a hundredth, not the default tenth: the choice weighs each replica's latency too, and
    // on a loaded machine one stalled answer can make the others look ten times slower
    // than the newcomer's assumed 1 ms (it then took a third of the calls at a tenth).
    let slow_start = SlowStartConfig {
        window: Duration::from_secs(600),
        min_weight: 0.01,
    };
    let config = ReplicaConfig {
        slow_start,
        ..config(4)
    };
    let (replicas, changes) = Replicas::<Channel, String>::balance_channel(config, 8).unwrap();
    for addr in &addrs[..2] {
        changes
            .send(Change::Insert(addr.to_string(), endpoint(*addr)))
            .await
            .unwrap();
    }
    let layer = RetryLayer::new(roomy(quick_policy())).over_replicas();
    let mut c = InventoryClient::new(ServiceBuilder::new().layer(layer).service(replicas.clone()));
    // The changes are applied by a task: wait until both are in (no timer involved).
    while replicas.len() < 2 {
        tokio::task::yield_now().await;
    }
    call_all(&mut c, "warm", 50).await;
    changes
        .send(Change::Insert(addrs[2].to_string(), endpoint(addrs[2])))
        .await
        .unwrap();
    while replicas.len() < 3 {
        tokio::task::yield_now().await;
    }
    let new = replicas
        .snapshot()
        .into_iter()
        .find(|r| r.key == addrs[2].to_string())
        .unwrap();
    assert_eq!(new.snapshot.state.as_str(), "warming");
    call_all(&mut c, "after", 150).await;
    // A tenth of a share, rising over 10 min, against two full ones: far below a third.
    let newcomer = servers[2].seen().len();
    assert!(
        newcomer < 30,
        "the new replica took {newcomer} of 150 calls"
    );
    // Removed: no further attempt reaches it.
    changes
        .send(Change::Remove(addrs[0].to_string()))
        .await
        .unwrap();
    while replicas.len() > 2 {
        tokio::task::yield_now().await;
    }
    let before = servers[0].seen().len();
    call_all(&mut c, "removed", 50).await;
    assert_eq!(servers[0].seen().len(), before);
}

/// Answers by shard: every call to shard `bad` fails; a first attempt of every tenth call
/// to shard `good` fails (its retry succeeds).
#[derive(Default)]
struct Shards {
    good_calls: std::sync::atomic::AtomicU32,
}

#[tonic::async_trait]
impl stormguard_demo::Inventory for Shards {
    async fn reserve(
        &self,
        req: tonic::Request<stormguard_demo::ReserveRequest>,
    ) -> Result<tonic::Response<stormguard_demo::ReserveReply>, tonic::Status> {
        let shard = req.metadata().get("x-shard").and_then(|v| v.to_str().ok());
        let retry = req.metadata().contains_key("grpc-previous-rpc-attempts");
        let fail = match shard {
            Some("bad") => true,
            _ if retry => false,
            _ => {
                let n = self
                    .good_calls
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                n.is_multiple_of(10)
            }
        };
        if fail {
            return Err(tonic::Status::unavailable("shard down"));
        }
        Ok(tonic::Response::new(
            stormguard_demo::ReserveReply::default(),
        ))
    }

    type WatchStockStream = client_support::LevelStream;

    async fn watch_stock(
        &self,
        _req: tonic::Request<stormguard_demo::WatchStockRequest>,
    ) -> Result<tonic::Response<Self::WatchStockStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }
}

/// Paused time, an in-memory connection: the whole run is one budget window on every
/// machine.
#[tokio::test(start_paused = true)]
async fn a_failing_shard_spends_its_own_retries_not_the_other_shards() {
    let channel = in_memory(|incoming| {
        tokio::spawn(tonic::transport::Server::builder().serve_with_incoming(
            stormguard_demo::InventoryServer::new(Shards::default()),
            incoming,
        ));
    })
    .await;
    let started = tokio::time::Instant::now();
    let budget_config = BudgetConfig {
        min_retries_per_second: 1,
        retry_ratio: 0.2,
        // About the per-key accounts: the floor lent whatever the answers.
        floor: Floor::Always,
        ..BudgetConfig::default()
    };
    let shared: Arc<dyn Budget> = Arc::new(RetryBudget::new(budget_config.clone()).unwrap());
    let controller = RetryController::new(MethodTable::uniform(quick_policy()), shared, None, 3)
        .unwrap()
        .with_key_budgets(KeyedBudgets::new(budget_config, 16).unwrap());
    let layer = RetryLayer::new(controller).budget_key(|request| {
        match request.headers().get("x-shard")?.as_bytes() {
            b"bad" => Some(1),
            _ => Some(2),
        }
    });
    let stats = layer.stats();
    let mut c = InventoryClient::new(ServiceBuilder::new().layer(layer).service(channel));
    let mut failed = [0, 0];
    for i in 0..300 {
        // One call in three to the bad shard.
        let shard = if i % 3 == 0 { "bad" } else { "good" };
        let mut request = tonic::Request::new(reserve(&format!("call-{i}")));
        request
            .metadata_mut()
            .insert("x-shard", shard.parse().unwrap());
        if c.reserve(request).await.is_err() {
            failed[usize::from(shard == "good")] += 1;
        }
    }
    let s = stats.snapshot();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "one budget window"
    );
    // The good shard's 20 failures were all retried (and succeeded); the bad shard had its
    // floor of 10 retries (each failing again, a call giving up after its third attempt),
    // and its other calls were refused by its own account.
    assert_eq!(failed, [100, 0], "{s:?}");
    assert_eq!(s.refused.budget, 0, "{s:?}");
    assert_eq!(s.retries, 20 + 10, "{s:?}");
    assert_eq!(s.refused.key_budget + s.refused.attempts, 100, "{s:?}");
    assert!(s.refused.key_budget >= 90, "{s:?}");
    // Its first five calls had their third attempt refused at the attempt limit.
    assert_eq!((s.refused.key_budget, s.refused.attempts), (95, 5), "{s:?}");
}

/// Serves `svc` behind a `ShedLayer` that is already shutting down when `draining`.
async fn serve_shed(svc: Scripted, draining: bool) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let layer =
        stormguard_server::ShedLayer::from_config(&stormguard_server::AdmissionConfig::default())
            .unwrap();
    if draining {
        assert!(layer.shutdown_handle().begin());
    }
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(stormguard_demo::InventoryServer::new(svc))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    addr
}

#[tokio::test]
async fn a_replica_shutting_down_costs_no_call_not_even_a_non_idempotent_one() {
    let draining = Scripted::always(Step::Ok);
    let serving = Scripted::always(Step::Ok);
    let endpoints = [
        endpoint(serve_shed(draining.clone(), true).await),
        endpoint(serve_shed(serving.clone(), false).await),
    ];
    let replicas = Replicas::from_endpoints(config(6), endpoints).unwrap();
    let layer = RetryLayer::new(roomy(non_idempotent())).over_replicas();
    let stats = layer.stats();
    let mut c = client(&replicas, layer);
    call_all(&mut c, "call", 50).await;
    // The draining replica ran nothing; each call ran once, on the serving one.
    assert!(draining.seen().is_empty());
    assert_eq!(ids_seen(&serving).len(), 50);
    assert!(ids_seen(&serving).values().all(|&n| n == 1));
    let s = stats.snapshot();
    assert_eq!(s.refused.not_idempotent, 0, "{s:?}");
    assert!(s.retries >= 1, "the draining replica was tried: {s:?}");
}

/// Paused time: the slow replica's 20 ms is virtual and the fast ones answer in no virtual
/// time, so the share does not depend on how busy the machine is.
#[tokio::test(start_paused = true)]
async fn a_slow_replica_gets_a_small_share() {
    let slow = Scripted::always(Step::slow(Duration::from_millis(20), Step::Ok));
    let fast = [Scripted::always(Step::Ok), Scripted::always(Step::Ok)];
    let mut endpoints = vec![endpoint(serve(slow.clone()).await)];
    for f in &fast {
        endpoints.push(endpoint(serve(f.clone()).await));
    }
    let replicas = Replicas::from_endpoints(config(7), endpoints).unwrap();
    let layer = RetryLayer::new(roomy(quick_policy())).over_replicas();
    let c = client(&replicas, layer);
    // 300 calls, ten at a time.
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..10 {
        let mut c = c.clone();
        tasks.spawn(async move {
            for i in 0..30 {
                c.reserve(reserve(&format!("w{w}-{i}"))).await.unwrap();
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    // A uniform pick would give it 100; latency × load gives it a few.
    let share = slow.seen().len();
    assert!(share < 30, "the slow replica took {share} of 300 calls");
}

/// A middleware of the kind that sits over a tonic `Channel`: it requires its inner
/// service's error to be a `std::error::Error` (here to count failures by their source).
#[derive(Clone)]
struct CountFailures<S> {
    inner: S,
    failures: Arc<std::sync::atomic::AtomicUsize>,
}

impl<S, R> tower::Service<R> for CountFailures<S>
where
    S: tower::Service<R>,
    S::Error: std::error::Error + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let future = self.inner.call(request);
        let failures = Arc::clone(&self.failures);
        Box::pin(async move {
            let result = future.await;
            if result.is_err() {
                failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            result
        })
    }
}

#[tokio::test]
async fn middleware_bounded_on_std_error_sits_over_replicas_as_over_a_channel() {
    let server = Scripted::always(Step::Ok);
    let addr = serve(server.clone()).await;
    let replicas = Replicas::from_endpoints(config(8), [endpoint(addr)]).unwrap();
    let failures = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = CountFailures {
        inner: replicas.clone(),
        failures: Arc::clone(&failures),
    };
    let mut c = InventoryClient::new(counted);
    call_all(&mut c, "typed", 3).await;
    assert_eq!(server.seen().len(), 3);
    assert_eq!(failures.load(std::sync::atomic::Ordering::Relaxed), 0);

    // A replica whose server is gone: the error is typed and keeps the transport's as its
    // source; the tonic client reads it as it reads a `Channel`'s (`UNAVAILABLE`).
    let gone = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let replicas = Replicas::from_endpoints(config(9), [endpoint(gone)]).unwrap();
    let mut direct = replicas.clone();
    let request = http::Request::new(tonic::body::Body::empty());
    let err = tower::ServiceExt::oneshot(&mut direct, request)
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        stormguard_client::replicas::Error::Replica(_)
    ));
    assert!(std::error::Error::source(&err).is_some());
    let counted = CountFailures {
        inner: replicas,
        failures: Arc::clone(&failures),
    };
    let status = InventoryClient::new(counted)
        .reserve(reserve("typed-gone"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(failures.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[tokio::test]
async fn a_replica_id_names_its_key() {
    let addr = serve(Scripted::always(Step::Ok)).await;
    let replicas = Replicas::from_endpoints(config(10), [endpoint(addr)]).unwrap();
    let report = replicas.snapshot();
    let [replica] = report.as_slice() else {
        panic!("one replica: {report:?}")
    };
    assert_eq!(replicas.key(replica.snapshot.id), Some(replica.key.clone()));
    assert!(replicas.remove(&replica.key));
    assert_eq!(replicas.key(replica.snapshot.id), None);
}
