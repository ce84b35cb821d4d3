//! The client layer and the simulator's hedged call decide alike.
//!
//! One seeded script (hedged calls one after another, each with a deadline of its own,
//! and for each copy sent an answer after some time: `OK`, a failure code with or without
//! a pushback, or no answer at all) runs through the real [`RetryLayer`] over a scripted
//! inner service on paused time, and through `stormguard_sim::HedgedCall` on the same
//! instants, with controllers built alike (same hedging policy, budget and seed). Every
//! copy sent is recorded with its instant and its `grpc-previous-rpc-attempts`, every
//! copy cancelled with its instant, and every call's end with its instant and code. The
//! two records must be equal, event by event: the layer's hedged future and the
//! simulator's driver make core's hedging calls in the same order.
//!
//! The simulator's driver is told the copies' answers in the order the layer polls its
//! copies (the first copy, then the hedges in the order the layer keeps them), so that
//! answers at the same instant are seen in the same order on both sides.

#![allow(clippy::unwrap_used)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stormguard_client::{RetryLayer, RetrySnapshot};
use stormguard_core::CallTimes;
use stormguard_core::Instant;
use stormguard_core::MethodScope;
use stormguard_core::MethodTable;
use stormguard_core::{Budget, BudgetConfig, RetryBudget};
use stormguard_core::{Code, CodeSet};
use stormguard_core::{Failure, RetryController};
use stormguard_core::{HedgeDelay, HedgingPolicy};
use stormguard_core::{wire::encode_grpc_timeout, wire::response_pushback};
use stormguard_sim::{Action, HedgedCall};
use tonic::body::Body;
use tower::{Service, ServiceExt, service_fn};
use tower_layer::Layer;

use crate::scripted::{BoxError, code_of, response};

const PATH: &str = "/pkg.Svc/Get";
const MS: Duration = Duration::from_millis(1);
const COPIES: u32 = 3;
const HEDGE_DELAY: Duration = Duration::from_millis(10);

