//! What the overload soak (`soak`) and the process faults (`process_faults`) share: the example
//! server as a child process, client channels each behind its own `RetryLayer`, the
//! capacity measurement and the open-loop arrivals. Both examples include this file, so a
//! fix to how the server is started or the load is offered applies to both runs.
#![allow(dead_code, reason = "each example uses the parts it needs")]

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use stormguard::client::RetryLayer;
use stormguard_demo::{InventoryClient, ReserveRequest};
use tokio::net::TcpStream;
use tokio::time::{Instant, MissedTickBehavior};
use tonic::transport::{Endpoint, Uri};
use tower::ServiceBuilder;

/// The most arrivals one client sends at once after falling behind.
pub(crate) const MAX_BURST: u64 = 16;
/// Bound on every wait for the server (start-up, a stats line, draining, exit).
pub(crate) const BOUND: Duration = Duration::from_secs(30);
/// The server's shape in both runs: 4 workers × 20 ms, a queue of 32.
const SERVER_ARGS: [&str; 8] = [
    "--workers",
    "4",
    "--queue",
    "32",
    "--service-time-ms",
    "20",
    "--seed",
    "5",
];

/// The example server as a child process, its stdout lines arriving on a channel, each
/// with the moment this process read it.
pub(crate) struct ServerProcess {
    pub(crate) child: Child,
    lines: mpsc::Receiver<(std::time::Instant, String)>,
    stderr: Arc<Mutex<Vec<String>>>,
    stderr_reader: Option<JoinHandle<()>>,
    /// When this process read the `listening on ADDR` line: the listener was bound.
    pub(crate) listening_at: std::time::Instant,
}

