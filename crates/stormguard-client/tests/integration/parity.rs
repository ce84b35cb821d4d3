//! The client layer and the simulator's client decide alike.
//!
//! One seeded script (logical calls one after another, each with or without a deadline of
//! its own, and for each attempt an answer after some time: `OK`, a failure code with or
//! without a pushback, or no answer at all) runs through the real [`RetryLayer`] over a
//! scripted inner service on paused time, and through `stormguard_sim::SimCall` on the
//! same instants, with controllers built alike (same budget, breaker and seed). Every
//! attempt is recorded with its instant, its `grpc-previous-rpc-attempts` and its
//! `grpc-timeout`, and every call's end with its instant and code. The two records must be
//! equal, event by event.

#![allow(clippy::unwrap_used)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stormguard_client::{RetryLayer, RetrySnapshot};
use stormguard_core::CallTimes;
use stormguard_core::Instant;
use stormguard_core::{BreakerConfig, CircuitBreaker};
use stormguard_core::{Budget, BudgetConfig, RetryBudget};
use stormguard_core::{Code, CodeSet};
use stormguard_core::{Failure, RetryController, TRANSPARENT_RETRIES};
use stormguard_core::{MethodTable, RetryPolicy};
use stormguard_core::{wire::encode_grpc_timeout, wire::response_pushback};
use stormguard_sim::{SimCall, Step};
use tonic::body::Body;
use tower::{Service, ServiceExt, service_fn};
use tower_layer::Layer;

use crate::scripted::{BoxError, code_of, response};

const PATH: &str = "/pkg.Svc/Get";
const MS: Duration = Duration::from_millis(1);
const PER_ATTEMPT: Duration = Duration::from_millis(60);
const MAX_ATTEMPTS: u32 = 4;

