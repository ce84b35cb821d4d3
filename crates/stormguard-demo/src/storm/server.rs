//! The server side of the scenarios: the demo Inventory behind a fixed capacity model,
//! served by tonic on loopback with the h2 settings a storm needs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use stormguard_core::AdmissionConfig;
use stormguard_core::wire::STORMGUARD_UNPROCESSED;
use stormguard_server::ShedLayer;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use super::StormError;
use crate::server::DemoInventory;
use crate::{Inventory, InventoryServer, ReserveReply, ReserveRequest, WatchStockRequest};

/// Streams a client may reset before their server reads them, per connection. Under a
/// storm every caller that gives up resets its stream; h2's default (20) closes the
/// connection with `GOAWAY (ENHANCE_YOUR_CALM)`, which flushes the server's queue and
/// looks like a recovery. `docs/operating.md` ("HTTP/2 resets") gives the same value.
pub const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 10_000;

/// What happens to the work of a caller that has left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerModel {
    /// The handler holds one of the workers while it runs and waits for one in FIFO
    /// order; a caller that resets its stream drops the handler, so abandoned work, queued
    /// or running, costs nothing more. What a tonic handler behind a semaphore does.
    Cancelling,
    /// Workers fed by an unbounded FIFO queue that finish every call they take, even
    /// when its caller has left: a thread pool, or a query already sent to a database.
    Pool,
}

impl ServerModel {
    /// `"cancelling"` or `"pool"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ServerModel::Cancelling => "cancelling",
            ServerModel::Pool => "pool",
        }
    }
}

/// The demo Inventory with a fixed capacity: at most `workers` `Reserve` calls run at
/// once, each taking the demo's service time of wall time.
#[derive(Clone, Debug)]
pub struct Workers {
    inner: DemoInventory,
    permits: Arc<Semaphore>,
    model: ServerModel,
}

impl Workers {
    /// `inner` limited to `workers` calls at once, with `model` for abandoned work.
    pub fn new(inner: DemoInventory, workers: usize, model: ServerModel) -> Self {
        Workers {
            inner,
            permits: Arc::new(Semaphore::new(workers)),
            model,
        }
    }

    /// Stops taking work: calls waiting for a worker end `UNAVAILABLE`. For the end of a
    /// run, so that a pool's backlog does not outlive its server.
    pub fn close(&self) {
        self.permits.close();
    }
}

fn closed() -> Status {
    Status::unavailable("demo: server closed")
}

#[tonic::async_trait]
impl Inventory for Workers {
    async fn reserve(
        &self,
        request: Request<ReserveRequest>,
    ) -> Result<Response<ReserveReply>, Status> {
        match self.model {
            ServerModel::Cancelling => {
                let _worker = self.permits.acquire().await.map_err(|_| closed())?;
                self.inner.reserve(request).await
            }
            ServerModel::Pool => {
                let permits = Arc::clone(&self.permits);
                let inner = self.inner.clone();
                // The spawned task is not cancelled when this handler is dropped.
                let job = tokio::spawn(async move {
                    let _worker = permits.acquire_owned().await.map_err(|_| closed())?;
                    inner.reserve(request).await
                });
                job.await
                    .map_err(|e| Status::internal(format!("demo: worker failed: {e}")))?
            }
        }
    }

    type WatchStockStream = <DemoInventory as Inventory>::WatchStockStream;

    async fn watch_stock(
        &self,
        request: Request<WatchStockRequest>,
    ) -> Result<Response<Self::WatchStockStream>, Status> {
        self.inner.watch_stock(request).await
    }
}

