use super::*;

fn throttle(max_tokens: f64, token_ratio: f64) -> A6Budget {
    A6Budget::new(A6BudgetConfig {
        max_tokens,
        token_ratio,
    })
    .expect("valid test config")
}

fn field_of(err: ConfigError) -> String {
    match err {
        ConfigError::Invalid { field, .. } => field,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn starts_full() {
    let now = Instant::now();
    let t = throttle(10.0, 0.1);
    assert_eq!(t.tokens(), 10.0);
    assert!(t.withdraw_at(now));
    assert_eq!(t.balance_at(now), 5.0);
    assert_eq!(t.config().max_tokens, 10.0);
}

#[test]
fn withdraw_consumes_nothing() {
    let now = Instant::now();
    let t = throttle(10.0, 0.1);
    for _ in 0..100 {
        assert!(t.withdraw_at(now));
    }
    assert_eq!(t.tokens(), 10.0);
}

#[test]
fn failure_costs_one_token_and_never_goes_below_zero() {
    let now = Instant::now();
    let t = throttle(3.0, 0.5);
    t.record_failure_at(now);
    assert_eq!(t.tokens(), 2.0);
    for _ in 0..10 {
        t.record_failure_at(now);
    }
    assert_eq!(t.tokens(), 0.0);
    assert_eq!(t.balance_at(now), 0.0);
    t.deposit_at(now);
    assert_eq!(t.tokens(), 0.5, "the floor did not leave a debt");
}

#[test]
fn success_adds_token_ratio_up_to_max_tokens() {
    let now = Instant::now();
    let t = throttle(10.0, 0.1);
    t.deposit_at(now);
    assert_eq!(t.tokens(), 10.0, "already full");
    t.record_failure_at(now);
    for _ in 0..5 {
        t.deposit_at(now);
    }
    assert_eq!(t.tokens(), 9.5);
    for _ in 0..20 {
        t.deposit_at(now);
    }
    assert_eq!(t.tokens(), 10.0, "capped at maxTokens");
    let t = throttle(4.0, 3.0);
    t.record_failure_at(now);
    t.deposit_at(now);
    assert_eq!(t.tokens(), 4.0, "a big ratio is capped too");
}

#[test]
fn threshold_is_strictly_greater_than_half() {
    let now = Instant::now();
    let t = throttle(10.0, 0.1);
    for _ in 0..4 {
        t.record_failure_at(now);
    }
    assert_eq!(t.tokens(), 6.0);
    assert!(t.withdraw_at(now));
    assert_eq!(t.balance_at(now), 1.0);
    t.record_failure_at(now);
    assert_eq!(t.tokens(), 5.0);
    assert!(!t.withdraw_at(now), "5 is not greater than 10 / 2");
    assert_eq!(t.balance_at(now), 0.0);
    // An odd maximum: 3 / 2 = 1.5, so 2 tokens retry and 1 does not.
    let t = throttle(3.0, 0.1);
    t.record_failure_at(now);
    assert!(t.withdraw_at(now));
    assert_eq!(t.balance_at(now), 0.5);
    t.record_failure_at(now);
    assert!(!t.withdraw_at(now));
}

#[test]
fn token_ratio_is_truncated_to_three_decimals() {
    let now = Instant::now();
    let t = throttle(10.0, 0.1239);
    t.record_failure_at(now);
    t.deposit_at(now);
    assert_eq!(t.tokens(), 9.123, "0.1239 counts as 0.123");
    // 0.29 * 1000.0 is 289.99999999999994 in f64: truncation must still give 0.290.
    let t = throttle(10.0, 0.29);
    t.record_failure_at(now);
    t.deposit_at(now);
    assert_eq!(t.tokens(), 9.29);
    // Ten successes at 0.1 make exactly one token (no float drift).
    let t = throttle(10.0, 0.1);
    for _ in 0..6 {
        t.record_failure_at(now);
    }
    for _ in 0..10 {
        t.deposit_at(now);
    }
    assert_eq!(t.tokens(), 5.0);
    assert!(!t.withdraw_at(now));
}

#[test]
fn a6_sequence_max_10_ratio_point_1() {
    // The proposal's example service config: maxTokens 10, tokenRatio 0.1.
    let now = Instant::now();
    let t = throttle(10.0, 0.1);
    let mut allowed = Vec::new();
    for _ in 0..6 {
        allowed.push(t.withdraw_at(now));
        t.record_failure_at(now);
    }
    // 10, 9, 8, 7, 6 allow a retry; at 5 retries stop.
    assert_eq!(allowed, [true, true, true, true, true, false]);
    assert_eq!(t.tokens(), 4.0);
    for _ in 0..10 {
        t.deposit_at(now);
    }
    assert_eq!(t.tokens(), 5.0);
    assert!(!t.withdraw_at(now), "back to 5: still throttled");
    t.deposit_at(now);
    assert!(t.withdraw_at(now), "5.1 > 5");
    t.record_failure_at(now);
    assert!(!t.withdraw_at(now), "4.1");
}

#[test]
fn validate_names_max_tokens() {
    for max in [0.0, -1.0, 1000.001, f64::NAN, f64::INFINITY, 0.0004] {
        let config = A6BudgetConfig {
            max_tokens: max,
            token_ratio: 0.1,
        };
        let err = config.validate().expect_err("bad maxTokens");
        assert_eq!(field_of(err.clone()), "retryThrottling.maxTokens", "{max}");
        assert_eq!(A6Budget::new(config).expect_err("refused"), err);
    }
    for max in [0.001, 1.0, 1000.0] {
        let config = A6BudgetConfig {
            max_tokens: max,
            token_ratio: 0.1,
        };
        assert_eq!(config.validate(), Ok(()), "{max}");
    }
}

#[test]
fn validate_names_token_ratio() {
    for ratio in [0.0, -0.5, f64::NAN, f64::INFINITY, 0.0009] {
        let config = A6BudgetConfig {
            max_tokens: 10.0,
            token_ratio: ratio,
        };
        let err = config.validate().expect_err("bad tokenRatio");
        assert_eq!(field_of(err), "retryThrottling.tokenRatio", "{ratio}");
    }
    for ratio in [0.001, 0.1, 5000.0] {
        let config = A6BudgetConfig {
            max_tokens: 10.0,
            token_ratio: ratio,
        };
        assert_eq!(config.validate(), Ok(()), "{ratio}");
    }
}

#[test]
fn clones_share_one_bucket_through_arc_dyn_budget() {
    let now = Instant::now();
    let t = throttle(2.0, 0.5);
    let shared: Arc<dyn Budget> = Arc::new(t.clone());
    shared.record_failure_at(now);
    assert_eq!(t.tokens(), 1.0);
    assert!(!shared.withdraw_at(now));
    assert!(format!("{shared:?}").contains("A6Budget"));
    shared.deposit();
    assert!(t.withdraw());
    shared.record_failure();
    assert_eq!(t.balance(), 0.0);
}

#[cfg(feature = "tower")]
#[tokio::test]
async fn through_tower_retry_failures_drain_the_bucket_and_successes_refill_it() {
    use crate::budget::tower_harness::call;
    let t = Arc::new(throttle(4.0, 0.5));
    // 4 -> 3 tokens: retried; 3 -> 2: not above 2, so the call ends.
    assert_eq!(call(&t, false).await, (2, false));
    assert_eq!(t.tokens(), 2.0);
    // Throttled: the failure still costs its token, and no retry goes out.
    assert_eq!(call(&t, false).await, (1, false));
    assert_eq!(t.tokens(), 1.0);
    for _ in 0..5 {
        assert_eq!(call(&t, true).await, (1, true));
    }
    assert_eq!(t.tokens(), 3.5);
    // 3.5 -> 2.5: retried; 2.5 -> 1.5: the call ends.
    assert_eq!(call(&t, false).await, (2, false));
    assert_eq!(t.tokens(), 1.5);
}

#[cfg(feature = "tower")]
#[test]
fn tower_withdrawals_each_see_the_tokens_their_own_failure_left() {
    // Ten simultaneous failures on a full bucket of 10: they leave 9, 8, ..., 0 in some
    // order, and exactly the four that left 9, 8, 7 and 6 may retry. A failure counted
    // apart from its check could see a later failure's count and refuse too many.
    const THREADS: usize = 10;
    for _ in 0..200 {
        let t = throttle(10.0, 0.1);
        let barrier = std::sync::Barrier::new(THREADS);
        let granted = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..THREADS)
                .map(|_| {
                    let (t, barrier) = (&t, &barrier);
                    scope.spawn(move || {
                        barrier.wait();
                        tower::retry::budget::Budget::withdraw(t)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("worker"))
                .filter(|&granted| granted)
                .count()
        });
        assert_eq!(granted, 4);
        assert_eq!(t.tokens(), 0.0);
    }
}

#[test]
fn concurrent_updates_are_not_lost() {
    let t = throttle(1000.0, 0.25);
    let now = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..4 {
            let t = t.clone();
            scope.spawn(move || {
                for _ in 0..100 {
                    t.record_failure_at(now);
                }
                for _ in 0..200 {
                    t.deposit_at(now);
                }
            });
        }
    });
    // Each worker: -100 then +50; none can hit the floor or the cap on its own path
    // because the failures of all workers total 400 of 1000 tokens.
    assert_eq!(t.tokens(), 800.0);
}

#[test]
fn validate_names_the_token_ratio() {
    assert!(
        A6BudgetConfig {
            max_tokens: 10.0,
            token_ratio: 0.1
        }
        .validate()
        .is_ok()
    );
    let err = A6BudgetConfig {
        max_tokens: 10.0,
        token_ratio: 0.0004,
    }
    .validate();
    assert!(
        err.expect_err("a ratio below the floor")
            .to_string()
            .contains("retryThrottling.tokenRatio")
    );
}
