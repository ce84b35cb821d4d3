//! One replica: the fleet example run as a child process (`fleet --replica`).
//!
//! A tonic server for the demo Inventory behind the `ShedLayer` (4 workers, each `Reserve`
//! taking 2 ms of wall time: a sleep, so five replicas do not burn the machine's cores),
//! on `127.0.0.1:PORT` (port 0: any free one), or `--ip IP` (`--discovery dns`: each
//! replica on its own loopback address).
//!
//! Its stdout, read by the parent:
//! - first `port N`, once the socket is bound (the parent connects only then);
//! - then every 20 ms (when it saw any) one JSON line with the attempts answered since the last one:
//!   `{"attempts":[[call,previous,at_us,latency_us,code],...]}`: the `x-call-id` metadata
//!   the client set (0 when absent), `grpc-previous-rpc-attempts` (0 when absent),
//!   arrival in microseconds of the Unix clock (shared by every process of the machine),
//!   time until the response head left, and its `grpc-status` (0 when it comes in the
//!   trailers, as an OK answer's does; -1 when the caller left first).
//!
//! Its stdin, written by the parent, one command a line: `fail` (answer every call
//! `UNAVAILABLE` at once), `slow F` (service time × F), `stop` (graceful shutdown: the
//! `ShedLayer`'s `ShutdownHandle` sets its gRPC health service `NOT_SERVING` and answers
//! queued and arriving calls `UNAVAILABLE` with a 1 ms pushback while running ones finish,
//! tonic sends GOAWAY and waits for them; then a last line and exit 0), `stop MS` (the
//! same, tonic's part MS later: the server says `NOT_SERVING`, and answers arriving calls
//! so, for MS before its connections go).
//!
//! It serves `grpc.health.v1.Health` (tonic-health, the whole server's status `""`),
//! handed to the `ShedLayer` with `with_readiness`; health calls are not recorded.
//! End of stdin (the parent is gone, however it died) exits at once.
//!
//! `--cold-ms T` starts it cold: every call costs 10× the service time at first, falling
//! linearly to 1× over T.

use std::error::Error;
use std::io::{BufRead, Write};
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use stormguard::engine::{wire::GRPC_PREVIOUS_RPC_ATTEMPTS, wire::GRPC_STATUS};
use stormguard::server::AdmissionConfig;
use stormguard::server::ShedLayer;
use stormguard::server::ShutdownHandle;
use stormguard::server::WorkerLimit;
use stormguard_demo::InventoryServer;
use stormguard_demo::server::{DemoConfig, DemoControl, DemoInventory};
use stormguard_demo::storm::MAX_PENDING_ACCEPT_RESET_STREAMS;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

/// Calls one replica runs at once.
pub(crate) const WORKERS: usize = 4;
/// Wall time of one `Reserve`.
pub(crate) const SERVICE_TIME: Duration = Duration::from_millis(2);
/// A cold replica's first calls cost this many times the service time.
pub(crate) const COLD_FACTOR: f64 = 10.0;
/// The metadata key that names the logical call on every attempt.
pub(crate) const CALL_ID: &str = "x-call-id";
/// The health service's calls: served, not recorded.
const HEALTH_PATH: &str = "/grpc.health.v1.Health/";
/// How often the replica writes what it saw.
const FLUSH_EVERY: Duration = Duration::from_millis(20);

/// One attempt as the replica reports it: call, previous attempts, arrival (Unix µs),
/// latency (µs), status code.
pub(crate) type Seen = (u64, u32, u64, u64, i32);

/// A command from the parent.
#[derive(Debug, PartialEq)]
enum Command {
    Fail,
    Slow(f64),
    /// Begin the shutdown; tonic's graceful part after this long.
    Stop(Duration),
}

