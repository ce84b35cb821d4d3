//! The server's gate and the simulator's server decide alike.
//!
//! One script (arrivals of first attempts and retries of every criticality, with and
//! without deadlines, completions, cancellations, at scripted instants) runs through the
//! server's gate (`stormguard_server::test_util::GateDriver`, on paused time, polling
//! tickets as the response future does, with the expiry timers firing at their instants)
//! and through the simulator's [`SimServer`] (on the same instants). Every decision is
//! recorded with its instant: a call run (at once or later), queued (with its expiry),
//! shed (why, and the pushback sent; on arrival or displaced from a full queue), or
//! expired (on arrival or while queued). The two records must be equal, decision by
//! decision, with a fixed and with an adaptive limit (the limit's every step is compared
//! too).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use stormguard_core::AdaptiveLimitConfig;
use stormguard_core::Criticality;
use stormguard_core::Instant;
use stormguard_core::WorkerLimit;
use stormguard_core::wire::AttemptClass;
use stormguard_core::{
    AdmissionConfig, AdmissionController, CallClass, QueueOrder, RetryThreshold, Shed, ShedReason,
};
use stormguard_server::test_util::{Decided, GateDriver};
use stormguard_sim::{Job, ServerAction, SimServer};

const MS: Duration = Duration::from_millis(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum What {
    Run,
    Queued {
        expires_in: Duration,
    },
    Shed {
        /// 0 queue full, 1 retry threshold, 2 sheddable (or displaced).
        reason: u8,
        pushback_ms: i64,
    },
    Expired,
    /// The worker limit after the step (recorded when it changed).
    Limit(usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Record {
    at: Duration,
    call: u32,
    what: What,
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Arrive {
        call: u32,
        class: CallClass,
        deadline: Option<Duration>,
    },
    /// The call that has run longest finishes.
    FinishOldest,
    /// The caller of `call` goes away (queued: it leaves; running: its worker is freed).
    Cancel(u32),
}

/// One side of the comparison, driven at explicit instants.
trait Side {
    fn arrive(
        &mut self,
        now: Instant,
        call: u32,
        class: CallClass,
        deadline: Option<Instant>,
    ) -> Vec<(u32, What)>;
    /// The worker limit now.
    fn limit(&self) -> usize;
    fn finish(&mut self, now: Instant, call: u32) -> Vec<(u32, What)>;
    fn cancel(&mut self, now: Instant, call: u32) -> Vec<(u32, What)>;
    fn timer(&mut self, now: Instant, call: u32) -> Vec<(u32, What)>;
}

fn shed(s: Shed) -> What {
    What::Shed {
        reason: match s.reason {
            ShedReason::QueueFull => 0,
            ShedReason::RetryThreshold => 1,
            ShedReason::Sheddable => 2,
        },
        pushback_ms: s.pushback.millis(),
    }
}

/// The server's gate, used as the response future uses it.
struct Server(GateDriver);

fn gate_records(now: Instant, decided: Vec<(u32, Decided)>) -> Vec<(u32, What)> {
    decided
        .into_iter()
        .map(|(call, decided)| match decided {
            Decided::Run => (call, What::Run),
            Decided::Queued { expiry } => (
                call,
                What::Queued {
                    expires_in: expiry - now,
                },
            ),
            Decided::Shed(s) => (call, shed(s)),
            Decided::Expired => (call, What::Expired),
            Decided::Closing => panic!("the scripts never shut the gate down"),
        })
        .collect()
}

impl Side for Server {
    fn limit(&self) -> usize {
        self.0.worker_limit()
    }

    fn arrive(
        &mut self,
        now: Instant,
        call: u32,
        class: CallClass,
        deadline: Option<Instant>,
    ) -> Vec<(u32, What)> {
        gate_records(now, self.0.arrive(now, call, class, deadline))
    }

    fn finish(&mut self, now: Instant, call: u32) -> Vec<(u32, What)> {
        gate_records(now, self.0.finish(now, call))
    }

    fn cancel(&mut self, now: Instant, call: u32) -> Vec<(u32, What)> {
        gate_records(now, self.0.cancel(now, call))
    }

    fn timer(&mut self, now: Instant, call: u32) -> Vec<(u32, What)> {
        gate_records(now, self.0.timer(now, call))
    }
}

/// The simulator's server.
struct Sim(SimServer);

fn job(call: u32) -> Job {
    Job {
        slot: call,
        id: call.into(),
    }
}

fn sim_records(now: Instant, actions: Vec<ServerAction>) -> Vec<(u32, What)> {
    actions
        .into_iter()
        .map(|action| match action {
            ServerAction::Start(j) => (j.slot, What::Run),
            ServerAction::Queued(j, expiry) => (
                j.slot,
                What::Queued {
                    expires_in: expiry - now,
                },
            ),
            ServerAction::Shed(j, s) => (j.slot, shed(s)),
            ServerAction::Expired(j) => (j.slot, What::Expired),
            ServerAction::Refused(j) => panic!("a shedding server never refuses: {j:?}"),
        })
        .collect()
}

impl Side for Sim {
    fn limit(&self) -> usize {
        self.0.worker_limit()
    }

    fn arrive(
        &mut self,
        now: Instant,
        call: u32,
        class: CallClass,
        deadline: Option<Instant>,
    ) -> Vec<(u32, What)> {
        let mut out = Vec::new();
        self.0.arrive(now, job(call), class, deadline, &mut out);
        sim_records(now, out)
    }

    fn finish(&mut self, now: Instant, call: u32) -> Vec<(u32, What)> {
        let mut out = Vec::new();
        self.0.done(now, job(call), &mut out);
        sim_records(now, out)
    }

    fn cancel(&mut self, now: Instant, call: u32) -> Vec<(u32, What)> {
        let mut out = Vec::new();
        self.0.cancel(now, job(call), &mut out);
        sim_records(now, out)
    }

    fn timer(&mut self, now: Instant, call: u32) -> Vec<(u32, What)> {
        let mut out = Vec::new();
        self.0.timer(now, job(call), &mut out);
        sim_records(now, out)
    }
}

/// Runs `script` through `side` on paused time from `t0`, with the expiry timers of
/// queued calls firing at their instants (before a step at the same instant).
async fn play(side: &mut impl Side, t0: Instant, script: &[(Duration, Step)]) -> Vec<Record> {
    let mut records = Vec::new();
    // Timers of queued calls, and calls on a worker by the order they started.
    let mut timers: BTreeSet<(Instant, u32)> = BTreeSet::new();
    let mut running: BTreeMap<usize, u32> = BTreeMap::new();
    let mut started = 0usize;
    let mut limit = side.limit();
    let mut note = |now: Instant,
                    decided: Vec<(u32, What)>,
                    timers: &mut BTreeSet<(Instant, u32)>,
                    running: &mut BTreeMap<usize, u32>| {
        // Calls started in one step (a raised limit starts several) take their start
        // order from their number, not from the order a side reported them in.
        let mut decided = decided;
        decided.sort_by_key(|(call, _)| *call);
        for (call, what) in decided {
            match what {
                What::Queued { expires_in } => {
                    timers.insert((now + expires_in, call));
                }
                What::Run => {
                    started += 1;
                    running.insert(started, call);
                }
                _ => {}
            }
            records.push(Record {
                at: now - t0,
                call,
                what,
            });
        }
    };
    for &(at, step) in script {
        let step_at = t0 + at;
        while let Some(&(expiry, call)) = timers.first()
            && expiry <= step_at
        {
            timers.pop_first();
            tokio::time::advance(expiry.saturating_duration_since(Instant::now())).await;
            let decided = side.timer(expiry, call);
            note(expiry, decided, &mut timers, &mut running);
        }
        tokio::time::advance(step_at.saturating_duration_since(Instant::now())).await;
        let now = Instant::now();
        assert_eq!(now, step_at, "paused time lands on the scripted instant");
        let decided = match step {
            Step::Arrive {
                call,
                class,
                deadline,
            } => side.arrive(now, call, class, deadline.map(|d| now + d)),
            Step::FinishOldest => match running.pop_first() {
                Some((_, call)) => side.finish(now, call),
                None => Vec::new(),
            },
            Step::Cancel(call) => {
                running.retain(|_, c| *c != call);
                side.cancel(now, call)
            }
        };
        note(now, decided, &mut timers, &mut running);
        if side.limit() != limit {
            limit = side.limit();
            note(
                now,
                vec![(0, What::Limit(limit))],
                &mut timers,
                &mut running,
            );
        }
    }
    records.sort();
    records
}

/// A seeded script, 0 to 2 ms between steps: 7 in 10 are arrivals (a third of them
/// retries, four in five with a deadline 1 to 40 ms away), 2 in 10 completions, 1 in 10
/// a cancellation of one of the last calls. Arrivals outpace completions, so the queue
/// fills, sheds and expires.
fn script(seed: u64, steps: usize) -> Vec<(Duration, Step)> {
    let mut state = seed | 1;
    let mut next = move |n: u64| {
        // xorshift64*: a fixed sequence for a seed.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) % n
    };
    let mut at = Duration::ZERO;
    let mut calls = 0u32;
    let mut script = Vec::with_capacity(steps);
    for _ in 0..steps {
        at += MS * u32::try_from(next(3)).unwrap_or(0);
        let step = match next(10) {
            0..=6 => {
                calls += 1;
                let attempt = if next(3) == 0 {
                    AttemptClass::Retry
                } else {
                    AttemptClass::First
                };
                // One in ten sheddable, one in ten critical.
                let criticality = match next(10) {
                    0 => Criticality::Sheddable,
                    1 => Criticality::Critical,
                    _ => Criticality::Default,
                };
                Step::Arrive {
                    call: calls,
                    class: CallClass::new(attempt, criticality),
                    deadline: (next(5) != 0).then(|| MS * u32::try_from(1 + next(40)).unwrap_or(1)),
                }
            }
            7 | 8 => Step::FinishOldest,
            _ => Step::Cancel(calls.saturating_sub(u32::try_from(next(6)).unwrap_or(0))),
        };
        script.push((at, step));
    }
    script
}

fn config(queue_order: QueueOrder) -> AdmissionConfig {
    AdmissionConfig {
        workers: WorkerLimit::Fixed(3),
        queue_capacity: 8,
        retry_threshold: RetryThreshold {
            depth: Some(3),
            queue_delay: Some(12 * MS),
        },
        max_time_queued: 25 * MS,
        min_time_left: 2 * MS,
        queue_order,
        pushback_max: 200 * MS,
        no_retry_depth: Some(6),
        seed: Some(99),
        ..AdmissionConfig::default()
    }
}

async fn compare(config: AdmissionConfig, seed: u64) -> Vec<Record> {
    let script = script(seed, 600);
    let t0 = Instant::now();
    let mut server = Server(GateDriver::new(
        AdmissionController::new(config.clone()).expect("valid config"),
    ));
    let served = play(&mut server, t0, &script).await;
    let end = Instant::now();
    let mut sim = Sim(SimServer::shedding(config).expect("valid config"));
    let simulated = play(&mut sim, end, &script).await;
    // Compare one by one, so a difference names the first decision that differs.
    for (i, (a, b)) in served.iter().zip(&simulated).enumerate() {
        assert_eq!(a, b, "decision {i} differs (server, simulator)");
    }
    assert_eq!(served.len(), simulated.len(), "as many decisions");
    served
}

fn count(records: &[Record], pred: impl Fn(&What) -> bool) -> usize {
    records.iter().filter(|r| pred(&r.what)).count()
}

fn adaptive(queue_order: QueueOrder) -> AdmissionConfig {
    AdmissionConfig {
        workers: WorkerLimit::Adaptive(AdaptiveLimitConfig {
            initial_limit: 3,
            min_limit: 1,
            max_limit: 8,
            window: 5 * MS,
            min_window_samples: 3,
            probe_interval: 150 * MS,
        }),
        ..config(queue_order)
    }
}

#[tokio::test(start_paused = true)]
async fn server_queue_and_simulator_decide_alike() {
    for (name, config, seed) in [
        (
            "lifo",
            config(QueueOrder::AdaptiveLifo { from_depth: 4 }),
            1,
        ),
        (
            "lifo",
            config(QueueOrder::AdaptiveLifo { from_depth: 4 }),
            2,
        ),
        ("fifo", config(QueueOrder::Fifo), 3),
        (
            "adaptive-lifo",
            adaptive(QueueOrder::AdaptiveLifo { from_depth: 4 }),
            4,
        ),
        ("adaptive-fifo", adaptive(QueueOrder::Fifo), 5),
    ] {
        let is_adaptive = config.workers.is_adaptive();
        let records = compare(config, seed).await;
        // The script reaches every kind of decision, so the comparison covers them all.
        let queued = count(&records, |w| matches!(w, What::Queued { .. }));
        let run = count(&records, |w| *w == What::Run);
        let expired = count(&records, |w| *w == What::Expired);
        let retry_shed = count(
            &records,
            |w| matches!(w, What::Shed { reason: 1, pushback_ms } if *pushback_ms > 0),
        );
        let full = count(&records, |w| matches!(w, What::Shed { reason: 0, .. }));
        let sheddable = count(&records, |w| matches!(w, What::Shed { reason: 2, .. }));
        let do_not_retry = count(
            &records,
            |w| matches!(w, What::Shed { pushback_ms, .. } if *pushback_ms == -1),
        );
        let limits = count(&records, |w| matches!(w, What::Limit(_)));
        println!(
            "{name} seed {seed}: {} decisions equal ({run} run, {queued} queued, \
             {retry_shed} retries shed, {full} shed full, {sheddable} sheddable shed or \
             displaced, {do_not_retry} told not to retry, {expired} expired, {limits} limit \
             changes)",
            records.len()
        );
        for (what, n) in [
            ("queued", queued),
            ("run", run),
            ("expired", expired),
            ("retries shed with a pushback", retry_shed),
            ("shed because full", full),
            ("sheddable shed or displaced", sheddable),
            ("told not to retry", do_not_retry),
            ("limit changes", if is_adaptive { limits } else { 5 }),
        ] {
            assert!(n >= 5, "{name}/{seed}: only {n} {what}");
        }
    }
}
