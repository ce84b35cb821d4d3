#![allow(clippy::unwrap_used)]
use super::*;
use proptest::prelude::*;

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);

/// Default config without jitter, so open durations are exact.
fn exact() -> BreakerConfig {
    BreakerConfig {
        open_jitter: 0.0,
        ..BreakerConfig::default()
    }
}

fn breaker(config: BreakerConfig) -> CircuitBreaker {
    CircuitBreaker::new(config, 1).expect("valid config")
}

fn record(b: &CircuitBreaker, now: Instant, successes: u32, failures: u32) {
    for _ in 0..successes {
        b.acquire_at(now).expect("admitted").success_at(now);
    }
    for _ in 0..failures {
        b.acquire_at(now).expect("admitted").failure_at(now);
    }
}

/// Trips a breaker with the default min volume (20) at `now`.
fn trip(b: &CircuitBreaker, now: Instant) -> Instant {
    record(b, now, 0, b.config().min_requests);
    match b.state_at(now) {
        BreakerState::Open { until } => until,
        other => panic!("expected open, got {other:?}"),
    }
}

#[test]
fn opens_only_with_min_volume() {
    let b = breaker(exact());
    let t0 = Instant::now();
    record(&b, t0, 0, 19);
    assert_eq!(b.state_at(t0), BreakerState::Closed, "19 < min_requests");
    assert!(b.acquire_at(t0).is_ok());
    record(&b, t0, 0, 1);
    assert_eq!(
        b.state_at(t0),
        BreakerState::Open {
            until: t0 + 5 * SEC
        }
    );
}

#[test]
fn opens_at_the_rate_threshold_and_not_below() {
    let t0 = Instant::now();

    // 9 / 20 = 0.45 < 0.5
    let below = breaker(exact());
    record(&below, t0, 11, 9);
    assert_eq!(below.state_at(t0), BreakerState::Closed);
    // More successes keep it below.
    record(&below, t0, 5, 0);
    assert_eq!(below.state_at(t0), BreakerState::Closed);

    // 10 / 20 = 0.5 exactly: opens on the 20th outcome.
    let at = breaker(exact());
    record(&at, t0, 10, 9);
    assert_eq!(at.state_at(t0), BreakerState::Closed);
    record(&at, t0, 0, 1);
    assert!(matches!(at.state_at(t0), BreakerState::Open { .. }));

    // Volume reached by a success while the rate is over: opens too.
    let by_success = breaker(exact());
    record(&by_success, t0, 0, 19);
    record(&by_success, t0, 1, 0);
    assert!(matches!(by_success.state_at(t0), BreakerState::Open { .. }));

    // A custom threshold: 0.3 with 3 / 10 opens, 2 / 10 does not.
    let cfg = BreakerConfig {
        failure_rate: 0.3,
        min_requests: 10,
        ..exact()
    };
    let b = breaker(cfg.clone());
    record(&b, t0, 8, 2);
    assert_eq!(b.state_at(t0), BreakerState::Closed);
    let b = breaker(cfg);
    record(&b, t0, 7, 3);
    assert!(matches!(b.state_at(t0), BreakerState::Open { .. }));
}

