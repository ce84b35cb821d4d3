//! The default, adaptive worker limit on the `ShedLayer` across service shapes, against
//! the fixed limit an operator who measured the capacity would set. Each handler is a
//! tower service behind the real layer on paused time: its inner resource is a FIFO pool
//! of permits (a connection pool, a semaphore), so the calls the layer lets in beyond it
//! wait inside the handler, where the layer cannot order, expire or shed them. Callers
//! send `grpc-timeout`; the layer cuts a call at its deadline and drops its work, as a
//! tonic handler behind a semaphore does.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use std::future::Future;

use bytes::Bytes;
use http_body::Frame;
use stormguard_server::{AdmissionConfig, ShedLayer, ShedStats, WorkerLimit};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

const MS: Duration = Duration::from_millis(1);

/// The handler's pool: `permits` (more may be added mid-run), each held `service` ×
/// the factor in `slow` (a slowdown of the resource).
#[derive(Clone)]
struct Pool {
    permits: Arc<Semaphore>,
    service: Duration,
    slow_per_mille: Arc<AtomicU64>,
}

impl Pool {
    fn new(permits: usize, service: Duration) -> Self {
        Pool {
            permits: Arc::new(Semaphore::new(permits)),
            service,
            slow_per_mille: Arc::new(AtomicU64::new(1000)),
        }
    }

    async fn use_once(&self) {
        let _permit = self.permits.acquire().await.expect("open");
        let factor = self.slow_per_mille.load(Ordering::Relaxed) as f64 / 1000.0;
        tokio::time::sleep(self.service.mul_f64(factor)).await;
    }
}

/// How a run offers calls: `callers` closed loops, or an open loop at `per_second`.
#[derive(Clone, Copy)]
enum Offer {
    Closed { callers: usize },
    Open { per_second: f64 },
}

/// Calls answered OK, per 100 ms of the run, and the layer's stats.
struct Run {
    served: Vec<u64>,
    stats: ShedStats,
}

impl Run {
    /// Calls served from `from` to `to` seconds into the run.
    fn between(&self, from: f64, to: f64) -> u64 {
        let (a, b) = ((from * 10.0) as usize, (to * 10.0) as usize);
        self.served[a..b.min(self.served.len())].iter().sum()
    }
}

type Handler =
    tower::util::BoxCloneSyncService<http::Request<String>, http::Response<String>, Infallible>;

/// The handler over `pool`: one use of it per call.
fn pool_handler(pool: &Pool) -> Handler {
    let pool = pool.clone();
    tower::util::BoxCloneSyncService::new(tower::service_fn(move |_req: http::Request<String>| {
        let pool = pool.clone();
        async move {
            pool.use_once().await;
            Ok::<_, Infallible>(http::Response::new(String::new()))
        }
    }))
}

/// Offers calls with `timeout` to `handler` behind a layer of `admission` for `secs`
/// (the `schedule` runs beside it: a slowdown, added permits).
async fn run(
    admission: AdmissionConfig,
    handler: Handler,
    offer: Offer,
    timeout: Duration,
    secs: u64,
) -> Run {
    let layer = ShedLayer::from_config(admission).expect("valid");
    let stats = layer.stats();
    let service = layer.layer(handler);
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let served: Arc<Vec<AtomicU64>> = Arc::new((0..secs * 10).map(|_| AtomicU64::new(0)).collect());
    let call = {
        let served = Arc::clone(&served);
        move || {
            let service = service.clone();
            let served = Arc::clone(&served);
            async move {
                let mut request = http::Request::new(String::new());
                let ms = timeout.as_millis().to_string();
                request
                    .headers_mut()
                    .insert("grpc-timeout", format!("{ms}m").parse().expect("header"));
                let response = service.oneshot(request).await.expect("infallible");
                let ok = response.headers().get("grpc-status").is_none();
                let slot = start.elapsed().as_millis() as usize / 100;
                if ok && let Some(count) = served.get(slot) {
                    count.fetch_add(1, Ordering::Relaxed);
                }
                ok
            }
        }
    };
    let mut calls = JoinSet::new();
    match offer {
        Offer::Closed { callers } => {
            for _ in 0..callers {
                let call = call.clone();
                calls.spawn(async move {
                    while Instant::now() < end {
                        if !call().await {
                            // A shed answer comes at once: come back a little later.
                            tokio::time::sleep(MS).await;
                        }
                    }
                });
            }
        }
        Offer::Open { per_second } => {
            let mut rng = fastrand::Rng::with_seed(3);
            let mut at = start;
            while at < end {
                tokio::time::sleep_until(at).await;
                let call = call.clone();
                calls.spawn(async move {
                    call().await;
                });
                let gap = -(1.0 - rng.f64()).ln() / per_second;
                at += Duration::from_secs_f64(gap);
            }
        }
    }
    while calls.join_next().await.is_some() {}
    let served = served.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    Run { served, stats }
}