/// What the server does with one attempt.
#[derive(Clone, Copy, Debug)]
enum Answer {
    /// Answers after `after` with `code` (and `pushback`, a header value).
    After {
        after: Duration,
        code: Code,
        pushback: Option<&'static str>,
    },
    /// Never answers.
    Hang,
    /// Fails at once without reaching the server (a connection that could not be made):
    /// retried transparently once the connection backoff allows.
    Unsent,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Record {
    Attempt {
        call: usize,
        at: Duration,
        previous: u32,
        grpc_timeout: Option<String>,
    },
    End {
        call: usize,
        at: Duration,
        code: Code,
    },
}

struct Call {
    /// The caller's own timeout.
    timeout: Option<Duration>,
    /// The pause before the call starts (after the previous one ended).
    gap: Duration,
}

struct Script {
    calls: Vec<Call>,
    /// Answers in the order attempts are sent (both sides send the same attempts, or the
    /// records differ).
    answers: Vec<Answer>,
}

fn script(seed: u64, calls: usize) -> Script {
    let mut rng = fastrand::Rng::with_seed(seed);
    let calls: Vec<Call> = (0..calls)
        .map(|_| Call {
            timeout: (rng.u8(..) < 200).then(|| MS * rng.u32(30..400)),
            gap: MS * rng.u32(0..40),
        })
        .collect();
    // DEADLINE_EXCEEDED and CANCELLED answered before the 60 ms per-attempt timeout are
    // early expiry answers: the attempt timing out when it carried that limit, the server's
    // final answer when it carried what was left of a shorter call deadline.
    let codes = [
        Code::Unavailable,
        Code::Unavailable,
        Code::DeadlineExceeded,
        Code::Cancelled,
        Code::ResourceExhausted,
        Code::Internal,
    ];
    let pushbacks = [
        None,
        None,
        None,
        Some("-1"),
        Some("0"),
        Some("25"),
        Some("x"),
    ];
    // Enough answers for every call to use all its attempts and transparent retries.
    let per_call = (MAX_ATTEMPTS + TRANSPARENT_RETRIES) as usize;
    let answers = (0..calls.len() * per_call)
        .map(|_| match rng.u8(..) {
            0..=14 => Answer::Unsent,
            15..=149 => Answer::After {
                after: MS * rng.u32(0..100),
                code: Code::Ok,
                pushback: None,
            },
            150..=229 => Answer::After {
                after: MS * rng.u32(0..90),
                code: codes[rng.usize(..codes.len())],
                pushback: pushbacks[rng.usize(..pushbacks.len())],
            },
            _ => Answer::Hang,
        })
        .collect();
    Script { calls, answers }
}

fn controller() -> RetryController {
    let policy = RetryPolicy {
        idempotent: true,
        max_attempts: MAX_ATTEMPTS,
        retryable_codes: {
            let mut codes = CodeSet::single(Code::Unavailable);
            codes.insert(Code::ResourceExhausted);
            codes
        },
        ..RetryPolicy::default()
    };
    let budget: Arc<dyn Budget> = Arc::new(
        RetryBudget::new(BudgetConfig {
            min_retries_per_second: 2,
            retry_ratio: 0.2,
            ..BudgetConfig::default()
        })
        .unwrap(),
    );
    let breaker = CircuitBreaker::new(
        BreakerConfig {
            failure_rate: 0.6,
            window: Duration::from_secs(2),
            min_requests: 20,
            open_for: Duration::from_millis(200),
            ..BreakerConfig::default()
        },
        11,
    )
    .unwrap();
    RetryController::new(MethodTable::uniform(policy), budget, Some(breaker), 5).unwrap()
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
            let header = |name| {
                request
                    .headers()
                    .get(name)
                    .map(|v: &http::HeaderValue| v.to_str().unwrap().to_owned())
            };
            records.lock().unwrap().push(Record::Attempt {
                call: *current.lock().unwrap(),
                at: Instant::now() - t0,
                previous: header("grpc-previous-rpc-attempts").map_or(0, |v| v.parse().unwrap()),
                grpc_timeout: header("grpc-timeout"),
            });
            let answer = answers.lock().unwrap().pop_front().unwrap();
            async move {
                match answer {
                    Answer::After {
                        after,
                        code,
                        pushback,
                    } => {
                        tokio::time::sleep(after).await;
                        Ok::<_, BoxError>(response(code, pushback))
                    }
                    Answer::Hang => std::future::pending().await,
                    Answer::Unsent => Err(Box::new(tonic::ConnectError("refused".into())) as _),
                }
            }
        })
    };
    let layer = RetryLayer::new(controller()).with_per_attempt_timeout(PER_ATTEMPT);
    let stats = layer.stats();
    let mut svc = layer.layer(svc);
    for (i, call) in script.calls.iter().enumerate() {
        tokio::time::sleep(call.gap).await;
        *current.lock().unwrap() = i;
        let mut request = http::Request::new(Body::empty());
        *request.uri_mut() = format!("http://parity{PATH}").parse().unwrap();
        if let Some(t) = call.timeout {
            let value = encode_grpc_timeout(t).as_str().parse().unwrap();
            request.headers_mut().insert("grpc-timeout", value);
        }
        let result = svc.ready().await.unwrap().call(request).await;
        let code = code_of(result);
        records.lock().unwrap().push(Record::End {
            call: i,
            at: Instant::now() - t0,
            code,
        });
    }
    let records = records.lock().unwrap().clone();
    (records, stats.snapshot())
}

/// When a tokio timer set for `at` fires: tokio's timer wheel counts whole milliseconds
/// from the runtime's start (`t0` here, as the paused clock starts with the runtime) and
/// rounds a deadline up to the next one. Script times are whole milliseconds already; a
/// backoff delay is not, so the simulator's exact instant is moved to the layer's tick.
fn on_tokio_tick(t0: Instant, at: Instant) -> Instant {
    let nanos = (at - t0).as_nanos().div_ceil(1_000_000) * 1_000_000;
    t0 + Duration::from_nanos(u64::try_from(nanos).unwrap())
}