#[test]
fn window_slides_and_old_failures_expire() {
    let t0 = Instant::now();

    // 19 failures, then one more half a window later: all still in the window.
    let b = breaker(exact());
    record(&b, t0, 0, 19);
    record(&b, t0 + 5 * SEC, 0, 1);
    assert!(matches!(
        b.state_at(t0 + 5 * SEC),
        BreakerState::Open { .. }
    ));

    // The same, one full window later: the first 19 have expired.
    let b = breaker(exact());
    record(&b, t0, 0, 19);
    record(&b, t0 + 10 * SEC, 0, 1);
    assert_eq!(b.state_at(t0 + 10 * SEC), BreakerState::Closed);
    // Only the new failures count now: 18 more make 19, still below the volume.
    record(&b, t0 + 10 * SEC, 0, 18);
    assert_eq!(b.state_at(t0 + 10 * SEC), BreakerState::Closed);
    record(&b, t0 + 10 * SEC, 0, 1);
    assert!(matches!(
        b.state_at(t0 + 10 * SEC),
        BreakerState::Open { .. }
    ));

    // Expiry by age, not only by a bucket being reused: 15 s later the new outcome
    // lands in another bucket while the old failures still sit in theirs.
    let b = breaker(exact());
    record(&b, t0, 0, 19);
    record(&b, t0 + 15 * SEC, 0, 1);
    assert_eq!(b.state_at(t0 + 15 * SEC), BreakerState::Closed);
    // Long idle gaps (many windows) expire everything too.
    record(&b, t0 + 3600 * SEC, 0, 19);
    assert_eq!(b.state_at(t0 + 3600 * SEC), BreakerState::Closed);

    // Partial slide: failures at 0 s expire, those at 6 s remain.
    let b = breaker(exact());
    record(&b, t0, 0, 10);
    record(&b, t0 + 6 * SEC, 0, 9);
    record(&b, t0 + 10 * SEC + 500 * MS, 0, 1); // window: 9 + 1 = 10 outcomes
    assert_eq!(b.state_at(t0 + 10 * SEC + 500 * MS), BreakerState::Closed);
    record(&b, t0 + 10 * SEC + 500 * MS, 0, 10); // 20 outcomes
    assert!(matches!(
        b.state_at(t0 + 10 * SEC + 500 * MS),
        BreakerState::Open { .. }
    ));
}

#[test]
fn refuses_while_open_with_the_time_left() {
    let b = breaker(exact());
    let t0 = Instant::now();
    let until = trip(&b, t0);
    assert_eq!(until, t0 + 5 * SEC);

    let err = b.acquire_at(t0).expect_err("open");
    assert_eq!(err.retry_after, 5 * SEC);
    let err = b.acquire_at(t0 + 2 * SEC).expect_err("open");
    assert_eq!(err.retry_after, 3 * SEC);
    let err = b.acquire_at(t0 + 5 * SEC - MS).expect_err("open");
    assert_eq!(err.retry_after, MS);
    assert_eq!(
        err.to_string(),
        "circuit breaker open; retry after 1ms",
        "message names the wait"
    );

    // From `until` on: half-open, a probe is admitted.
    assert_eq!(b.state_at(t0 + 5 * SEC), BreakerState::HalfOpen);
    assert!(b.acquire_at(t0 + 5 * SEC).is_ok());
}

fn open_duration(config: &BreakerConfig, seed: u64) -> Duration {
    let b = CircuitBreaker::new(config.clone(), seed).expect("valid");
    let t0 = Instant::now();
    trip(&b, t0) - t0
}

#[test]
fn jitter_spreads_open_durations_across_seeds() {
    let config = BreakerConfig::default(); // 5 s, jitter 0.5 → [5 s, 7.5 s]
    let lo = config.open_for;
    let hi = config.open_for.mul_f64(1.0 + config.open_jitter);

    let a = open_duration(&config, 1);
    let b = open_duration(&config, 2);
    assert_ne!(a, b, "different seeds open for different durations");
    for d in [a, b] {
        assert!(lo <= d && d <= hi, "{d:?} outside [{lo:?}, {hi:?}]");
    }

    // 1000 breakers (a fleet): durations cover the range evenly, so their half-open
    // probes do not arrive together. Ten bins of 250 ms; each should hold ~100.
    let mut bins = [0u32; 10];
    for seed in 0..1000 {
        let d = open_duration(&config, seed);
        assert!(lo <= d && d <= hi, "{d:?} outside [{lo:?}, {hi:?}]");
        let frac = (d - lo).as_secs_f64() / (hi - lo).as_secs_f64();
        bins[((frac * 10.0) as usize).min(9)] += 1;
    }
    for (i, &n) in bins.iter().enumerate() {
        assert!(
            (50..=150).contains(&n),
            "bin {i} holds {n} of 1000: {bins:?}"
        );
    }

    // The same seed is reproducible (the simulator relies on it).
    assert_eq!(open_duration(&config, 7), open_duration(&config, 7));
    // No jitter: exactly open_for.
    assert_eq!(open_duration(&exact(), 3), 5 * SEC);
}

