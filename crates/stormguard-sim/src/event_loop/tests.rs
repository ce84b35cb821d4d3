use super::*;
use std::time::Duration;

use crate::scenario::{BudgetKind, ClientPolicy, QueueServer, ServerKind, Shard, Tier, Window};
use crate::server::SimServer;
use crate::stats::Bin;
use stormguard_core::AdmissionConfig;
use stormguard_core::BreakerConfig;
use stormguard_core::BudgetConfig;
use stormguard_core::RetryPolicy;
use stormguard_core::WorkerLimit;
use stormguard_core::{Code, CodeSet};

/// The default policy for a method whose answers may be retried.
fn retried() -> RetryPolicy {
    RetryPolicy {
        idempotent: true,
        ..RetryPolicy::default()
    }
}

fn policy(retry: Option<RetryPolicy>, budget: BudgetKind) -> ClientPolicy {
    ClientPolicy {
        name: "test".into(),
        retry,
        hedging: None,
        budget,
        breaker: None,
        layer_per_attempt_timeout: None,
        deadline: Some(Duration::from_secs(1)),
        budget_per_shard: false,
        pushback_on_give_up: false,
    }
}

fn scenario(failure_rate: f64, policy: ClientPolicy) -> Scenario {
    Scenario {
        clients: 4,
        rate_per_client: 50.0,
        duration: Duration::from_secs(6),
        measure_from: Duration::ZERO,
        bin: Duration::from_millis(500),
        network: Duration::from_millis(1),
        tiers: vec![],
        shards: vec![Shard {
            server: ServerKind::Unbounded {
                latency: Duration::from_millis(2),
            },
            failure_rate,
            outage: None,
        }],
        policy,
        seed: 11,
    }
}

fn field(err: SimError) -> &'static str {
    match err {
        SimError::Scenario { field, .. } => field,
        other => panic!("not a scenario error: {other}"),
    }
}

#[test]
fn bad_scenarios_name_their_field() {
    let ok = scenario(0.1, policy(None, BudgetKind::Unlimited));
    assert!(ok.validate().is_ok());
    let cases: Vec<(Scenario, &str)> = vec![
        (
            Scenario {
                clients: 0,
                ..ok.clone()
            },
            "clients",
        ),
        (
            Scenario {
                rate_per_client: f64::NAN,
                ..ok.clone()
            },
            "rate_per_client",
        ),
        (
            Scenario {
                rate_per_client: 0.0,
                ..ok.clone()
            },
            "rate_per_client",
        ),
        (
            Scenario {
                duration: Duration::ZERO,
                ..ok.clone()
            },
            "duration",
        ),
        (
            Scenario {
                measure_from: ok.duration,
                ..ok.clone()
            },
            "measure_from",
        ),
        (
            Scenario {
                bin: Duration::ZERO,
                ..ok.clone()
            },
            "bin",
        ),
        (
            Scenario {
                shards: vec![],
                ..ok.clone()
            },
            "shards",
        ),
        (scenario(1.5, ok.policy.clone()), "shards.failure_rate"),
        (
            scenario(
                0.1,
                ClientPolicy {
                    layer_per_attempt_timeout: Some(Duration::ZERO),
                    ..ok.policy.clone()
                },
            ),
            "policy.layer_per_attempt_timeout",
        ),
    ];
    for (bad, name) in cases {
        let err = run(&bad).expect_err("invalid scenario");
        assert_eq!(field(err), name);
    }
}

#[test]
fn a_shedding_config_with_another_worker_count_is_refused() {
    // The engine runs `QueueServer::workers` workers; an admission config that says
    // otherwise used to be ignored without a word.
    let mut sc = one_worker_shard(None);
    if let ServerKind::Queue(QueueServer {
        shedding: Some(c), ..
    }) = &mut sc.shards[0].server
    {
        c.workers = WorkerLimit::Fixed(4);
    }
    let err = run(&sc).expect_err("mismatched workers");
    assert_eq!(field(err), "shards.server.shedding.workers");
    assert!(run(&one_worker_shard(None)).is_ok());
}

