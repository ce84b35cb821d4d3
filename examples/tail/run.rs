//! One policy's run: a fresh server, channel and client; a warm-up at the normal load, the
//! measured normal load, then twice the capacity, back to back on the same client (so the
//! learned delays and the budget carry over into the overload, as they would).
//!
//! Calls arrive open loop, evenly spaced at a fixed rate, each its own task; a call counts
//! in the phase it arrived in, and so do all of its attempts (each carries the phase).

use std::sync::Arc;
use std::time::Duration;
use tower::BoxError;

use stormguard_demo::InventoryClient;
use stormguard_demo::ReserveRequest;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::client::{Caller, Policy};
use crate::server::{Counts, Phase, Tail, WORKERS, serve};
use stormguard_demo::storm::connect;

/// How long each part of a run lasts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    pub(crate) warmup: Duration,
    pub(crate) normal: Duration,
    pub(crate) overload: Duration,
    /// How long the capacity is measured for.
    pub(crate) calibration: Duration,
}

impl Timing {
    /// 2 s of warm-up, 40 s measured at the normal load, 10 s of overload.
    pub(crate) fn standard() -> Self {
        Timing {
            warmup: Duration::from_secs(2),
            normal: Duration::from_secs(40),
            overload: Duration::from_secs(10),
            calibration: Duration::from_millis(2000),
        }
    }

    /// 1.5 s of warm-up, 3 s measured, 2 s of overload.
    pub(crate) fn quick() -> Self {
        Timing {
            warmup: Duration::from_millis(1500),
            normal: Duration::from_secs(3),
            overload: Duration::from_secs(2),
            calibration: Duration::from_millis(800),
        }
    }

    pub(crate) fn total(&self) -> Duration {
        self.warmup + self.normal + self.overload
    }
}

/// What every policy's run shares.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RunConfig {
    /// Logical calls per second at the normal load.
    pub(crate) rate: f64,
    /// Logical calls per second during the overload.
    pub(crate) overload_rate: f64,
    pub(crate) deadline: Duration,
    pub(crate) seed: u64,
    pub(crate) timing: Timing,
}

/// What one phase of a run measured.
#[derive(Clone, Debug, Default)]
pub(crate) struct PhaseData {
    /// Logical calls that arrived in the phase.
    pub(crate) calls: u64,
    /// Latency of each call that succeeded within its deadline, in µs.
    pub(crate) ok_us: Vec<u64>,
    /// Attempts of the phase's calls the server received, answered or shed.
    pub(crate) received: u64,
    /// Of those, the ones that reached the handler and were slow.
    pub(crate) slow: u64,
}

/// What one policy's run measured.
#[derive(Clone, Debug)]
pub(crate) struct RunData {
    pub(crate) normal: PhaseData,
    pub(crate) overload: PhaseData,
    /// stormguard's layer, over the whole run: hedges sent, hedges that answered their
    /// call, and hedges that were due and not sent because the budget was spent.
    pub(crate) hedges: Option<u64>,
    pub(crate) hedges_won: Option<u64>,
    pub(crate) hedges_refused_budget: Option<u64>,
}

/// The server's capacity in calls per second, slow attempts included: `2 × WORKERS`
/// callers in a closed loop without deadlines keep every worker busy, and the answers are
/// counted.
pub(crate) async fn capacity(seed: u64, calibration: Duration) -> Result<f64, BoxError> {
    let (tail, control) = Tail::new(seed);
    let serving = serve(tail.clone(), seed).await?;
    let client = InventoryClient::new(connect(serving.addr).await?);
    let mut callers = JoinSet::new();
    for _ in 0..2 * WORKERS {
        let mut client = client.clone();
        callers.spawn(async move {
            loop {
                if client.reserve(ReserveRequest::default()).await.is_err() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        });
    }
    // Let the callers settle, then count.
    tokio::time::sleep(calibration / 4).await;
    let (before, t0) = (control.counts().ok, Instant::now());
    tokio::time::sleep(calibration).await;
    let done = control.counts().ok - before;
    let rate = done as f64 / t0.elapsed().as_secs_f64();
    callers.abort_all();
    tail.close();
    Ok(rate)
}

/// Runs `policy` through the three phases. `progress` is called with the share of the run
/// done, about ten times a second.
pub(crate) async fn run(
    policy: Policy,
    config: &RunConfig,
    progress: &(dyn Fn(f64) + Send + Sync),
) -> Result<RunData, BoxError> {
    let (tail, _control) = Tail::new(config.seed);
    let counts: Arc<Counts> = tail.counts();
    let serving = serve(tail.clone(), config.seed).await?;
    let caller = Caller::new(policy, connect(serving.addr).await?, config.seed)?;
    let timing = config.timing;
    let phases = [
        (Phase::Warmup, config.rate, timing.warmup),
        (Phase::Normal, config.rate, timing.normal),
        (Phase::Overload, config.overload_rate, timing.overload),
    ];
    let deadline = config.deadline;
    let total = timing.total().as_secs_f64();
    let start = Instant::now();
    let mut last_progress = start;
    let mut calls = JoinSet::new();
    let mut outcomes: Vec<(Phase, Option<u64>)> = Vec::new();
    let mut phase_start = start;
    for (phase, rate, length) in phases {
        let n = (rate * length.as_secs_f64()).round() as u64;
        for i in 0..n {
            let at = phase_start + Duration::from_secs_f64(i as f64 / rate);
            tokio::time::sleep_until(at).await;
            let caller = caller.clone();
            calls.spawn(async move {
                let called = Instant::now();
                let answer = tokio::time::timeout(deadline, caller.reserve(phase, deadline)).await;
                let took = called.elapsed();
                let ok = matches!(answer, Ok(Ok(()))) && took <= deadline;
                (
                    phase,
                    ok.then(|| u64::try_from(took.as_micros()).unwrap_or(u64::MAX)),
                )
            });
            while let Some(done) = calls.try_join_next() {
                outcomes.push(done?);
            }
            let now = Instant::now();
            if now - last_progress >= Duration::from_millis(100) {
                progress((now - start).as_secs_f64() / total);
                last_progress = now;
            }
        }
        phase_start += length;
    }
    while let Some(done) = calls.join_next().await {
        outcomes.push(done?);
    }
    progress(1.0);
    tail.close();
    drop(serving);

    let phase_data = |phase: Phase| {
        let mut data = PhaseData {
            received: counts.received(phase),
            slow: counts.slow(phase),
            ..PhaseData::default()
        };
        for (p, ok) in &outcomes {
            if *p == phase {
                data.calls += 1;
                data.ok_us.extend(ok);
            }
        }
        data
    };
    let stats = caller.stats().map(|s| s.snapshot());
    Ok(RunData {
        normal: phase_data(Phase::Normal),
        overload: phase_data(Phase::Overload),
        hedges: stats.map(|s| s.hedges),
        hedges_won: stats.map(|s| s.hedges_won),
        hedges_refused_budget: stats.map(|s| s.hedges_refused.budget),
    })
}