#[test]
fn half_open_admits_exactly_n_probes_at_once() {
    let b = breaker(exact());
    let t0 = Instant::now();
    let t1 = trip(&b, t0);
    let probes: Vec<_> = (0..3)
        .map(|_| b.acquire_at(t1).expect("probe admitted"))
        .collect();
    let err = b.acquire_at(t1).expect_err("a fourth probe is refused");
    assert!(err.retry_after < 5 * SEC, "hint within [0, open_for)");
    assert!(b.acquire_at(t1 + SEC).is_err(), "still refused later");
    assert_eq!(b.state_at(t1), BreakerState::HalfOpen);
    drop(probes);
}

#[test]
fn dropped_permits_free_probe_slots_and_record_nothing() {
    let b = breaker(exact());
    let t0 = Instant::now();

    // Closed: 20 cancelled calls count for nothing (as successes they would have
    // made 19 failures reach the volume and open the breaker).
    let cancelled: Vec<_> = (0..20).map(|_| b.acquire_at(t0).expect("closed")).collect();
    drop(cancelled);
    record(&b, t0, 0, 19);
    assert_eq!(b.state_at(t0), BreakerState::Closed);
    record(&b, t0, 0, 1);
    let t1 = match b.state_at(t0) {
        BreakerState::Open { until } => until,
        s => panic!("expected open, got {s:?}"),
    };

    // Half-open: a dropped probe frees its slot and does not count as a success.
    let p1 = b.acquire_at(t1).expect("probe");
    let p2 = b.acquire_at(t1).expect("probe");
    let p3 = b.acquire_at(t1).expect("probe");
    assert!(b.acquire_at(t1).is_err());
    drop(p2);
    let p4 = b
        .acquire_at(t1)
        .expect("the freed slot admits another probe");
    assert!(b.acquire_at(t1).is_err());
    p1.success_at(t1);
    p3.success_at(t1);
    assert_eq!(b.state_at(t1), BreakerState::HalfOpen, "2 of 3 successes");
    p4.success_at(t1);
    assert_eq!(b.state_at(t1), BreakerState::Closed);
}

#[test]
fn probe_failure_reopens_with_a_new_jittered_duration() {
    let config = BreakerConfig::default();
    let b = CircuitBreaker::new(config.clone(), 9).expect("valid");
    let t0 = Instant::now();
    let t1 = trip(&b, t0);
    let first = t1 - t0;

    let p1 = b.acquire_at(t1).expect("probe");
    let p2 = b.acquire_at(t1).expect("probe");
    p1.success_at(t1);
    let t2 = t1 + 100 * MS;
    p2.failure_at(t2);
    let until = match b.state_at(t2) {
        BreakerState::Open { until } => until,
        s => panic!("expected open, got {s:?}"),
    };
    let second = until - t2;
    assert!(5 * SEC <= second && second <= 7500 * MS, "{second:?}");
    assert_ne!(first, second, "each open period is drawn afresh");
    assert_eq!(
        b.acquire_at(t2).expect_err("open").retry_after,
        second,
        "refused again for the new period"
    );

    // The next half-open round starts with all slots free and no successes.
    let ps: Vec<_> = (0..3)
        .map(|_| b.acquire_at(until).expect("probe"))
        .collect();
    assert!(b.acquire_at(until).is_err());
    let mut ps = ps.into_iter();
    ps.next().expect("p").success_at(until);
    ps.next().expect("p").success_at(until);
    assert_eq!(b.state_at(until), BreakerState::HalfOpen);
    ps.next().expect("p").success_at(until);
    assert_eq!(b.state_at(until), BreakerState::Closed);
}

#[test]
fn n_probe_successes_close_and_reset_the_window() {
    let b = breaker(exact());
    let t0 = Instant::now();
    let t1 = trip(&b, t0); // 20 failures in the window at t0
    for i in 0..3 {
        assert_eq!(
            b.state_at(t1),
            BreakerState::HalfOpen,
            "after {i} successes"
        );
        b.acquire_at(t1).expect("probe").success_at(t1);
    }
    assert_eq!(b.state_at(t1), BreakerState::Closed);
    // Still inside the 10 s window of the old failures, yet they no longer count.
    record(&b, t1, 0, 19);
    assert_eq!(b.state_at(t1), BreakerState::Closed);
    // Closed again: admits everything.
    let many: Vec<_> = (0..100)
        .map(|_| b.acquire_at(t1).expect("closed"))
        .collect();
    drop(many);
}