#[test]
fn a_huge_service_time_under_a_slowdown_saturates_instead_of_panicking() {
    let mut sc = one_worker_shard(None);
    if let ServerKind::Queue(q) = &mut sc.shards[0].server {
        q.service_time = Duration::MAX;
        q.slowdown = Some((
            Window {
                from: Duration::ZERO,
                until: sc.duration,
            },
            2.0,
        ));
    }
    let stats = run(&sc).expect("valid scenario");
    assert_eq!(stats.successes, 0, "no call finishes within the run");
}

#[test]
fn a_huge_network_delay_saturates_instead_of_overflowing() {
    // A failed attempt on a queueing shard is answered after a round trip (2 × network).
    let mut sc = one_worker_shard(None);
    sc.network = Duration::MAX;
    sc.shards[0].failure_rate = 1.0;
    let stats = run(&sc).expect("valid scenario");
    assert_eq!(stats.successes, 0, "no answer comes back within the run");
}

#[test]
fn core_configs_are_validated_by_the_core() {
    let bad_budget = BudgetKind::Budget(BudgetConfig {
        retry_ratio: 0.0,
        ..BudgetConfig::default()
    });
    let err = run(&scenario(0.1, policy(Some(retried()), bad_budget))).expect_err("invalid budget");
    assert!(matches!(err, SimError::Config(_)), "{err}");
    assert!(err.to_string().contains("retry_ratio"), "{err}");
    let bad_retry = RetryPolicy {
        max_attempts: 1,
        ..retried()
    };
    let err = run(&scenario(
        0.1,
        policy(Some(bad_retry), BudgetKind::Unlimited),
    ))
    .expect_err("invalid retry policy");
    assert!(err.to_string().contains("maxAttempts"), "{err}");
}

#[test]
fn results_do_not_depend_on_the_base_instant() {
    let sc = scenario(
        0.3,
        policy(Some(retried()), BudgetKind::Budget(BudgetConfig::default())),
    );
    let now = Instant::now();
    let a = run_from(&sc, now).expect("valid");
    let b = run_from(&sc, now + Duration::from_secs(3 * 3600)).expect("valid");
    assert_eq!(a, b);
    assert!(a.retries > 0);
}

#[test]
fn bins_add_up_to_the_totals_when_everything_is_measured() {
    let sc = scenario(0.5, policy(Some(retried()), BudgetKind::Unlimited));
    let stats = run(&sc).expect("valid");
    let sum = |f: fn(&Bin) -> u64| stats.bins.iter().map(f).sum::<u64>();
    assert_eq!(stats.bins.len(), 12);
    assert_eq!(sum(|b| b.calls), stats.calls);
    assert_eq!(sum(|b| b.successes), stats.successes);
    // Bins count attempts by send time: only retries can be sent after the last
    // arrival, while the run finishes the calls in flight.
    let late_retries = stats.retries - sum(|b| b.retries);
    assert_eq!(sum(|b| b.attempts) + late_retries, stats.attempts);
    assert!(late_retries < stats.retries / 10, "{late_retries}");
    assert_eq!(stats.attempts, stats.calls + stats.retries);
    let failed: u64 = stats.gave_up.values().sum();
    assert_eq!(stats.successes + failed, stats.calls);
    // Unlimited retries at 50 %: calls that failed used all three attempts.
    assert_eq!(stats.gave_up.get("attempts").copied(), Some(failed));
}

#[test]
fn an_open_breaker_rejects_calls_without_an_attempt() {
    let mut p = policy(Some(retried()), BudgetKind::Budget(BudgetConfig::default()));
    p.breaker = Some(BreakerConfig::default());
    let stats = run(&scenario(1.0, p)).expect("valid");
    let rejected = stats
        .gave_up
        .get("rejected_by_breaker")
        .copied()
        .unwrap_or(0);
    assert!(rejected > stats.calls / 2, "{stats:?}");
    assert!(stats.attempts < stats.calls / 2, "{stats:?}");
}

