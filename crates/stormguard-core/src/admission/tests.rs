#![allow(clippy::unwrap_used)]
use super::*;
use crate::admission::config::{MAX_PUSHBACK, MAX_TIME_QUEUED};
use crate::wire::code::Code;

use proptest::prelude::*;

/// Twenty pushbacks with no completions yet (the estimate is `pushback_max`).
fn pushbacks(seed: Option<u64>) -> Vec<Duration> {
    let mut p = AdmissionController::new(AdmissionConfig { seed, ..config() }).unwrap();
    let now = Instant::now();
    (0..20).map(|_| p.pushback_at(now, 8)).collect()
}

#[test]
fn replicas_draw_their_own_pushback_jitter_unless_a_seed_is_set() {
    // Two servers built from the same default config must not send their clients back
    // at the same instants.
    assert_ne!(pushbacks(None), pushbacks(None));
    assert_eq!(pushbacks(Some(7)), pushbacks(Some(7)));
    let policy = AdmissionController::new(config()).unwrap();
    assert!(policy.config().seed.is_some(), "the drawn seed is kept");
}

fn config() -> AdmissionConfig {
    AdmissionConfig {
        workers: WorkerLimit::Fixed(2),
        queue_capacity: 10,
        retry_threshold: RetryThreshold {
            depth: Some(4),
            queue_delay: None,
        },
        pushback_max: Duration::from_millis(500),
        ..AdmissionConfig::default()
    }
}

fn busy(depth: usize, oldest: Option<Instant>) -> QueueLoad {
    QueueLoad {
        free_workers: 0,
        depth,
        oldest_enqueued: oldest,
    }
}

#[test]
fn validate_names_each_bad_field() {
    let field = |c: AdmissionConfig| match c.validate().unwrap_err() {
        ConfigError::Invalid { field, .. } => field,
        other => panic!("unexpected {other:?}"),
    };
    let base = config();
    assert!(base.validate().is_ok());
    assert_eq!(
        field(AdmissionConfig {
            workers: WorkerLimit::Fixed(0),
            ..base.clone()
        }),
        "admission.workers"
    );
    assert_eq!(
        field(AdmissionConfig {
            retry_threshold: RetryThreshold {
                depth: Some(11),
                queue_delay: None
            },
            ..base.clone()
        }),
        "admission.retry_threshold.depth"
    );
    for bad in [
        Duration::ZERO,
        MAX_TIME_QUEUED + Duration::from_millis(1),
        Duration::MAX,
    ] {
        assert_eq!(
            field(AdmissionConfig {
                max_time_queued: bad,
                ..base.clone()
            }),
            "admission.max_time_queued"
        );
    }
    for bad in [
        Duration::ZERO,
        Duration::from_micros(999),
        MAX_PUSHBACK + Duration::from_millis(1),
    ] {
        assert_eq!(
            field(AdmissionConfig {
                pushback_max: bad,
                ..base.clone()
            }),
            "admission.pushback_max"
        );
    }
    assert_eq!(
        field(AdmissionConfig {
            shed_code: Code::Ok,
            ..base.clone()
        }),
        "admission.shed_code"
    );
    assert_eq!(
        field(AdmissionConfig {
            no_retry_depth: Some(11),
            ..base.clone()
        }),
        "admission.no_retry_depth"
    );
    for bad in [MAX_TIME_QUEUED + Duration::from_millis(1), Duration::MAX] {
        assert_eq!(
            field(AdmissionConfig {
                no_retry_margin: Some(bad),
                ..base.clone()
            }),
            "admission.no_retry_margin"
        );
        assert_eq!(
            field(AdmissionConfig {
                no_retry_after_shedding: Some(bad),
                ..base.clone()
            }),
            "admission.no_retry_after_shedding"
        );
    }
    assert!(
        AdmissionController::new(AdmissionConfig {
            workers: WorkerLimit::Fixed(0),
            ..base
        })
        .is_err()
    );
}