#[test]
fn every_transition_is_recorded_once_with_its_details() {
    let b = breaker(BreakerConfig {
        half_open_probes: 1,
        ..exact()
    });
    let watch = b.watch();
    let t0 = Instant::now();
    record(&b, t0, 5, 15); // 15 / 20 failed: opens on the 20th outcome
    let t1 = t0 + 5 * SEC;
    b.acquire_at(t1).expect("probe").failure_at(t1); // re-opens
    let t2 = t1 + 5 * SEC;
    assert_eq!(b.state_at(t2), BreakerState::HalfOpen);
    b.acquire_at(t2).expect("probe").success_at(t2); // closes

    let got: Vec<_> = watch.take().unwrap().collect();
    let open_at = |at: Instant| BreakerState::Open {
        until: at + 5 * SEC,
    };
    assert_eq!(
        got,
        [
            BreakerTransition {
                from: BreakerState::Closed,
                to: open_at(t0),
                at: t0,
                failure_rate: Some(0.75),
            },
            BreakerTransition {
                from: open_at(t0),
                to: BreakerState::HalfOpen,
                at: t1,
                failure_rate: None,
            },
            BreakerTransition {
                from: BreakerState::HalfOpen,
                to: open_at(t1),
                at: t1,
                failure_rate: None,
            },
            BreakerTransition {
                from: open_at(t1),
                to: BreakerState::HalfOpen,
                at: t2,
                failure_rate: None,
            },
            BreakerTransition {
                from: BreakerState::HalfOpen,
                to: BreakerState::Closed,
                at: t2,
                failure_rate: None,
            },
        ]
    );
    assert_eq!(got[0].open_for(), Some(5 * SEC));
    assert_eq!(got[4].open_for(), None);
    assert!(watch.take().is_none(), "each is handed out once");
    // A watch made now hears only what comes next; each watch hears everything.
    let late = b.watch();
    trip(&b, t2);
    assert_eq!(late.take().unwrap().count(), 1);
    assert_eq!(watch.take().unwrap().count(), 1);
}

#[test]
fn a_watch_far_behind_counts_what_the_log_lost() {
    let b = breaker(BreakerConfig {
        min_requests: 1,
        half_open_probes: 1,
        ..exact()
    });
    let watch = b.watch();
    let mut t = Instant::now();
    // Ten rounds of open → half-open → closed: 30 transitions.
    for _ in 0..10 {
        record(&b, t, 0, 1);
        t += 5 * SEC;
        b.acquire_at(t).expect("probe").success_at(t);
    }
    let mut taken = watch.take().unwrap();
    assert_eq!(taken.missed(), 30 - TRANSITION_LOG as u64);
    let kept: Vec<_> = taken.by_ref().collect();
    assert_eq!(kept.len(), TRANSITION_LOG);
    assert_eq!(kept.last().map(|t| t.to), Some(BreakerState::Closed));
}

#[test]
fn concurrent_takers_share_out_each_transition_exactly_once() {
    let b = breaker(BreakerConfig {
        min_requests: 1,
        half_open_probes: 1,
        ..exact()
    });
    let watch = Arc::new(b.watch());
    let t0 = Instant::now();
    let threads: Vec<_> = (0..4)
        .map(|n| {
            let (b, watch) = (b.clone(), Arc::clone(&watch));
            std::thread::spawn(move || {
                let mut seen = 0;
                for i in 0..500u32 {
                    let now = t0 + SEC * (i * 4 + n);
                    // Each thread flips the breaker (one failure opens it; after 5 s a
                    // probe's success closes it) and takes what there is.
                    if let Ok(permit) = b.acquire_at(now) {
                        if permit.is_probe() {
                            permit.success_at(now);
                        } else {
                            permit.failure_at(now);
                        }
                    }
                    // Handed out or counted as missed: each exactly once.
                    seen += watch.take().map_or(0, |t| t.missed() + t.count() as u64);
                }
                seen
            })
        })
        .collect();
    let taken: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let last = watch.take().map_or(0, |t| t.missed() + t.count() as u64);
    let recorded = b.shared.lock().log.recorded;
    assert!(recorded > 100, "the breaker flipped often: {recorded}");
    assert_eq!(taken + last, recorded);
}