fn command(line: &str) -> Result<Command, String> {
    let mut words = line.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some("fail"), None, None) => Ok(Command::Fail),
        (Some("stop"), None, None) => Ok(Command::Stop(Duration::ZERO)),
        (Some("stop"), Some(ms), None) => match ms.parse::<u64>() {
            Ok(ms) if ms <= 60_000 => Ok(Command::Stop(Duration::from_millis(ms))),
            _ => Err(format!("stop: {ms:?} is not a delay of 0 to 60000 ms")),
        },
        (Some("slow"), Some(factor), None) => match factor.parse::<f64>() {
            Ok(f) if f.is_finite() && f > 0.0 => Ok(Command::Slow(f)),
            _ => Err(format!("slow: {factor:?} is not a factor above 0")),
        },
        _ => Err(format!("unknown command {line:?}")),
    }
}

/// Runs the replica until `stop` or the end of stdin.
pub(crate) fn main(ip: std::net::IpAddr, port: u16, seed: u64, cold: Duration) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let served = match runtime {
        Ok(runtime) => runtime.block_on(serve(ip, port, seed, cold)),
        Err(e) => Err(e.into()),
    };
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleet replica: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(
    ip: std::net::IpAddr,
    port: u16,
    seed: u64,
    cold: Duration,
) -> Result<(), Box<dyn Error>> {
    let listener = TcpListener::bind((ip, port))
        .await
        .map_err(|e| format!("bind {ip}:{port}: {e}"))?;
    let port = listener.local_addr()?.port();
    let demo = DemoInventory::new(DemoConfig {
        service_time: SERVICE_TIME,
        fail_rate: 0.0,
        seed,
    });
    let control = demo.control();
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();

    let (commands_tx, commands) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if commands_tx.send(line).is_err() {
                return;
            }
        }
        // The parent is gone: nobody reads what this process would say.
        std::process::exit(0);
    });
    write_line(&format!("port {port}"));

    let shed = ShedLayer::from_config(&AdmissionConfig {
        workers: WorkerLimit::Fixed(WORKERS),
        seed: Some(seed),
        ..AdmissionConfig::default()
    })?;
    let (reporter, health) = tonic_health::server::health_reporter();
    let shed = shed.with_readiness(reporter, "");
    let shutdown = shed.shutdown_handle();
    let drained = obey(commands, control.clone(), shutdown);
    if !cold.is_zero() {
        tokio::spawn(warm_up(control, cold));
    }
    let flusher = {
        let seen = Arc::clone(&seen);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(FLUSH_EVERY);
            loop {
                tick.tick().await;
                flush(&seen);
            }
        })
    };

    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    Server::builder()
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESET_STREAMS))
        .layer(RecordLayer { seen: seen.clone() })
        .layer(shed)
        .add_service(health)
        .add_service(InventoryServer::new(demo))
        .serve_with_incoming_shutdown(incoming, async {
            let _ = drained.await;
        })
        .await?;
    flusher.abort();
    flush(&seen);
    Ok(())
}

/// Carries out the parent's commands on a task; the receiver fires when tonic's graceful
/// shutdown is to start.
fn obey(
    mut commands: mpsc::UnboundedReceiver<String>,
    knobs: DemoControl,
    shutdown: ShutdownHandle,
) -> tokio::sync::oneshot::Receiver<()> {
    let (drained_tx, drained) = tokio::sync::oneshot::channel::<()>();
    let mut drained_tx = Some(drained_tx);
    tokio::spawn(async move {
        while let Some(line) = commands.recv().await {
            match command(&line) {
                Ok(Command::Fail) => knobs.set_fail_rate(1.0),
                Ok(Command::Slow(f)) => knobs.set_service_time(SERVICE_TIME.mul_f64(f)),
                // The health service says NOT_SERVING; queued and arriving calls are
                // answered UNAVAILABLE with a 1 ms pushback, running ones finish; after
                // `delay`, tonic sends GOAWAY and waits for them.
                Ok(Command::Stop(delay)) => {
                    shutdown.begin();
                    if let Some(tx) = drained_tx.take() {
                        tokio::spawn(async move {
                            tokio::time::sleep(delay).await;
                            let _ = tx.send(());
                        });
                    }
                }
                Err(e) => eprintln!("fleet replica: {e}"),
            }
        }
    });
    drained
}