#[test]
fn admits_when_a_worker_is_free() {
    let mut p = AdmissionController::new(config()).unwrap();
    let now = Instant::now();
    let load = QueueLoad {
        free_workers: 1,
        depth: 0,
        oldest_enqueued: None,
    };
    assert_eq!(
        p.decide_at(now, load, AttemptClass::Retry),
        Admission::Admit
    );
    assert_eq!(
        p.decide_at(now, load, AttemptClass::First),
        Admission::Admit
    );
}

#[test]
fn retries_are_shed_from_the_threshold_first_attempts_only_when_full() {
    let mut p = AdmissionController::new(config()).unwrap();
    let now = Instant::now();
    for depth in 0..4 {
        assert_eq!(
            p.decide_at(now, busy(depth, Some(now)), AttemptClass::Retry),
            Admission::Queue
        );
    }
    for depth in 4..10 {
        let d = p.decide_at(now, busy(depth, Some(now)), AttemptClass::Retry);
        assert!(
            matches!(
                d,
                Admission::Shed(Shed {
                    reason: ShedReason::RetryThreshold,
                    ..
                })
            ),
            "{depth}: {d:?}"
        );
        assert_eq!(
            p.decide_at(now, busy(depth, Some(now)), AttemptClass::First),
            Admission::Queue
        );
    }
    for class in [AttemptClass::First, AttemptClass::Retry] {
        let d = p.decide_at(now, busy(10, Some(now)), class);
        assert!(
            matches!(
                d,
                Admission::Shed(Shed {
                    reason: ShedReason::QueueFull,
                    ..
                })
            ),
            "{d:?}"
        );
    }
}

#[test]
fn retry_threshold_by_queue_delay() {
    let mut p = AdmissionController::new(AdmissionConfig {
        retry_threshold: RetryThreshold {
            depth: None,
            queue_delay: Some(Duration::from_millis(20)),
        },
        ..config()
    })
    .unwrap();
    let t0 = Instant::now();
    let load = busy(1, Some(t0));
    let at = |ms| t0 + Duration::from_millis(ms);
    assert_eq!(
        p.decide_at(at(19), load, AttemptClass::Retry),
        Admission::Queue
    );
    assert!(matches!(
        p.decide_at(at(20), load, AttemptClass::Retry),
        Admission::Shed(_)
    ));
    assert_eq!(
        p.decide_at(at(500), load, AttemptClass::First),
        Admission::Queue
    );
    // No queue, no delay: nothing to shed by.
    assert_eq!(
        p.decide_at(at(500), busy(0, None), AttemptClass::Retry),
        Admission::Queue
    );
}

#[test]
fn without_thresholds_retries_wait_like_first_attempts() {
    let mut p = AdmissionController::new(AdmissionConfig {
        retry_threshold: RetryThreshold {
            depth: None,
            queue_delay: None,
        },
        ..config()
    })
    .unwrap();
    let now = Instant::now();
    assert_eq!(
        p.decide_at(now, busy(9, Some(now)), AttemptClass::Retry),
        Admission::Queue
    );
    assert!(matches!(
        p.decide_at(now, busy(10, Some(now)), AttemptClass::Retry),
        Admission::Shed(_)
    ));
}

#[test]
fn no_retry_depth_tells_deep_retries_not_to_come_back() {
    let mut p = AdmissionController::new(AdmissionConfig {
        no_retry_depth: Some(8),
        ..config()
    })
    .unwrap();
    let now = Instant::now();
    let shed = |d| match d {
        Admission::Shed(s) => s.pushback,
        other => panic!("not shed: {other:?}"),
    };
    assert!(matches!(
        shed(p.decide_at(now, busy(7, Some(now)), AttemptClass::Retry)),
        ShedPushback::After(_)
    ));
    assert_eq!(
        shed(p.decide_at(now, busy(8, Some(now)), AttemptClass::Retry)),
        ShedPushback::DoNotRetry
    );
    assert_eq!(ShedPushback::DoNotRetry.millis(), -1);
    // First attempts are never told not to retry.
    assert!(matches!(
        shed(p.decide_at(now, busy(10, Some(now)), AttemptClass::First)),
        ShedPushback::After(_)
    ));
}