#[test]
fn stale_permits_are_ignored() {
    let b = breaker(exact());
    let t0 = Instant::now();

    // Slow calls started while closed.
    let slow_ok = b.acquire_at(t0).expect("closed");
    let slow_fail = b.acquire_at(t0).expect("closed");
    let t1 = trip(&b, t0);

    // A stale success does not close an open breaker.
    slow_ok.success_at(t0 + SEC);
    assert_eq!(b.state_at(t0 + SEC), BreakerState::Open { until: t1 });

    // Half-open: a stale failure does not re-open, and takes no probe slot.
    let p1 = b.acquire_at(t1).expect("probe");
    let p2 = b.acquire_at(t1).expect("probe");
    slow_fail.failure_at(t1);
    assert_eq!(b.state_at(t1), BreakerState::HalfOpen);
    let p3 = b.acquire_at(t1).expect("third slot still free");
    assert!(b.acquire_at(t1).is_err());

    // A probe failure re-opens; the other probes of that round are now stale.
    p1.failure_at(t1);
    let t2 = match b.state_at(t1) {
        BreakerState::Open { until } => until,
        s => panic!("expected open, got {s:?}"),
    };
    p2.success_at(t1 + MS);
    assert!(matches!(b.state_at(t1 + MS), BreakerState::Open { .. }));

    // Next round: the stale probe's drop frees nothing and its success counts nothing.
    let q: Vec<_> = (0..3).map(|_| b.acquire_at(t2).expect("probe")).collect();
    drop(p3);
    assert!(b.acquire_at(t2).is_err(), "stale drop freed no slot");
    let mut q = q.into_iter();
    q.next().expect("q").success_at(t2);
    q.next().expect("q").success_at(t2);
    assert_eq!(b.state_at(t2), BreakerState::HalfOpen);
    q.next().expect("q").success_at(t2);
    assert_eq!(b.state_at(t2), BreakerState::Closed);

    // A probe from the half-open round finishing after the close is ignored too.
    let t3 = t2 + SEC;
    let b2 = breaker(exact());
    let u = trip(&b2, t3);
    let late = b2.acquire_at(u).expect("probe");
    let others: Vec<_> = (0..2).map(|_| b2.acquire_at(u).expect("probe")).collect();
    for p in others {
        p.success_at(u);
    }
    b2.acquire_at(u).expect("probe").success_at(u);
    assert_eq!(b2.state_at(u), BreakerState::Closed);
    late.failure_at(u);
    assert_eq!(
        b2.state_at(u),
        BreakerState::Closed,
        "late probe failure ignored"
    );
}

#[test]
fn clones_share_state() {
    let a = breaker(exact());
    let b = a.clone();
    let t0 = Instant::now();
    let until = trip(&a, t0);
    assert_eq!(b.state_at(t0), BreakerState::Open { until });
    assert!(b.acquire_at(t0).is_err());
    // Probes are shared too: three through one clone fill the slots of the other.
    let ps: Vec<_> = (0..3)
        .map(|_| a.acquire_at(until).expect("probe"))
        .collect();
    assert!(b.acquire_at(until).is_err());
    for p in ps {
        p.success_at(until);
    }
    assert_eq!(b.state_at(until), BreakerState::Closed);
    assert_eq!(b.config(), a.config());

    // Across threads: four clones each see 10 failures; only together do they reach
    // the volume of 40.
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<CircuitBreaker>();
    send_sync::<BreakerPermit>();
    let shared = breaker(BreakerConfig {
        min_requests: 40,
        ..exact()
    });
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let b = shared.clone();
            std::thread::spawn(move || record(&b, t0, 0, 10))
        })
        .collect();
    for t in threads {
        t.join().expect("no panic");
    }
    assert!(matches!(shared.state_at(t0), BreakerState::Open { .. }));
}