#[test]
fn a_timed_out_attempt_is_retried_whatever_the_retryable_codes() {
    // A server slower than the attempt timeout: every attempt times out. Only
    // UNAVAILABLE is retryable, yet a timed-out attempt is retried, as the client layer
    // retries it, until the attempt limit.
    let retry = RetryPolicy {
        per_attempt_timeout: Some(Duration::from_millis(20)),
        ..retried()
    };
    let mut sc = scenario(0.0, policy(Some(retry), BudgetKind::Unlimited));
    sc.shards[0].server = ServerKind::Unbounded {
        latency: Duration::from_millis(30),
    };
    let stats = run(&sc).expect("valid");
    assert_eq!(stats.successes, 0);
    assert_eq!(stats.amplification(), 3.0);
    assert_eq!(stats.gave_up.get("attempts"), Some(&stats.calls));
    // The layer's own attempt timeout limits a method with no retry policy: one
    // attempt, not retried.
    sc.policy.retry = None;
    sc.policy.layer_per_attempt_timeout = Some(Duration::from_millis(20));
    let stats = run(&sc).expect("valid");
    assert_eq!(stats.amplification(), 1.0);
    assert_eq!(stats.gave_up.get("not_retryable"), Some(&stats.calls));
    // The policy's own timeout wins over the layer's: 40 ms lets every attempt finish.
    sc.policy.retry = Some(RetryPolicy {
        per_attempt_timeout: Some(Duration::from_millis(40)),
        ..retried()
    });
    let stats = run(&sc).expect("valid");
    assert_eq!(stats.successes, stats.calls);
    assert_eq!(stats.amplification(), 1.0);
}

/// A breaker-guarded client calling a server that takes 30 ms, with DEADLINE_EXCEEDED
/// among the retryable codes (as a policy may list it for a server's own expiry
/// answers).
fn slow_server_with_breaker() -> Scenario {
    let retry = RetryPolicy {
        retryable_codes: [Code::Unavailable, Code::DeadlineExceeded]
            .into_iter()
            .collect(),
        ..retried()
    };
    let mut p = policy(Some(retry), BudgetKind::Unlimited);
    p.breaker = Some(BreakerConfig::default());
    let mut sc = scenario(0.0, p);
    sc.shards[0].server = ServerKind::Unbounded {
        latency: Duration::from_millis(30),
    };
    sc
}

#[test]
fn a_callers_short_deadline_is_final_and_does_not_open_the_breaker() {
    // Callers wait 20 ms for a method that takes 30 ms: every call ends at its deadline,
    // after one attempt, and the shared breaker hears nothing of it.
    let mut sc = slow_server_with_breaker();
    sc.policy.deadline = Some(Duration::from_millis(20));
    let stats = run(&sc).expect("valid");
    assert_eq!(stats.successes, 0);
    assert_eq!(stats.attempts, stats.calls);
    assert_eq!(stats.gave_up.get("rejected_by_breaker"), None, "{stats:?}");
    assert_eq!(stats.gave_up.get("deadline"), Some(&stats.calls));
}

#[test]
fn a_hanging_dependency_opens_the_breaker_through_the_attempt_timeout() {
    // The same slow server seen through a 20 ms per-attempt timeout and a 1 s deadline:
    // each timed-out attempt is a failure of the dependency, so the breaker opens and
    // then rejects most calls without sending them.
    let mut sc = slow_server_with_breaker();
    if let Some(retry) = sc.policy.retry.as_mut() {
        retry.retryable_codes = CodeSet::single(Code::Unavailable);
        retry.per_attempt_timeout = Some(Duration::from_millis(20));
    }
    let stats = run(&sc).expect("valid");
    let rejected = stats
        .gave_up
        .get("rejected_by_breaker")
        .copied()
        .unwrap_or(0);
    assert_eq!(stats.successes, 0);
    assert!(rejected > stats.calls / 2, "{stats:?}");
}

#[test]
fn a_tier_sends_nothing_for_an_attempt_whose_time_ran_out_on_the_way() {
    // 20 ms each way to the tier, a 10 ms attempt timeout from the fleet: each attempt
    // reaches the tier after its deadline, and the tier's client, like the layer, sends
    // no call of its own.
    let mut sc = scenario(0.0, policy(None, BudgetKind::Unlimited));
    sc.policy.layer_per_attempt_timeout = Some(Duration::from_millis(10));
    sc.tiers = vec![Tier {
        processes: 2,
        latency: Duration::from_millis(40),
    }];
    let stats = run(&sc).expect("valid");
    let n = stats.calls;
    assert_eq!(stats.attempts_by_level, [n, 0]);
    assert_eq!(stats.gave_up.get("not_retryable"), Some(&n));
}

