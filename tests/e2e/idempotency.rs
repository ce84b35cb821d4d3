//! Idempotency keys end to end, over real tonic on loopback: the client layer stamps one
//! key per logical call (the same on every attempt and hedge), the server layer hands it
//! to the handler and runs each key once, and a keyed write whose answers are lost is
//! retried and still executed exactly once per logical call.

#![allow(clippy::unwrap_used)]

use crate::client_support;
use crate::lossy_support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use client_support::{budget, channel, reserve};
use lossy_support::{CALL_HEADER, LoseAnswers};
use stormguard_client::RetryLayer;
use stormguard_core::BackoffConfig;
use stormguard_core::IdempotencyConfig;
use stormguard_core::MethodScope;
use stormguard_core::RetryController;
use stormguard_core::{Code as CoreCode, CodeSet};
use stormguard_core::{HedgeDelay, HedgingPolicy};
use stormguard_core::{MethodTable, RetryPolicy};
use stormguard_demo::{
    Inventory, InventoryClient, InventoryServer, ReserveReply, ReserveRequest, StockLevel,
    WatchStockRequest,
};
use stormguard_server::idempotency::{
    Begin, Digest, IdempotencyKey, IdempotencyLayer, IdempotencyStore, MESSAGE_IN_FLIGHT,
    MESSAGE_NOT_KEPT, MemoryStore, Record, ScopedKey,
};
use stormguard_server::{AdmissionConfig, ShedLayer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tonic::codegen::tokio_stream::Stream;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Response, Status};
use tower::ServiceBuilder;

const KEY: &str = "idempotency-key";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// What the handler saw of one run.
#[derive(Clone, Debug)]
struct Run {
    request_id: String,
    /// The `IdempotencyKey` extension.
    extension: Option<String>,
    /// The `idempotency-key` header.
    header: Option<String>,
    previous_attempts: Option<String>,
}

/// A write: each run is an execution of its side effect, counted per logical call
/// (`request_id`). A run may be held until the test releases it.
#[derive(Clone, Default)]
struct Writes {
    runs: Arc<Mutex<Vec<Run>>>,
    /// When set, each run waits for a permit (`release`) before it answers, after telling
    /// `entered`.
    hold: Option<Arc<Hold>>,
    /// Answer `UNAVAILABLE` to this many runs first (the handler's own "try again").
    unavailable: Arc<AtomicU64>,
}

/// Counted, so no signal is lost whichever side comes first.
struct Hold {
    entered: Semaphore,
    release: Semaphore,
}

impl Default for Hold {
    fn default() -> Self {
        Hold {
            entered: Semaphore::new(0),
            release: Semaphore::new(0),
        }
    }
}

/// Waits for `n` signals of `sem`.
async fn signals(sem: &Semaphore, n: u32) {
    sem.acquire_many(n).await.unwrap().forget();
}

/// Waits for a signal of `expected`; a run of the handler first fails the test (the call
/// that should have been answered without running ran), so a removed rule fails the test
/// instead of hanging it. No timer: on paused time a timer can fire while an answer is
/// still on the loopback.
async fn before_a_run(expected: &Semaphore, hold: &Hold, what: &str) {
    tokio::select! {
        biased;
        _ = signals(expected, 1) => {}
        _ = signals(&hold.entered, 1) => panic!("{what} ran the handler"),
    }
}

impl Writes {
    fn held() -> Self {
        Writes {
            hold: Some(Arc::default()),
            ..Writes::default()
        }
    }

    fn runs(&self) -> Vec<Run> {
        self.runs.lock().unwrap().clone()
    }

    /// Executions per logical call.
    fn executions(&self) -> HashMap<String, usize> {
        let mut per_call = HashMap::new();
        for run in self.runs() {
            *per_call.entry(run.request_id).or_default() += 1;
        }
        per_call
    }
}

type LevelStream = Pin<Box<dyn Stream<Item = Result<StockLevel, Status>> + Send>>;