#[test]
fn config_validation_names_the_field() {
    let field_of = |c: BreakerConfig| match c.validate() {
        Err(ConfigError::Invalid { field, .. }) => field,
        other => panic!("expected an invalid field, got {other:?}"),
    };
    let d = BreakerConfig::default;
    assert_eq!(d().validate(), Ok(()));

    for rate in [0.0, -0.1, 1.01, f64::NAN, f64::INFINITY] {
        let c = BreakerConfig {
            failure_rate: rate,
            ..d()
        };
        assert_eq!(field_of(c), "breaker.failure_rate", "rate {rate}");
    }
    for window in [Duration::ZERO, 999 * MS, 601 * SEC] {
        let c = BreakerConfig { window, ..d() };
        assert_eq!(field_of(c), "breaker.window", "{window:?}");
    }
    let c = BreakerConfig {
        min_requests: 0,
        ..d()
    };
    assert_eq!(field_of(c), "breaker.min_requests");
    for open_for in [Duration::ZERO, 3601 * SEC, Duration::MAX] {
        let c = BreakerConfig { open_for, ..d() };
        assert_eq!(field_of(c), "breaker.open_for", "{open_for:?}");
    }
    for jitter in [-0.01, 10.01, f64::NAN] {
        let c = BreakerConfig {
            open_jitter: jitter,
            ..d()
        };
        assert_eq!(field_of(c), "breaker.open_jitter", "{jitter}");
    }
    let c = BreakerConfig {
        half_open_probes: 0,
        ..d()
    };
    assert_eq!(field_of(c.clone()), "breaker.half_open_probes");
    let err = CircuitBreaker::new(c, 0).expect_err("new validates");
    assert!(
        err.to_string().contains("breaker.half_open_probes"),
        "{err}"
    );

    // The edges of each range are accepted.
    let edges = BreakerConfig {
        failure_rate: 1.0,
        window: SEC,
        min_requests: 1,
        open_for: 3600 * SEC,
        open_jitter: 10.0,
        half_open_probes: 1,
    };
    assert_eq!(edges.validate(), Ok(()));
    let edges = BreakerConfig {
        window: 600 * SEC,
        open_for: Duration::from_nanos(1),
        open_jitter: 0.0,
        ..d()
    };
    assert_eq!(edges.validate(), Ok(()));
}

#[tokio::test(start_paused = true)]
async fn convenience_forms_use_the_clock() {
    let b = breaker(BreakerConfig {
        min_requests: 1,
        ..exact()
    });
    b.acquire().expect("closed").success();
    assert_eq!(b.state_at(Instant::now()), BreakerState::Closed);
    b.acquire().expect("closed").failure(); // 1 of 2 = 0.5 → opens
    // Paused clock: no time passes between the calls.
    assert_eq!(b.acquire().expect_err("open").retry_after, 5 * SEC);
    tokio::time::advance(2 * SEC).await;
    assert_eq!(b.acquire().expect_err("open").retry_after, 3 * SEC);
    tokio::time::advance(3 * SEC).await;
    b.acquire().expect("half-open probe").success();
    assert_eq!(b.state_at(Instant::now()), BreakerState::HalfOpen, "1 of 3");
}

// ---- property test: a model of the state machine ------------------------------

#[derive(Debug, Clone)]
enum Op {
    Acquire,
    Success(usize),
    Failure(usize),
    Drop(usize),
    Advance(u64),
    Back(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Acquire),
        3 => any::<usize>().prop_map(Op::Success),
        3 => any::<usize>().prop_map(Op::Failure),
        1 => any::<usize>().prop_map(Op::Drop),
        2 => (0u64..4000).prop_map(Op::Advance),
        1 => (0u64..500).prop_map(Op::Back),
    ]
}

fn config() -> impl Strategy<Value = BreakerConfig> {
    (
        0.05f64..=1.0,
        1u64..=30,
        1u32..6,
        1u64..3000,
        0.0f64..=2.0,
        1u32..5,
    )
        .prop_map(
            |(rate, window, min, open_ms, jitter, probes)| BreakerConfig {
                failure_rate: rate,
                window: Duration::from_secs(window),
                min_requests: min,
                open_for: Duration::from_millis(open_ms),
                open_jitter: jitter,
                half_open_probes: probes,
            },
        )
}