#[test]
fn a_chain_multiplies_retries_unless_give_ups_say_do_not_retry() {
    // Delays of at most 1 ms keep the 27 attempts of a call inside its deadline.
    let fast = RetryPolicy {
        backoff: stormguard_core::BackoffConfig::FullJitter {
            base: Duration::from_millis(1),
            cap: Duration::from_millis(1),
            multiplier: 1.0,
        },
        ..retried()
    };
    let mut sc = scenario(1.0, policy(Some(fast), BudgetKind::Unlimited));
    let tier = Tier {
        processes: 3,
        latency: Duration::from_millis(1),
    };
    sc.tiers = vec![tier.clone(), tier];
    let stats = run(&sc).expect("valid");
    let n = stats.calls;
    assert_eq!(stats.attempts_by_level, [3 * n, 9 * n, 27 * n]);
    assert_eq!(stats.bottom_amplification(), 27.0);
    assert!(stats.shards.is_empty());
    // With "do not retry" on give-ups only the bottom hop retries.
    sc.policy.pushback_on_give_up = true;
    let stats = run(&sc).expect("valid");
    let n = stats.calls;
    assert_eq!(stats.attempts_by_level, [n, n, 3 * n]);
    assert_eq!(stats.gave_up.get("pushback"), Some(&n));
    // Without retries every level sees each call once, and healthy chains succeed.
    sc.policy.retry = None;
    sc.shards[0].failure_rate = 0.0;
    let stats = run(&sc).expect("valid");
    let n = stats.calls;
    assert_eq!(stats.attempts_by_level, [n, n, n]);
    assert_eq!(stats.successes, n);
}

#[test]
fn an_outage_window_fails_only_inside_it() {
    let mut sc = scenario(0.0, policy(None, BudgetKind::Unlimited));
    sc.shards[0].outage = Some(Window {
        from: Duration::from_secs(2),
        until: Duration::from_secs(4),
    });
    let stats = run(&sc).expect("valid");
    for (i, bin) in stats.bins.iter().enumerate() {
        let inside = (4..8).contains(&i);
        let expect = if inside { 0 } else { bin.calls };
        assert_eq!(bin.successes, expect, "bin {i}: {bin:?}");
    }
}

/// Jobs running on shard 0's server `ms` into a run of `sc` with one arrival.
fn running_at(sc: &Scenario, ms: u64) -> Option<usize> {
    let mut sim = Sim::new(sc, Instant::now()).expect("valid");
    sim.fleet.arrival(&mut sim.agenda);
    while sim.step(ms * 1_000_000) {}
    sim.servers.get(0).map(SimServer::running)
}

/// A one-worker shedding shard.
fn one_worker_shard(depth: Option<usize>) -> Scenario {
    let mut sc = scenario(0.0, policy(None, BudgetKind::Unlimited));
    sc.shards[0].server = ServerKind::Queue(QueueServer {
        workers: 1,
        service_time: Duration::from_millis(10),
        queue_capacity: 8,
        slowdown: None,
        drops_abandoned: false,
        shedding: Some(AdmissionConfig {
            workers: WorkerLimit::Fixed(1),
            queue_capacity: 8,
            retry_threshold: stormguard_core::RetryThreshold {
                depth,
                queue_delay: None,
            },
            min_time_left: Duration::from_millis(2),
            ..AdmissionConfig::default()
        }),
    });
    sc
}

#[test]
fn a_client_timeout_frees_the_worker_of_a_shedding_server_not_of_a_plain_one() {
    // One worker, 100 ms of service, the client gives up after 10 ms: its reset
    // reaches the server at 11 ms. The shipped layer drops the handler's future and
    // gives the worker back; a plain FIFO server runs the call to the end.
    let mut sc = one_worker_shard(None);
    sc.network = Duration::from_millis(1);
    sc.policy.layer_per_attempt_timeout = Some(Duration::from_millis(10));
    if let ServerKind::Queue(q) = &mut sc.shards[0].server {
        q.service_time = Duration::from_millis(100);
    }
    assert_eq!(running_at(&sc, 5), Some(1));
    assert_eq!(running_at(&sc, 12), Some(0));
    if let ServerKind::Queue(q) = &mut sc.shards[0].server {
        q.shedding = None;
    }
    assert_eq!(running_at(&sc, 12), Some(1));
}

