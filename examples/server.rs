//! The demo Inventory server behind stormguard's admission queue.
//!
//! ```text
//! cargo run --release --example server -- --addr 127.0.0.1:0 --workers 4 --queue 64 \
//!     --service-time-ms 5 [--fail-rate 0.0] [--no-shed] [--retry-depth N] [--lifo-depth N] \
//!     [--load-reports]
//! cargo run --release --example server -- --addr 127.0.0.1:0 --config admission.json \
//!     --service-time-ms 5
//! ```
//!
//! `--help` describes every flag. `--config FILE` reads the whole admission configuration
//! from a JSON, YAML or TOML file (by its extension; `{"admission": {"workers": 4,
//! "queue_capacity": 64, "max_time_queued": "500ms", ...}}` in JSON, see
//! `AdmissionConfig::from_path`); a bad document stops the server with an error that names
//! the field. It excludes the flags that also set it (`--workers`, `--queue`,
//! `--retry-depth`, `--lifo-depth`, `--no-shed`).
//!
//! Prints `listening on ADDR` once bound (the real port when given `:0`), then one JSON
//! line per second on stdout with the cumulative counters:
//! `{"admitted":N,"completed":N,"shed_first":N,"shed_retry":N,"expired":N,"queue_depth":N,...}`.
//!
//! The HTTP/2 limit on streams reset before the server accepted them
//! (`--max-pending-resets`) is raised from h2's 20 to 10 000, in both modes: why, and what
//! it costs, is in `docs/operating.md` ("HTTP/2 resets").
//!
//! `Reserve` takes `--service-time-ms` of wall time (a sleep, not CPU); `--fail-rate`
//! answers that fraction `UNAVAILABLE` at once. `--no-shed` serves the same service with
//! no stormguard layer (tonic runs every call at once); its JSON line then counts the
//! handler's calls (`admitted` = calls that reached the handler, `completed` = calls it
//! answered) and reports 0 for what only the queue does.
//!
//! `--log-calls` also prints one JSON line per answered call, written when its response
//! headers leave the ShedLayer, for tools that check a peer's retry behaviour from outside:
//! `{"call":"ID","attempt":N,"arrived_us":T,"answered_us":T,"status":"14","pushback":"120",
//! "cancelled":false}`,
//! where `call` is the request's `x-call-id` metadata (a client sets it once per logical
//! call, so every attempt carries it), `attempt` its `grpc-previous-rpc-attempts` (absent on
//! a first attempt), times are microseconds since the server started, and `status` and
//! `pushback` are the `grpc-status` and `grpc-retry-pushback-ms` response headers (absent on
//! answers whose status comes in the trailers, as every served call's does). A call whose
//! caller left before the answer is logged when it is dropped, with `"cancelled":true`.
//!
//! `--load-reports` attaches an ORCA load report (`endpoint-load-metrics-bin`: utilization =
//! calls running / workers, calls per second, sheds per second, queue depth, time queued)
//! to every answer, as `ShedLayer::with_load_reports` does; a `--config` file turns it on
//! with `"load_reports": true` in its `admission` object.
//!
//! SIGINT (Ctrl-C) and SIGTERM stop it gracefully: the admission queue answers every call
//! it holds `UNAVAILABLE` with a 1 ms pushback (`ShutdownHandle::begin`: they never reached
//! the handler, a retrying client goes elsewhere at once), then tonic's graceful shutdown
//! closes the listener, sends `GOAWAY` and waits for the running calls; the server exits 0.
//! `--max-connection-age-ms MS` closes each connection from the server's side once it is
//! that old (tonic's `Server::max_connection_age`: `GOAWAY`, its running calls finish). A
//! port another process holds is an error that says `EADDRINUSE`.
//!
//! `--otel-stdout` also exports the layer's OpenTelemetry metrics to stdout every
//! second and once more on Ctrl-C, and `--metrics-addr ADDR` serves them to Prometheus at
//! `http://ADDR/metrics` (both need `--features otel-examples`; the rules and dashboard
//! that read them are in `ops/`, see `docs/operating.md`).

use std::error::Error;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use serde::Serialize;
use stormguard::server::ShedSettings;
use stormguard::server::WorkerLimit;
use stormguard::server::{AdmissionConfig, QueueOrder, RetryThreshold};
use stormguard::server::{ShedBody, ShedLayer, ShedStats};
use stormguard_demo::InventoryServer;
use stormguard_demo::server::{DemoConfig, DemoControl, DemoInventory};
use tokio::net::TcpListener;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

#[path = "support/cli.rs"]
mod cli;
#[path = "support/otel.rs"]
mod otel;

