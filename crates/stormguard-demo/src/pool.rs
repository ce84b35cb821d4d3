//! An `Inventory` whose `Reserve` uses an inner resource of fixed capacity.
//!
//! [`PoolInventory`] holds one of `capacity` permits (a FIFO semaphore, like a database
//! connection pool) for `service_time` of wall time per `Reserve`. Calls beyond the
//! capacity that reach the handler wait *inside* it, where an admission queue in front
//! cannot see, order or shed them: the server that a fixed worker count set too high
//! gets wrong, and that an adaptive limit has to find by itself. A call whose caller
//! leaves gives its permit back at once (the handler's future is dropped). The service
//! time can change while it runs ([`PoolInventory::set_service_time`]): a capacity drop.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;
use tonic::codegen::tokio_stream;
use tonic::{Request, Response, Status};

use crate::{Inventory, ReserveReply, ReserveRequest, StockLevel, WatchStockRequest};

/// The demo Inventory over a pool of `capacity` permits. Clones share the pool.
#[derive(Clone, Debug)]
pub struct PoolInventory {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    permits: Semaphore,
    capacity: usize,
    service_time_ns: AtomicU64,
    completed: AtomicU64,
    inside: AtomicUsize,
    max_inside: AtomicUsize,
}

/// Counts a call as inside the handler while it lives.
struct Inside<'a>(&'a Shared);

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.inside.fetch_sub(1, Ordering::Relaxed);
    }
}

impl PoolInventory {
    /// A pool of `capacity` permits, each held `service_time` per call.
    pub fn new(capacity: usize, service_time: Duration) -> Self {
        PoolInventory {
            shared: Arc::new(Shared {
                permits: Semaphore::new(capacity),
                capacity,
                service_time_ns: AtomicU64::new(
                    u64::try_from(service_time.as_nanos()).unwrap_or(u64::MAX),
                ),
                completed: AtomicU64::new(0),
                inside: AtomicUsize::new(0),
                max_inside: AtomicUsize::new(0),
            }),
        }
    }

    /// The pool's capacity C.
    pub fn capacity(&self) -> usize {
        self.shared.capacity
    }

    /// Changes the service time from the next call on (a slowdown of the resource).
    pub fn set_service_time(&self, service_time: Duration) {
        let ns = u64::try_from(service_time.as_nanos()).unwrap_or(u64::MAX);
        self.shared.service_time_ns.store(ns, Ordering::Relaxed);
    }

    /// Takes a permit for the service time: one unit of the resource's work.
    pub async fn use_once(&self) -> Result<(), Status> {
        let s = &*self.shared;
        let now_inside = s.inside.fetch_add(1, Ordering::Relaxed) + 1;
        let _inside = Inside(s);
        s.max_inside.fetch_max(now_inside, Ordering::Relaxed);
        let _permit = s
            .permits
            .acquire()
            .await
            .map_err(|_| Status::internal("pool closed"))?;
        let service_time = Duration::from_nanos(s.service_time_ns.load(Ordering::Relaxed));
        tokio::time::sleep(service_time).await;
        s.completed.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Calls that finished their work.
    pub fn completed(&self) -> u64 {
        self.shared.completed.load(Ordering::Relaxed)
    }

    /// The most calls ever inside the handler at once (holding or waiting for a permit).
    pub fn max_inside(&self) -> usize {
        self.shared.max_inside.load(Ordering::Relaxed)
    }
}

#[tonic::async_trait]
impl Inventory for PoolInventory {
    async fn reserve(
        &self,
        _request: Request<ReserveRequest>,
    ) -> Result<Response<ReserveReply>, Status> {
        self.use_once().await?;
        Ok(Response::new(ReserveReply {
            reserved: true,
            ..ReserveReply::default()
        }))
    }

    type WatchStockStream = tokio_stream::Empty<Result<StockLevel, Status>>;

    async fn watch_stock(
        &self,
        _request: Request<WatchStockRequest>,
    ) -> Result<Response<Self::WatchStockStream>, Status> {
        Err(Status::unimplemented("PoolInventory serves Reserve only"))
    }
}