struct Held {
    permit: BreakerPermit,
    /// Model epoch (count of observed transitions) when it was issued.
    epoch: u64,
    probe: bool,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Never panics; never admits more than N concurrent probes in one half-open
    /// round (and admits exactly while fewer are in flight); N probe successes close,
    /// a probe failure opens for a jittered duration; stale outcomes change nothing.
    #[test]
    fn state_machine_matches_the_model(
        cfg in config(),
        seed in any::<u64>(),
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        let b = CircuitBreaker::new(cfg.clone(), seed).expect("valid");
        let n = cfg.half_open_probes;
        let base = Instant::now();
        let mut offset = Duration::ZERO;
        let mut held: Vec<Held> = Vec::new();
        let mut epoch = 0u64;
        let mut successes = 0u32; // probe successes in the current half-open round
        let mut state = b.state_at(base);
        prop_assert_eq!(state, BreakerState::Closed);

        let open_range = |now: Instant| {
            (now + cfg.open_for, now + cfg.open_for.mul_f64(1.0 + cfg.open_jitter) + Duration::from_nanos(1))
        };

        for op in ops {
            let now = base + offset;
            let before = state;
            let mut expect_change_ok = false;
            match op {
                Op::Advance(ms) => offset += Duration::from_millis(ms),
                Op::Back(ms) => offset = offset.saturating_sub(Duration::from_millis(ms)),
                Op::Acquire => {
                    let live = held.iter().filter(|h| h.probe && h.epoch == epoch).count() as u32;
                    match (b.acquire_at(now), before) {
                        (Ok(permit), BreakerState::Closed) => {
                            held.push(Held { permit, epoch, probe: false });
                        }
                        (Ok(permit), BreakerState::HalfOpen) => {
                            prop_assert!(live < n, "admitted probe {} of {}", live + 1, n);
                            held.push(Held { permit, epoch, probe: true });
                        }
                        (Err(e), BreakerState::Open { until }) => {
                            prop_assert_eq!(e.retry_after, until.saturating_duration_since(now));
                        }
                        (Err(e), BreakerState::HalfOpen) => {
                            prop_assert!(live >= n, "refused with {} of {} probes", live, n);
                            prop_assert!(e.retry_after < cfg.open_for);
                        }
                        (r, s) => prop_assert!(false, "acquire in {:?} gave {:?}", s, r.map(|_| ())),
                    }
                }
                Op::Success(i) | Op::Failure(i) | Op::Drop(i) => {
                    if held.is_empty() {
                        continue;
                    }
                    let h = held.swap_remove(i % held.len());
                    let current = h.epoch == epoch;
                    match (&op, h.probe) {
                        (Op::Success(_), true) => {
                            h.permit.success_at(now);
                            if current {
                                successes += 1;
                            }
                        }
                        (Op::Success(_), false) => h.permit.success_at(now),
                        (Op::Failure(_), _) => h.permit.failure_at(now),
                        _ => drop(h.permit),
                    }
                    let after = b.state_at(now);
                    match (&op, current, h.probe) {
                        (Op::Drop(_), _, _) | (_, false, _) => {
                            prop_assert_eq!(after, before, "stale or dropped permit changed state");
                        }
                        (Op::Success(_), true, true) => {
                            if successes >= n {
                                prop_assert_eq!(after, BreakerState::Closed);
                            } else {
                                prop_assert_eq!(after, BreakerState::HalfOpen);
                            }
                        }
                        (Op::Failure(_), true, true) => {
                            let (lo, hi) = open_range(now);
                            match after {
                                BreakerState::Open { until } => prop_assert!(lo <= until && until <= hi),
                                s => prop_assert!(false, "probe failure left {:?}", s),
                            }
                        }
                        (_, true, false) => expect_change_ok = true,
                        _ => unreachable!(),
                    }
                }
            }
            let after = b.state_at(base + offset);
            if after != before {
                match (before, after) {
                    (BreakerState::Closed, BreakerState::Open { until }) => {
                        prop_assert!(expect_change_ok, "opened without a closed outcome");
                        let (lo, hi) = open_range(now);
                        prop_assert!(lo <= until && until <= hi);
                    }
                    (BreakerState::Open { until }, BreakerState::HalfOpen) => {
                        prop_assert!(base + offset >= until);
                    }
                    (BreakerState::HalfOpen, BreakerState::Open { .. } | BreakerState::Closed) => {}
                    (x, y) => prop_assert!(false, "transition {:?} -> {:?}", x, y),
                }
                epoch += 1;
                successes = 0;
            }
            state = after;
            // Invariant: never more than N live probes of the current round.
            if state == BreakerState::HalfOpen {
                let live = held.iter().filter(|h| h.probe && h.epoch == epoch).count() as u32;
                prop_assert!(live <= n);
            }
        }
    }
}