#[test]
fn drain_estimate_follows_the_completion_rate() {
    let mut p = AdmissionController::new(config()).unwrap();
    let t0 = Instant::now();
    // Unknown rate: the maximum.
    assert_eq!(p.drain_estimate_at(t0, 5), Duration::from_millis(500));
    // One completion every 2 ms.
    for i in 0..50 {
        p.record_completion_at(t0 + Duration::from_millis(2 * i));
    }
    let now = t0 + Duration::from_millis(98);
    // 10 queued and this one: 11 completions, 2 ms apart.
    assert_eq!(p.drain_estimate_at(now, 10), Duration::from_millis(22));
    assert_eq!(
        p.completion_rate().per_second_at(now).map(|r| r.round()),
        Some(500.0)
    );
    // Nothing queued: one gap, until a worker frees up.
    assert_eq!(p.drain_estimate_at(now, 0), Duration::from_millis(2));
    // Clamped above.
    assert_eq!(p.drain_estimate_at(now, 10_000), Duration::from_millis(500));
    // A stalled server looks slow, not fast: 50 ms of silence per completion.
    let later = now + Duration::from_millis(50);
    assert_eq!(p.drain_estimate_at(later, 3), Duration::from_millis(200));
}

#[test]
fn drain_estimate_is_never_below_one_millisecond() {
    let mut p = AdmissionController::new(config()).unwrap();
    let t0 = Instant::now();
    // A completion every 10 µs.
    for i in 0..100 {
        p.record_completion_at(t0 + Duration::from_micros(10 * i));
    }
    let now = t0 + Duration::from_micros(990);
    assert_eq!(p.drain_estimate_at(now, 0), Duration::from_millis(1));
    assert_eq!(p.pushback_at(now, 0), Duration::from_millis(1));
    // All at the same instant: a zero gap still gives 1 ms.
    let mut q = AdmissionController::new(config()).unwrap();
    for _ in 0..10 {
        q.record_completion_at(t0);
    }
    assert_eq!(q.drain_estimate_at(t0, 5), Duration::from_millis(1));
}

#[test]
fn pushback_is_jittered_within_half_to_full_estimate() {
    let mut p = AdmissionController::new(config()).unwrap();
    let t0 = Instant::now();
    for i in 0..50 {
        p.record_completion_at(t0 + Duration::from_millis(2 * i));
    }
    let now = t0 + Duration::from_millis(98);
    let values: Vec<u128> = (0..200)
        .map(|_| p.pushback_at(now, 50).as_millis())
        .collect();
    assert!(values.iter().all(|v| (51..=102).contains(v)), "{values:?}");
    let distinct: std::collections::BTreeSet<_> = values.iter().collect();
    assert!(distinct.len() > 20, "not jittered: {distinct:?}");
}

/// A policy whose completions came exactly 2 ms apart up to `t0 + 98 ms`, returned
/// with that instant.
fn warmed(config: AdmissionConfig) -> (AdmissionController, Instant) {
    let mut p = AdmissionController::new(config).unwrap();
    let t0 = Instant::now();
    for i in 0..50 {
        p.record_completion_at(t0 + Duration::from_millis(2 * i));
    }
    (p, t0 + Duration::from_millis(98))
}

fn only_the_deadline_rule() -> AdmissionConfig {
    AdmissionConfig {
        no_retry_margin: Some(Duration::from_millis(5)),
        no_retry_after_shedding: None,
        ..config()
    }
}