#[test]
fn a_shedding_server_cuts_a_running_call_at_its_deadline_as_the_layer_does() {
    // One worker, 100 ms of service, a 20 ms deadline and 5 ms each way: the call
    // reaches the server at 5 ms and is cut at 18 ms (`cut_at`: 2 ms of
    // `min_time_left` before the deadline), its worker given back then; the client
    // gives up at 20 ms and its reset would reach the server only at 25 ms. A plain
    // FIFO server runs the call to the end.
    let mut sc = one_worker_shard(None);
    sc.network = Duration::from_millis(5);
    sc.policy.deadline = Some(Duration::from_millis(20));
    if let ServerKind::Queue(q) = &mut sc.shards[0].server {
        q.service_time = Duration::from_millis(100);
    }
    assert_eq!(running_at(&sc, 6), Some(1));
    assert_eq!(running_at(&sc, 17), Some(1));
    assert_eq!(running_at(&sc, 19), Some(0));
    if let ServerKind::Queue(q) = &mut sc.shards[0].server {
        q.shedding = None;
    }
    assert_eq!(running_at(&sc, 19), Some(1));
}

#[test]
fn a_hedge_that_lost_frees_its_worker_at_a_shedding_server_not_at_a_plain_one() {
    // Two workers, 100 ms of service, a hedge 10 ms after the first copy: both run.
    // The first copy's OK reaches the client at 102 ms and the hedge is cancelled; the
    // reset reaches the server at 103 ms, 8 ms before the hedge's work would end.
    let mut sc = one_worker_shard(None);
    sc.policy.hedging = Some(stormguard_core::HedgingPolicy {
        max_attempts: 2,
        delay: stormguard_core::HedgeDelay::Fixed(Duration::from_millis(10)),
        ..Default::default()
    });
    if let ServerKind::Queue(q) = &mut sc.shards[0].server {
        q.workers = 2;
        q.service_time = Duration::from_millis(100);
        if let Some(c) = q.shedding.as_mut() {
            c.workers = WorkerLimit::Fixed(2);
        }
    }
    assert_eq!(running_at(&sc, 5), Some(1));
    assert_eq!(running_at(&sc, 20), Some(2));
    assert_eq!(running_at(&sc, 102), Some(1));
    assert_eq!(running_at(&sc, 104), Some(0));
    if let ServerKind::Queue(q) = &mut sc.shards[0].server {
        q.shedding = None;
    }
    assert_eq!(running_at(&sc, 104), Some(1));
}

#[test]
fn a_method_is_retried_or_hedged_not_both() {
    let mut sc = scenario(0.0, policy(Some(retried()), BudgetKind::Unlimited));
    sc.policy.hedging = Some(stormguard_core::HedgingPolicy::default());
    assert_eq!(field(run(&sc).expect_err("both")), "policy.hedging");
}

#[test]
fn a_shedding_server_sheds_retries_with_pushback_and_serves_first_attempts() {
    // One worker, twice as much work as it can do: the admission policy queues a
    // little, sheds retries first and tells them when to come back.
    let retry = retried();
    let p = policy(Some(retry), BudgetKind::Unlimited);
    let mut sc = scenario(0.0, p);
    sc.clients = 2;
    sc.rate_per_client = 100.0;
    sc.shards[0].server = ServerKind::Queue(QueueServer {
        workers: 1,
        service_time: Duration::from_millis(10),
        queue_capacity: 1000,
        slowdown: None,
        drops_abandoned: false,
        shedding: Some(AdmissionConfig {
            workers: WorkerLimit::Fixed(1),
            queue_capacity: 4,
            retry_threshold: stormguard_core::RetryThreshold {
                depth: Some(1),
                queue_delay: None,
            },
            ..AdmissionConfig::default()
        }),
    });
    let stats = run(&sc).expect("valid");
    // Capacity is 100/s of 200/s offered: about half succeed, and no more attempts
    // than the capacity can serve are wasted on long queues.
    let rate = stats.success_rate();
    assert!((0.35..=0.6).contains(&rate), "{rate}: {stats:?}");
    // The same load on a plain FIFO of the same capacity: the queue grows and every
    // call waits past its deadline.
    if let ServerKind::Queue(q) = &mut sc.shards[0].server {
        q.shedding = None;
    }
    let fifo = run(&sc).expect("valid");
    assert!(fifo.success_rate() < rate / 2.0, "{fifo:?}");
}
