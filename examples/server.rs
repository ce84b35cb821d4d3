//! The demo Inventory server behind stormguard's admission queue.
//!
//! ```text
//! cargo run --release --example server -- --addr 127.0.0.1:0 --workers 4 --queue 64 \
//!     --service-time-ms 5 [--fail-rate 0.0] [--no-shed] [--retry-depth N] [--lifo-depth N]
//! cargo run --release --example server -- --addr 127.0.0.1:0 --config admission.json \
//!     --service-time-ms 5
//! ```
//!
//! `--config FILE` reads the whole admission configuration from a JSON, YAML or TOML file
//! (by its extension; `{"admission": {"workers": 4, "queue_capacity": 64,
//! "max_time_queued": "500ms", ...}}` in JSON, see `AdmissionConfig::from_path`); a bad
//! document stops the server with an error that names the field. It excludes the flags that also set it (`--workers`, `--queue`,
//! `--retry-depth`, `--lifo-depth`, `--no-shed`).
//!
//! Prints `listening on ADDR` once bound (the real port when given `:0`), then one JSON
//! line per second on stdout with the cumulative counters:
//! `{"admitted":N,"completed":N,"shed_first":N,"shed_retry":N,"expired":N,"queue_depth":N,...}`.
//!
//! The HTTP/2 limit on streams reset before the server accepted them
//! (`--max-pending-resets`, default 10 000 here) is raised from h2's 20: under a storm,
//! callers that time out reset their streams faster than a busy connection accepts
//! them, and at 20 the server answers with GOAWAY (ENHANCE_YOUR_CALM), dropping every
//! call on the connection: an artifact that looks like a recovery. Both modes use it.
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
//! `--otel-stdout` also exports the layer's OpenTelemetry metrics to stdout every
//! second and once more on Ctrl-C (needs `--features otel-examples`).

use std::error::Error;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;
use stormguard::core::admission::{AdmissionConfig, QueueOrder, RetryThreshold};
use stormguard::server::{ShedBody, ShedLayer, ShedStats};
use stormguard_demo::InventoryServer;
use stormguard_demo::server::{DemoConfig, DemoControl, DemoInventory};
use tokio::net::TcpListener;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

#[path = "support/otel.rs"]
mod otel;

const USAGE: &str = "usage: server --addr ADDR --workers N --queue N --service-time-ms MS \
                     [--fail-rate F] [--no-shed] [--retry-depth N] [--lifo-depth N] [--seed N] \
                     [--max-pending-resets N] [--config FILE] [--log-calls] [--otel-stdout]";

/// The command line.
#[derive(Debug)]
pub struct Args {
    /// The admission configuration file (`--config`), which replaces the flags that set it.
    pub config: Option<String>,
    addr: SocketAddr,
    workers: usize,
    queue: usize,
    service_time: Duration,
    fail_rate: f64,
    no_shed: bool,
    retry_depth: Option<usize>,
    lifo_depth: Option<usize>,
    seed: u64,
    max_pending_resets: usize,
    otel_stdout: bool,
    log_calls: bool,
}

/// Parses the arguments after the program name.
pub fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut admission_flag = None;
    let mut parsed = Args {
        config: None,
        addr: "127.0.0.1:50051".parse().map_err(|e| format!("{e}"))?,
        workers: 4,
        queue: 64,
        service_time: Duration::from_millis(5),
        fail_rate: 0.0,
        no_shed: false,
        retry_depth: None,
        lifo_depth: None,
        seed: 1,
        max_pending_resets: 10_000,
        otel_stdout: false,
        log_calls: false,
    };
    fn value<T: std::str::FromStr>(flag: &str, v: Option<String>) -> Result<T, String> {
        let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
        v.parse().map_err(|_| format!("{flag}: cannot read {v:?}"))
    }
    while let Some(flag) = args.next() {
        if matches!(
            flag.as_str(),
            "--workers" | "--queue" | "--retry-depth" | "--lifo-depth" | "--no-shed"
        ) {
            admission_flag = Some(flag.clone());
        }
        match flag.as_str() {
            "--config" => parsed.config = Some(value(&flag, args.next())?),
            "--addr" => parsed.addr = value(&flag, args.next())?,
            "--workers" => parsed.workers = value(&flag, args.next())?,
            "--queue" => parsed.queue = value(&flag, args.next())?,
            "--service-time-ms" => {
                let ms: f64 = value(&flag, args.next())?;
                parsed.service_time = Duration::try_from_secs_f64(ms / 1000.0)
                    .map_err(|_| format!("--service-time-ms: {ms} is not a duration"))?;
            }
            "--fail-rate" => {
                let rate: f64 = value(&flag, args.next())?;
                if !(0.0..=1.0).contains(&rate) {
                    return Err(format!("--fail-rate: {rate} is outside [0, 1]"));
                }
                parsed.fail_rate = rate;
            }
            "--no-shed" => parsed.no_shed = true,
            "--log-calls" => parsed.log_calls = true,
            "--retry-depth" => parsed.retry_depth = Some(value(&flag, args.next())?),
            "--lifo-depth" => parsed.lifo_depth = Some(value(&flag, args.next())?),
            "--seed" => parsed.seed = value(&flag, args.next())?,
            "--max-pending-resets" => parsed.max_pending_resets = value(&flag, args.next())?,
            "--otel-stdout" => parsed.otel_stdout = true,
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if let (Some(_), Some(flag)) = (&parsed.config, admission_flag) {
        return Err(format!("--config and {flag} exclude each other"));
    }
    Ok(parsed)
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
        workers: args.workers,
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
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("server: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn Error>> {
    let inventory = DemoInventory::new(DemoConfig {
        service_time: args.service_time,
        fail_rate: args.fail_rate,
        seed: args.seed,
    });
    let control = inventory.control();
    let layer = admission(&args)?.map(ShedLayer::from_config).transpose()?;
    let export = if args.otel_stdout {
        Some(otel::Export::stdout(Duration::from_secs(1))?)
    } else {
        None
    };
    #[cfg(feature = "otel-examples")]
    let layer = match &export {
        Some(export) => layer.map(|layer| layer.with_meter(&export.meter())),
        None => layer,
    };
    let stats = layer.as_ref().map(ShedLayer::stats);

    let listener = TcpListener::bind(args.addr).await?;
    println!("listening on {}", listener.local_addr()?);
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));

    let reporter = {
        let control = control.clone();
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
    };

    let shutdown = async {
        // Without a signal handler the server simply runs until killed.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let log = args.log_calls.then(|| CallLogLayer {
        started: std::time::Instant::now(),
    });
    let builder = Server::builder()
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
        .add_service(InventoryServer::new(inventory));
    let served = builder
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    reporter.abort();
    if let Some(export) = export {
        export.finish();
    }
    served?;
    Ok(())
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
            stormguard::core::wire::GRPC_PREVIOUS_RPC_ATTEMPTS,
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
                line.status = header(response.headers(), stormguard::core::wire::GRPC_STATUS);
                line.pushback = header(
                    response.headers(),
                    stormguard::core::wire::GRPC_RETRY_PUSHBACK_MS,
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