fn through_the_simulator(script: &Script) -> Vec<Record> {
    let controller = controller();
    let t0 = Instant::now();
    let mut now = t0;
    let mut answers = script.answers.iter().copied();
    let mut records = Vec::new();
    for (i, call) in script.calls.iter().enumerate() {
        now += call.gap;
        let times = CallTimes {
            caller: call.timeout,
            per_attempt: Some(PER_ATTEMPT),
            ..CallTimes::default()
        };
        let (mut sim, mut step) = match SimCall::begin_at(&controller, PATH, &times, now) {
            Ok(begun) => (Some(begun.0), begun.1),
            Err(refusal) => (
                None,
                Step::End(stormguard_sim::End::GaveUp(
                    refusal,
                    Failure::status(Code::Unavailable),
                )),
            ),
        };
        loop {
            match step {
                Step::Send(plan) => {
                    let header = match plan.grpc_timeout {
                        Some(t) => Some(encode_grpc_timeout(t).as_str().to_owned()),
                        None => call
                            .timeout
                            .map(|t| encode_grpc_timeout(t).as_str().to_owned()),
                    };
                    records.push(Record::Attempt {
                        call: i,
                        at: now - t0,
                        previous: plan.previous_attempts,
                        grpc_timeout: header,
                    });
                    let sim = sim.as_mut().unwrap();
                    let answer = match answers.next().unwrap() {
                        Answer::After {
                            after,
                            code,
                            pushback,
                        } => Some((now + after, code, pushback, false)),
                        Answer::Hang => None,
                        Answer::Unsent => Some((now, Code::Unavailable, None, true)),
                    };
                    // The layer polls its timer before the attempt: a tie goes to the timer.
                    let fire = plan
                        .fire_at
                        .expect("every attempt has a per-attempt timeout");
                    step = match answer {
                        Some((at, _, _, true)) if at < fire => {
                            now = at;
                            sim.connect_refused_at(now)
                        }
                        Some((at, code, pushback, unsent)) if at < fire => {
                            now = at;
                            let failure = (code != Code::Ok).then(|| Failure {
                                unsent,
                                ..Failure {
                                    pushback: pushback.and_then(|p| {
                                        response_pushback([p.as_bytes()], std::iter::empty())
                                    }),
                                    ..Failure::status(code)
                                }
                            });
                            sim.answered_at(failure, now)
                        }
                        _ => {
                            now = fire;
                            sim.timer_at(now)
                        }
                    };
                }
                Step::Wait(delay) => {
                    now = on_tokio_tick(t0, now + delay);
                    step = sim.as_mut().unwrap().retry_due(now);
                }
                Step::End(end) => {
                    records.push(Record::End {
                        call: i,
                        at: now - t0,
                        code: end.code(),
                    });
                    break;
                }
            }
        }
    }
    records
}

#[tokio::test(start_paused = true)]
async fn the_layer_and_the_simulator_make_the_same_decisions() {
    let mut reached_total = std::collections::BTreeMap::new();
    // Eight seeds: early expiry answers count as attempt timeouts (failures for the
    // breaker), so fewer scripts reach a budget refusal before the breaker opens.
    for seed in [1, 2, 3, 4, 5, 6, 7, 8] {
        let script = script(seed, 400);
        let (layer, stats) = through_the_layer(&script).await;
        let sim = through_the_simulator(&script);
        for (n, (a, b)) in layer.iter().zip(&sim).enumerate() {
            assert_eq!(a, b, "seed {seed}: record {n} differs");
        }
        assert_eq!(layer.len(), sim.len(), "seed {seed}");
        // Over the seeds, the scripts reach every decision: retries granted and refused
        // for every cause that applies, attempt timeouts, expiries, successes.
        let r = stats.refused;
        let reached = [
            ("retries", stats.retries),
            ("transparent retries", stats.transparent_retries),
            ("ok", stats.ok),
            ("attempt timeouts", stats.attempt_timeouts),
            ("expired", stats.deadline_exceeded),
            ("delayed by pushback", stats.delayed_by_pushback),
            ("refused: not retryable", r.not_retryable),
            ("refused: pushback", r.pushback),
            ("refused: attempts", r.attempts),
            ("refused: deadline", r.deadline),
            ("refused: breaker", r.breaker),
            ("refused: budget", r.budget),
        ];
        for (what, n) in reached {
            *reached_total.entry(what).or_insert(0) += n;
        }
    }
    for (what, n) in reached_total {
        assert!(n > 0, "{what} never happens");
    }
}