/// The flags `--config` replaces.
const ADMISSION_FLAGS: [&str; 5] = ["workers", "queue", "retry_depth", "lifo_depth", "no_shed"];

/// The demo Inventory server behind stormguard's admission queue.
///
/// Prints `listening on ADDR` once bound, then one JSON line of cumulative counters per
/// second, until Ctrl-C.
#[derive(Debug, Parser)]
#[command(name = "server")]
pub struct Args {
    /// Read the whole admission configuration from FILE (JSON, YAML or TOML by its
    /// extension) instead of `--workers`, `--queue`, `--retry-depth`, `--lifo-depth` and
    /// `--no-shed`
    #[arg(long, value_name = "FILE", conflicts_with_all = ADMISSION_FLAGS)]
    pub config: Option<String>,
    /// Address to listen on (port 0: any free port)
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:50051")]
    addr: SocketAddr,
    /// Calls the admission queue runs at once
    #[arg(long, value_name = "N", default_value_t = 4)]
    workers: usize,
    /// Calls that may wait for a worker
    #[arg(long, value_name = "N", default_value_t = 64)]
    queue: usize,
    /// Wall time `Reserve` takes (a sleep, not CPU), in milliseconds; fractions allowed
    #[arg(long = "service-time-ms", value_name = "MS", default_value = "5",
          value_parser = service_time)]
    service_time: Duration,
    /// Share of calls answered UNAVAILABLE at once, from 0 to 1
    #[arg(long = "fail-rate", value_name = "F", default_value_t = 0.0, value_parser = fraction)]
    fail_rate: f64,
    /// Serve the same service with no stormguard layer (tonic runs every call at once)
    #[arg(long = "no-shed")]
    no_shed: bool,
    /// Attach an ORCA load report (`endpoint-load-metrics-bin`) to every answer; also
    /// `"load_reports": true` in a `--config` file
    #[arg(long = "load-reports", conflicts_with = "no_shed")]
    load_reports: bool,
    /// Queue depth from which retries are shed [default: queue / 8, at least 1]
    #[arg(long = "retry-depth", value_name = "N")]
    retry_depth: Option<usize>,
    /// Queue depth from which the newest call is served first [default: the admission
    /// default]
    #[arg(long = "lifo-depth", value_name = "N")]
    lifo_depth: Option<usize>,
    /// Seed of failures and pushback jitter
    #[arg(long, value_name = "N", default_value_t = 1)]
    seed: u64,
    /// HTTP/2 streams reset before the server accepted them that a connection tolerates
    /// before GOAWAY (h2's default is 20)
    #[arg(
        long = "max-pending-resets",
        value_name = "N",
        default_value_t = 10_000
    )]
    max_pending_resets: usize,
    /// Also print one JSON line per answered call
    #[arg(long = "log-calls")]
    log_calls: bool,
    /// Also export the layer's OpenTelemetry metrics to stdout every second and on Ctrl-C
    /// (needs `--features otel-examples`)
    #[arg(long = "otel-stdout")]
    otel_stdout: bool,
    /// Also serve the layer's metrics to Prometheus at http://ADDR/metrics (needs
    /// `--features otel-examples`)
    #[arg(long = "metrics-addr", value_name = "ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// Close each connection from the server's side (HTTP/2 GOAWAY, running calls finish)
    /// once it is this old, in milliseconds [default: never]
    #[arg(long = "max-connection-age-ms", value_name = "MS", value_parser = cli::millis)]
    max_connection_age: Option<Duration>,
}

/// `--service-time-ms`: milliseconds, fractions allowed.
fn service_time(value: &str) -> Result<Duration, String> {
    let ms: f64 = value.parse().map_err(|e| format!("{e}"))?;
    Duration::try_from_secs_f64(ms / 1000.0).map_err(|_| format!("{ms} is not a duration"))
}

/// `--fail-rate`: a share from 0 to 1.
fn fraction(value: &str) -> Result<f64, String> {
    let rate: f64 = value.parse().map_err(|e| format!("{e}"))?;
    if !(0.0..=1.0).contains(&rate) {
        return Err(format!("{rate} is outside [0, 1]"));
    }
    Ok(rate)
}

/// Parses the arguments after the program name.
pub fn parse_args(args: impl Iterator<Item = String>) -> Result<Args, clap::Error> {
    Args::try_parse_from(std::iter::once("server".to_owned()).chain(args))
}

