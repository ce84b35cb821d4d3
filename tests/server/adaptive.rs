//! The default, adaptive worker limit on the `ShedLayer` across service shapes, against
//! the fixed limit an operator who measured the capacity would set. Each handler is a
//! tower service behind the real layer on paused time: its inner resource is a FIFO pool
//! of permits (a connection pool, a semaphore), so the calls the layer lets in beyond it
//! wait inside the handler, where the layer cannot order, expire or shed them. Callers
//! send `grpc-timeout`; the layer cuts a call at its deadline and drops its work, as a
//! tonic handler behind a semaphore does.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body::Frame;
use stormguard_server::{AdmissionConfig, ShedLayer, ShedStats, WorkerLimit};
use tokio::sync::{Semaphore, watch};
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

/// The handler's processors: `threads` runtime threads shared by every call in the
/// handler. Each call needs `work` of CPU × the factor in `slow`, and with `k` calls in,
/// each progresses at `min(1, threads / k)` of real speed (processor sharing): latency
/// grows smoothly with the calls let in, nothing waits in line. A call dropped mid-run
/// (cut at its deadline) gives its share back at once.
#[derive(Clone)]
struct Cpu {
    sharing: Arc<Mutex<Sharing>>,
    /// Bumped when a call leaves before its work is done: the others finish sooner.
    left_early: watch::Sender<u64>,
    work: Duration,
    slow_per_mille: Arc<AtomicU64>,
}

/// The calls on the processors, and the CPU each still needs.
struct Sharing {
    threads: f64,
    /// Up to when the CPU given to the calls is accounted.
    at: Instant,
    /// Each call in, by id: the CPU seconds it still needs.
    needs: HashMap<u64, f64>,
    /// Calls whose work is done, not yet collected by their future.
    done: HashSet<u64>,
    next_id: u64,
}

/// CPU seconds below which a call's work counts as done (float rounding).
const EPSILON: f64 = 1e-9;

impl Sharing {
    /// The speed of each call with `k` calls in.
    fn rate(&self, k: usize) -> f64 {
        (self.threads / k as f64).min(1.0)
    }

    /// Accounts the CPU given until `now`, one finishing call at a time (each that
    /// finishes raises the others' share from then on).
    fn advance_to(&mut self, now: Instant) {
        while let Some((&id, &least)) = self.needs.iter().min_by(|a, b| a.1.total_cmp(b.1)) {
            let rate = self.rate(self.needs.len());
            let span = now.saturating_duration_since(self.at).as_secs_f64();
            let until_done = least.max(0.0) / rate;
            if until_done > span + EPSILON {
                self.needs.values_mut().for_each(|n| *n -= span * rate);
                break;
            }
            self.needs
                .values_mut()
                .for_each(|n| *n -= until_done * rate);
            self.at = (self.at + Duration::from_secs_f64(until_done)).min(now);
            self.needs.remove(&id);
            self.done.insert(id);
        }
        self.at = now;
    }

    /// When call `id` finishes if no other call comes in: the calls that need less
    /// finish first, each raising the share of the rest.
    fn finish_of(&self, id: u64) -> Instant {
        let mine = self.needs.get(&id).copied().unwrap_or(0.0);
        let mut needs: Vec<f64> = self.needs.values().copied().collect();
        needs.sort_unstable_by(f64::total_cmp);
        let (mut secs, mut given) = (0.0, 0.0);
        for (i, &need) in needs.iter().enumerate() {
            secs += (need - given).max(0.0) / self.rate(needs.len() - i);
            given = need;
            if need >= mine {
                break;
            }
        }
        self.at + Duration::from_secs_f64(secs)
    }
}

