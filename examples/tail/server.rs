//! The server: the demo Inventory with a fixed worker limit, behind the `ShedLayer`, where a
//! seeded share of the attempts it receives is slow, and a layer in front of everything
//! that counts the attempts it receives, per phase of the run.
//!
//! Slowness belongs to the *attempt*, not to the request: the handler draws it from a seeded
//! sequence for each attempt it receives, whatever the request says, as a garbage
//! collection pause or a cold cache hits whichever call is there at that moment. A hedge of
//! a slow call is then fast as often as any other attempt. (Were the slowness a property of
//! the request, its hedge would be slow too, and no hedging could help.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use stormguard_core::AdmissionConfig;

use stormguard_core::WorkerLimit;
use stormguard_demo::server::{DemoConfig, DemoControl, DemoInventory};
use stormguard_demo::storm::MAX_PENDING_ACCEPT_RESET_STREAMS;
use stormguard_demo::storm::Serving;
use stormguard_demo::{
    Inventory, InventoryServer, ReserveReply, ReserveRequest, WatchStockRequest,
};
use stormguard_server::ShedLayer;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};
use tower::Service;

/// Calls the server runs at once.
pub(crate) const WORKERS: usize = 8;
/// Wall time of a normal attempt.
pub(crate) const SERVICE_TIME: Duration = Duration::from_millis(10);
/// A slow attempt takes this many times the service time.
pub(crate) const SLOWDOWN: u32 = 10;
/// Of every [`BLOCK`] attempts the handler receives, this many are slow: exactly 1.5 %.
pub(crate) const SLOW_PER_BLOCK: usize = 3;
pub(crate) const BLOCK: usize = 200;

/// The metadata key that names the phase of the run a call belongs to.
pub(crate) const PHASE_HEADER: &str = "x-tail-phase";

/// The parts of a run, each counted apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Normal load, not measured: learned delays fill their histograms.
    Warmup,
    /// Normal load, measured.
    Normal,
    /// Twice the capacity, measured.
    Overload,
}

impl Phase {
    pub(crate) const ALL: [Phase; 3] = [Phase::Warmup, Phase::Normal, Phase::Overload];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Phase::Warmup => "warmup",
            Phase::Normal => "normal",
            Phase::Overload => "overload",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    fn of(value: Option<&[u8]>) -> Option<Phase> {
        Phase::ALL
            .into_iter()
            .find(|p| value == Some(p.as_str().as_bytes()))
    }
}

/// What the server counted, per [`Phase`].
#[derive(Debug, Default)]
pub(crate) struct Counts {
    /// Attempts received, answered or shed.
    received: [AtomicU64; 3],
    /// Attempts that reached the handler and were slow.
    slow: [AtomicU64; 3],
}

impl Counts {
    pub(crate) fn received(&self, phase: Phase) -> u64 {
        self.received[phase.index()].load(Ordering::SeqCst)
    }

    pub(crate) fn slow(&self, phase: Phase) -> u64 {
        self.slow[phase.index()].load(Ordering::SeqCst)
    }
}

/// Which attempts are slow: in each block of [`BLOCK`] attempts in the order the handler
/// receives them, [`SLOW_PER_BLOCK`] positions drawn from a seeded RNG.
#[derive(Debug)]
struct SlowSequence {
    state: Mutex<(fastrand::Rng, Vec<bool>, usize)>,
}

impl SlowSequence {
    fn new(seed: u64) -> Self {
        SlowSequence {
            state: Mutex::new((fastrand::Rng::with_seed(seed), vec![false; BLOCK], BLOCK)),
        }
    }

    /// Whether the next attempt received is slow.
    fn next(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (rng, block, at) = &mut *state;
        if *at == BLOCK {
            block.fill(false);
            let mut drawn = 0;
            while drawn < SLOW_PER_BLOCK {
                let i = rng.usize(..BLOCK);
                if !block[i] {
                    block[i] = true;
                    drawn += 1;
                }
            }
            *at = 0;
        }
        let slow = block[*at];
        *at += 1;
        slow
    }
}

