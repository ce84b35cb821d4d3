//! A demo `Inventory` implementation with knobs, for examples, tests and the storm demo.
//!
//! Overload experiments need a server whose capacity is known and adjustable: `Reserve`
//! takes `service_time` of *wall* time (`tokio::time::sleep`, not CPU, so capacity is
//! `workers / service_time` whatever the machine, and paused-time tests can advance it),
//! and answers a `fail_rate` fraction of calls `UNAVAILABLE` at once (seeded RNG, so runs
//! repeat). Both knobs can change while the server runs (the storm demonstration drops
//! capacity mid-run). A *gate* lets a test hold every handler at a known point, so tests
//! fill workers and queues without racing the clock. Counters say which calls reached the
//! handler, by attempt class, and the most that ever ran at once.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use stormguard_core::{
    wire::AttemptClass, wire::GRPC_PREVIOUS_RPC_ATTEMPTS, wire::GRPC_TIMEOUT,
    wire::X_RETRY_ATTEMPT, wire::attempt_class, wire::decode_grpc_timeout,
};
use tokio::sync::watch;
use tonic::codegen::tokio_stream::{self, Stream};
use tonic::{Request, Response, Status};

use crate::{
    Inventory, InventoryBatch, ReserveBatchReply, ReserveReply, ReserveRequest, StockLevel,
    WatchStockRequest,
};

/// The knobs of a [`DemoInventory`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DemoConfig {
    /// Wall time each `Reserve` takes before answering.
    pub service_time: Duration,
    /// Fraction of `Reserve` calls answered `UNAVAILABLE` at once, in `[0, 1]`.
    pub fail_rate: f64,
    /// Seed of the failure draw.
    pub seed: u64,
}

impl Default for DemoConfig {
    /// 5 ms service time, no failures, seed 1.
    fn default() -> Self {
        DemoConfig {
            service_time: Duration::from_millis(5),
            fail_rate: 0.0,
            seed: 1,
        }
    }
}

/// The counters of a [`DemoInventory`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DemoCounts {
    /// `Reserve` calls that reached the handler.
    pub entered: u64,
    /// Of those, first attempts, classified as the shed layer classifies them
    /// ([`attempt_class`]: no or zero `grpc-previous-rpc-attempts`, else no
    /// or zero `x-retry-attempt`).
    pub entered_first: u64,
    /// Of those, retries (including calls whose attempt header could not be read).
    pub entered_retry: u64,
    /// `Reserve` calls answered OK.
    pub ok: u64,
    /// `Reserve` calls answered `UNAVAILABLE` by the fail rate.
    pub failed: u64,
    /// `Reserve` handlers running now.
    pub running: usize,
    /// The most `Reserve` handlers that ever ran at once.
    pub max_running: usize,
}

#[derive(Debug)]
struct Shared {
    service_time_ns: AtomicU64,
    fail_rate_bits: AtomicU64,
    rng: Mutex<fastrand::Rng>,
    gate: watch::Sender<bool>,
    entered: AtomicU64,
    entered_first: AtomicU64,
    entered_retry: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
    running: AtomicUsize,
    max_running: AtomicUsize,
    entry_log: Mutex<VecDeque<String>>,
}

/// How many `request_id`s [`DemoControl::entry_log`] keeps.
pub const ENTRY_LOG_CAPACITY: usize = 1024;

/// The demo `stormguard.demo.v1.Inventory` service. Clones share knobs and counters.
#[derive(Clone, Debug)]
pub struct DemoInventory {
    shared: Arc<Shared>,
}

/// Changes the knobs and reads the counters of a running [`DemoInventory`].
#[derive(Clone, Debug)]
pub struct DemoControl {
    shared: Arc<Shared>,
}

impl DemoInventory {
    /// A service with `config`, gate open.
    pub fn new(config: DemoConfig) -> Self {
        let (gate, _) = watch::channel(true);
        let shared = Shared {
            service_time_ns: AtomicU64::new(duration_ns(config.service_time)),
            fail_rate_bits: AtomicU64::new(clamp_rate(config.fail_rate).to_bits()),
            rng: Mutex::new(fastrand::Rng::with_seed(config.seed)),
            gate,
            entered: AtomicU64::new(0),
            entered_first: AtomicU64::new(0),
            entered_retry: AtomicU64::new(0),
            ok: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            running: AtomicUsize::new(0),
            max_running: AtomicUsize::new(0),
            entry_log: Mutex::new(VecDeque::new()),
        };
        DemoInventory {
            shared: Arc::new(shared),
        }
    }