impl Cpu {
    fn new(threads: usize, work: Duration) -> Self {
        Cpu {
            sharing: Arc::new(Mutex::new(Sharing {
                threads: threads as f64,
                at: Instant::now(),
                needs: HashMap::new(),
                done: HashSet::new(),
                next_id: 0,
            })),
            left_early: watch::Sender::new(0),
            work,
            slow_per_mille: Arc::new(AtomicU64::new(1000)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sharing> {
        self.sharing.lock().expect("not poisoned")
    }

    /// One call's work: returns once the processors gave it all the CPU it needs.
    async fn use_once(&self) {
        let factor = self.slow_per_mille.load(Ordering::Relaxed) as f64 / 1000.0;
        let mut left_early = self.left_early.subscribe();
        let id = {
            let mut sharing = self.lock();
            sharing.advance_to(Instant::now());
            let id = sharing.next_id;
            sharing.next_id += 1;
            sharing.needs.insert(id, self.work.as_secs_f64() * factor);
            id
        };
        let _leave = LeaveCpu { cpu: self, id };
        loop {
            left_early.borrow_and_update();
            let finish = {
                let mut sharing = self.lock();
                sharing.advance_to(Instant::now());
                if sharing.done.remove(&id) {
                    return;
                }
                sharing.finish_of(id)
            };
            // A call that came in since delays the finish: woken early, this looks again.
            tokio::select! {
                () = tokio::time::sleep_until(finish) => {}
                _ = left_early.changed() => {}
            }
        }
    }
}

/// Takes a call off the processors when its future is dropped mid-run.
struct LeaveCpu<'a> {
    cpu: &'a Cpu,
    id: u64,
}

impl Drop for LeaveCpu<'_> {
    fn drop(&mut self) {
        let mut sharing = self.cpu.lock();
        sharing.advance_to(Instant::now());
        sharing.done.remove(&self.id);
        if sharing.needs.remove(&self.id).is_some() {
            drop(sharing);
            self.cpu.left_early.send_modify(|n| *n += 1);
        }
    }
}

/// How a run offers calls: `callers` closed loops, or an open loop at `per_second`.
#[derive(Clone, Copy)]
enum Offer {
    Closed { callers: usize },
    Open { per_second: f64 },
}

/// Calls answered OK and the worker limit, per 100 ms of the run, and the layer's stats.
struct Run {
    served: Vec<u64>,
    limits: Vec<usize>,
    stats: ShedStats,
}

impl Run {
    /// Calls served from `from` to `to` seconds into the run.
    fn between(&self, from: f64, to: f64) -> u64 {
        let (a, b) = ((from * 10.0) as usize, (to * 10.0) as usize);
        self.served[a..b.min(self.served.len())].iter().sum()
    }

    /// The highest worker limit seen from `from` to `to` seconds into the run.
    fn highest_limit(&self, from: f64, to: f64) -> usize {
        let (a, b) = ((from * 10.0) as usize, (to * 10.0) as usize);
        let limits = &self.limits[a..b.min(self.limits.len())];
        limits.iter().copied().max().unwrap_or(0)
    }
}

type Handler =
    tower::util::BoxCloneSyncService<http::Request<String>, http::Response<String>, Infallible>;

/// The handler over a `resource`: one `work` on it per call.
fn handler<R, F, Fut>(resource: &R, work: F) -> Handler
where
    R: Clone + Send + Sync + 'static,
    F: Fn(R) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let resource = resource.clone();
    tower::util::BoxCloneSyncService::new(tower::service_fn(move |_req: http::Request<String>| {
        let (resource, work) = (resource.clone(), work.clone());
        async move {
            work(resource).await;
            Ok::<_, Infallible>(http::Response::new(String::new()))
        }
    }))
}

/// The handler over `pool`: one use of it per call.
fn pool_handler(pool: &Pool) -> Handler {
    handler(pool, |pool| async move { pool.use_once().await })
}

/// The handler over `cpu`: one call's work on it per call.
fn cpu_handler(cpu: &Cpu) -> Handler {
    handler(cpu, |cpu| async move { cpu.use_once().await })
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
    let layer = ShedLayer::from_config(&admission).expect("valid");
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
    let limits = {
        let stats = stats.clone();
        tokio::spawn(async move {
            let mut limits = Vec::new();
            let mut every = tokio::time::interval(100 * MS);
            for _ in 0..secs * 10 {
                every.tick().await;
                limits.push(stats.workers());
            }
            limits
        })
    };
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
    let limits = limits.await.expect("limits");
    Run {
        served,
        limits,
        stats,
    }
}

/// From 1 s to 3 s into a run, the work behind `slow` takes 2.5 times as long: the
/// storm's trigger.
fn slow_down(slow: &Arc<AtomicU64>) -> tokio::task::JoinHandle<()> {
    let slow = Arc::clone(slow);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        slow.store(2500, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(2)).await;
        slow.store(1000, Ordering::Relaxed);
    })
}