#[test]
fn the_deadline_rule_adds_pushback_drain_and_margin() {
    let (p, now) = warmed(only_the_deadline_rule());
    let ms = Duration::from_millis;
    // 10 queued: E = 11 × 2 ms = 22 ms. P 30 + E 22 + S 5 = 57 ms.
    assert_eq!(p.drain_estimate_at(now, 10), ms(22));
    let fits = |left| !p.cannot_serve_in_time_at(now, 10, ms(30), Some(now + ms(left)));
    assert!(!fits(57));
    assert!(fits(58));
    assert!(!fits(0));
    // A deadline already gone, and no deadline at all.
    assert!(p.cannot_serve_in_time_at(now + ms(10), 10, ms(1), Some(now)));
    assert!(!p.cannot_serve_in_time_at(now, 10, ms(30), None));
    // The drain term follows the depth: 40 queued is 82 ms.
    assert!(p.cannot_serve_in_time_at(now, 40, ms(30), Some(now + ms(100))));
    assert!(!p.cannot_serve_in_time_at(now, 0, ms(30), Some(now + ms(100))));
    // Off: never.
    let (off, now) = warmed(AdmissionConfig {
        no_retry_margin: None,
        ..only_the_deadline_rule()
    });
    assert!(!off.cannot_serve_in_time_at(now, 40, ms(30), Some(now)));
    // A huge margin saturates instead of overflowing.
    let (huge, now) = warmed(AdmissionConfig {
        no_retry_margin: Some(MAX_TIME_QUEUED),
        ..only_the_deadline_rule()
    });
    assert!(huge.cannot_serve_in_time_at(now, usize::MAX, MAX_PUSHBACK, Some(now)));
}

#[test]
fn shed_calls_without_time_for_a_retry_are_told_not_to_retry() {
    let (mut p, now) = warmed(only_the_deadline_rule());
    let ms = Duration::from_millis;
    // 10 queued: E = 22 ms, P in [11, 22], S = 5: at most 49 ms needed, at least 38.
    for class in [AttemptClass::First, AttemptClass::Retry] {
        for _ in 0..50 {
            let roomy = p.shed_pushback_at(now, 10, class, Some(now + ms(50)));
            assert!(matches!(roomy, ShedPushback::After(_)), "{roomy:?}");
            let tight = p.shed_pushback_at(now, 10, class, Some(now + ms(38)));
            assert_eq!(tight, ShedPushback::DoNotRetry);
            assert!(matches!(
                p.shed_pushback_at(now, 10, class, None),
                ShedPushback::After(_)
            ));
        }
    }
    // Through the decision: a first attempt shed by a full queue with 30 ms left.
    let full = busy(10, Some(now));
    let d = p.decide_with_deadline_at(now, full, AttemptClass::First, Some(now + ms(30)));
    assert_eq!(
        d,
        Admission::Shed(Shed {
            reason: ShedReason::QueueFull,
            pushback: ShedPushback::DoNotRetry
        })
    );
    // Without a deadline, `decide_at` keeps sending delays.
    assert!(matches!(
        p.decide_at(now, full, AttemptClass::First),
        Admission::Shed(Shed {
            pushback: ShedPushback::After(_),
            ..
        })
    ));
}

fn only_the_sustained_rule(after_ms: u64) -> AdmissionConfig {
    AdmissionConfig {
        no_retry_margin: None,
        no_retry_after_shedding: Some(Duration::from_millis(after_ms)),
        ..config()
    }
}

#[test]
fn sustained_shedding_turns_every_pushback_to_do_not_retry_until_a_break() {
    let (mut p, t0) = warmed(only_the_sustained_rule(100));
    let ms = Duration::from_millis;
    let at = |t| t0 + ms(t);
    let told = |p: &mut AdmissionController, t, class| {
        p.shed_pushback_at(at(t), 10, class, None) == ShedPushback::DoNotRetry
    };
    assert_eq!(p.shedding_since(), None);
    // A shed every 10 ms (the drain estimate at depth 10 is 22 ms: no break).
    for t in (0..100).step_by(10) {
        assert!(!told(&mut p, t, AttemptClass::Retry), "{t} ms");
    }
    assert_eq!(p.shedding_since(), Some(at(0)));
    // 100 ms of shedding: retries and first attempts alike.
    assert!(told(&mut p, 100, AttemptClass::Retry));
    assert!(told(&mut p, 105, AttemptClass::First));
    // An arrival that finds a worker free is a break.
    let free = QueueLoad {
        free_workers: 1,
        depth: 0,
        oldest_enqueued: None,
    };
    assert_eq!(
        p.decide_at(at(106), free, AttemptClass::First),
        Admission::Admit
    );
    assert_eq!(p.shedding_since(), None);
    assert!(!told(&mut p, 107, AttemptClass::Retry));
    for t in (117..207).step_by(10) {
        told(&mut p, t, AttemptClass::Retry);
    }
    assert!(told(&mut p, 207, AttemptClass::Retry));
    // So is an arrival that finds the queue below the retry threshold (4 here): a
    // retry would wait in it.
    assert_eq!(
        p.decide_at(at(208), busy(3, Some(at(200))), AttemptClass::First),
        Admission::Queue
    );
    assert_eq!(p.shedding_since(), None);
    // An arrival at the threshold is not one.
    assert!(!told(&mut p, 209, AttemptClass::Retry));
    p.decide_at(at(210), busy(4, Some(at(200))), AttemptClass::First);
    assert_eq!(p.shedding_since(), Some(at(209)));
    // A lull in shedding is not a break while no arrival finds a short queue.
    assert!(told(&mut p, 209 + 5_000, AttemptClass::Retry));
    assert_eq!(p.shedding_since(), Some(at(209)));
}

