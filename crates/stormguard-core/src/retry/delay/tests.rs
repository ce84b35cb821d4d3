#![allow(clippy::unwrap_used)]
use super::*;
use crate::error::ConfigError;
use crate::retry::policy::{HedgeDelay, HedgingPolicy};
use crate::wire::code::{Code, CodeSet};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn learned() -> LearnedDelay {
    LearnedDelay {
        min_samples: 20,
        ..LearnedDelay::default()
    }
}

#[test]
fn no_delay_before_enough_samples() {
    let e = DelayEstimator::new(learned());
    let now = Instant::now();
    for _ in 0..19 {
        e.record_at(ms(3), now);
    }
    assert_eq!(e.delay_at(now), None);
    e.record_at(ms(3), now);
    let d = e.delay_at(now).unwrap();
    assert!(d >= ms(3) && d <= ms(3) * 110 / 100, "{d:?}");
}

#[test]
fn the_percentile_reads_the_tail_within_a_bucket() {
    let e = DelayEstimator::new(learned());
    let now = Instant::now();
    // 90 % at 2 ms, 10 % at 40 ms: p97 is in the slow tenth.
    for i in 0..1000 {
        e.record_at(if i % 10 == 0 { ms(40) } else { ms(2) }, now);
    }
    let d = e.delay_at(now).unwrap();
    assert!(d >= ms(40) && d <= ms(44), "{d:?}");
}

#[test]
fn a_slowdown_raises_the_estimate_when_losers_are_counted() {
    // Before: 2 ms. During a slowdown first attempts stall; a hedge sent at the delay
    // wins 2 ms after it was sent, and the first attempt, cancelled then, is recorded
    // for the time it ran (delay + 2 ms). Counting only winners would keep the
    // estimate at 2 ms and hedge every call.
    let e = DelayEstimator::new(learned());
    let now = Instant::now();
    for _ in 0..200 {
        e.record_at(ms(2), now);
    }
    let before = e.delay_at(now).unwrap();
    for _ in 0..200 {
        let delay = e.delay_at(now).unwrap();
        e.record_at(ms(2), now); // the winning hedge
        e.record_at(delay + ms(2), now); // the first attempt, cancelled when it lost
    }
    let after = e.delay_at(now).unwrap();
    assert!(after > before, "{before:?} -> {after:?}");
}

#[test]
fn floor_and_ceiling_bound_the_delay() {
    let config = LearnedDelay {
        floor: ms(5),
        ceiling: ms(20),
        ..learned()
    };
    let e = DelayEstimator::new(config.clone());
    let now = Instant::now();
    for _ in 0..100 {
        e.record_at(Duration::from_micros(100), now);
    }
    assert_eq!(e.delay_at(now), Some(ms(5)));
    let e = DelayEstimator::new(config);
    for _ in 0..100 {
        e.record_at(Duration::from_secs(3600), now);
    }
    assert_eq!(e.delay_at(now), Some(ms(20)));
}

#[test]
fn old_samples_age_out() {
    let e = DelayEstimator::new(learned());
    let t0 = Instant::now();
    for _ in 0..100 {
        e.record_at(ms(2), t0);
    }
    assert!(e.delay_at(t0).is_some());
    // One window later the old samples still count (previous window)...
    assert!(e.delay_at(t0 + Duration::from_secs(10)).is_some());
    // ... two windows later with nothing new, they are gone.
    assert_eq!(e.delay_at(t0 + Duration::from_secs(30)), None);
}

#[test]
fn validation_names_the_field() {
    let bad = |policy: HedgingPolicy| match policy.validate("h") {
        Err(ConfigError::Invalid { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        bad(HedgingPolicy {
            max_attempts: 1,
            ..HedgingPolicy::default()
        }),
        "h.maxAttempts"
    );
    assert_eq!(
        bad(HedgingPolicy {
            non_fatal_codes: CodeSet::single(Code::Ok),
            ..HedgingPolicy::default()
        }),
        "h.nonFatalStatusCodes"
    );
    assert_eq!(
        bad(HedgingPolicy {
            delay: HedgeDelay::Learned(LearnedDelay {
                percentile: 1.0,
                ..LearnedDelay::default()
            }),
            ..HedgingPolicy::default()
        }),
        "h.percentile"
    );
    assert_eq!(
        bad(HedgingPolicy {
            delay: HedgeDelay::Learned(LearnedDelay {
                floor: ms(10),
                ceiling: ms(5),
                ..LearnedDelay::default()
            }),
            ..HedgingPolicy::default()
        }),
        "h.floor"
    );
}

#[test]
fn buckets_cover_every_latency() {
    assert_eq!(bucket(Duration::ZERO), 0);
    assert_eq!(bucket(Duration::MAX), BUCKETS - 1);
    for us in [17u64, 100, 1_000, 10_000, 1_000_000] {
        let b = bucket(Duration::from_micros(us));
        assert!(bucket_upper_micros(b) >= us as f64, "{us}");
    }
}

#[test]
fn a_few_slow_attempts_leave_the_percentile_on_the_fast_majority() {
    let learned = LearnedDelay {
        min_samples: 10,
        ..LearnedDelay::default()
    };
    let estimator = DelayEstimator::new(learned);
    let now = Instant::now();
    assert_eq!(
        estimator.delay_at(now),
        None,
        "too few samples to hedge yet"
    );
    // 2 % of attempts are slow: the p97 is the fast majority.
    for i in 0..100u64 {
        estimator.record_at(ms(if i % 50 == 0 { 50 } else { 2 }), now);
    }
    let delay = estimator.delay_at(now).unwrap();
    assert!(delay >= ms(2) && delay < ms(3), "{delay:?}");
}

/// Absurd inputs: zero and `Duration::MAX` latencies, a window of `Duration::MAX`,
/// `min_samples` of `u32::MAX`, a clock that goes back.
#[test]
fn absurd_latencies_keep_the_delay_in_range() {
    let now = Instant::now();
    let bounded = LearnedDelay {
        floor: ms(2),
        ceiling: ms(20),
        min_samples: 1,
        window: Duration::MAX,
        ..LearnedDelay::default()
    };
    for elapsed in [Duration::ZERO, Duration::MAX, Duration::from_nanos(1)] {
        let e = DelayEstimator::new(bounded.clone());
        for _ in 0..10_000 {
            e.record_at(elapsed, now);
        }
        let d = e.delay_at(now).unwrap();
        assert!(
            d >= bounded.floor && d <= bounded.ceiling,
            "{elapsed:?}: {d:?}"
        );
        // Read back in time and far ahead: still in range, or no delay at all.
        let far = now
            .checked_add(Duration::from_secs(u64::MAX / 4))
            .unwrap_or(now);
        for t in [now.checked_sub(Duration::from_secs(1)).unwrap_or(now), far] {
            assert!(
                e.delay_at(t)
                    .is_none_or(|d| d >= bounded.floor && d <= bounded.ceiling)
            );
        }
    }
    let never = DelayEstimator::new(LearnedDelay {
        min_samples: u32::MAX,
        ..bounded
    });
    for _ in 0..10_000 {
        never.record_at(Duration::MAX, now);
    }
    assert_eq!(never.delay_at(now), None);
}