    /// A handle on the knobs and counters.
    pub fn control(&self) -> DemoControl {
        DemoControl {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl DemoControl {
    /// Sets the wall time of each `Reserve` from now on.
    pub fn set_service_time(&self, service_time: Duration) {
        self.shared
            .service_time_ns
            .store(duration_ns(service_time), Ordering::Relaxed);
    }

    /// The wall time of each `Reserve`.
    pub fn service_time(&self) -> Duration {
        Duration::from_nanos(self.shared.service_time_ns.load(Ordering::Relaxed))
    }

    /// Sets the fraction answered `UNAVAILABLE` (clamped to `[0, 1]`; NaN is 0).
    pub fn set_fail_rate(&self, fail_rate: f64) {
        self.shared
            .fail_rate_bits
            .store(clamp_rate(fail_rate).to_bits(), Ordering::Relaxed);
    }

    /// Closes the gate: handlers that enter from now on (and those already waiting)
    /// stop after counting themselves and before their service time, until
    /// [`DemoControl::open_gate`].
    pub fn close_gate(&self) {
        self.shared.gate.send_replace(false);
    }

    /// Opens the gate: held handlers go on.
    pub fn open_gate(&self) {
        self.shared.gate.send_replace(true);
    }

    /// Waits until at least `n` `Reserve` handlers are running (entered, not finished).
    /// For tests that must know the workers are taken before sending more.
    pub async fn wait_running(&self, n: usize) {
        let mut rx = self.shared.gate.subscribe();
        while self.shared.running.load(Ordering::SeqCst) < n {
            // Every handler entry touches the gate channel's version (see `reserve`),
            // so this wakes on each entry without polling the clock.
            let _ = rx.changed().await;
        }
    }

    /// The non-empty `request_id`s of the `Reserve` calls that reached the handler, in
    /// the order they reached it (the last [`ENTRY_LOG_CAPACITY`]). Calls without an id
    /// are not logged, so load tests pay nothing for it.
    pub fn entry_log(&self) -> Vec<String> {
        let log = self
            .shared
            .entry_log
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        log.iter().cloned().collect()
    }

    /// The counters now.
    pub fn counts(&self) -> DemoCounts {
        let s = &self.shared;
        DemoCounts {
            entered: s.entered.load(Ordering::SeqCst),
            entered_first: s.entered_first.load(Ordering::SeqCst),
            entered_retry: s.entered_retry.load(Ordering::SeqCst),
            ok: s.ok.load(Ordering::SeqCst),
            failed: s.failed.load(Ordering::SeqCst),
            running: s.running.load(Ordering::SeqCst),
            max_running: s.max_running.load(Ordering::SeqCst),
        }
    }
}

/// Decrements `running` when the handler ends or is dropped (caller gone).
struct Running<'a>(&'a Shared);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

#[tonic::async_trait]
impl Inventory for DemoInventory {
    async fn reserve(
        &self,
        request: Request<ReserveRequest>,
    ) -> Result<Response<ReserveReply>, Status> {
        let s = &*self.shared;
        let previous: u32 = request
            .metadata()
            .get(GRPC_PREVIOUS_RPC_ATTEMPTS)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let timeout_ms = request
            .metadata()
            .get(GRPC_TIMEOUT)
            .and_then(|v| decode_timeout_ms(v.as_bytes()))
            .unwrap_or(0);
        let request_id = &request.get_ref().request_id;
        if !request_id.is_empty() {
            let mut log = s.entry_log.lock().unwrap_or_else(PoisonError::into_inner);
            if log.len() == ENTRY_LOG_CAPACITY {
                log.pop_front();
            }
            log.push_back(request_id.clone());
        }
        s.entered.fetch_add(1, Ordering::SeqCst);
        let class = attempt_class(
            request
                .metadata()
                .get(GRPC_PREVIOUS_RPC_ATTEMPTS)
                .map(|v| v.as_bytes()),
            request
                .metadata()
                .get(X_RETRY_ATTEMPT)
                .map(|v| v.as_bytes()),
        );
        if class == AttemptClass::First {
            s.entered_first.fetch_add(1, Ordering::SeqCst);
        } else {
            s.entered_retry.fetch_add(1, Ordering::SeqCst);
        }
        let now_running = s.running.fetch_add(1, Ordering::SeqCst) + 1;
        let _running = Running(s);
        s.max_running.fetch_max(now_running, Ordering::SeqCst);
        // Wake `wait_running` waiters without changing the gate's state.
        s.gate.send_modify(|_| {});

        let mut gate = s.gate.subscribe();
        // An error means the sender is gone, which cannot happen while `self` lives.
        let _ = gate.wait_for(|open| *open).await;

        let fail_rate = f64::from_bits(s.fail_rate_bits.load(Ordering::Relaxed));
        let fail = fail_rate > 0.0
            && s.rng.lock().unwrap_or_else(PoisonError::into_inner).f64() < fail_rate;
        if fail {
            s.failed.fetch_add(1, Ordering::SeqCst);
            return Err(Status::unavailable("demo: injected failure"));
        }
        let service_time = Duration::from_nanos(s.service_time_ns.load(Ordering::Relaxed));
        if !service_time.is_zero() {
            tokio::time::sleep(service_time).await;
        }
        s.ok.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(ReserveReply {
            reserved: true,
            attempt: previous.saturating_add(1),
            timeout_ms,
        }))
    }

    type WatchStockStream = Pin<Box<dyn Stream<Item = Result<StockLevel, Status>> + Send>>;

    /// Sends `count` (at most 10 000) levels, `interval_ms` apart (at once when 0): with an
    /// interval, a watch that sits idle between updates, as a subscription API does.
    async fn watch_stock(
        &self,
        request: Request<WatchStockRequest>,
    ) -> Result<Response<Self::WatchStockStream>, Status> {
        let WatchStockRequest {
            sku,
            count,
            interval_ms,
        } = request.into_inner();
        let count = count.min(10_000);
        let levels = (0..count).map(move |seq| {
            Ok(StockLevel {
                sku: sku.clone(),
                level: u64::from(count - seq),
                seq,
            })
        });
        if interval_ms == 0 {
            return Ok(Response::new(Box::pin(tokio_stream::iter(levels))));
        }
        let every = Duration::from_millis(u64::from(interval_ms));
        // The first update at once, then one per interval, the stream idle in between.
        let paced =
            futures_util::stream::unfold((levels, true), move |(mut levels, first)| async move {
                if !first {
                    tokio::time::sleep(every).await;
                }
                levels.next().map(|level| (level, (levels, false)))
            });
        Ok(Response::new(Box::pin(paced)))
    }
}

#[tonic::async_trait]
impl InventoryBatch for DemoInventory {
    /// Reads the whole stream, then answers with the count and the total quantity. Not
    /// gated and not counted as `Reserve` calls: it shows what a client stream costs
    /// the server while the caller sends it.
    async fn reserve_batch(
        &self,
        request: Request<tonic::Streaming<ReserveRequest>>,
    ) -> Result<Response<ReserveBatchReply>, Status> {
        let mut stream = request.into_inner();
        let (mut reserved, mut quantity) = (0u32, 0u64);
        while let Some(item) = stream.message().await? {
            reserved = reserved.saturating_add(1);
            quantity = quantity.saturating_add(u64::from(item.quantity));
        }
        Ok(Response::new(ReserveBatchReply { reserved, quantity }))
    }
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn clamp_rate(rate: f64) -> f64 {
    if rate.is_nan() {
        0.0
    } else {
        rate.clamp(0.0, 1.0)
    }
}

/// Milliseconds of a `grpc-timeout` value (for the reply's `timeout_ms`), rounded down;
/// `None` when malformed.
fn decode_timeout_ms(value: &[u8]) -> Option<u64> {
    let timeout = decode_grpc_timeout(value).ok()?;
    Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests;