/// Completions 2 ms apart from `t0` to `until` ms, a retry shed every `every` ms at
/// depth 4; the last shed answer.
fn shed_every(p: &mut AdmissionController, t0: Instant, until: u64, every: u64) -> ShedPushback {
    let mut last = None;
    for t in (0..=until).step_by(2) {
        let now = t0 + Duration::from_millis(t);
        p.record_completion_at(now);
        if t % every == 0 {
            last = Some(p.shed_pushback_at(now, 4, AttemptClass::Retry, None));
        }
    }
    last.unwrap()
}

#[test]
fn a_lull_in_shedding_with_the_queue_past_the_threshold_is_no_break() {
    // Sheds 8 ms or 40 ms apart at depth 4 (the retry threshold) while calls
    // complete: one stretch either way, -1 from 50 ms.
    for every in [8, 40] {
        let (mut p, t0) = warmed(only_the_sustained_rule(50));
        assert_eq!(shed_every(&mut p, t0, 80, every), ShedPushback::DoNotRetry);
        assert_eq!(p.shedding_since(), Some(t0));
    }
}

#[test]
fn with_both_rules_off_only_no_retry_depth_says_do_not_retry() {
    let (mut p, now) = warmed(AdmissionConfig {
        no_retry_margin: None,
        no_retry_after_shedding: None,
        ..config()
    });
    let ms = Duration::from_millis;
    for t in 0..2_000 {
        let pb = p.shed_pushback_at(now + ms(t), 10, AttemptClass::Retry, Some(now));
        assert!(matches!(pb, ShedPushback::After(_)), "{t}: {pb:?}");
    }
}

#[test]
fn expiry_is_the_earlier_of_queue_bound_and_deadline() {
    let p = AdmissionController::new(AdmissionConfig {
        max_time_queued: Duration::from_millis(100),
        min_time_left: Duration::from_millis(5),
        ..config()
    })
    .unwrap();
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    assert_eq!(p.expiry(t0, None), t0 + ms(100));
    assert_eq!(p.expiry(t0, Some(t0 + ms(50))), t0 + ms(45));
    assert_eq!(p.expiry(t0, Some(t0 + ms(500))), t0 + ms(100));
    assert_eq!(p.expiry(t0 + ms(10), Some(t0 + ms(12))), t0 + ms(7));
}

#[test]
fn longest_accepted_max_time_queued_does_not_expire_calls_at_once() {
    // `Duration::MAX` used to be accepted, overflowed the instant and made every
    // queued call expire the moment it arrived; the bound keeps expiry in range.
    let p = AdmissionController::new(AdmissionConfig {
        max_time_queued: MAX_TIME_QUEUED,
        ..config()
    })
    .unwrap();
    let t0 = Instant::now();
    assert_eq!(p.expiry(t0, None), t0 + MAX_TIME_QUEUED);
    assert!(
        AdmissionController::new(AdmissionConfig {
            max_time_queued: Duration::MAX,
            ..config()
        })
        .is_err()
    );
}