fn fixed(n: usize) -> AdmissionConfig {
    AdmissionConfig {
        workers: WorkerLimit::Fixed(n),
        ..AdmissionConfig::default()
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn behind_a_pool_the_default_serves_what_the_right_fixed_limit_does() {
    // 8 permits x 10 ms, 64 callers giving up after 50 ms: the old default of 64
    // fixed workers lets them all in, every call waits 80 ms inside, and none succeeds.
    let go = |admission| {
        let pool = Pool::new(8, 10 * MS);
        run(
            admission,
            pool_handler(&pool),
            Offer::Closed { callers: 64 },
            50 * MS,
            3,
        )
    };
    let right = go(fixed(8)).await.between(1.0, 3.0);
    let default = go(AdmissionConfig::default()).await;
    let guess = go(fixed(64)).await.between(1.0, 3.0);
    let ratio = default.between(1.0, 3.0) as f64 / right as f64;
    eprintln!("pool of 8: default {ratio:.3}x of workers = 8; 64 fixed: {guess}, 8 fixed: {right}");
    assert!(ratio >= 0.97, "{ratio:.3}x");
    assert!(guess * 10 < right, "{guess} against {right}");
    let snapshot = default.stats.snapshot();
    assert!(snapshot.adaptive_limit);
    assert!((8..=10).contains(&snapshot.worker_limit), "{snapshot:?}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn through_a_slowdown_the_default_serves_what_the_right_fixed_limit_does() {
    // The storm's trigger: 78 % of 8 x 10 ms offered, the service time x2.5 from 1 s to
    // 3 s (the pool then serves about half of what is offered), 50 ms per call.
    let go = |admission| async move {
        let pool = Pool::new(8, 10 * MS);
        let slow = Arc::clone(&pool.slow_per_mille);
        let trigger = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            slow.store(2500, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_secs(2)).await;
            slow.store(1000, Ordering::Relaxed);
        });
        let offer = Offer::Open { per_second: 624.0 };
        let run = run(admission, pool_handler(&pool), offer, 50 * MS, 4).await;
        trigger.await.expect("trigger");
        run
    };
    let right = go(fixed(8)).await;
    let default = go(AdmissionConfig::default()).await;
    let during = default.between(1.0, 3.0) as f64 / right.between(1.0, 3.0) as f64;
    let before = default.between(0.0, 1.0) as f64 / right.between(0.0, 1.0) as f64;
    let after = default.between(3.0, 4.0) as f64 / right.between(3.0, 4.0) as f64;
    eprintln!("slowdown: default {before:.3}x before, {during:.3}x during, {after:.3}x after");
    assert!(during >= 0.95, "{during:.3}x during");
    assert!(
        before >= 0.98 && after >= 0.98,
        "{before:.3}x before, {after:.3}x after"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_tiny_server_and_a_large_one_are_served_at_their_capacity() {
    // One permit x 10 ms: 100 calls/s.
    let pool = Pool::new(1, 10 * MS);
    let offer = Offer::Closed { callers: 4 };
    let tiny = run(
        AdmissionConfig::default(),
        pool_handler(&pool),
        offer,
        100 * MS,
        3,
    )
    .await;
    let share = tiny.between(1.0, 3.0) as f64 / 200.0;
    eprintln!("1 permit: {share:.3} of capacity");
    assert!(share >= 0.95, "{share:.3}");
    // 200 permits x 5 ms: 40 000 calls/s, which the default must reach within 2 s of
    // start (not cap at a start value or crawl up to it).
    let pool = Pool::new(200, 5 * MS);
    let offer = Offer::Closed { callers: 400 };
    let large = run(
        AdmissionConfig::default(),
        pool_handler(&pool),
        offer,
        100 * MS,
        2,
    )
    .await;
    let share = large.between(1.5, 2.0) as f64 / 20_000.0;
    eprintln!("200 permits: {share:.3} of capacity from 1.5 s to 2 s");
    assert!(share >= 0.97, "{share:.3}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_limit_follows_a_capacity_that_rises_mid_run() {
    // 8 permits x 10 ms, 8 more from 2 s: within 2 s the default serves the 16.
    let pool = Pool::new(8, 10 * MS);
    let permits = Arc::clone(&pool.permits);
    let grow = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        permits.add_permits(8);
    });
    let offer = Offer::Closed { callers: 48 };
    let run = run(
        AdmissionConfig::default(),
        pool_handler(&pool),
        offer,
        100 * MS,
        4,
    )
    .await;
    grow.await.expect("grow");
    let share = run.between(3.5, 4.0) as f64 / 800.0;
    eprintln!("16 permits from 2 s: {share:.3} of capacity from 3.5 s to 4 s");
    assert!(share >= 0.97, "{share:.3}");
}

/// A response body that ends `after` its handler answered: a stream that runs on.
struct Streaming {
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl http_body::Body for Streaming {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.sleep.as_mut().poll(cx).map(|()| None)
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_response_stream_that_runs_for_seconds_is_not_read_as_queueing() {
    // Unary calls over 8 permits x 10 ms, beside 4 streams that answer at once and
    // then stream for 3 s each (no permit), three in a row from 0.5 s: the streams hold
    // workers, but their length is no latency of the handler's.
    let pool = Pool::new(8, 10 * MS);
    let layer = ShedLayer::from_config(AdmissionConfig::default()).expect("valid");
    let stats = layer.stats();
    let streams = layer
        .clone()
        .layer(tower::service_fn(|_req: http::Request<String>| async {
            let sleep = Box::pin(tokio::time::sleep(Duration::from_secs(3)));
            Ok::<_, Infallible>(http::Response::new(Streaming { sleep }))
        }));
    let mut open = JoinSet::new();
    for _ in 0..4 {
        let streams = streams.clone();
        open.spawn(async move {
            use http_body_util::BodyExt;
            // From after the first probe: streams come and go while the server runs.
            tokio::time::sleep(Duration::from_millis(500)).await;
            for _ in 0..3 {
                let response = streams.clone().oneshot(http::Request::default()).await;
                let body = response.expect("infallible").into_body();
                body.collect().await.expect("infallible");
            }
        });
    }
    let unary = layer.layer(pool_handler(&pool));
    let served = Arc::new(AtomicU64::new(0));
    let mut callers = JoinSet::new();
    for _ in 0..24 {
        let (unary, served) = (unary.clone(), Arc::clone(&served));
        callers.spawn(async move {
            let end = Instant::now() + Duration::from_secs(9);
            while Instant::now() < end {
                let response = unary.clone().oneshot(http::Request::default()).await;
                if response
                    .expect("infallible")
                    .headers()
                    .get("grpc-status")
                    .is_none()
                {
                    served.fetch_add(1, Ordering::Relaxed);
                } else {
                    tokio::time::sleep(MS).await;
                }
            }
        });
    }
    while callers.join_next().await.is_some() {}
    while open.join_next().await.is_some() {}
    // 9 s at 800 calls/s, less the first probe's few milliseconds.
    let share = served.load(Ordering::Relaxed) as f64 / 7200.0;
    eprintln!(
        "beside 4 streams of 3 s: unary {share:.3} of capacity; {:?}",
        stats.snapshot()
    );
    assert!(share >= 0.97, "{share:.3}");
}