/// A tonic server running on loopback until dropped (the examples' servers).
#[derive(Debug)]
pub struct Serving {
    /// Where it listens.
    pub addr: SocketAddr,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Serving {
    /// Runs `server` (a tonic server's `serve_with_incoming` on a listener bound to
    /// `addr`) on the runtime until the returned value is dropped.
    pub fn spawn<F>(addr: SocketAddr, server: F) -> Serving
    where
        F: std::future::Future<Output = Result<(), tonic::transport::Error>> + Send + 'static,
    {
        Serving {
            addr,
            task: tokio::spawn(server),
        }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `service` on a fresh loopback port, behind a `ShedLayer` with `admission` when
/// given, with the storm's h2 settings.
pub(crate) async fn serve<T: Inventory>(
    service: T,
    admission: Option<AdmissionConfig>,
) -> Result<Serving, StormError> {
    serve_costed(service, admission, None, false, &|layer| layer).await
}

/// Makes every answer the `ShedLayer` sheds cost the server `cost` of CPU before it is
/// sent: a layer outside the `ShedLayer` that sees the shed marker
/// (`stormguard-unprocessed`) on an answer and busy-loops on the runtime thread that polls
/// it, as decoding, authenticating or a cache miss before the shed decision would. Clones
/// share the total spent.
#[derive(Clone, Debug)]
pub struct RejectCost {
    cost: Duration,
    spent_ns: Arc<AtomicU64>,
}

impl RejectCost {
    /// `cost` of CPU per shed answer.
    pub fn new(cost: Duration) -> Self {
        RejectCost {
            cost,
            spent_ns: Arc::default(),
        }
    }

    /// CPU spent on shed answers so far.
    pub fn spent(&self) -> Duration {
        Duration::from_nanos(self.spent_ns.load(Ordering::Relaxed))
    }

    /// Busy-loops for the cost and counts it.
    fn pay(&self) {
        let start = Instant::now();
        while start.elapsed() < self.cost {
            std::hint::spin_loop();
        }
        let spent = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.spent_ns.fetch_add(spent, Ordering::Relaxed);
    }
}

impl<S> tower::Layer<S> for RejectCost {
    type Service = RejectCostService<S>;

    fn layer(&self, inner: S) -> RejectCostService<S> {
        RejectCostService {
            inner,
            cost: self.clone(),
        }
    }
}

/// The service of [`RejectCost`].
#[derive(Clone, Debug)]
pub struct RejectCostService<S> {
    inner: S,
    cost: RejectCost,
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, Rq, B> tower::Service<http::Request<Rq>> for RejectCostService<S>
where
    S: tower::Service<http::Request<Rq>, Response = http::Response<B>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    B: 'static,
{
    type Response = http::Response<B>;
    type Error = S::Error;
    type Future = BoxFuture<Result<http::Response<B>, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Rq>) -> Self::Future {
        let future = self.inner.call(request);
        let cost = self.cost.clone();
        Box::pin(async move {
            let result = future.await;
            if let Ok(response) = &result
                && response.headers().contains_key(STORMGUARD_UNPROCESSED)
            {
                cost.pay();
            }
            result
        })
    }
}

/// [`serve`], with `reject_cost` outside the `ShedLayer` when both are given, the
/// `ShedLayer` sending load reports when `load_reports` is set, and `instrument` applied to
/// it.
pub(crate) async fn serve_costed<T: Inventory>(
    service: T,
    admission: Option<AdmissionConfig>,
    reject_cost: Option<RejectCost>,
    load_reports: bool,
    instrument: &dyn Fn(ShedLayer) -> ShedLayer,
) -> Result<Serving, StormError> {
    let shed = |config| -> Result<ShedLayer, StormError> {
        let layer = ShedLayer::from_config(&config)?;
        Ok(instrument(if load_reports {
            layer.with_load_reports()
        } else {
            layer
        }))
    };
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let builder = Server::builder()
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESET_STREAMS));
    let service = InventoryServer::new(service);
    Ok(match (admission, reject_cost) {
        (Some(config), Some(cost)) => {
            // The first layer is the outer one.
            let mut builder = builder.layer(cost).layer(shed(config)?);
            Serving::spawn(
                addr,
                builder.add_service(service).serve_with_incoming(incoming),
            )
        }
        (Some(config), None) => {
            let mut builder = builder.layer(shed(config)?);
            Serving::spawn(
                addr,
                builder.add_service(service).serve_with_incoming(incoming),
            )
        }
        (None, _) => {
            let mut builder = builder;
            Serving::spawn(
                addr,
                builder.add_service(service).serve_with_incoming(incoming),
            )
        }
    })
}