#[test]
fn adaptive_lifo_switches_at_its_depth() {
    let fifo = AdmissionController::new(AdmissionConfig {
        queue_order: QueueOrder::Fifo,
        ..config()
    })
    .unwrap();
    let t0 = Instant::now();
    let late = Some(Oldest {
        enqueued_at: t0,
        expiry: t0 + Duration::from_millis(10),
    });
    let at = t0 + Duration::from_millis(9);
    assert!(!fifo.serve_newest(at, 0, None) && !fifo.serve_newest(at, 10, late));
    let lifo = AdmissionController::new(AdmissionConfig {
        queue_order: QueueOrder::AdaptiveLifo { from_depth: 3 },
        ..config()
    })
    .unwrap();
    assert!(!lifo.serve_newest(t0, 2, late));
    assert!(lifo.serve_newest(t0, 3, late));
}

#[test]
fn lifo_when_late_serves_the_oldest_until_it_has_waited_half_its_time() {
    let queue = AdmissionController::new(AdmissionConfig {
        queue_order: QueueOrder::LifoWhenLate,
        ..config()
    })
    .unwrap();
    let t0 = Instant::now();
    let oldest = Oldest {
        enqueued_at: t0,
        expiry: t0 + Duration::from_millis(300),
    };
    // However deep the queue, a call that has waited less than it has left is served
    // first: a crowd, not an overload.
    let early = t0 + Duration::from_millis(149);
    assert!(!queue.serve_newest(early, 10_000, Some(oldest)));
    // From half its time on, the queue is not draining in time: newest first.
    let half = t0 + Duration::from_millis(150);
    assert!(queue.serve_newest(half, 1, Some(oldest)));
    assert!(!queue.serve_newest(half, 0, None));
}

proptest! {
    #[test]
    fn pushback_never_zero_never_above_max(
        max_ms in 1u64..5_000,
        gaps in proptest::collection::vec(0u64..100_000, 0..40),
        silence_us in 0u64..10_000_000,
        depth in 0usize..100_000,
        seed in any::<u64>(),
    ) {
        let mut p = AdmissionController::new(AdmissionConfig {
            pushback_max: Duration::from_millis(max_ms),
            seed: Some(seed),
            ..config()
        }).unwrap();
        let mut now = Instant::now();
        for gap in gaps {
            now += Duration::from_micros(gap);
            p.record_completion_at(now);
        }
        now += Duration::from_micros(silence_us);
        for class in [AttemptClass::First, AttemptClass::Retry] {
            let pb = p.pushback_at(now, depth);
            prop_assert!(pb >= Duration::from_millis(1), "{pb:?}");
            prop_assert!(pb <= Duration::from_millis(max_ms), "{pb:?}");
            let ms = p.shed_pushback_at(now, depth, class, None).millis();
            prop_assert!((1..=max_ms as i64).contains(&ms), "{ms}");
        }
    }
}

#[test]
fn retries_are_shed_before_first_attempts_on_a_busy_queue() {
    let config = AdmissionConfig {
        queue_capacity: 8,
        retry_threshold: RetryThreshold {
            depth: Some(2),
            queue_delay: None,
        },
        ..AdmissionConfig::default()
    };
    let mut policy = AdmissionController::new(config).unwrap();
    let now = Instant::now();
    let first = crate::wire::attempt_class(None, None);
    let retry = crate::wire::attempt_class(Some(b"1"), None);
    let busy = |depth| busy(depth, Some(now));
    assert_eq!(policy.decide_at(now, busy(3), first), Admission::Queue);
    assert!(matches!(
        policy.decide_at(now, busy(3), retry),
        Admission::Shed(_)
    ));
    assert!(matches!(
        policy.decide_at(now, busy(8), first),
        Admission::Shed(_)
    ));
}

#[test]
fn shed_pushback_follows_the_deadline_and_the_sustained_rules() {
    let mut policy = AdmissionController::new(AdmissionConfig {
        pushback_max: Duration::from_millis(100),
        no_retry_after_shedding: Some(Duration::from_millis(300)),
        ..AdmissionConfig::default()
    })
    .unwrap();
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    // No rate known yet: pushback in [50, 100] ms, drain estimate 100 ms.
    // 1 s left: room for both and the 5 ms margin.
    let p = policy.shed_pushback_at(t0, 4, AttemptClass::Retry, Some(t0 + ms(1000)));
    assert!(matches!(p, ShedPushback::After(_)));
    // 120 ms left: no room for 50..100 ms of pushback and 100 ms of drain.
    let p = policy.shed_pushback_at(t0, 4, AttemptClass::First, Some(t0 + ms(120)));
    assert_eq!(p, ShedPushback::DoNotRetry);
    // Shedding without a break (no arrival found a free worker or a short queue)...
    for t in (50..300).step_by(50) {
        policy.shed_pushback_at(t0 + ms(t), 4, AttemptClass::Retry, None);
    }
    // ...for 300 ms: every shed call is told not to come back.
    let p = policy.shed_pushback_at(t0 + ms(300), 4, AttemptClass::Retry, None);
    assert_eq!(p, ShedPushback::DoNotRetry);
}