/// The admission configuration: from `--config FILE`, else from the flags; `None` with
/// `--no-shed`.
pub fn admission(args: &Args) -> Result<Option<AdmissionConfig>, Box<dyn Error>> {
    if let Some(path) = &args.config {
        let config =
            AdmissionConfig::from_path(path).map_err(|e| format!("--config {path}: {e}"))?;
        return Ok(Some(config));
    }
    if args.no_shed {
        return Ok(None);
    }
    let defaults = AdmissionConfig::default();
    Ok(Some(AdmissionConfig {
        workers: WorkerLimit::Fixed(args.workers),
        queue_capacity: args.queue,
        retry_threshold: RetryThreshold {
            depth: Some(
                args.retry_depth
                    .unwrap_or_else(|| (args.queue / 8).max(1).min(args.queue)),
            ),
            queue_delay: None,
        },
        queue_order: args.lifo_depth.map_or(defaults.queue_order, |from_depth| {
            QueueOrder::AdaptiveLifo { from_depth }
        }),
        seed: Some(args.seed),
        ..defaults
    }))
}

/// One stats line.
#[derive(Serialize)]
struct Line {
    admitted: u64,
    completed: u64,
    shed_first: u64,
    shed_retry: u64,
    expired: u64,
    queue_depth: usize,
    in_flight: usize,
    /// Calls granted a worker (or expired) whose future has not looked yet: 0 at rest.
    unsettled: usize,
    /// Tasks alive in the server's runtime (connections, streams, the reporter).
    tasks: usize,
    cancelled_queued: u64,
    time_queued_us: u64,
    handler_ok: u64,
    handler_failed: u64,
}

fn line(stats: Option<&ShedStats>, control: &DemoControl) -> Line {
    let demo = control.counts();
    let tasks = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    match stats.map(ShedStats::snapshot) {
        Some(s) => Line {
            admitted: s.admitted,
            completed: s.completed,
            shed_first: s.shed_first,
            shed_retry: s.shed_retry,
            expired: s.expired,
            queue_depth: s.queue_depth,
            in_flight: s.in_flight,
            unsettled: stats.map_or(0, |st| st.occupancy().unsettled),
            tasks,
            cancelled_queued: s.cancelled_queued,
            time_queued_us: s.time_queued_us,
            handler_ok: demo.ok,
            handler_failed: demo.failed,
        },
        None => Line {
            admitted: demo.entered,
            completed: demo.ok + demo.failed,
            shed_first: 0,
            shed_retry: 0,
            expired: 0,
            queue_depth: 0,
            in_flight: demo.running,
            unsettled: 0,
            tasks,
            cancelled_queued: 0,
            time_queued_us: 0,
            handler_ok: demo.ok,
            handler_failed: demo.failed,
        },
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    cli::exit_code("server", run(args).await)
}

async fn run(args: Args) -> Result<(), Box<dyn Error>> {
    let inventory = DemoInventory::new(DemoConfig {
        service_time: args.service_time,
        fail_rate: args.fail_rate,
        seed: args.seed,
    });
    let control = inventory.control();
    let layer = shed_layer(&args)?;
    let export = otel::Export::start(otel::Sinks {
        stdout: args.otel_stdout.then_some(Duration::from_secs(1)),
        metrics_addr: args.metrics_addr,
    })
    .await?;
    #[cfg(feature = "otel-examples")]
    let layer = match &export {
        Some(export) => layer.map(|layer| layer.with_meter(&export.meter())),
        None => layer,
    };
    let stats = layer.as_ref().map(ShedLayer::stats);
    let queue_shutdown = layer.as_ref().map(ShedLayer::shutdown_handle);
    let listener = bind(args.addr).await?;
    println!("listening on {}", listener.local_addr()?);
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let reporter = report_every_second(stats, control);
    // SIGINT (Ctrl-C) or SIGTERM: the queue answers what it holds (UNAVAILABLE, pushback
    // 1 ms; the calls never reached the handler), then tonic's graceful shutdown closes the
    // listener, sends GOAWAY and waits for the running calls.
    let shutdown = async move {
        stop_signal().await;
        if let Some(queue) = &queue_shutdown {
            queue.begin();
        }
    };
    let served = serve(&args, layer, inventory, incoming, shutdown).await;
    reporter.abort();
    if let Some(export) = export {
        export.finish();
    }
    served?;
    Ok(())
}

/// The admission layer of [`admission`], with load reports on `--load-reports` or
/// `admission.load_reports` in the `--config` file; `None` with `--no-shed`.
fn shed_layer(args: &Args) -> Result<Option<ShedLayer>, Box<dyn Error>> {
    let layer = admission(args)?
        .as_ref()
        .map(ShedLayer::from_config)
        .transpose()?;
    let from_file = match &args.config {
        Some(path) => {
            ShedSettings::from_path(path)
                .map_err(|e| format!("--config {path}: {e}"))?
                .load_reports
        }
        None => false,
    };
    Ok(match layer {
        Some(layer) if args.load_reports || from_file => Some(layer.with_load_reports()),
        layer => layer,
    })
}

/// Listens on `addr`; an address in use is said in words.
async fn bind(addr: SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            format!(
                "cannot listen on {addr}: the address is in use (EADDRINUSE): another process \
                 holds the port"
            )
        } else {
            format!("cannot listen on {addr}: {e}")
        }
    })
}

