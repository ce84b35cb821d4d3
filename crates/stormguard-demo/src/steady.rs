//! A healthy service under steady load, with and without the `ShedLayer`: what the layer
//! costs a service that is not overloaded.
//!
//! One tonic server on loopback whose `Reserve` handler waits `handler` of wall time (a
//! handler that waits on I/O: its capacity is not limited, so latency is flat with
//! concurrency), `callers` in closed loops each sending one call at a time with a
//! `deadline`, and `watchers` holding a `WatchStock` stream each that sends one level every
//! `watch_every` (a subscription API, idle between messages). Client and server share the
//! process and its runtime. [`run_steady`] runs one such load against one [`Guard`] and
//! counts what was served; `examples/steady.rs` prints the table of `docs/admission.md`,
//! and `tests/server_adaptive.rs` holds the ratios.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use stormguard_core::{AdmissionConfig, WorkerLimit};
use stormguard_server::{ShedLayer, ShedSnapshot};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::Code;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};

use crate::server::{DemoConfig, DemoInventory};
use crate::storm::MAX_PENDING_ACCEPT_RESET_STREAMS;
use crate::{InventoryClient, InventoryServer, ReserveRequest, WatchStockRequest};

/// What stands in front of the handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guard {
    /// No layer: tonic alone.
    Bare,
    /// The `ShedLayer` at `AdmissionConfig::default()` (the adaptive worker limit).
    Default,
    /// The `ShedLayer` with a fixed worker limit.
    Fixed(usize),
}

impl Guard {
    /// The name the example's table prints.
    pub fn name(self) -> String {
        match self {
            Guard::Bare => "no layer".to_owned(),
            Guard::Default => "default".to_owned(),
            Guard::Fixed(n) => format!("Fixed({n})"),
        }
    }
}

/// One steady load.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Steady {
    /// Wall time of each `Reserve` (a sleep: flat with concurrency).
    pub handler: Duration,
    /// Closed-loop callers of `Reserve`.
    pub callers: usize,
    /// The deadline of each `Reserve` (sent as `grpc-timeout`, and held by the caller).
    pub deadline: Duration,
    /// `WatchStock` streams held open for the whole run.
    pub watchers: usize,
    /// Time between two levels of a watch.
    pub watch_every: Duration,
    /// How long the callers call, after the warm-up.
    pub run: Duration,
    /// How long the callers call before the counting starts.
    pub warmup: Duration,
}

impl Steady {
    /// `callers` over a handler of `handler`, 300 ms deadlines, no watchers, a 1 s warm-up
    /// and a 5 s run.
    pub fn new(handler: Duration, callers: usize) -> Self {
        Steady {
            handler,
            callers,
            deadline: Duration::from_millis(300),
            watchers: 0,
            watch_every: Duration::from_millis(500),
            run: Duration::from_secs(5),
            warmup: Duration::from_secs(1),
        }
    }
}

/// What one run served.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SteadyOutcome {
    /// `Reserve` calls answered OK during the run.
    pub ok: u64,
    /// `Reserve` calls that failed during the run, whatever the code.
    pub failed: u64,
    /// Of those, answered `UNAVAILABLE` or `RESOURCE_EXHAUSTED` (shed).
    pub shed: u64,
    /// Levels the watchers received during the run.
    pub levels: u64,
    /// Levels the watchers would receive in the run at their pace.
    pub levels_due: u64,
    /// The layer's counters at the end (none without a layer).
    pub snapshot: Option<ShedSnapshot>,
    /// The layer's worker limit and no-load latency (µs), every 250 ms from the start.
    pub limits: Vec<(usize, Option<u64>)>,
}

/// Counts shared by the callers and watchers.
#[derive(Debug, Default)]
struct Counts {
    counting: AtomicBool,
    stop: AtomicBool,
    ok: AtomicU64,
    failed: AtomicU64,
    shed: AtomicU64,
    levels: AtomicU64,
}