/// What the server does with one copy.
#[derive(Clone, Copy, Debug)]
enum Answer {
    /// Answers after `after` (at least 1 ms) with `code` (and `pushback`, a header value).
    After {
        after: Duration,
        code: Code,
        pushback: Option<&'static str>,
    },
    /// Never answers.
    Hang,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Record {
    Sent {
        call: usize,
        at: Duration,
        previous: u32,
    },
    Cancelled {
        call: usize,
        at: Duration,
        previous: u32,
    },
    End {
        call: usize,
        at: Duration,
        code: Code,
    },
}

struct Call {
    /// The caller's own timeout.
    timeout: Duration,
    /// The pause before the call starts (after the previous one ended).
    gap: Duration,
}

struct Script {
    calls: Vec<Call>,
    /// Answers in the order copies are sent (both sides send the same copies, or the
    /// records differ).
    answers: Vec<Answer>,
}

fn script(seed: u64, calls: usize) -> Script {
    let mut rng = fastrand::Rng::with_seed(seed);
    let calls: Vec<Call> = (0..calls)
        .map(|_| Call {
            timeout: MS * rng.u32(5..120),
            gap: MS * rng.u32(0..30),
        })
        .collect();
    // UNAVAILABLE is non-fatal (the next copy goes at once); the others end the call.
    let codes = [
        Code::Unavailable,
        Code::Unavailable,
        Code::Unavailable,
        Code::ResourceExhausted,
        Code::Internal,
    ];
    let pushbacks = [
        None,
        None,
        None,
        Some("-1"),
        Some("0"),
        Some("15"),
        Some("x"),
    ];
    let answers = (0..calls.len() * COPIES as usize)
        .map(|_| match rng.u8(..) {
            0..=139 => Answer::After {
                after: MS * rng.u32(1..60),
                code: Code::Ok,
                pushback: None,
            },
            140..=219 => Answer::After {
                after: MS * rng.u32(1..40),
                code: codes[rng.usize(..codes.len())],
                pushback: pushbacks[rng.usize(..pushbacks.len())],
            },
            _ => Answer::Hang,
        })
        .collect();
    Script { calls, answers }
}

fn controller() -> RetryController {
    let hedging = HedgingPolicy {
        max_attempts: COPIES,
        delay: HedgeDelay::Fixed(HEDGE_DELAY),
        non_fatal_codes: CodeSet::single(Code::Unavailable),
        min_attempt_time: Duration::from_millis(5),
        max_pushback: Duration::from_millis(20),
    };
    let mut methods = MethodTable::none();
    methods.set_hedging(MethodScope::Default, Some(hedging));
    let budget: Arc<dyn Budget> = Arc::new(
        RetryBudget::new(BudgetConfig {
            min_retries_per_second: 5,
            retry_ratio: 0.3,
            ..BudgetConfig::default()
        })
        .unwrap(),
    );
    RetryController::new(methods, budget, None, 5).unwrap()
}

/// Records a copy's cancellation when the layer drops it before it answered.
struct OnDrop {
    records: Arc<Mutex<Vec<Record>>>,
    call: usize,
    previous: u32,
    t0: Instant,
    answered: bool,
}

impl Drop for OnDrop {
    fn drop(&mut self) {
        if !self.answered {
            self.records.lock().unwrap().push(Record::Cancelled {
                call: self.call,
                at: Instant::now() - self.t0,
                previous: self.previous,
            });
        }
    }
}

async fn through_the_layer(script: &Script) -> (Vec<Record>, RetrySnapshot) {
    let t0 = Instant::now();
    let records = Arc::new(Mutex::new(Vec::new()));
    let answers = Arc::new(Mutex::new(
        script.answers.iter().copied().collect::<VecDeque<_>>(),
    ));
    let current = Arc::new(Mutex::new(0usize));
    let svc = {
        let (records, answers, current) = (records.clone(), answers.clone(), current.clone());
        service_fn(move |request: http::Request<Body>| {
            let previous = request
                .headers()
                .get("grpc-previous-rpc-attempts")
                .map_or(0, |v| v.to_str().unwrap().parse().unwrap());
            let call = *current.lock().unwrap();
            records.lock().unwrap().push(Record::Sent {
                call,
                at: Instant::now() - t0,
                previous,
            });
            let answer = answers.lock().unwrap().pop_front().unwrap();
            let guard = OnDrop {
                records: records.clone(),
                call,
                previous,
                t0,
                answered: false,
            };
            async move {
                // The whole guard moves into the copy's future, dropped with it.
                let mut guard = guard;
                match answer {
                    Answer::After {
                        after,
                        code,
                        pushback,
                    } => {
                        tokio::time::sleep(after).await;
                        guard.answered = true;
                        Ok::<_, BoxError>(response(code, pushback))
                    }
                    Answer::Hang => std::future::pending().await,
                }
            }
        })
    };
    let layer = RetryLayer::new(controller());
    let stats = layer.stats();
    let mut svc = layer.layer(svc);
    for (i, call) in script.calls.iter().enumerate() {
        tokio::time::sleep(call.gap).await;
        *current.lock().unwrap() = i;
        let mut request = http::Request::new(Body::empty());
        *request.uri_mut() = format!("http://parity{PATH}").parse().unwrap();
        let value = encode_grpc_timeout(call.timeout).as_str().parse().unwrap();
        request.headers_mut().insert("grpc-timeout", value);
        let result = svc.ready().await.unwrap().call(request).await;
        let code = code_of(result);
        records.lock().unwrap().push(Record::End {
            call: i,
            at: Instant::now() - t0,
            code,
        });
    }
    let records = records.lock().unwrap().clone();
    (normalized(records), stats.snapshot())
}

/// A copy in flight on the simulator's side: its number and its answer, if it comes.
struct Flight {
    copy: u32,
    answer: Option<(Instant, Option<Failure>)>,
}

/// One hedged call through the simulator's driver, its records appended to `records`;
/// returns when it ended.
fn simulate_call(
    controller: &RetryController,
    i: usize,
    call: &Call,
    (t0, mut now): (Instant, Instant),
    answers: &mut impl Iterator<Item = Answer>,
    records: &mut Vec<Record>,
) -> Instant {
    let times = CallTimes {
        caller: Some(call.timeout),
        ..CallTimes::default()
    };
    let mut out = Vec::new();
    let mut sim = HedgedCall::begin_at(controller, PATH, &times, now, &mut out).unwrap();
    // The copies in flight in the order the layer polls them: the first copy, then the
    // hedges as the layer keeps them (pushed when sent, swap-removed when answered).
    let mut first: Option<Flight> = None;
    let mut hedges: Vec<Flight> = Vec::new();
    let mut timer: Option<Instant> = None;
    loop {
        for action in out.drain(..) {
            match action {
                Action::Send { copy, plan } => {
                    records.push(Record::Sent {
                        call: i,
                        at: now - t0,
                        previous: plan.previous_attempts,
                    });
                    let answer = match answers.next().unwrap() {
                        Answer::After {
                            after,
                            code,
                            pushback,
                        } => {
                            let failure = (code != Code::Ok).then(|| Failure {
                                pushback: pushback.and_then(|p| {
                                    response_pushback([p.as_bytes()], std::iter::empty())
                                }),
                                ..Failure::status(code)
                            });
                            Some((now + after, failure))
                        }
                        Answer::Hang => None,
                    };
                    let flight = Flight { copy, answer };
                    if copy == 0 {
                        first = Some(flight);
                    } else {
                        hedges.push(flight);
                    }
                }
                Action::Cancel { copy } => {
                    records.push(Record::Cancelled {
                        call: i,
                        at: now - t0,
                        previous: copy,
                    });
                    if first.as_ref().is_some_and(|f| f.copy == copy) {
                        first = None;
                    }
                    hedges.retain(|f| f.copy != copy);
                }
                Action::Arm(at) => timer = at,
                Action::End(end) => {
                    records.push(Record::End {
                        call: i,
                        at: now - t0,
                        code: end.code(),
                    });
                    return now;
                }
            }
        }
        // The next answer, in the layer's polling order at the earliest instant.
        let next = first
            .iter()
            .chain(&hedges)
            .filter_map(|f| f.answer.map(|(at, _)| at))
            .min();
        match (next, timer) {
            // An answer and the timer at once: the layer's poll makes its checks, then
            // polls the copies, as `answered_at` does.
            (Some(at), t) if t.is_none_or(|t| at <= t) => {
                now = at;
                let due = |f: &Flight| f.answer.is_some_and(|(a, _)| a == at);
                let (copy, failure) = if let Some(f) = first.take_if(|f| due(f)) {
                    (f.copy, f.answer.unwrap().1)
                } else {
                    let i = hedges.iter().position(due).unwrap();
                    let f = hedges.swap_remove(i);
                    (f.copy, f.answer.unwrap().1)
                };
                sim.answered_at(copy, failure, now, &mut out);
            }
            (_, Some(t)) => {
                now = t;
                timer = None;
                sim.timer_at(now, &mut out);
            }
            (_, None) => panic!("call {i}: nothing left to wait for, and not over"),
        }
    }
}

fn through_the_simulator(script: &Script) -> Vec<Record> {
    let controller = controller();
    let t0 = Instant::now();
    let mut now = t0;
    let mut answers = script.answers.iter().copied();
    let mut records = Vec::new();
    for (i, call) in script.calls.iter().enumerate() {
        now += call.gap;
        now = simulate_call(&controller, i, call, (t0, now), &mut answers, &mut records);
    }
    normalized(records)
}

/// The copies cancelled at one instant, in the order of their numbers: the layer drops
/// them in the order it keeps them, the simulator's driver in its own.
fn normalized(mut records: Vec<Record>) -> Vec<Record> {
    let key = |r: &Record| match r {
        Record::Cancelled { call, at, previous } => Some((*call, *at, *previous)),
        _ => None,
    };
    let mut i = 0;
    while i < records.len() {
        let mut j = i;
        while j < records.len() && key(&records[j]).is_some() {
            j += 1;
        }
        records[i..j].sort_by_key(key);
        i = j.max(i + 1);
    }
    records
}

#[tokio::test(start_paused = true)]
async fn the_layer_and_the_simulator_hedge_alike() {
    let mut reached_total = std::collections::BTreeMap::new();
    for seed in [1, 2, 3, 4] {
        let script = script(seed, 400);
        let (layer, stats) = through_the_layer(&script).await;
        let sim = through_the_simulator(&script);
        for (n, (a, b)) in layer.iter().zip(&sim).enumerate() {
            assert_eq!(a, b, "seed {seed}: record {n} differs");
        }
        assert_eq!(layer.len(), sim.len(), "seed {seed}");
        // Over the seeds, the scripts reach every decision: hedges sent, won and refused,
        // copies cancelled, calls won, given up (on a fatal code, on a pushback) and
        // expired.
        let cancelled = layer
            .iter()
            .filter(|r| matches!(r, Record::Cancelled { .. }))
            .count() as u64;
        let third = layer
            .iter()
            .filter(|r| matches!(r, Record::Sent { previous: 2, .. }))
            .count() as u64;
        let h = stats.hedges_refused;
        let reached = [
            ("hedges", stats.hedges),
            ("third copies", third),
            ("hedges won", stats.hedges_won),
            ("cancelled copies", cancelled),
            ("ok", stats.ok),
            ("failed", stats.failed),
            ("expired", stats.deadline_exceeded),
            ("hedge refused: budget", h.budget),
            ("hedge refused: deadline", h.deadline),
            ("gave up: pushback", stats.refused.pushback),
            ("gave up: not retryable", stats.refused.not_retryable),
        ];
        for (what, n) in reached {
            *reached_total.entry(what).or_insert(0) += n;
        }
    }
    for (what, n) in reached_total {
        assert!(n > 0, "{what} never happens");
    }
}