/// The demo Inventory (which answers and counts) behind [`WORKERS`] workers, each attempt
/// holding one for the service time, or ten times it when the attempt is slow.
#[derive(Clone, Debug)]
pub(crate) struct Tail {
    inner: DemoInventory,
    permits: Arc<Semaphore>,
    slow: Arc<SlowSequence>,
    counts: Arc<Counts>,
}

impl Tail {
    /// A server whose slow attempts follow `seed`; the demo's own service time is zero, the
    /// wait is here.
    pub(crate) fn new(seed: u64) -> (Self, DemoControl) {
        let inner = DemoInventory::new(DemoConfig {
            service_time: Duration::ZERO,
            fail_rate: 0.0,
            seed,
        });
        let control = inner.control();
        let tail = Tail {
            inner,
            permits: Arc::new(Semaphore::new(WORKERS)),
            slow: Arc::new(SlowSequence::new(seed)),
            counts: Arc::default(),
        };
        (tail, control)
    }

    pub(crate) fn counts(&self) -> Arc<Counts> {
        Arc::clone(&self.counts)
    }

    /// Stops taking work: calls waiting for a worker end `UNAVAILABLE`.
    pub(crate) fn close(&self) {
        self.permits.close();
    }
}

#[tonic::async_trait]
impl Inventory for Tail {
    async fn reserve(
        &self,
        request: Request<ReserveRequest>,
    ) -> Result<Response<ReserveReply>, Status> {
        // Drawn when the attempt arrives, in arrival order.
        let slow = self.slow.next();
        if slow
            && let Some(phase) =
                Phase::of(request.metadata().get(PHASE_HEADER).map(|v| v.as_bytes()))
        {
            self.counts.slow[phase.index()].fetch_add(1, Ordering::SeqCst);
        }
        let _worker = self
            .permits
            .acquire()
            .await
            .map_err(|_| Status::unavailable("tail: server closed"))?;
        let factor = if slow { SLOWDOWN } else { 1 };
        tokio::time::sleep(SERVICE_TIME * factor).await;
        self.inner.reserve(request).await
    }

    type WatchStockStream = <DemoInventory as Inventory>::WatchStockStream;

    async fn watch_stock(
        &self,
        request: Request<WatchStockRequest>,
    ) -> Result<Response<Self::WatchStockStream>, Status> {
        self.inner.watch_stock(request).await
    }
}

/// Counts every attempt it receives by its phase, before the `ShedLayer` sees it.
#[derive(Clone, Debug)]
struct Counted<S> {
    inner: S,
    counts: Arc<Counts>,
}

impl<S, B> Service<http::Request<B>> for Counted<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> S::Future {
        if let Some(phase) = Phase::of(request.headers().get(PHASE_HEADER).map(|v| v.as_bytes())) {
            self.counts.received[phase.index()].fetch_add(1, Ordering::SeqCst);
        }
        self.inner.call(request)
    }
}

/// The shed layer's configuration: the defaults, with the server's real concurrency.
pub(crate) fn admission(seed: u64) -> AdmissionConfig {
    AdmissionConfig {
        workers: WorkerLimit::Fixed(WORKERS),
        seed: Some(seed),
        ..AdmissionConfig::default()
    }
}

/// Serves `tail` on a fresh loopback port: the counting layer, then the `ShedLayer`, then
/// the service. The socket is bound before this returns, so a client can connect at once.
pub(crate) async fn serve(tail: Tail, seed: u64) -> Result<Serving, tower::BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let counts = tail.counts();
    let mut builder = Server::builder()
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESET_STREAMS))
        .layer(tower::layer::layer_fn(move |inner| Counted {
            inner,
            counts: Arc::clone(&counts),
        }))
        .layer(ShedLayer::from_config(&admission(seed))?);
    Ok(Serving::spawn(
        addr,
        builder
            .add_service(InventoryServer::new(tail))
            .serve_with_incoming(incoming),
    ))
}
