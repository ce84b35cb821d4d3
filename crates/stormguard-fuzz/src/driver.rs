//! A seeded mutation driver: the same seed runs the same inputs, on any toolchain.
//!
//! It starts from each target's seeds, mutates a pool of inputs (byte flips, inserts,
//! deletions, duplications, splices, dictionary fragments), and keeps an input in the pool
//! when it produced an answer not seen before, so it explores past the first error a parser
//! returns. It has no coverage feedback (that needs a nightly toolchain's sanitizers), so it
//! relies on the targets' dictionaries to reach deep into structured inputs.
//!
//! A panic in a target is returned as a [`Crash`] with the input that caused it. An input
//! that runs longer than [`HANG_LIMIT`] is a hang: the watchdog prints the target, seed and
//! input number (enough to replay it) and aborts the process.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::targets::Target;

/// The longest any single input may run before the driver calls it a hang.
pub const HANG_LIMIT: Duration = Duration::from_secs(10);

/// The longest input the driver builds (bytes).
pub const MAX_INPUT: usize = 4096;

/// The most inputs the pool keeps.
const MAX_POOL: usize = 1024;

/// What one run of a target did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The target's name.
    pub target: &'static str,
    /// Inputs run.
    pub inputs: u64,
    /// Inputs the parser accepted.
    pub accepted: u64,
    /// Inputs the parser refused (a clear error or a "do not retry").
    pub rejected: u64,
    /// Distinct answers seen.
    pub features: usize,
    /// The slowest single input.
    pub slowest: Duration,
}

/// A target that panicked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Crash {
    /// The target's name.
    pub target: &'static str,
    /// Which input (0-based) of the run with this seed.
    pub index: u64,
    /// The input.
    pub input: Vec<u8>,
    /// The panic message.
    pub message: String,
}

impl std::fmt::Display for Crash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: input #{} panicked: {}\ninput ({} bytes): {:?}",
            self.target,
            self.index,
            self.message,
            self.input.len(),
            String::from_utf8_lossy(&self.input)
        )
    }
}

impl std::error::Error for Crash {}

/// Runs `inputs` inputs through `target`, seeded by `seed`.
pub fn run(target: &'static Target, seed: u64, inputs: u64) -> Result<Report, Crash> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut pool: Vec<Vec<u8>> = target.seeds.iter().map(|s| s.as_bytes().to_vec()).collect();
    pool.push(Vec::new());
    let mut features = std::collections::HashSet::new();
    let mut report = Report {
        target: target.name,
        inputs: 0,
        accepted: 0,
        rejected: 0,
        features: 0,
        slowest: Duration::ZERO,
    };

    let watchdog = Watchdog::start(target.name, seed);
    for index in 0..inputs {
        let input = if (index as usize) < pool.len() {
            pool[index as usize].clone()
        } else {
            mutate(&mut rng, &pool, target.dictionary)
        };
        watchdog.begin(index);
        let started = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| (target.run)(&input)));
        report.slowest = report.slowest.max(started.elapsed());
        let outcome = outcome.map_err(|panic| Crash {
            target: target.name,
            index,
            message: panic_message(panic.as_ref()),
            input: input.clone(),
        })?;
        report.inputs += 1;
        if outcome.accepted {
            report.accepted += 1;
        } else {
            report.rejected += 1;
        }
        // Keep inputs that gave a new answer, and now and then an accepted one: mutating
        // well-formed inputs is how the driver reaches the checks behind the syntax.
        let new = features.insert((outcome.accepted, outcome.feature));
        if new || (outcome.accepted && rng.u8(..8) == 0) {
            if pool.len() < MAX_POOL {
                pool.push(input);
            } else {
                let slot = rng.usize(..pool.len());
                pool[slot] = input;
            }
        }
    }
    watchdog.stop();
    report.features = features.len();
    Ok(report)
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic".to_owned()
    }
}

/// One new input: a pool entry with one to four mutations.
fn mutate(rng: &mut fastrand::Rng, pool: &[Vec<u8>], dictionary: &[&str]) -> Vec<u8> {
    let mut input = pool[rng.usize(..pool.len())].clone();
    for _ in 0..rng.usize(1..=4) {
        let at = rng.usize(..=input.len());
        match rng.u8(..8) {
            // flip a bit
            0 if !input.is_empty() => {
                let i = rng.usize(..input.len());
                input[i] ^= 1 << rng.u8(..8);
            }
            // insert a random byte, often an ASCII digit
            1 => {
                let b = if rng.bool() {
                    rng.u8(b'0'..=b'9')
                } else {
                    rng.u8(..)
                };
                input.insert(at, b);
            }
            // delete a range
            2 if !input.is_empty() => {
                let i = rng.usize(..input.len());
                let n = rng.usize(1..=(input.len() - i).min(16));
                input.drain(i..i + n);
            }
            // repeat a range (long runs of digits, repeated keys)
            3 if !input.is_empty() => {
                let i = rng.usize(..input.len());
                let n = rng.usize(1..=(input.len() - i).min(32));
                let chunk = input[i..i + n].to_vec();
                for _ in 0..rng.usize(1..=8) {
                    input.splice(at..at, chunk.iter().copied());
                }
            }
            // splice the tail of another entry
            4 => {
                let other = &pool[rng.usize(..pool.len())];
                let from = rng.usize(..=other.len());
                input.truncate(at);
                input.extend_from_slice(&other[from..]);
            }
            // replace a range with a dictionary fragment
            5 if !dictionary.is_empty() && !input.is_empty() => {
                let i = rng.usize(..input.len());
                let n = rng.usize(0..=(input.len() - i).min(8));
                let token = dictionary[rng.usize(..dictionary.len())];
                input.splice(i..i + n, token.bytes());
            }
            // insert a dictionary fragment
            _ if !dictionary.is_empty() => {
                let token = dictionary[rng.usize(..dictionary.len())];
                input.splice(at..at, token.bytes());
            }
            _ => input.insert(at, rng.u8(..)),
        }
    }
    input.truncate(MAX_INPUT);
    input
}

/// Aborts the process when one input runs longer than [`HANG_LIMIT`].
struct Watchdog {
    index: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn start(target: &'static str, seed: u64) -> Self {
        let index = Arc::new(AtomicU64::new(u64::MAX));
        let done = Arc::new(AtomicBool::new(false));
        let thread = {
            let (index, done) = (index.clone(), done.clone());
            std::thread::spawn(move || {
                let tick = Duration::from_millis(100);
                let mut last = u64::MAX;
                let mut since = Instant::now();
                while !done.load(Ordering::Relaxed) {
                    std::thread::park_timeout(tick);
                    let now = index.load(Ordering::Relaxed);
                    if now != last {
                        (last, since) = (now, Instant::now());
                    } else if since.elapsed() > HANG_LIMIT && !done.load(Ordering::Relaxed) {
                        eprintln!(
                            "{target}: input #{now} (seed {seed}) has run for more than \
                             {HANG_LIMIT:?}: a hang"
                        );
                        std::process::abort();
                    }
                }
            })
        };
        Watchdog {
            index,
            done,
            thread: Some(thread),
        }
    }

    fn begin(&self, index: u64) {
        self.index.store(index, Ordering::Relaxed);
    }

    fn stop(mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}