/// Runs `steady` against a server behind `guard` on loopback; counts what the callers
/// and watchers got after the warm-up.
pub async fn run_steady(
    steady: Steady,
    guard: Guard,
) -> Result<SteadyOutcome, Box<dyn std::error::Error + Send + Sync>> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let demo = DemoInventory::new(DemoConfig {
        service_time: steady.handler,
        ..DemoConfig::default()
    });
    // Every watch and caller shares one connection. A thousand watches opened at once
    // keep the server busy accepting them, and callers that give up at their deadline
    // meanwhile reset streams the server has not accepted yet: past h2's default of 20
    // such resets the server closes the connection, and every stream on it fails, with a
    // layer or without. Both servers allow what the storm's do.
    let server_builder = || {
        Server::builder()
            .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESET_STREAMS))
    };
    let (server, stats) = match guard {
        Guard::Bare => (
            tokio::spawn(
                server_builder()
                    .add_service(InventoryServer::new(demo))
                    .serve_with_incoming(incoming),
            ),
            None,
        ),
        Guard::Default | Guard::Fixed(_) => {
            let config = match guard {
                Guard::Fixed(n) => AdmissionConfig {
                    workers: WorkerLimit::Fixed(n),
                    ..AdmissionConfig::default()
                },
                _ => AdmissionConfig::default(),
            };
            let layer = ShedLayer::from_config(&config)?;
            let stats = layer.stats();
            (
                tokio::spawn(
                    server_builder()
                        .layer(layer)
                        .add_service(InventoryServer::new(demo))
                        .serve_with_incoming(incoming),
                ),
                Some(stats),
            )
        }
    };
    let channel: Channel = Endpoint::from_shared(format!("http://{addr}"))?
        .http2_max_local_error_reset_streams(None)
        .connect()
        .await?;
    let client = InventoryClient::new(channel);
    let counts = Arc::new(Counts::default());
    let mut tasks = JoinSet::new();
    let total = steady.warmup + steady.run;
    for w in 0..steady.watchers {
        let mut client = client.clone();
        let counts = Arc::clone(&counts);
        let count = u32::try_from(total.as_millis() / steady.watch_every.as_millis().max(1) + 2)
            .unwrap_or(u32::MAX);
        let interval_ms = u32::try_from(steady.watch_every.as_millis()).unwrap_or(u32::MAX);
        tasks.spawn(async move {
            // Opened again after the server's pushback when shed, as a watch client
            // reconnects: a thousand watches opened at once are a burst of new calls.
            let mut stream = loop {
                let request = WatchStockRequest {
                    sku: format!("w{w}"),
                    count,
                    interval_ms,
                };
                match client.watch_stock(request).await {
                    Ok(response) => break response.into_inner(),
                    Err(status) if status.code() == Code::Unavailable => {
                        let pushback = status
                            .metadata()
                            .get("grpc-retry-pushback-ms")
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.parse::<u64>().ok())
                            .unwrap_or(10);
                        tokio::time::sleep(Duration::from_millis(pushback)).await;
                    }
                    Err(_) => return,
                }
            };
            while let Ok(Some(_)) = stream.message().await {
                if counts.stop.load(Ordering::Relaxed) {
                    return;
                }
                if counts.counting.load(Ordering::Relaxed) {
                    counts.levels.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    for _ in 0..steady.callers {
        let mut client = client.clone();
        let counts = Arc::clone(&counts);
        tasks.spawn(async move {
            while !counts.stop.load(Ordering::Relaxed) {
                // No request id: the demo logs none, and the call costs what a plain one does.
                let mut request = tonic::Request::new(ReserveRequest::default());
                request.set_timeout(steady.deadline);
                let answer = tokio::time::timeout(steady.deadline, client.reserve(request)).await;
                if !counts.counting.load(Ordering::Relaxed) {
                    continue;
                }
                match answer {
                    Ok(Ok(_)) => counts.ok.fetch_add(1, Ordering::Relaxed),
                    Ok(Err(status))
                        if matches!(status.code(), Code::Unavailable | Code::ResourceExhausted) =>
                    {
                        counts.shed.fetch_add(1, Ordering::Relaxed);
                        counts.failed.fetch_add(1, Ordering::Relaxed)
                    }
                    _ => counts.failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        });
    }
    let start = Instant::now();
    let mut limits = Vec::new();
    let mut at = start;
    while at < start + total {
        if at >= start + steady.warmup {
            counts.counting.store(true, Ordering::Relaxed);
        }
        if let Some(stats) = &stats {
            let snapshot = stats.snapshot();
            limits.push((snapshot.worker_limit, snapshot.min_latency_us));
        }
        at += Duration::from_millis(250);
        tokio::time::sleep_until(at.min(start + total)).await;
    }
    counts.counting.store(false, Ordering::Relaxed);
    counts.stop.store(true, Ordering::Relaxed);
    let snapshot = stats.as_ref().map(|s| s.snapshot());
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    server.abort();
    let per_watcher = steady.run.as_millis() / steady.watch_every.as_millis().max(1);
    Ok(SteadyOutcome {
        ok: counts.ok.load(Ordering::Relaxed),
        failed: counts.failed.load(Ordering::Relaxed),
        shed: counts.shed.load(Ordering::Relaxed),
        levels: counts.levels.load(Ordering::Relaxed),
        levels_due: u64::try_from(per_watcher).unwrap_or(u64::MAX) * steady.watchers as u64,
        snapshot,
        limits,
    })
}