/// `handler` behind a `ShedLayer` of `admission`, as a handler a layer above may call
/// (its answer's body read to the end), and the layer's stats.
fn behind(admission: AdmissionConfig, handler: Handler) -> (Handler, ShedStats) {
    let layer = ShedLayer::from_config(&admission).expect("valid");
    let stats = layer.stats();
    let service = layer.layer(handler);
    let handler = tower::service_fn(move |req: http::Request<String>| {
        let service = service.clone();
        async move {
            use http_body_util::BodyExt;
            let (parts, body) = service.oneshot(req).await?.into_parts();
            let body = body.collect().await?.to_bytes();
            let body = String::from_utf8_lossy(&body).into_owned();
            Ok::<_, Infallible>(http::Response::from_parts(parts, body))
        }
    });
    (tower::util::BoxCloneSyncService::new(handler), stats)
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
        let trigger = slow_down(&pool.slow_per_mille);
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
    let layer = ShedLayer::from_config(&AdmissionConfig::default()).expect("valid");
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

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn on_the_runtimes_threads_the_default_serves_what_workers_equal_to_threads_do() {
    // A CPU-bound handler: 4 threads, 20 ms of CPU per call (200 calls/s), 64 callers
    // giving up after 200 ms. 64 fixed workers share the threads 16 ways: every call
    // takes 320 ms, and none succeeds. (A call's answer is seen on the next millisecond
    // of the paused clock; 20 ms of work keeps that rounding below the ratio's noise.)
    let go = |admission| {
        let cpu = Cpu::new(4, 20 * MS);
        let offer = Offer::Closed { callers: 64 };
        run(admission, cpu_handler(&cpu), offer, 200 * MS, 3)
    };
    let right = go(fixed(4)).await.between(1.0, 3.0);
    let default = go(AdmissionConfig::default()).await;
    let guess = go(fixed(64)).await.between(1.0, 3.0);
    let ratio = default.between(1.0, 3.0) as f64 / right as f64;
    eprintln!("4 threads: default {ratio:.3}x of workers = 4; 64 fixed: {guess}, 4 fixed: {right}");
    assert!(ratio >= 0.98, "{ratio:.3}x");
    assert!(guess * 10 < right, "{guess} against {right}");
    let snapshot = default.stats.snapshot();
    assert!((4..=6).contains(&snapshot.worker_limit), "{snapshot:?}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn on_the_runtimes_threads_through_a_slowdown_the_default_serves_what_workers_equal_to_threads_do()
 {
    // 78 % of 4 threads x 20 ms offered, the CPU per call x2.5 from 1 s to 3 s, 200 ms
    // per call. 64 fixed workers let the slowdown's backlog onto the threads, where
    // every call slows every other.
    let go = |admission| async move {
        let cpu = Cpu::new(4, 20 * MS);
        let trigger = slow_down(&cpu.slow_per_mille);
        let offer = Offer::Open { per_second: 156.0 };
        let run = run(admission, cpu_handler(&cpu), offer, 200 * MS, 4).await;
        trigger.await.expect("trigger");
        run
    };
    let right = go(fixed(4)).await;
    let default = go(AdmissionConfig::default()).await;
    let guess = go(fixed(64)).await.between(1.0, 3.0);
    let during = default.between(1.0, 3.0) as f64 / right.between(1.0, 3.0) as f64;
    let before = default.between(0.0, 1.0) as f64 / right.between(0.0, 1.0) as f64;
    let after = default.between(3.0, 4.0) as f64 / right.between(3.0, 4.0) as f64;
    eprintln!(
        "4 threads, slowdown: default {before:.3}x before, {during:.3}x during, {after:.3}x \
         after; 64 fixed during: {guess}, 4 fixed: {}",
        right.between(1.0, 3.0)
    );
    assert!(during >= 0.98, "{during:.3}x during");
    assert!(
        before >= 0.98 && after >= 0.98,
        "{before:.3}x before, {after:.3}x after"
    );
    assert!(guess * 2 < right.between(1.0, 3.0), "{guess} fixed at 64");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn in_a_chain_through_a_downstream_slowdown_the_default_serves_what_fixed_limits_do() {
    // The handler calls a downstream service, itself behind a `ShedLayer` over a pool of
    // 8 x 10 ms, slowed x2.5 from 1 s to 3 s; 78 % of it offered upstream, 50 ms per
    // call (the upstream cuts a call at its deadline, and with it the downstream call).
    let go = |upstream, downstream| async move {
        let pool = Pool::new(8, 10 * MS);
        let trigger = slow_down(&pool.slow_per_mille);
        let (downstream, _) = behind(downstream, pool_handler(&pool));
        let offer = Offer::Open { per_second: 624.0 };
        let run = run(upstream, downstream, offer, 50 * MS, 4).await;
        trigger.await.expect("trigger");
        run
    };
    let default = AdmissionConfig::default;
    // Both layers at the downstream's capacity: what an operator who measured it sets.
    let right = go(fixed(8), fixed(8)).await;
    let ours = go(default(), default()).await;
    // Only the upstream's fixed: it caps what reaches the downstream's default limit.
    let upstream_fixed = go(fixed(8), default()).await.between(1.0, 3.0);
    let during = ours.between(1.0, 3.0) as f64 / right.between(1.0, 3.0) as f64;
    let before = ours.between(0.0, 1.0) as f64 / right.between(0.0, 1.0) as f64;
    let after = ours.between(3.0, 4.0) as f64 / right.between(3.0, 4.0) as f64;
    let highest = ours.highest_limit(0.0, 4.0);
    eprintln!(
        "chain, slowdown: both default {before:.3}x of both at 8 before, {during:.3}x \
         during, {after:.3}x after; the upstream's limit at most {highest}; the upstream \
         at 8 over the downstream's default: {upstream_fixed} during, both at 8: {}",
        right.between(1.0, 3.0)
    );
    assert!(ours.between(1.0, 3.0) as f64 >= 0.98 * upstream_fixed as f64);
    // Behind an upstream of fixed limit, the downstream's callers leave when their
    // deadline passes mid-call: its default limit still finds the slower floor rather
    // than reading every window as calls queued inside (it fell to its floor and served
    // a tenth of this).
    let capped = upstream_fixed as f64 / right.between(1.0, 3.0) as f64;
    assert!(capped >= 0.95, "{capped:.3}x with the upstream at 8");
    // As behind one layer (`through_a_slowdown_...`): the default serves about 0.97x
    // while the floor it steers by is rising.
    assert!(during >= 0.95, "{during:.3}x during");
    // The upstream learns the downstream's capacity, not more.
    assert!(highest <= 16, "the upstream's limit reached {highest}");
    assert!(
        before >= 0.98 && after >= 0.98,
        "{before:.3}x before, {after:.3}x after"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn answers_that_were_not_served_do_not_raise_the_limit() {
    // A third of the calls are answered `UNAVAILABLE` at once (the handler passes on its
    // own dependency's shed); the others use a pool of 8 permits x 10 ms. Read as fast
    // successes they would drag the latency floor down and the limit up, and the calls
    // let in beyond the pool would wait inside it past their callers' 50 ms.
    let pool = Pool::new(8, 10 * MS);
    let calls = Arc::new(AtomicU64::new(0));
    let handler = tower::service_fn(move |_req: http::Request<String>| {
        let (pool, calls) = (pool.clone(), Arc::clone(&calls));
        async move {
            if calls.fetch_add(1, Ordering::Relaxed) % 3 == 0 {
                let mut refused = http::Response::new(String::new());
                let unavailable = http::HeaderValue::from_static("14");
                refused.headers_mut().insert("grpc-status", unavailable);
                return Ok::<_, Infallible>(refused);
            }
            pool.use_once().await;
            Ok(http::Response::new(String::new()))
        }
    });
    let handler = tower::util::BoxCloneSyncService::new(handler);
    let offer = Offer::Closed { callers: 64 };
    let run = run(AdmissionConfig::default(), handler, offer, 50 * MS, 3).await;
    let highest = run.highest_limit(1.0, 3.0);
    let served = run.between(1.0, 3.0) as f64 / 1600.0;
    eprintln!("a third not served: limit at most {highest} from 1 s, {served:.3} of capacity");
    assert!(highest <= 10, "the limit grew to {highest}");
    assert!(served >= 0.95, "{served:.3} of the pool's capacity");
}