#[tonic::codegen::async_trait]
impl Inventory for Writes {
    async fn reserve(
        &self,
        req: Request<ReserveRequest>,
    ) -> Result<Response<ReserveReply>, Status> {
        let header = |name: &str| {
            req.metadata()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        let run = Run {
            request_id: req.get_ref().request_id.clone(),
            extension: req
                .extensions()
                .get::<IdempotencyKey>()
                .map(|k| k.as_str().to_owned()),
            header: header(KEY),
            previous_attempts: header("grpc-previous-rpc-attempts"),
        };
        let attempt = run
            .previous_attempts
            .as_deref()
            .map_or(0, |v| v.parse().unwrap());
        self.runs.lock().unwrap().push(run);
        if let Some(hold) = &self.hold {
            hold.entered.add_permits(1);
            hold.release.acquire().await.unwrap().forget();
        }
        let failing = self
            .unavailable
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        if failing.is_ok() {
            return Err(Status::unavailable("try again"));
        }
        Ok(Response::new(ReserveReply {
            reserved: true,
            attempt: attempt + 1,
            timeout_ms: 0,
        }))
    }

    type WatchStockStream = LevelStream;

    async fn watch_stock(
        &self,
        _req: Request<WatchStockRequest>,
    ) -> Result<Response<LevelStream>, Status> {
        Err(Status::unimplemented("not a write"))
    }
}

/// Serves `svc` behind `idem` inside a `ShedLayer` (64 workers: nothing here is shed), the
/// order the docs give, and outside both `lossy`, on a fresh loopback port.
async fn serve(svc: Writes, idem: IdempotencyLayer, lossy: Option<LoseAnswers>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = TcpIncoming::from(listener);
    let lossy = lossy.unwrap_or_default();
    tokio::spawn(
        Server::builder()
            .layer(lossy)
            .layer(ShedLayer::from_config(&AdmissionConfig::default()).unwrap())
            .layer(idem)
            .add_service(InventoryServer::new(svc))
            .serve_with_incoming(incoming),
    );
    addr
}

/// A quick full-jitter backoff (paused time makes it free anyway).
fn quick() -> BackoffConfig {
    BackoffConfig::FullJitter {
        base: ms(1),
        cap: ms(5),
        multiplier: 2.0,
    }
}

/// A write: not idempotent, retried up to `max_attempts`.
fn write_policy(max_attempts: u32, idempotent: bool) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        idempotent,
        backoff: quick(),
        ..RetryPolicy::default()
    }
}

fn retry_layer(policy: RetryPolicy, keyed: bool) -> RetryLayer {
    let mut table = MethodTable::uniform(policy);
    table.set_idempotency_key(MethodScope::Default, keyed);
    RetryLayer::new(RetryController::new(table, budget(1000, 0.5), None, 21).unwrap())
}

type Client = InventoryClient<stormguard_client::Retry<Channel>>;

async fn client(addr: SocketAddr, layer: RetryLayer) -> Client {
    InventoryClient::new(
        ServiceBuilder::new()
            .layer(layer)
            .service(channel(addr).await),
    )
}

async fn plain(addr: SocketAddr) -> InventoryClient<Channel> {
    InventoryClient::new(channel(addr).await)
}

/// A request with the caller's own key.
fn with_key(id: &str, key: &str) -> Request<ReserveRequest> {
    let mut req = Request::new(reserve(id));
    req.metadata_mut().insert(KEY, key.parse().unwrap());
    req
}

fn memory(config: IdempotencyConfig) -> Arc<MemoryStore> {
    Arc::new(MemoryStore::new(config).unwrap())
}

