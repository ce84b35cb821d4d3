//! The parent's side of a replica process: start it, read what it says, command it, stop
//! or kill it. A [`Replica`] kills its process when dropped, so no child outlives a run
//! that ends early or panics; a child whose parent died some other way sees its stdin
//! close and exits (see `replica.rs`).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::oneshot;

use crate::replica::Seen;

/// Bound on every wait for a replica: its port, its graceful exit.
const BOUND: Duration = Duration::from_secs(20);
/// Lines of a replica's stderr kept for error messages.
const STDERR_LINES: usize = 20;

/// One attempt a replica received.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Received {
    /// The replica's index in the fleet.
    pub(crate) replica: usize,
    /// The logical call (`x-call-id`).
    pub(crate) call: u64,
    /// Its `grpc-previous-rpc-attempts`.
    pub(crate) attempt: u32,
    /// Arrival, Unix µs.
    pub(crate) at_us: u64,
    /// Until the response head, µs.
    pub(crate) latency_us: u64,
    /// `grpc-status` of the answer (0 OK, -1 caller left first).
    pub(crate) code: i32,
}

/// What every replica process of one run reported, and what could not be read.
#[derive(Debug, Default)]
pub(crate) struct Reports {
    pub(crate) received: Vec<Received>,
    pub(crate) errors: Vec<String>,
}

pub(crate) type SharedReports = Arc<Mutex<Reports>>;

fn lock(reports: &SharedReports) -> std::sync::MutexGuard<'_, Reports> {
    reports.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One line after the first.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Batch {
    attempts: Vec<Seen>,
}

/// A replica process.
#[derive(Debug)]
pub(crate) struct Replica {
    child: Child,
    stdin: ChildStdin,
    /// Fires when the child's stdout closes (it exited, or is about to).
    closed: Option<oneshot::Receiver<()>>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    /// Killed: nothing more to stop or wait for.
    gone: bool,
    pub(crate) port: u16,
}

impl Replica {
    /// Starts replica `index` on `port` (0: any), cold for `cold`; returns once it is
    /// listening. Its reports go to `reports`.
    pub(crate) async fn start(
        index: usize,
        port: u16,
        seed: u64,
        cold: Duration,
        reports: &SharedReports,
    ) -> Result<Replica, String> {
        let localhost = std::net::IpAddr::from([127, 0, 0, 1]);
        Replica::start_on(localhost, index, port, seed, cold, reports).await
    }