/// A cold start: the service time falls from `COLD_FACTOR` × to 1× over `cold`.
async fn warm_up(control: DemoControl, cold: Duration) {
    let started = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    loop {
        tick.tick().await;
        let done = (started.elapsed().as_secs_f64() / cold.as_secs_f64()).min(1.0);
        let factor = COLD_FACTOR - (COLD_FACTOR - 1.0) * done;
        control.set_service_time(SERVICE_TIME.mul_f64(factor));
        if done >= 1.0 {
            return;
        }
    }
}

/// Writes one line to stdout; a parent that stopped reading ends this process.
fn write_line(line: &str) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
        std::process::exit(0);
    }
}

/// Writes the attempts seen since the last flush, if any.
fn flush(seen: &Mutex<Vec<Seen>>) {
    let batch = std::mem::take(&mut *seen.lock().unwrap_or_else(PoisonError::into_inner));
    if batch.is_empty() {
        return;
    }
    match serde_json::to_string(&serde_json::json!({ "attempts": batch })) {
        Ok(line) => write_line(&line),
        Err(e) => eprintln!("fleet replica: {e}"),
    }
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Records every attempt that reaches the server, before the `ShedLayer` decides.
#[derive(Clone, Debug)]
struct RecordLayer {
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl<S> tower::Layer<S> for RecordLayer {
    type Service = Record<S>;

    fn layer(&self, inner: S) -> Record<S> {
        Record {
            inner,
            seen: self.seen.clone(),
        }
    }
}

#[derive(Clone, Debug)]
struct Record<S> {
    inner: S,
    seen: Arc<Mutex<Vec<Seen>>>,
}

/// A header's value as a number, if it is one.
fn number<T: std::str::FromStr>(headers: &http::HeaderMap, name: &str) -> Option<T> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// One attempt in progress: pushed into the log when answered, or dropped unanswered.
struct Pending {
    seen: Arc<Mutex<Vec<Seen>>>,
    started: std::time::Instant,
    attempt: Seen,
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.attempt.3 = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(self.attempt);
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> tower::Service<http::Request<B>> for Record<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path().starts_with(HEALTH_PATH) {
            return Box::pin(self.inner.call(request));
        }
        let headers = request.headers();
        let pending = Pending {
            seen: self.seen.clone(),
            started: std::time::Instant::now(),
            attempt: (
                number(headers, CALL_ID).unwrap_or(0),
                number(headers, GRPC_PREVIOUS_RPC_ATTEMPTS).unwrap_or(0),
                unix_us(),
                0,
                -1,
            ),
        };
        let answer = self.inner.call(request);
        Box::pin(async move {
            // The whole of `pending` moves in (not only the field written below), so it is
            // dropped, and logged, when the answer is out or the call is dropped.
            let mut pending = pending;
            let answer = answer.await;
            if let Ok(response) = &answer {
                pending.attempt.4 = number(response.headers(), GRPC_STATUS).unwrap_or(0);
            }
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_and_garbage_is_refused() {
        assert_eq!(command("fail"), Ok(Command::Fail));
        assert_eq!(command(" slow 10 "), Ok(Command::Slow(10.0)));
        assert_eq!(command("stop"), Ok(Command::Stop(Duration::ZERO)));
        assert_eq!(
            command("stop 1000"),
            Ok(Command::Stop(Duration::from_secs(1)))
        );
        assert!(command("stop -1").is_err());
        assert!(command("stop 99999999").is_err());
        assert!(command("slow -1").is_err());
        assert!(command("slow NaN").is_err());
        assert!(command("fail now").is_err());
        assert!(command("").is_err());
    }
}
