#![allow(clippy::unwrap_used)]
use super::*;
use Criticality::*;

const SEC: Duration = Duration::from_secs(1);

fn throttle(config: AdaptiveThrottleConfig) -> AdaptiveThrottle {
    AdaptiveThrottle::new(config, 42).unwrap()
}

/// Records `accepts` OK answers and `rejects` shed answers of `class` at `now`.
fn feed(t: &AdaptiveThrottle, class: Criticality, accepts: u32, rejects: u32, now: Instant) {
    for _ in 0..accepts {
        t.record_answer_at(class, Code::Ok, false, now);
    }
    for _ in 0..rejects {
        t.record_answer_at(class, Code::ResourceExhausted, false, now);
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

#[test]
fn the_probability_is_the_sre_formula_at_known_counts() {
    let t = throttle(AdaptiveThrottleConfig::default());
    let now = Instant::now();
    assert_eq!(t.probability_at(Default, now), 0.0, "no history");
    feed(&t, Default, 100, 0, now);
    assert_eq!(t.probability_at(Default, now), 0.0, "all accepted");
    // 100 requests, 50 accepts, K = 2: 100 − 100 = 0.
    let t = throttle(AdaptiveThrottleConfig::default());
    feed(&t, Default, 50, 50, now);
    assert_eq!(t.probability_at(Default, now), 0.0, "exactly 1/K accepted");
    feed(&t, Default, 0, 50, now);
    // 150 requests, 50 accepts: (150 − 100) / 151.
    assert!(close(t.probability_at(Default, now), 50.0 / 151.0));
    assert_eq!(
        t.counts_at(Default, now),
        WindowCounts {
            requests: 150,
            accepts: 50
        }
    );
    // K = 1.1: (150 − 55) / 151.
    let k = AdaptiveThrottleConfig {
        k: 1.1,
        sheddable_k: 1.1,
        ..AdaptiveThrottleConfig::default()
    };
    let t = throttle(k);
    feed(&t, Default, 50, 100, now);
    assert!(close(t.probability_at(Default, now), 95.0 / 151.0));
}

#[test]
fn the_ceiling_caps_the_probability() {
    let t = throttle(AdaptiveThrottleConfig::default());
    let now = Instant::now();
    feed(&t, Default, 0, 1000, now);
    // 1000 / 1001 without the ceiling.
    assert_eq!(t.probability_at(Default, now), 0.9);
    let low = throttle(AdaptiveThrottleConfig {
        max_reject_probability: 0.5,
        ..AdaptiveThrottleConfig::default()
    });
    feed(&low, Default, 0, 1000, now);
    assert_eq!(low.probability_at(Default, now), 0.5);
    // With the ceiling, about one call in ten still goes out however long it lasts.
    let sent = (0..10_000)
        .filter(|_| t.admit_at(Default, now).is_ok())
        .count();
    assert!((800..1200).contains(&sent), "{sent} of 10000 sent");
}

#[test]
fn the_window_forgets() {
    let t = throttle(AdaptiveThrottleConfig::default());
    let t0 = Instant::now();
    feed(&t, Default, 0, 100, t0);
    assert_eq!(t.counts_at(Default, t0 + 9 * SEC).requests, 100);
    assert!(t.probability_at(Default, t0 + 9 * SEC) > 0.0);
    // The bucket of t0 rotates out 10 s (the window) after it began.
    assert_eq!(t.counts_at(Default, t0 + 10 * SEC), WindowCounts::default());
    assert_eq!(t.probability_at(Default, t0 + 10 * SEC), 0.0);
    // Counts spread over time leave bucket by bucket.
    let t = throttle(AdaptiveThrottleConfig::default());
    for s in 0..10 {
        feed(&t, Default, 0, 10, t0 + s * SEC);
    }
    assert_eq!(t.counts_at(Default, t0 + 9 * SEC).requests, 100);
    assert_eq!(t.counts_at(Default, t0 + 12 * SEC).requests, 70);
    // An instant older than the newest seen lands in the newest bucket.
    t.record_answer_at(Default, Code::Ok, false, t0);
    assert_eq!(
        t.counts_at(Default, t0 + 12 * SEC),
        WindowCounts {
            requests: 71,
            accepts: 1
        }
    );
    // A bucket reused after a long silence starts from zero.
    assert_eq!(
        t.counts_at(Default, t0 + 100 * SEC),
        WindowCounts::default()
    );
    feed(&t, Default, 1, 0, t0 + 100 * SEC);
    assert_eq!(t.counts_at(Default, t0 + 100 * SEC).requests, 1);
}

#[test]
fn local_rejections_count_as_requests_not_accepts() {
    let t = throttle(AdaptiveThrottleConfig::default());
    let now = Instant::now();
    feed(&t, Default, 10, 90, now);
    let before = t.counts_at(Default, now);
    let refused = (0..100)
        .filter(|_| t.admit_at(Default, now).is_err())
        .count() as u64;
    assert!(refused > 0);
    let after = t.counts_at(Default, now);
    assert_eq!(after.requests, before.requests + refused);
    assert_eq!(after.accepts, before.accepts);
}

#[test]
fn sheddable_is_refused_first_and_critical_last() {
    let t = throttle(AdaptiveThrottleConfig::default());
    let now = Instant::now();
    // The same history in every class: 100 requests, 30 accepted.
    for class in Criticality::ALL {
        feed(&t, class, 30, 70, now);
    }
    let p = |c| t.probability_at(c, now);
    assert!(close(p(Sheddable), (100.0 - 45.0) / 101.0));
    assert!(close(p(Default), (100.0 - 60.0) / 101.0));
    assert!(close(p(Critical), (100.0 - 90.0) / 101.0));
    assert!(p(Sheddable) > p(Default) && p(Default) > p(Critical));
    // 40 % accepted: critical (K = 3) is not refused at all, default is.
    let t = throttle(AdaptiveThrottleConfig::default());
    for class in Criticality::ALL {
        feed(&t, class, 40, 60, now);
    }
    assert_eq!(t.probability_at(Critical, now), 0.0);
    assert!(t.probability_at(Default, now) > 0.0);
    assert!((0..1000).all(|_| t.admit_at(Critical, now).is_ok()));
}

#[test]
fn each_class_has_its_own_window() {
    let t = throttle(AdaptiveThrottleConfig::default());
    let now = Instant::now();
    // The backend sheds every sheddable call and accepts every critical one.
    feed(&t, Sheddable, 0, 100, now);
    feed(&t, Critical, 100, 0, now);
    assert_eq!(t.probability_at(Sheddable, now), 0.9);
    assert_eq!(t.probability_at(Default, now), 0.0);
    assert_eq!(t.probability_at(Critical, now), 0.0);
}

#[test]
fn draws_are_seeded_and_follow_the_probability() {
    let draws = |seed| {
        let t = AdaptiveThrottle::new(AdaptiveThrottleConfig::default(), seed).unwrap();
        let now = Instant::now();
        feed(&t, Default, 20, 80, now);
        (0..200)
            .map(|_| t.admit_at(Default, now).is_ok())
            .collect::<Vec<_>>()
    };
    assert_eq!(draws(1), draws(1), "same seed, same draws");
    assert_ne!(draws(1), draws(2), "another seed, other draws");
    // At p = 0 nothing is ever refused, and nothing is counted.
    let t = throttle(AdaptiveThrottleConfig::default());
    let now = Instant::now();
    assert!((0..1000).all(|_| t.admit_at(Default, now).is_ok()));
    assert_eq!(t.counts_at(Default, now), WindowCounts::default());
    // Refusals follow p: 60 requests, 0 accepts, p capped at 0.5.
    let t = throttle(AdaptiveThrottleConfig {
        max_reject_probability: 0.5,
        ..AdaptiveThrottleConfig::default()
    });
    feed(&t, Default, 0, 60, now);
    let refused = (0..10_000)
        .filter(|_| t.admit_at(Default, now).is_err())
        .count();
    assert!((4500..5500).contains(&refused), "{refused}");
}

#[test]
fn only_overload_answers_are_refusals() {
    let c = AdaptiveThrottleConfig::default();
    assert!(c.is_rejection(Code::ResourceExhausted, false));
    assert!(c.is_rejection(Code::Unavailable, true));
    assert!(
        !c.is_rejection(Code::Unavailable, false),
        "a handler's UNAVAILABLE"
    );
    // A ShedLayer's "expired while queued".
    assert!(c.is_rejection(Code::DeadlineExceeded, true));
    assert!(!c.is_rejection(Code::DeadlineExceeded, false));
    for code in [
        Code::Ok,
        Code::NotFound,
        Code::InvalidArgument,
        Code::Internal,
    ] {
        assert!(!c.is_rejection(code, false), "{code}");
        assert!(!c.is_rejection(code, true), "{code}");
    }
    let t = throttle(c);
    let now = Instant::now();
    for _ in 0..100 {
        t.record_answer_at(Default, Code::NotFound, false, now);
        t.record_answer_at(Default, Code::Unavailable, false, now);
    }
    assert_eq!(t.probability_at(Default, now), 0.0);
    // Configurable: INTERNAL as an overload answer.
    let internal = AdaptiveThrottleConfig {
        reject_codes: CodeSet::from_iter([Code::Internal]),
        ..AdaptiveThrottleConfig::default()
    };
    assert!(internal.is_rejection(Code::Internal, false));
    assert!(!internal.is_rejection(Code::ResourceExhausted, false));
}

#[test]
fn a_timeout_is_a_request_not_an_accept() {
    let t = throttle(AdaptiveThrottleConfig::default());
    let now = Instant::now();
    feed(&t, Default, 10, 0, now);
    for _ in 0..30 {
        t.record_timeout_at(Default, now);
    }
    assert_eq!(
        t.counts_at(Default, now),
        WindowCounts {
            requests: 40,
            accepts: 10
        }
    );
    assert!(close(t.probability_at(Default, now), 20.0 / 41.0));
}

#[test]
fn validation_names_the_field() {
    let bad = |c: AdaptiveThrottleConfig| c.validate().unwrap_err().to_string();
    let d = AdaptiveThrottleConfig::default;
    assert!(bad(AdaptiveThrottleConfig { k: 0.5, ..d() }).contains("adaptive_throttle.k"));
    assert!(bad(AdaptiveThrottleConfig { k: f64::NAN, ..d() }).contains("adaptive_throttle.k"));
    assert!(
        bad(AdaptiveThrottleConfig {
            sheddable_k: 2.5,
            ..d()
        })
        .contains("adaptive_throttle.sheddable_k")
    );
    assert!(
        bad(AdaptiveThrottleConfig {
            critical_k: 1.5,
            ..d()
        })
        .contains("adaptive_throttle.critical_k")
    );
    assert!(
        bad(AdaptiveThrottleConfig {
            max_reject_probability: 1.0,
            ..d()
        })
        .contains("adaptive_throttle.max_reject_probability")
    );
    assert!(
        bad(AdaptiveThrottleConfig {
            window: Duration::from_millis(500),
            ..d()
        })
        .contains("adaptive_throttle.window")
    );
    assert!(
        bad(AdaptiveThrottleConfig {
            shed_codes: CodeSet::single(Code::Ok),
            ..d()
        })
        .contains("adaptive_throttle.shed_codes")
    );
    assert!(
        bad(AdaptiveThrottleConfig {
            reject_codes: CodeSet::EMPTY,
            shed_codes: CodeSet::EMPTY,
            ..d()
        })
        .contains("adaptive_throttle.reject_codes")
    );
    assert!(d().validate().is_ok());
    assert!(AdaptiveThrottle::new(AdaptiveThrottleConfig { k: 0.0, ..d() }, 1).is_err());
}

#[test]
fn only_refusals_for_overload_count_against_the_backend() {
    let throttle = AdaptiveThrottle::new(AdaptiveThrottleConfig::default(), 7).unwrap();
    let (now, class) = (Instant::now(), Criticality::Default);
    for _ in 0..10 {
        throttle.record_answer_at(class, Code::Ok, false, now);
    }
    for _ in 0..30 {
        throttle.record_answer_at(class, Code::Unavailable, true, now);
    }
    // p = (40 − 2 · 10) / 41
    assert!((throttle.probability_at(class, now) - 20.0 / 41.0).abs() < 1e-9);
    // A plain UNAVAILABLE from a handler is an application answer: an accept.
    throttle.record_answer_at(class, Code::Unavailable, false, now);
    assert!((throttle.probability_at(class, now) - 19.0 / 42.0).abs() < 1e-9);
    // Ten seconds later the window has forgotten all of it.
    assert_eq!(
        throttle.probability_at(class, now + Duration::from_secs(10)),
        0.0
    );
}