/// Prints a stats line (see [`line`]) every second until aborted.
fn report_every_second(
    stats: Option<ShedStats>,
    control: DemoControl,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        loop {
            tick.tick().await;
            match serde_json::to_string(&line(stats.as_ref(), &control)) {
                Ok(json) => println!("{json}"),
                Err(error) => eprintln!("server: stats line: {error}"),
            }
        }
    })
}

/// Serves `inventory` on `incoming` until `shutdown`, behind `--max-connection-age-ms`,
/// `--max-pending-resets`, the call log of `--log-calls`, then `layer` (none with
/// `--no-shed`).
async fn serve(
    args: &Args,
    layer: Option<ShedLayer>,
    inventory: DemoInventory,
    incoming: TcpIncoming,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let log = args.log_calls.then(|| CallLogLayer {
        started: std::time::Instant::now(),
    });
    let mut server = Server::builder();
    if let Some(age) = args.max_connection_age {
        server = server.max_connection_age(age);
    }
    server
        .http2_max_pending_accept_reset_streams(Some(args.max_pending_resets))
        .layer(tower::util::option_layer(log))
        // Both arms answer with tonic's body type: the layer's body (which holds a worker
        // until a response ends) is boxed into it, the bare arm is unchanged.
        .layer(tower::util::option_layer(layer.map(|layer| {
            tower::ServiceBuilder::new()
                .map_response(|r: http::Response<ShedBody<tonic::body::Body>>| {
                    r.map(tonic::body::Body::new)
                })
                .layer(layer)
        })))
        .add_service(InventoryServer::new(inventory))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// Resolves on SIGINT or (on Unix) SIGTERM; never, if no handler can be installed (the
/// server then runs until killed).
async fn stop_signal() {
    let interrupt = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}

/// `--log-calls`: one JSON line per answered call (see the module docs).
#[derive(Clone, Copy, Debug)]
struct CallLogLayer {
    started: std::time::Instant,
}

impl<S> tower::Layer<S> for CallLogLayer {
    type Service = CallLog<S>;

    fn layer(&self, inner: S) -> CallLog<S> {
        CallLog {
            inner,
            started: self.started,
        }
    }
}

#[derive(Clone, Debug)]
struct CallLog<S> {
    inner: S,
    started: std::time::Instant,
}

/// One `--log-calls` line.
#[derive(Serialize)]
struct CallLine {
    call: Option<String>,
    attempt: Option<String>,
    arrived_us: u128,
    answered_us: u128,
    status: Option<String>,
    pushback: Option<String>,
    cancelled: bool,
}

fn header(headers: &http::HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

impl<S, B, R> tower::Service<http::Request<B>> for CallLog<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
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

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let started = self.started;
        let call = header(request.headers(), "x-call-id");
        let attempt = header(
            request.headers(),
            stormguard::engine::wire::GRPC_PREVIOUS_RPC_ATTEMPTS,
        );
        let arrived_us = started.elapsed().as_micros();
        let answer = self.inner.call(request);
        Box::pin(async move {
            // A call whose caller leaves first is logged too, as `"cancelled":true`.
            let mut pending = Pending(
                started,
                Some(CallLine {
                    call,
                    attempt,
                    arrived_us,
                    answered_us: 0,
                    status: None,
                    pushback: None,
                    cancelled: true,
                }),
            );
            let answer = answer.await;
            if let (Ok(response), Some(line)) = (&answer, pending.1.as_mut()) {
                line.cancelled = false;
                line.status = header(response.headers(), stormguard::engine::wire::GRPC_STATUS);
                line.pushback = header(
                    response.headers(),
                    stormguard::engine::wire::GRPC_RETRY_PUSHBACK_MS,
                );
            }
            drop(pending);
            answer
        })
    }
}

/// Prints its line when dropped: at the answer, or when the call is dropped unanswered.
struct Pending(std::time::Instant, Option<CallLine>);

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(mut line) = self.1.take() {
            line.answered_us = self.0.elapsed().as_micros();
            if let Ok(json) = serde_json::to_string(&line) {
                println!("{json}");
            }
        }
    }
}