    /// [`start`](Self::start) on `ip` rather than 127.0.0.1.
    pub(crate) async fn start_on(
        ip: std::net::IpAddr,
        index: usize,
        port: u16,
        seed: u64,
        cold: Duration,
        reports: &SharedReports,
    ) -> Result<Replica, String> {
        let exe = std::env::current_exe().map_err(|e| format!("current exe: {e}"))?;
        let mut child = Command::new(&exe)
            .arg("--replica")
            .args(["--ip", &ip.to_string()])
            .args(["--port", &port.to_string()])
            .args(["--seed", &seed.to_string()])
            .args(["--cold-ms", &cold.as_millis().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
        // From here on, `replica` owns the child: an error below kills it on drop.
        let (stdin, stdout, stderr_pipe) =
            match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
                (Some(i), Some(o), Some(e)) => (i, o, e),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("replica {index}: no pipes"));
                }
            };
        let (port_tx, port_rx) = oneshot::channel();
        let (closed_tx, closed) = oneshot::channel();
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let mut replica = Replica {
            child,
            stdin,
            closed: Some(closed),
            stderr: stderr.clone(),
            gone: false,
            port,
        };
        std::thread::spawn(move || {
            for line in BufReader::new(stderr_pipe).lines().map_while(Result::ok) {
                let mut kept = stderr.lock().unwrap_or_else(PoisonError::into_inner);
                if kept.len() == STDERR_LINES {
                    kept.pop_front();
                }
                kept.push_back(line);
            }
        });
        let reports = reports.clone();
        std::thread::spawn(move || read_stdout(index, stdout, port_tx, closed_tx, &reports));
        let answer = tokio::time::timeout(BOUND, port_rx).await;
        match answer {
            Ok(Ok(Ok(p))) => {
                replica.port = p;
                Ok(replica)
            }
            Ok(Ok(Err(e))) => Err(format!("replica {index}: {e}{}", replica.stderr_tail())),
            Ok(Err(_)) => Err(format!(
                "replica {index}: exited before its port{}",
                replica.stderr_tail()
            )),
            Err(_) => Err(format!("replica {index}: no port within {BOUND:?}")),
        }
    }

    /// Sends one command line (`fail`, `slow 10`, `stop`, `stop 1000`).
    pub(crate) fn send(&mut self, command: &str) -> Result<(), String> {
        writeln!(self.stdin, "{command}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| format!("replica on port {}: {command}: {e}", self.port))
    }

    /// SIGKILL: the process ends at once; connections to it are reset or refused.
    pub(crate) fn kill(&mut self) {
        if !self.gone {
            let _ = self.child.kill();
            let _ = self.reap();
            self.gone = true;
        }
    }

    /// Waits for the process to be gone. Reaping a process blocks, for as long as the
    /// system takes to tear it down (long on a busy machine): the runtime's other tasks,
    /// the client's calls among them, move to another worker meanwhile instead of waiting
    /// behind it.
    fn reap(&mut self) -> std::io::Result<std::process::ExitStatus> {
        let child = &mut self.child;
        match tokio::runtime::Handle::try_current() {
            Ok(runtime)
                if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread =>
            {
                tokio::task::block_in_place(|| child.wait())
            }
            _ => child.wait(),
        }
    }

    /// Graceful shutdown: `stop`, then waits (at most [`BOUND`]) until it has said all it
    /// had to say and exited; killed if it does not.
    pub(crate) async fn stop(&mut self) -> Result<(), String> {
        self.stop_after(Duration::ZERO).await
    }

    /// [`stop`](Self::stop), its connections kept for `drain` after the shutdown began
    /// (`stop MS`: the health service says `NOT_SERVING` meanwhile).
    pub(crate) async fn stop_after(&mut self, drain: Duration) -> Result<(), String> {
        if self.gone {
            return Ok(());
        }
        if drain.is_zero() {
            self.send("stop")?;
        } else {
            self.send(&format!("stop {}", drain.as_millis()))?;
        }
        let closed = self.closed.take();
        let ended = match closed {
            Some(closed) => tokio::time::timeout(BOUND + drain, closed).await.is_ok(),
            None => true,
        };
        if !ended {
            self.kill();
            return Err(format!(
                "replica on port {} did not stop within {BOUND:?}{}",
                self.port,
                self.stderr_tail()
            ));
        }
        let status = self.reap().map_err(|e| format!("wait: {e}"))?;
        self.gone = true;
        if !status.success() {
            return Err(format!(
                "replica on port {} exited with {status}{}",
                self.port,
                self.stderr_tail()
            ));
        }
        Ok(())
    }

    fn stderr_tail(&self) -> String {
        let kept = self.stderr.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.is_empty() {
            String::new()
        } else {
            let lines: Vec<&str> = kept.iter().map(String::as_str).collect();
            format!("; its stderr: {}", lines.join(" | "))
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The first line, `port N`.
fn port_line(line: &str) -> Result<u16, String> {
    line.strip_prefix("port ")
        .and_then(|p| p.trim().parse().ok())
        .filter(|&p| p != 0)
        .ok_or_else(|| format!("expected `port N` first, got {line:?}"))
}

/// Reads a replica's stdout until it closes: the port, then batches of attempts.
fn read_stdout(
    index: usize,
    stdout: std::process::ChildStdout,
    port_tx: oneshot::Sender<Result<u16, String>>,
    closed_tx: oneshot::Sender<()>,
    reports: &SharedReports,
) {
    let mut lines = BufReader::new(stdout).lines();
    let first = match lines.next() {
        Some(Ok(line)) => port_line(&line),
        Some(Err(e)) => Err(format!("stdout: {e}")),
        // Dropping `port_tx` says: gone before its port.
        None => return,
    };
    let listening = first.is_ok();
    let _ = port_tx.send(first);
    if listening {
        // After a line that cannot be read, the rest is drained unread, so the replica
        // never blocks on a full pipe; the first error is reported.
        let mut broken = false;
        for line in lines {
            let line = match line {
                Ok(line) => line,
                Err(e) => {
                    lock(reports)
                        .errors
                        .push(format!("replica {index}: stdout: {e}"));
                    break;
                }
            };
            if broken {
                continue;
            }
            match serde_json::from_str::<Batch>(&line) {
                Ok(batch) => lock(reports)
                    .received
                    .extend(batch.attempts.into_iter().map(
                        |(call, attempt, at_us, latency_us, code)| Received {
                            replica: index,
                            call,
                            attempt,
                            at_us,
                            latency_us,
                            code,
                        },
                    )),
                Err(e) => {
                    lock(reports)
                        .errors
                        .push(format!("replica {index}: {line:?}: {e}"));
                    broken = true;
                }
            }
        }
    }
    let _ = closed_tx.send(());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_line_is_checked() {
        assert_eq!(port_line("port 4242"), Ok(4242));
        assert!(port_line("port 0").is_err());
        assert!(port_line("port 70000").is_err());
        assert!(port_line("listening on 127.0.0.1:1").is_err());
    }

    #[test]
    fn a_batch_is_read_strictly() {
        let ok: Batch = serde_json::from_str(r#"{"attempts":[[7,1,10,20,0]]}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ok.attempts, vec![(7, 1, 10, 20, 0)]);
        assert!(serde_json::from_str::<Batch>(r#"{"attempts":[[7,-1,10,20,0]]}"#).is_err());
        assert!(serde_json::from_str::<Batch>(r#"{"attempts":[[7,1,10]]}"#).is_err());
        assert!(serde_json::from_str::<Batch>(r#"{"other":1}"#).is_err());
    }
}