#[tokio::test(start_paused = true)]
async fn every_attempt_carries_the_call_s_one_key_and_the_handler_sees_it() {
    let svc = Writes::default();
    // The handler says "try again" twice: the write is retried (it is keyed), and the
    // layer without a store lets every attempt reach it.
    svc.unavailable.store(2, Ordering::Relaxed);
    let addr = serve(svc.clone(), IdempotencyLayer::new(), None).await;
    let mut client = client(addr, retry_layer(write_policy(3, false), true)).await;
    let reply = client.reserve(reserve("a")).await.unwrap();
    assert_eq!(reply.get_ref().attempt, 3);
    client.reserve(reserve("b")).await.unwrap();
    let runs = svc.runs();
    assert_eq!(runs.len(), 3 + 1);
    let a: Vec<_> = runs.iter().filter(|r| r.request_id == "a").collect();
    let key = a[0].header.clone().expect("a keyed call carries a key");
    assert_eq!(key.len(), 36, "a UUID: {key}");
    assert_eq!(&key[14..15], "4", "version 4: {key}");
    for run in &a {
        assert_eq!(
            run.header.as_deref(),
            Some(key.as_str()),
            "the same key on every attempt"
        );
        assert_eq!(
            run.extension.as_deref(),
            Some(key.as_str()),
            "and in the extension"
        );
    }
    let previous: Vec<_> = a.iter().map(|r| r.previous_attempts.as_deref()).collect();
    assert_eq!(previous, [None, Some("1"), Some("2")]);
    let b = runs.iter().find(|r| r.request_id == "b").unwrap();
    assert_ne!(
        b.header.as_deref(),
        Some(key.as_str()),
        "one key per logical call"
    );
}