impl ServerProcess {
    /// Starts the server at `path` listening on `addr` (port 0: any free port) with
    /// `extra` flags; returns it and the address it listens on. A server that cannot bind
    /// `addr` because another process holds it (`EADDRINUSE`) is an error that says so.
    pub(crate) fn start(
        path: &Path,
        addr: &str,
        extra: &[String],
    ) -> Result<(Self, String), String> {
        let mut child = Command::new(path)
            .args(["--addr", addr])
            .args(SERVER_ARGS)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot start {}: {e} (build it first: cargo build --example server)",
                    path.display()
                )
            })?;
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().ok_or("no stdout")?;
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send((std::time::Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let pipe = child.stderr.take().ok_or("no stderr")?;
        let sink = stderr.clone();
        let stderr_reader = std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if let Ok(mut v) = sink.lock() {
                    v.push(line);
                }
            }
        });
        let mut server = ServerProcess {
            child,
            lines,
            stderr,
            stderr_reader: Some(stderr_reader),
            listening_at: std::time::Instant::now(),
        };
        let (at, first) = match server.next_line_at() {
            Ok(line) => line,
            Err(error) => return Err(server.start_failed(addr, error)),
        };
        let bound = first
            .strip_prefix("listening on ")
            .ok_or_else(|| format!("unexpected first line {first:?}"))?
            .to_owned();
        server.listening_at = at;
        Ok((server, bound))
    }

    /// Why a server printed no `listening on` line: once it has exited and said why,
    /// `EADDRINUSE` in its own words, anything else with its stderr.
    fn start_failed(&mut self, addr: &str, error: String) -> String {
        let exited = wait_exit(&mut self.child);
        if let Some(reader) = self.stderr_reader.take() {
            let _ = reader.join();
        }
        let stderr = self.stderr();
        if stderr.iter().any(|l| l.contains("EADDRINUSE")) {
            return format!(
                "the server cannot listen on {addr}: another process holds the address \
                 (EADDRINUSE); server said {stderr:?}"
            );
        }
        match exited {
            Some(status) => format!("the server exited ({status}) before listening: {stderr:?}"),
            None => error,
        }
    }

    pub(crate) fn next_line(&mut self) -> Result<String, String> {
        self.next_line_at().map(|(_, line)| line)
    }

    fn next_line_at(&mut self) -> Result<(std::time::Instant, String), String> {
        self.lines.recv_timeout(BOUND).map_err(|_| {
            format!(
                "server: no line within {BOUND:?}; stderr: {:?}",
                self.stderr()
            )
        })
    }

    /// Drops the lines already read and not yet asked for, so that the next stats line is
    /// a fresh one.
    pub(crate) fn skip_buffered(&mut self) {
        while self.lines.try_recv().is_ok() {}
    }

    /// The next stats line (one per second).
    pub(crate) fn stats(&mut self) -> Result<serde_json::Value, String> {
        loop {
            let line = self.next_line()?;
            if line.starts_with('{') {
                return serde_json::from_str(&line).map_err(|e| format!("{line}: {e}"));
            }
        }
    }

    /// Waits (one stats line a second, at most [`BOUND`]) until the queue, the workers and
    /// the unsettled slots are empty; returns that line.
    pub(crate) fn at_rest(&mut self) -> Result<Option<serde_json::Value>, String> {
        for _ in 0..BOUND.as_secs() {
            let s = self.stats()?;
            if s["queue_depth"] == 0 && s["in_flight"] == 0 && s["unsettled"] == 0 {
                return Ok(Some(s));
            }
        }
        Ok(None)
    }

    /// Resident memory in KiB, from `/proc`.
    pub(crate) fn rss_kib(&self) -> Option<u64> {
        rss_kib(&format!("/proc/{}/status", self.child.id()))
    }

    pub(crate) fn stderr(&self) -> Vec<String> {
        self.stderr.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Sends `signal` (`INT`, `TERM`) with `kill`; `false` when the process was gone.
    pub(crate) fn signal(&self, signal: &str) -> Result<bool, String> {
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .map_err(|e| format!("kill -{signal}: {e}"))?;
        Ok(sent.success())
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn rss_kib(status_file: &str) -> Option<u64> {
    let status = std::fs::read_to_string(status_file).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Waits at most [`BOUND`] for `child` to exit.
pub(crate) fn wait_exit(child: &mut Child) -> Option<std::process::ExitStatus> {
    let until = std::time::Instant::now() + BOUND;
    while std::time::Instant::now() < until {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

pub(crate) type Client = InventoryClient<stormguard::client::Retry<tonic::transport::Channel>>;

/// One client "process": a channel whose connector calls `on_connect` with each new TCP
/// connection's outcome (`true` once connected), behind its own `RetryLayer`.
pub(crate) fn client(
    addr: &str,
    on_connect: Arc<dyn Fn(bool) + Send + Sync>,
) -> Result<(Client, RetryLayer), String> {
    let layer =
        RetryLayer::from_config(&stormguard_demo::client_config()).map_err(|e| e.to_string())?;
    let target = addr.to_owned();
    let connector = tower::service_fn(move |_: Uri| {
        let (target, on_connect) = (target.clone(), on_connect.clone());
        async move {
            let stream = TcpStream::connect(target).await;
            on_connect(stream.is_ok());
            let stream = stream?;
            stream.set_nodelay(true)?;
            Ok::<_, std::io::Error>(TokioIo::new(stream))
        }
    });
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?
        // A server of ours: calls that give up in bulk must not get the connection closed
        // (docs/operating.md, "HTTP/2 resets").
        .http2_max_local_error_reset_streams(None)
        .connect_with_connector_lazy(connector);
    let client = InventoryClient::new(ServiceBuilder::new().layer(layer.clone()).service(channel));
    Ok((client, layer))
}

/// `n` client "processes" of [`client`], every connection's outcome given to `on_connect`.
pub(crate) fn clients(
    addr: &str,
    n: usize,
    on_connect: &Arc<dyn Fn(bool) + Send + Sync>,
) -> Result<(Vec<Client>, Vec<RetryLayer>), String> {
    (0..n)
        .map(|_| client(addr, Arc::clone(on_connect)))
        .collect()
}

/// Stops `server` with SIGINT and says what went wrong: gone before the signal, not a
/// clean exit within [`BOUND`], a panic on its stderr.
pub(crate) fn stop(server: &mut ServerProcess) -> Result<Vec<String>, String> {
    let mut failures = Vec::new();
    if !server.signal("INT")? {
        failures.push("the server was gone before SIGINT".into());
    }
    match wait_exit(&mut server.child) {
        Some(status) if status.success() => {}
        other => failures.push(format!("the server did not exit cleanly: {other:?}")),
    }
    let stderr = server.stderr();
    if stderr.iter().any(|l| l.contains("panicked")) {
        failures.push(format!("the server panicked: {stderr:?}"));
    }
    Ok(failures)
}

/// The retry layers' counters that a run reports, summed over `layers`, by name.
pub(crate) fn retry_totals(layers: &[RetryLayer]) -> Vec<(&'static str, u64)> {
    let mut totals = vec![
        ("logical", 0),
        ("attempts", 0),
        ("retries", 0),
        ("ok", 0),
        ("refused_budget", 0),
        ("refused_pushback", 0),
        ("deadline_exceeded", 0),
    ];
    for l in layers {
        let s = l.stats().snapshot();
        let values = [
            s.logical,
            s.attempts,
            s.retries,
            s.ok,
            s.refused.budget,
            s.refused.pushback,
            s.deadline_exceeded,
        ];
        for ((_, total), v) in totals.iter_mut().zip(values) {
            *total += v;
        }
    }
    totals
}

/// The `i`th call's request; `tag` names the run in its request id.
pub(crate) fn request(tag: &str, i: u64) -> ReserveRequest {
    ReserveRequest {
        sku: format!("sku-{}", i % 100),
        quantity: 1,
        request_id: format!("{tag}-{i}"),
        payload: Vec::new(),
    }
}

/// Capacity: what the server completes per second when 64 callers keep it saturated,
/// measured over `seconds` between two of its stats lines, after `warm_up` more (the
/// first line comes a second after the server started: the callers already saturate it).
pub(crate) async fn capacity(
    server: &mut ServerProcess,
    clients: &[Client],
    tag: &'static str,
    warm_up: u64,
    seconds: u64,
) -> Result<f64, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..64u64 {
        let (mut c, stop) = (clients[(k as usize) % clients.len()].clone(), stop.clone());
        tasks.spawn(async move {
            let mut i = k << 32;
            while !stop.load(Ordering::Relaxed) {
                let mut r = tonic::Request::new(request(tag, i));
                r.set_timeout(Duration::from_secs(5));
                let _ = c.reserve(r).await;
                i += 1;
            }
        });
    }
    let measured = (|| {
        for _ in 0..warm_up {
            server.stats()?;
        }
        let a = server.stats()?;
        for _ in 1..seconds {
            server.stats()?;
        }
        let b = server.stats()?;
        let done = |v: &serde_json::Value| v["completed"].as_u64().unwrap_or(0);
        Ok::<_, String>((done(&b).saturating_sub(done(&a))) as f64 / seconds as f64)
    })();
    stop.store(true, Ordering::Relaxed);
    while tasks.join_next().await.is_some() {}
    measured
}

/// Open-loop arrivals from one client: from `begin` until `end`, every millisecond,
/// `call(i)` for each arrival due by then at `per_second` (ids from `first`), whatever the
/// answers; returns once every call it spawned has ended. `call` runs at the arrival and
/// returns the call itself, spawned as a task. The rate holds whatever the timer's
/// granularity; a generator that fell far behind (the machine stalled it) sends at most
/// [`MAX_BURST`] at once and adds the rest to `skipped`.
pub(crate) async fn open_loop<F, Fut>(
    begin: Instant,
    end: Instant,
    per_second: f64,
    first: u64,
    skipped: &AtomicU64,
    mut call: F,
) where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut calls = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let (mut due_done, mut i) = (0u64, first);
    while Instant::now() < end {
        tick.tick().await;
        let due = (begin.elapsed().as_secs_f64() * per_second) as u64;
        let behind = due.saturating_sub(due_done);
        let now = behind.min(MAX_BURST);
        skipped.fetch_add(behind - now, Ordering::Relaxed);
        due_done = due;
        for _ in 0..now {
            calls.spawn(call(i));
            i += 1;
        }
        // Reap finished calls so the set does not grow for the whole run.
        while calls.try_join_next().is_some() {}
    }
    while calls.join_next().await.is_some() {}
}