#[test]
fn cannot_serve_in_time_adds_pushback_drain_and_margin() {
    let policy = AdmissionController::new(AdmissionConfig {
        pushback_max: Duration::from_millis(100),
        ..AdmissionConfig::default()
    })
    .unwrap();
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    // No rate yet: E = 100 ms. P 60 + E 100 + S 5 = 165 ms.
    assert!(policy.cannot_serve_in_time_at(t0, 3, ms(60), Some(t0 + ms(165))));
    assert!(!policy.cannot_serve_in_time_at(t0, 3, ms(60), Some(t0 + ms(166))));
    assert!(!policy.cannot_serve_in_time_at(t0, 3, ms(60), None));
}

proptest! {
    /// Any valid config, at any queue depth (`usize::MAX` included) and after completions
    /// an hour apart: the pushback stays in `[1 ms, pushback_max]`, a shed answer's too, and
    /// a deadline too far to add to the clock expires no earlier than the call arrived.
    #[test]
    fn pushback_and_expiry_stay_in_range_at_any_depth(
        max_ms in 1u64..=MAX_PUSHBACK.as_millis() as u64,
        queued_ms in 1u64..=MAX_TIME_QUEUED.as_millis() as u64,
        left_ms in 0u64..=MAX_TIME_QUEUED.as_millis() as u64,
        depth in prop_oneof![Just(0usize), Just(1), Just(usize::MAX), any::<usize>()],
        seed in any::<u64>(),
    ) {
        let config = AdmissionConfig {
            pushback_max: Duration::from_millis(max_ms),
            max_time_queued: Duration::from_millis(queued_ms),
            min_time_left: Duration::from_millis(left_ms),
            seed: Some(seed),
            ..config()
        };
        prop_assume!(config.validate().is_ok());
        let mut p = AdmissionController::new(config).unwrap();
        let start = Instant::now();
        let mut t = start;
        for gap in [0, 1, 3_600_000] {
            t += Duration::from_millis(gap);
            p.record_completion_at(t);
        }
        let max = Duration::from_millis(max_ms);
        for class in [AttemptClass::First, AttemptClass::Retry] {
            let load = QueueLoad { free_workers: 0, depth, oldest_enqueued: Some(start) };
            if let Admission::Shed(shed) = p.decide_at(t, load, class) {
                prop_assert!(shed.pushback.millis() != 0);
            }
            let pushback = p.pushback_at(t, depth);
            prop_assert!(pushback >= Duration::from_millis(1) && pushback <= max, "{pushback:?}");
            for deadline in [None, Some(t)] {
                if let ShedPushback::After(d) = p.shed_pushback_at(t, depth, class, deadline) {
                    prop_assert!(d >= Duration::from_millis(1) && d <= max, "{d:?}");
                }
            }
        }
        let far = t.checked_add(Duration::from_secs(99_999_999 * 3600));
        prop_assert!(p.expiry(t, far) >= t && p.expiry(t, None) >= t);
    }
}

#[test]
fn sheddable_calls_rank_lowest_then_retries_then_first_attempts() {
    use crate::criticality::Criticality::{Critical, Default, Sheddable};
    use AttemptClass::{First, Retry};

    let rank = |a, c| CallClass::new(a, c).rank();
    assert!(rank(First, Sheddable) < rank(Retry, Default));
    // A retry of a critical call is still a retry.
    assert!(rank(Retry, Critical) < rank(First, Default));
    assert!(rank(First, Default) < rank(First, Critical));
}