#[tokio::test(start_paused = true)]
async fn a_caller_s_key_is_kept_a_bad_one_is_refused_and_unkeyed_methods_carry_none() {
    let svc = Writes::default();
    let addr = serve(svc.clone(), IdempotencyLayer::new(), None).await;
    let mut keyed = client(addr, retry_layer(write_policy(3, false), true)).await;
    keyed.reserve(with_key("mine", "order-42")).await.unwrap();
    // A key a server would refuse is the caller's error: not sent.
    let err = keyed
        .reserve(with_key("bad", "two words"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("call not sent"), "{}", err.message());
    let mut unkeyed = client(addr, retry_layer(write_policy(3, false), false)).await;
    unkeyed.reserve(reserve("none")).await.unwrap();
    let runs = svc.runs();
    assert_eq!(
        runs.len(),
        2,
        "the bad key never reached the server: {runs:?}"
    );
    assert_eq!(runs[0].header.as_deref(), Some("order-42"));
    assert_eq!(runs[0].extension.as_deref(), Some("order-42"));
    assert_eq!(
        (runs[1].header.as_deref(), runs[1].extension.as_deref()),
        (None, None)
    );
}

#[tokio::test(start_paused = true)]
async fn hedges_carry_the_key_of_their_call() {
    let svc = Writes::held();
    let hold = Arc::clone(svc.hold.as_ref().unwrap());
    let addr = serve(svc.clone(), IdempotencyLayer::new(), None).await;
    let mut table = MethodTable::none();
    table.set_hedging(
        MethodScope::Default,
        Some(HedgingPolicy {
            max_attempts: 2,
            delay: HedgeDelay::Fixed(ms(10)),
            non_fatal_codes: CodeSet::single(CoreCode::Unavailable),
            ..HedgingPolicy::default()
        }),
    );
    table.set_idempotency_key(MethodScope::Default, true);
    let layer = RetryLayer::new(RetryController::new(table, budget(100, 0.1), None, 7).unwrap());
    let mut client = client(addr, layer).await;
    let call = tokio::spawn(async move { client.reserve(reserve("h")).await });
    // Both copies reach the handler (no store): release them once both are in.
    signals(&hold.entered, 2).await;
    hold.release.add_permits(2);
    call.await.unwrap().unwrap();
    let runs = svc.runs();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[1].previous_attempts.as_deref(), Some("1"), "a hedge");
    assert!(runs[0].header.is_some());
    assert_eq!(
        runs[0].header, runs[1].header,
        "the hedge carries the call's key"
    );
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_of_a_completed_call_gets_the_recorded_answer_without_running() {
    let svc = Writes::default();
    let idem = IdempotencyLayer::new().with_store(memory(IdempotencyConfig::default()));
    let stats = idem.stats();
    let addr = serve(svc.clone(), idem, None).await;
    let mut client = plain(addr).await;
    let first = client.reserve(with_key("x", "k-1")).await.unwrap();
    let mut again = with_key("x", "k-1");
    again
        .metadata_mut()
        .insert("grpc-previous-rpc-attempts", "1".parse().unwrap());
    let second = client.reserve(again).await.unwrap();
    assert_eq!(
        second.get_ref(),
        first.get_ref(),
        "the recorded answer, not a new run"
    );
    assert_eq!(second.get_ref().attempt, 1);
    assert_eq!(svc.runs().len(), 1);
    let s = stats.snapshot();
    assert_eq!((s.keyed, s.recorded, s.replayed), (2, 1, 1));
    // Another key runs.
    client.reserve(with_key("y", "k-2")).await.unwrap();
    assert_eq!(svc.runs().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_unavailable_answer_releases_the_key_so_a_retry_runs() {
    let svc = Writes::default();
    svc.unavailable.store(1, Ordering::Relaxed);
    let idem = IdempotencyLayer::new().with_store(memory(IdempotencyConfig::default()));
    let stats = idem.stats();
    let addr = serve(svc.clone(), idem, None).await;
    let mut client = client(addr, retry_layer(write_policy(3, false), true)).await;
    let reply = client.reserve(reserve("u")).await.unwrap();
    assert_eq!(reply.get_ref().attempt, 2, "the retry ran the handler");
    assert_eq!(svc.runs().len(), 2);
    let s = stats.snapshot();
    assert_eq!((s.released, s.recorded, s.replayed), (1, 1, 0));
}

/// A store that tells the test when a duplicate found its key in flight.
struct Watched {
    inner: Arc<MemoryStore>,
    in_flight: Semaphore,
}

impl IdempotencyStore for Watched {
    fn begin(&self, key: &ScopedKey, fingerprint: &Digest) -> Begin<Record> {
        let begun = self.inner.begin(key, fingerprint);
        if matches!(begun, Begin::InFlight) {
            self.in_flight.add_permits(1);
        }
        begun
    }
    fn complete(&self, key: &ScopedKey, record: Record) {
        self.inner.complete(key, record);
    }
    fn abandon(&self, key: &ScopedKey, fingerprint: &Digest) {
        self.inner.abandon(key, fingerprint);
    }
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_while_the_first_runs_is_aborted_and_a_keyed_client_waits_for_the_answer() {
    let svc = Writes::held();
    let hold = Arc::clone(svc.hold.as_ref().unwrap());
    let store = Arc::new(Watched {
        inner: memory(IdempotencyConfig::default()),
        in_flight: Semaphore::new(0),
    });
    let idem = IdempotencyLayer::new()
        .with_store(store.clone())
        .with_in_flight_pushback(ms(20));
    let stats = idem.stats();
    let addr = serve(svc.clone(), idem, None).await;
    let mut first_client = plain(addr).await;
    let first = tokio::spawn(async move { first_client.reserve(with_key("f", "k-busy")).await });
    signals(&hold.entered, 1).await;
    // A plain client sees the answer as it is.
    let mut duplicate = plain(addr).await;
    let err = tokio::select! {
        biased;
        answer = duplicate.reserve(with_key("f", "k-busy")) => answer.unwrap_err(),
        _ = signals(&hold.entered, 1) => panic!("the duplicate ran the handler"),
    };
    assert_eq!(err.code(), Code::Aborted);
    assert_eq!(err.message(), MESSAGE_IN_FLIGHT);
    let md = err.metadata();
    assert_eq!(md.get("grpc-retry-pushback-ms").unwrap(), "20");
    assert_eq!(md.get("stormguard-unprocessed").unwrap(), "1");
    // A keyed stormguard client waits out the pushback and asks again: once the first run
    // completes, it gets the first run's answer.
    let mut keyed = client(addr, retry_layer(write_policy(5, false), true)).await;
    signals(&store.in_flight, 1).await; // the plain client's
    let waiting = tokio::spawn(async move { keyed.reserve(with_key("f", "k-busy")).await });
    // The keyed client's first attempt.
    before_a_run(&store.in_flight, &hold, "the keyed client's attempt").await;
    hold.release.add_permits(1);
    let first = first.await.unwrap().unwrap();
    let waited = waiting.await.unwrap().unwrap();
    assert_eq!(waited.get_ref(), first.get_ref());
    assert_eq!(svc.runs().len(), 1, "the handler ran once");
    let s = stats.snapshot();
    assert!(s.in_flight >= 2, "{s:?}");
    assert!(s.replayed >= 1, "{s:?}");
}

#[tokio::test(start_paused = true)]
async fn a_hedge_that_finds_its_key_in_flight_is_a_lost_copy_not_the_answer() {
    let svc = Writes::held();
    let hold = Arc::clone(svc.hold.as_ref().unwrap());
    let store = Arc::new(Watched {
        inner: memory(IdempotencyConfig::default()),
        in_flight: Semaphore::new(0),
    });
    let addr = serve(
        svc.clone(),
        IdempotencyLayer::new().with_store(store.clone()),
        None,
    )
    .await;
    let mut table = MethodTable::none();
    table.set_hedging(
        MethodScope::Default,
        Some(HedgingPolicy {
            max_attempts: 2,
            delay: HedgeDelay::Fixed(ms(10)),
            ..HedgingPolicy::default()
        }),
    );
    table.set_idempotency_key(MethodScope::Default, true);
    let layer = RetryLayer::new(RetryController::new(table, budget(100, 0.1), None, 7).unwrap());
    let mut client = client(addr, layer).await;
    let call = tokio::spawn(async move { client.reserve(reserve("h")).await });
    signals(&hold.entered, 1).await;
    before_a_run(&store.in_flight, &hold, "the hedge").await;
    hold.release.add_permits(1);
    let reply = call.await.unwrap().unwrap();
    assert_eq!(reply.get_ref().attempt, 1, "the first copy's answer");
    assert_eq!(svc.runs().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_hostile_key_is_refused_and_never_reaches_the_handler() {
    let svc = Writes::default();
    let store = memory(IdempotencyConfig::default());
    let idem = IdempotencyLayer::new().with_store(store.clone());
    let stats = idem.stats();
    let addr = serve(svc.clone(), idem, None).await;
    let mut client = plain(addr).await;
    let long = "k".repeat(129);
    let mut repeated = with_key("r", "one");
    repeated.metadata_mut().append(KEY, "two".parse().unwrap());
    let mut non_ascii = Request::new(reserve("n"));
    non_ascii.metadata_mut().insert(
        KEY,
        tonic::metadata::MetadataValue::try_from(&b"caf\xc3\xa9"[..]).unwrap(),
    );
    for req in [
        with_key("s", "has space"),
        with_key("l", &long),
        with_key("e", ""),
        repeated,
        non_ascii,
    ] {
        let err = client.reserve(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(
            err.message().contains("idempotency-key"),
            "{}",
            err.message()
        );
    }
    assert!(svc.runs().is_empty());
    assert_eq!(store.counts().entries, 0, "nothing stored");
    assert_eq!(stats.snapshot().invalid, 5);
}

#[tokio::test(start_paused = true)]
async fn the_store_s_bounds_hold_over_tonic() {
    let svc = Writes::default();
    // Two keys at most, and a time to live of a minute.
    let store = memory(IdempotencyConfig {
        max_entries: 2,
        ttl: Duration::from_secs(60),
        ..IdempotencyConfig::default()
    });
    let addr = serve(
        svc.clone(),
        IdempotencyLayer::new().with_store(store.clone()),
        None,
    )
    .await;
    let mut client = plain(addr).await;
    for key in ["a", "b", "c"] {
        client.reserve(with_key(key, key)).await.unwrap();
    }
    assert_eq!(store.counts().entries, 2);
    assert_eq!(store.counts().evictions, 1);
    client.reserve(with_key("c", "c")).await.unwrap();
    assert_eq!(svc.runs().len(), 3, "c is recorded");
    client.reserve(with_key("a", "a")).await.unwrap();
    assert_eq!(svc.runs().len(), 4, "a was evicted: it runs again");
    // Past the time to live, a key runs again.
    client.reserve(with_key("c", "c")).await.unwrap();
    assert_eq!(svc.runs().len(), 4);
    tokio::time::advance(Duration::from_secs(61)).await;
    client.reserve(with_key("c", "c")).await.unwrap();
    assert_eq!(svc.runs().len(), 5);
    assert!(store.counts().expired >= 1);
    assert!(store.counts().bytes <= store.config().max_bytes);
}

#[tokio::test(start_paused = true)]
async fn an_answer_too_large_to_record_is_sent_and_a_repeat_learns_it_ran() {
    let svc = Writes::default();
    let store = memory(IdempotencyConfig {
        // Less than the reply's one gRPC frame (5 bytes of framing and the message).
        max_record_bytes: 8,
        ..IdempotencyConfig::default()
    });
    let idem = IdempotencyLayer::new().with_store(store.clone());
    let stats = idem.stats();
    let addr = serve(svc.clone(), idem, None).await;
    let mut client = plain(addr).await;
    let reply = client.reserve(with_key("big", "big")).await.unwrap();
    assert!(reply.get_ref().reserved, "the answer itself is sent whole");
    let err = client.reserve(with_key("big", "big")).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    assert_eq!(err.message(), MESSAGE_NOT_KEPT);
    assert_eq!(svc.runs().len(), 1, "the repeat did not run");
    assert_eq!(stats.snapshot().oversize, 1);
}

#[tokio::test(start_paused = true)]
async fn at_every_bound_an_answer_is_sent_whole_and_a_repeat_never_runs() {
    // Bounds from below the body to above the whole answer: wherever the bound falls (in
    // the body, in the trailers, past both), the first caller gets the whole answer (its
    // status included) and the repeat is either the recorded answer or "not kept".
    let (mut kept, mut not_kept) = (0, 0);
    for limit in (4..=120).step_by(4) {
        let svc = Writes::default();
        let store = memory(IdempotencyConfig {
            max_record_bytes: limit,
            ..IdempotencyConfig::default()
        });
        let addr = serve(svc.clone(), IdempotencyLayer::new().with_store(store), None).await;
        let mut client = plain(addr).await;
        let first = client.reserve(with_key("k", "k")).await.unwrap();
        assert!(first.get_ref().reserved, "limit {limit}");
        match client.reserve(with_key("k", "k")).await {
            Ok(again) => {
                assert_eq!(again.get_ref(), first.get_ref(), "limit {limit}");
                kept += 1;
            }
            Err(e) => {
                assert_eq!(
                    (e.code(), e.message()),
                    (Code::AlreadyExists, MESSAGE_NOT_KEPT)
                );
                not_kept += 1;
            }
        }
        assert_eq!(svc.runs().len(), 1, "limit {limit}: the repeat did not run");
    }
    assert!(kept > 0 && not_kept > 0, "kept {kept}, not kept {not_kept}");
}

/// What the lossy run of `calls` logical writes did.
struct LossyRun {
    ok: usize,
    failed: usize,
    lost: u64,
    executions: HashMap<String, usize>,
}

/// `calls` logical writes, 16 at a time, through `layer` to a server that loses 5 % of
/// its answers after the handler ran, and deduplicates keys.
async fn lossy_writes(layer: RetryLayer, calls: usize) -> LossyRun {
    let svc = Writes::default();
    let lost = Arc::new(AtomicU64::new(0));
    let lossy = LoseAnswers {
        seed: 2121,
        percent: 5,
        lost: Arc::clone(&lost),
    };
    let idem = IdempotencyLayer::new().with_store(memory(IdempotencyConfig::default()));
    let addr = serve(svc.clone(), idem, Some(lossy)).await;
    let client = client(addr, layer).await;
    let results = Arc::new(Mutex::new((0usize, 0usize)));
    let mut tasks = Vec::new();
    for worker in 0..16 {
        let mut client = client.clone();
        let results = Arc::clone(&results);
        tasks.push(tokio::spawn(async move {
            for i in (worker..calls).step_by(16) {
                let id = format!("w-{i}");
                let mut req = Request::new(reserve(&id));
                // The lossy layer's draw: the call's id, on every attempt.
                req.metadata_mut().insert(CALL_HEADER, id.parse().unwrap());
                let ok = client.reserve(req).await.is_ok();
                let mut r = results.lock().unwrap();
                if ok { r.0 += 1 } else { r.1 += 1 }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (ok, failed) = *results.lock().unwrap();
    LossyRun {
        ok,
        failed,
        lost: lost.load(Ordering::Relaxed),
        executions: svc.executions(),
    }
}

impl std::fmt::Debug for LossyRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let runs: usize = self.executions.values().sum();
        let duplicated = self.executions.values().filter(|n| **n > 1).count();
        write!(
            f,
            "ok {}, failed {}, answers lost {}, executions {runs} for {} calls, {duplicated} done more than once",
            self.ok,
            self.failed,
            self.lost,
            self.executions.len()
        )
    }
}

const CALLS: usize = 400;

#[tokio::test(start_paused = true)]
async fn a_keyed_write_with_lost_answers_executes_exactly_once_per_logical_call() {
    // Not idempotent, but keyed: retried after it may have run, and the server recognises
    // the key.
    let run = lossy_writes(retry_layer(write_policy(5, false), true), CALLS).await;
    println!("keyed: {run:?}");
    assert!(run.lost >= 5, "the fault ran: {} answers lost", run.lost);
    assert_eq!(run.ok, CALLS, "every logical call succeeded: {run:?}");
    assert_eq!(run.executions.len(), CALLS);
    let duplicated = run.executions.values().filter(|n| **n > 1).count();
    assert_eq!(duplicated, 0, "0 duplicates");
    assert_eq!(run.executions.values().sum::<usize>(), CALLS);
}

#[tokio::test(start_paused = true)]
async fn without_a_key_a_lost_answer_is_either_not_retried_or_done_twice() {
    // Today's rule: a write that may have run is not retried. Every lost answer is a
    // failed call, though the write happened.
    let run = lossy_writes(retry_layer(write_policy(5, false), false), CALLS).await;
    println!("unkeyed: {run:?}");
    assert!(run.lost >= 5, "{run:?}");
    assert_eq!(
        run.failed as u64, run.lost,
        "each lost answer fails its call: {run:?}"
    );
    assert_eq!(run.executions.values().sum::<usize>(), CALLS);
    // Forced retries without a key: each lost answer's retry runs the write again.
    let run = lossy_writes(retry_layer(write_policy(5, true), false), CALLS).await;
    println!("forced: {run:?}");
    assert_eq!(run.ok, CALLS, "{run:?}");
    let duplicated = run.executions.values().filter(|n| **n > 1).count();
    assert!(duplicated >= 5, "writes done twice: {duplicated} ({run:?})");
    assert_eq!(
        run.executions.values().sum::<usize>() as u64,
        CALLS as u64 + run.lost,
        "one extra execution per lost answer"
    );
}
