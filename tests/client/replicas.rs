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

use client_support::{Scripted, Step, quick_policy, reserve, serve};
use stormguard_client::RetryLayer;
use stormguard_client::replicas::{Change, ReplicaConfig, Replicas};
use stormguard_core::budget::{Budget, BudgetConfig, KeyedBudgets, RetryBudget};
use stormguard_core::policy::{MethodTable, RetryPolicy};
use stormguard_core::replica::{EjectionConfig, LoadConfig};
use stormguard_core::retry::RetryController;
use stormguard_demo::InventoryClient;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};
use tower::ServiceBuilder;

type Client = InventoryClient<stormguard_client::Retry<Replicas<Channel, http::Uri>>>;

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
    RetryController::new(MethodTable::uniform(policy), budget, None, 7)
}

fn client(replicas: &Replicas<Channel, http::Uri>, layer: RetryLayer) -> Client {
    InventoryClient::new(ServiceBuilder::new().layer(layer).service(replicas.clone()))
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

#[tokio::test]
async fn retries_avoid_tried_replicas_and_a_failing_replica_is_ejected() {
    let bad = Scripted::always(Step::Fail(Code::Unavailable));
    let good = [Scripted::always(Step::Ok), Scripted::always(Step::Ok)];
    let bad_addr = serve(bad.clone()).await;
    let mut endpoints = vec![endpoint(bad_addr)];
    for g in &good {
        endpoints.push(endpoint(serve(g.clone()).await));
    }
    let replicas = Replicas::from_endpoints(config(1), endpoints).unwrap();
    let layer = RetryLayer::new(roomy(quick_policy())).over_replicas();
    let stats = layer.stats();
    let mut c = client(&replicas, layer);
    call_all(&mut c, "call", 200).await;
    // No call went to the same replica twice.
    for server in std::iter::once(&bad).chain(&good) {
        assert!(ids_seen(server).values().all(|&n| n == 1));
    }
    // The bad replica was ejected at its fifth failure in a row (and at most probed
    // since), unless the balancer, which scores it down after each failure, stopped
    // picking it before that (on a slow machine, less time passes for its score to heal).
    let report = replicas.snapshot();
    let bad_report = report
        .iter()
        .find(|r| r.key == endpoint(bad_addr).uri().clone())
        .unwrap();
    let attempts = bad.seen().len();
    assert!(
        bad_report.snapshot.ejections >= 1 || attempts < 5,
        "{attempts} attempts, {} ejections",
        bad_report.snapshot.ejections
    );
    assert!(attempts <= 10, "{attempts}");
    let s = stats.snapshot();
    assert_eq!((s.logical, s.ok), (200, 200));
    assert_eq!(s.retries as usize, bad.seen().len());
}

#[tokio::test]
async fn a_failing_replica_spends_its_own_retries_not_the_healthy_ones() {
    // The bad replica fails every call; the healthy ones fail one call in twenty. Ejection is
    // off and failures are forgotten at once, so the bad replica keeps a third of the
    // first attempts (the shared budget's worst case).
    let bad = Scripted::always(Step::Fail(Code::Unavailable));
    let flaky = || {
        let pattern =
            std::iter::once(Step::Fail(Code::Unavailable)).chain(std::iter::repeat_n(Step::Ok, 19));
        Scripted::new(pattern.cycle().take(4000), Step::Ok)
    };
    let good = [flaky(), flaky()];
    let mut endpoints = vec![endpoint(serve(bad.clone()).await)];
    for g in &good {
        endpoints.push(endpoint(serve(g.clone()).await));
    }
    let replicas = Replicas::from_endpoints(
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
        endpoints,
    )
    .unwrap();
    // 3 retries/s of floor (30 per window) and 1 retry per 5 successes, shared and per key.
    let budget_config = BudgetConfig {
        min_retries_per_second: 3,
        retry_ratio: 0.2,
        ..BudgetConfig::default()
    };
    let shared: Arc<dyn Budget> = Arc::new(RetryBudget::new(budget_config.clone()).unwrap());
    let controller = RetryController::new(MethodTable::uniform(quick_policy()), shared, None, 3)
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
    }
    let s = stats.snapshot();
    let on_bad = ids_seen(&bad);
    // A third of the first attempts when the balancer forgets at once; how much less
    // depends on how much time passes between calls (98 of 600 on a loaded CI machine, 200
    // on an idle one). What matters is that it keeps taking some, and what they cost:
    assert!(
        on_bad.len() > 50,
        "the bad replica took {} calls",
        on_bad.len()
    );
    assert!(s.refused.key_budget > 0, "{s:?}");
    // The healthy replicas' failures were all paid: every failed call met the bad replica,
    // whose own account refused the retry after it (it spent its floor, 30, and no more).
    assert_eq!(s.refused.budget, 0, "{s:?}");
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
    let (replicas, changes) = Replicas::<Channel, String>::balance_channel(config(4), 8).unwrap();
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
    assert_eq!(new.state.as_str(), "warming");
    call_all(&mut c, "after", 150).await;
    // A tenth of a share, rising over 5 s, against two full ones: far below a third.
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

#[tokio::test]
async fn a_failing_shard_spends_its_own_retries_not_the_other_shards() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(tonic::transport::Server::builder().serve_with_incoming(
        stormguard_demo::InventoryServer::new(Shards::default()),
        tonic::transport::server::TcpIncoming::from(listener),
    ));
    let budget_config = BudgetConfig {
        min_retries_per_second: 1,
        retry_ratio: 0.2,
        ..BudgetConfig::default()
    };
    let shared: Arc<dyn Budget> = Arc::new(RetryBudget::new(budget_config.clone()).unwrap());
    let controller = RetryController::new(MethodTable::uniform(quick_policy()), shared, None, 3)
        .with_key_budgets(KeyedBudgets::new(budget_config, 16).unwrap());
    let layer = RetryLayer::new(controller).budget_key(|request| {
        match request.headers().get("x-shard")?.as_bytes() {
            b"bad" => Some(1),
            _ => Some(2),
        }
    });
    let stats = layer.stats();
    let channel = endpoint(addr).connect().await.unwrap();
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
    // The good shard's 20 failures were all retried (and succeeded); the bad shard had its
    // floor of 10 retries (each failing again, a call giving up after its third attempt),
    // and its other calls were refused by its own account.
    assert_eq!(failed, [100, 0], "{s:?}");
    assert_eq!(s.refused.budget, 0, "{s:?}");
    assert_eq!(s.retries, 20 + 10, "{s:?}");
    assert_eq!(s.refused.key_budget + s.refused.attempts, 100, "{s:?}");
    assert!(s.refused.key_budget >= 90, "{s:?}");
}

/// Serves `svc` behind a `ShedLayer` that is already shutting down when `draining`.
async fn serve_shed(svc: Scripted, draining: bool) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let layer =
        stormguard_server::ShedLayer::from_config(stormguard_server::AdmissionConfig::default())
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
