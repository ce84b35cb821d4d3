use super::*;
use proptest::prelude::*;
use std::sync::Barrier;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn hedges_spend_only_the_upper_half_and_retries_the_rest() {
    let t0 = Instant::now();
    let b = budget(10, 0, 0.1);
    for _ in 0..100 {
        b.deposit_at(t0); // 10 retries minted
    }
    let hedges = (0..20).filter(|_| b.withdraw_hedge_at(t0)).count();
    assert_eq!(hedges, 5, "half of the 10 minted");
    assert_eq!(drain(&b, t0), 5, "the lower half is left for retries");
    // Retries first: once they spent past half, no hedge is granted.
    let c = budget(10, 5, 0.1); // reserve 50
    assert_eq!((0..26).filter(|_| c.withdraw_at(t0)).count(), 26);
    assert!(!c.withdraw_hedge_at(t0), "24 of 50 left");
    // The reserve counts as minted: a fresh default budget grants 25 hedges.
    let d = budget(10, 5, 0.1);
    assert_eq!((0..100).filter(|_| d.withdraw_hedge_at(t0)).count(), 25);
}

#[test]
fn config_fleet_size_divides_the_reserve() {
    let t0 = Instant::now();
    let b = RetryBudget::new(BudgetConfig {
        fleet_size: 10,
        ..BudgetConfig::default()
    })
    .expect("valid");
    assert_eq!(b.fleet_size(), 10);
    assert_eq!(b.balance_at(t0), 5.0);
    assert!(
        BudgetConfig {
            fleet_size: 0,
            ..BudgetConfig::default()
        }
        .validate()
        .is_err()
    );
}

fn config(ttl_secs: u64, min: u32, ratio: f64) -> BudgetConfig {
    BudgetConfig {
        ttl: Duration::from_secs(ttl_secs),
        min_retries_per_second: min,
        retry_ratio: ratio,
        ..BudgetConfig::default()
    }
}

fn budget(ttl_secs: u64, min: u32, ratio: f64) -> RetryBudget {
    RetryBudget::new(config(ttl_secs, min, ratio)).expect("valid test config")
}

#[test]
fn the_floor_is_withheld_while_the_dependency_fails_and_lent_again_at_a_success() {
    let t0 = Instant::now();
    let b = budget(10, 5, 0.1); // reserve 50, lent while the dependency answers
    // A process that has just started retries its first failures.
    for _ in 0..FLOOR_WITHHELD_AFTER - 1 {
        b.record_failure_at(t0);
    }
    assert_eq!(b.balance_at(t0), 50.0);
    assert!(b.withdraw_at(t0));
    // A third failure and no success in the window: the dependency is taken for down.
    b.record_failure_at(t0);
    assert_eq!(b.balance_at(t0), 0.0);
    assert!(!b.withdraw_at(t0));
    assert!(!b.withdraw_hedge_at(t0));
    // One answer lends the reserve again (less the retry spent, plus what it minted).
    b.deposit_at(t0 + ms(10));
    assert_eq!(b.balance_at(t0 + ms(10)), 49.1);
    // Failures after successes in the window leave it lent: a blip of a healthy
    // dependency is retried from the whole reserve.
    for _ in 0..100 {
        b.record_failure_at(t0 + ms(20));
    }
    assert!(b.withdraw_at(t0 + ms(20)));
    // Once the successes have left the window, the failures still in it withhold it.
    for _ in 0..3 {
        b.record_failure_at(t0 + ms(10_500));
    }
    assert_eq!(b.balance_at(t0 + ms(10_500)), 0.0);
    // A window later, nothing is left of either: a new start.
    assert_eq!(b.balance_at(t0 + ms(21_000)), 50.0);
}

#[test]
fn a_failure_with_a_pushback_is_an_answer_that_keeps_the_floor_lent() {
    let t0 = Instant::now();
    let b = budget(10, 5, 0.1); // reserve 50, lent while the dependency answers
    // A server that has just started and sheds with a pushback on every first attempt:
    // it is up and says when to come back, so its callers' retries are lent the floor.
    for _ in 0..20 {
        b.record_failure_at(t0);
        b.record_pushback_at(t0);
    }
    assert_eq!(b.balance_at(t0), 50.0);
    assert!(b.withdraw_at(t0));
    // Without a pushback, the same failures withhold it.
    let silent = budget(10, 5, 0.1);
    for _ in 0..20 {
        silent.record_failure_at(t0);
    }
    assert!(!silent.withdraw_at(t0));
    // Lent always, pushback or not.
    let always = RetryBudget::new(BudgetConfig {
        floor: Floor::Always,
        ..config(10, 5, 0.1)
    })
    .expect("valid test config");
    always.record_pushback_at(t0);
    assert_eq!(always.balance_at(t0), 50.0);
}

#[test]
fn a_floor_lent_always_ignores_failures() {
    let t0 = Instant::now();
    let b = RetryBudget::new(BudgetConfig {
        floor: Floor::Always,
        ..config(10, 5, 0.1)
    })
    .expect("valid");
    for _ in 0..1_000 {
        b.record_failure_at(t0);
    }
    assert_eq!(b.balance_at(t0), 50.0);
    assert_eq!(drain(&b, t0), 50);
}

fn drain(b: &RetryBudget, now: Instant) -> u32 {
    let mut granted = 0;
    while b.withdraw_at(now) {
        granted += 1;
        assert!(granted <= 1_000_000, "budget never ran dry");
    }
    granted
}

fn field_of(err: ConfigError) -> String {
    match err {
        ConfigError::Invalid { field, .. } => field,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn fleet_size_divides_the_reserve_and_only_the_reserve() {
    let t0 = Instant::now();
    let config = BudgetConfig::default(); // 5/s × 10 s = 50 per window
    let ten = RetryBudget::with_fleet_size(config.clone(), 10).expect("valid");
    assert_eq!(ten.fleet_size(), 10);
    assert_eq!(ten.balance_at(t0), 5.0);
    assert_eq!(drain(&ten, t0), 5);
    // A share below one retry per window grants nothing by itself ...
    let thousand = RetryBudget::with_fleet_size(config.clone(), 1000).expect("valid");
    assert_eq!(thousand.balance_at(t0), 0.05);
    assert!(!thousand.withdraw_at(t0));
    // ... but adds to what successes mint: 0.05 + 10 × 0.1 = 1.05.
    for _ in 0..10 {
        thousand.deposit_at(t0);
    }
    assert_eq!(drain(&thousand, t0), 1);
    // A fleet of one is `new`.
    let one = RetryBudget::with_fleet_size(config.clone(), 1).expect("valid");
    let plain = RetryBudget::new(config).expect("valid");
    assert_eq!(one.balance_at(t0), plain.balance_at(t0));
    assert!(format!("{ten:?}").contains("fleet_size: 10"));
}

#[test]
fn fleet_size_is_validated() {
    for bad in [0, MAX_FLEET_SIZE + 1, u32::MAX] {
        let err =
            RetryBudget::with_fleet_size(BudgetConfig::default(), bad).expect_err("out of range");
        assert_eq!(field_of(err), "retry.budget.fleet_size");
    }
    assert!(RetryBudget::with_fleet_size(BudgetConfig::default(), MAX_FLEET_SIZE).is_ok());
    // The config is still validated.
    let bad_config = BudgetConfig {
        retry_ratio: 0.0,
        ..BudgetConfig::default()
    };
    let err = RetryBudget::with_fleet_size(bad_config, 10).expect_err("bad ratio");
    assert_eq!(field_of(err), "retry.budget.retry_ratio");
}

#[test]
fn a_fleet_estimate_can_lower_the_floor_never_raise_it() {
    let t0 = Instant::now();
    let b = RetryBudget::with_fleet_size(BudgetConfig::default(), 10).expect("valid");
    b.set_fleet_estimate(25);
    assert_eq!(b.fleet_size(), 25);
    assert_eq!(b.balance_at(t0), 2.0);
    b.set_fleet_estimate(1);
    assert_eq!(
        b.fleet_size(),
        10,
        "an estimate below the configured size is ignored"
    );
    assert_eq!(b.balance_at(t0), 5.0);
    b.set_fleet_estimate(0);
    assert_eq!(b.fleet_size(), 10);
    b.set_fleet_estimate(u32::MAX);
    assert_eq!(b.fleet_size(), MAX_FLEET_SIZE);
    // Retries granted before the estimate grew stay spent: the balance is clamped at 0.
    let b = RetryBudget::with_fleet_size(BudgetConfig::default(), 1).expect("valid");
    assert_eq!(drain(&b, t0), 50);
    b.set_fleet_estimate(100);
    assert_eq!(b.balance_at(t0), 0.0);
    assert!(!b.withdraw_at(t0));
    // Clones share the estimate.
    let clone = b.clone();
    clone.set_fleet_estimate(1);
    assert_eq!(b.fleet_size(), 1);
}

#[test]
fn default_config_is_ten_seconds_five_per_second_ten_percent() {
    let config = BudgetConfig::default();
    assert_eq!(config.ttl, Duration::from_secs(10));
    assert_eq!(config.min_retries_per_second, 5);
    assert_eq!(config.retry_ratio, 0.1);
    assert_eq!(config.validate(), Ok(()));
    let b = RetryBudget::new(config.clone()).expect("default is valid");
    assert_eq!(b.config(), &config);
}

#[test]
fn validate_names_ttl_out_of_range() {
    for ttl in [Duration::ZERO, ms(999), Duration::from_secs(61)] {
        let config = BudgetConfig {
            ttl,
            ..BudgetConfig::default()
        };
        let err = config.validate().expect_err("ttl out of range");
        assert_eq!(field_of(err.clone()), "retry.budget.ttl");
        assert_eq!(RetryBudget::new(config).expect_err("refused"), err);
    }
    for ttl in [Duration::from_secs(1), ms(1500), Duration::from_secs(60)] {
        let config = BudgetConfig {
            ttl,
            ..BudgetConfig::default()
        };
        assert_eq!(config.validate(), Ok(()), "{ttl:?}");
    }
}

#[test]
fn validate_names_bad_ratio() {
    for ratio in [0.0, -0.1, f64::NAN, f64::INFINITY, 1000.001, 1e-7] {
        let config = BudgetConfig {
            retry_ratio: ratio,
            ..BudgetConfig::default()
        };
        let err = config.validate().expect_err("bad ratio");
        assert_eq!(field_of(err), "retry.budget.retry_ratio", "{ratio}");
    }
    for ratio in [1e-6, 0.6, 1.0, 1000.0] {
        let config = BudgetConfig {
            retry_ratio: ratio,
            ..BudgetConfig::default()
        };
        assert_eq!(config.validate(), Ok(()), "{ratio}");
    }
}

#[test]
fn validate_names_floor_too_large() {
    let config = BudgetConfig {
        min_retries_per_second: 1 << 31,
        ..BudgetConfig::default()
    };
    let err = config.validate().expect_err("floor too large");
    assert_eq!(field_of(err), "retry.budget.min_retries_per_second");
    let config = BudgetConfig {
        min_retries_per_second: i32::MAX as u32,
        ..BudgetConfig::default()
    };
    assert_eq!(config.validate(), Ok(()));
}

#[test]
fn truncate_decimal_keeps_every_three_place_decimal_exact() {
    for k in 0..=1_000_000u64 {
        let x = k as f64 / 1000.0;
        assert_eq!(truncate_decimal(x, 1000.0), k, "{x}");
    }
    assert_eq!(truncate_decimal(0.29, 1000.0), 290);
    assert_eq!(truncate_decimal(0.1239, 1000.0), 123);
    assert_eq!(truncate_decimal(0.6, 1e6), 600_000);
    assert_eq!(truncate_decimal(0.0000019, 1e6), 1);
}

#[test]
fn reserve_is_floor_times_ttl() {
    let t0 = Instant::now();
    assert_eq!(drain(&budget(10, 5, 0.1), t0), 50);
    assert_eq!(drain(&budget(1, 0, 0.1), t0), 0);
    let fractional = RetryBudget::new(BudgetConfig {
        ttl: ms(1500),
        min_retries_per_second: 3,
        retry_ratio: 0.1,
        ..BudgetConfig::default()
    })
    .expect("valid");
    assert_eq!(fractional.balance_at(t0), 4.5);
    assert_eq!(drain(&fractional, t0), 4);
}

#[test]
fn ratio_point_six_gives_exactly_six_per_ten_successes() {
    // tower issue #857: 1/0.6 truncates to a withdraw cost of 1, allowing 10 per 10.
    let t0 = Instant::now();
    let b = budget(10, 0, 0.6);
    for _ in 0..10 {
        b.deposit_at(t0);
    }
    assert_eq!(drain(&b, t0), 6);
    let b = budget(10, 0, 0.6);
    let mut granted = 0;
    for _ in 0..1000 {
        b.deposit_at(t0);
        if b.withdraw_at(t0) {
            granted += 1;
        }
    }
    assert_eq!(granted, 600);
    assert_eq!(b.balance_at(t0), 0.0);
}

#[test]
fn ratio_point_one_gives_one_per_ten_and_no_drift() {
    let t0 = Instant::now();
    let b = budget(10, 0, 0.1);
    for _ in 0..9 {
        b.deposit_at(t0);
    }
    assert!(!b.withdraw_at(t0), "0.9 of a retry is not a retry");
    b.deposit_at(t0);
    assert!(b.withdraw_at(t0));
    assert!(!b.withdraw_at(t0));
    // 10 000 successes: f64 summation of 0.1 would drift below 1000.
    let b = budget(10, 0, 0.1);
    for _ in 0..10_000 {
        b.deposit_at(t0);
    }
    assert_eq!(b.balance_at(t0), 1000.0);
    assert_eq!(drain(&b, t0), 1000);
}

#[test]
fn ratios_above_one_mint_several_retries_per_success() {
    let t0 = Instant::now();
    let b = budget(10, 0, 2.5);
    for _ in 0..10 {
        b.deposit_at(t0);
    }
    assert_eq!(drain(&b, t0), 25);
    let b = budget(10, 0, 1000.0);
    b.deposit_at(t0);
    assert_eq!(drain(&b, t0), 1000);
}

#[test]
fn withdraw_needs_a_whole_retry() {
    let t0 = Instant::now();
    let b = budget(10, 0, 0.5);
    assert!(!b.withdraw_at(t0));
    b.deposit_at(t0);
    assert_eq!(b.balance_at(t0), 0.5);
    assert!(!b.withdraw_at(t0));
    assert_eq!(b.balance_at(t0), 0.5, "a refused withdrawal costs nothing");
    b.deposit_at(t0);
    assert!(b.withdraw_at(t0));
    assert_eq!(b.balance_at(t0), 0.0);
}

#[test]
fn balance_is_exact() {
    let t0 = Instant::now();
    let b = budget(10, 5, 0.1);
    assert_eq!(b.balance_at(t0), 50.0);
    for _ in 0..13 {
        b.deposit_at(t0 + ms(100));
    }
    assert_eq!(b.balance_at(t0 + ms(100)), 51.3);
    assert!(b.withdraw_at(t0 + ms(200)));
    assert!(b.withdraw_at(t0 + ms(200)));
    assert_eq!(b.balance_at(t0 + ms(300)), 49.3);
    let b = budget(10, 0, 0.001);
    for _ in 0..7 {
        b.deposit_at(t0);
    }
    assert_eq!(b.balance_at(t0), 0.007);
}

#[test]
fn balance_reports_zero_not_debt() {
    // Withdrawals outlive the deposits that paid for them: no negative gauge.
    let t0 = Instant::now();
    let b = budget(1, 0, 1.0);
    b.deposit_at(t0);
    assert!(b.withdraw_at(t0 + ms(500)));
    let t = t0 + ms(1100);
    assert_eq!(b.balance_at(t), 0.0);
    assert!(!b.withdraw_at(t));
}

/// Counts how long a single deposit made at `t0 + offset` counts, sampling every ms.
fn lifetime_of_one_deposit(ttl_secs: u64, offset: Duration, first_call: Instant) -> Duration {
    let b = budget(ttl_secs, 0, 1.0);
    assert_eq!(b.balance_at(first_call), 0.0);
    let at = first_call + offset;
    b.deposit_at(at);
    let mut lived = Duration::ZERO;
    let mut t = at;
    loop {
        if b.balance_at(t) != 1.0 {
            return lived;
        }
        t += ms(1);
        lived += ms(1);
        assert!(lived <= Duration::from_secs(ttl_secs + 1), "never expired");
    }
}

#[test]
fn a_deposit_counts_for_ttl_within_one_slot_whatever_its_offset() {
    let mut rng = fastrand::Rng::with_seed(7);
    let t0 = Instant::now();
    for ttl_secs in [1, 3, 10] {
        let ttl = Duration::from_secs(ttl_secs);
        let slot = ttl / SLOTS as u32;
        for _ in 0..20 {
            let offset = ms(rng.u64(0..5000));
            let lived = lifetime_of_one_deposit(ttl_secs, offset, t0);
            assert!(lived <= ttl, "counted {lived:?} > ttl {ttl:?}");
            assert!(
                lived + slot + ms(1) > ttl,
                "expired after {lived:?}, ttl {ttl:?}"
            );
        }
    }
}

#[test]
fn a_deposit_17_ns_before_a_slot_boundary_counts_until_ttl_after_its_slot_began() {
    // The first call at t0 starts a slot: slots are ttl / 16 = 62.5 ms wide from there.
    let ttl = Duration::from_secs(1);
    let slot = ttl / SLOTS as u32;
    let t0 = Instant::now() + Duration::from_secs(61);
    let b = budget(1, 0, 1.0);
    assert_eq!(b.balance_at(t0), 0.0);
    // Made 17 ns before the next boundary, in the slot that began at t0.
    let at = t0 + slot - Duration::from_nanos(17);
    b.deposit_at(at);
    // It counts for `ttl - slot` at least, and until exactly `ttl` after t0.
    assert_eq!(
        b.balance_at(at + (ttl - slot)),
        1.0,
        "counted for ttl - slot"
    );
    assert_eq!(b.balance_at(t0 + ttl - Duration::from_nanos(1)), 1.0);
    assert_eq!(b.balance_at(t0 + ttl), 0.0, "gone ttl after its slot began");
}

/// Deposits at the given instants (sorted) and, every ms, checks that the balance lies
/// between the deposits younger than `ttl - slot` and those younger than `ttl`.
fn check_window(ttl_secs: u64, deposits: &[Instant], start: Instant, end: Instant) {
    let ttl = Duration::from_secs(ttl_secs);
    let slot = ttl / SLOTS as u32;
    let b = budget(ttl_secs, 0, 1.0);
    let mut next = 0;
    let mut t = start;
    while t <= end {
        while next < deposits.len() && deposits[next] <= t {
            b.deposit_at(deposits[next]);
            next += 1;
        }
        let made = &deposits[..next];
        let must = made.iter().filter(|&&d| t - d < ttl - slot).count();
        let may = made.iter().filter(|&&d| t - d < ttl).count();
        let balance = b.balance_at(t);
        assert!(
            balance >= must as f64 && balance <= may as f64,
            "at {:?}: balance {balance}, expected {must}..={may}",
            t - start
        );
        t += ms(1);
    }
}

#[test]
fn deposits_every_7ms_count_for_the_whole_ttl() {
    // tower's TpsBudget loses about half of these (its slots advance twice per
    // expiry when calls do not line up with the slot width).
    let t0 = Instant::now();
    let deposits: Vec<Instant> = (0..700).map(|i| t0 + ms(7 * i)).collect();
    check_window(1, &deposits, t0, t0 + ms(7 * 700 + 1500));
    // After a full window of steady deposits the balance is close to ttl / 7 ms.
    let b = budget(1, 0, 1.0);
    for d in &deposits {
        b.deposit_at(*d);
    }
    let at = *deposits.last().expect("non-empty");
    let balance = b.balance_at(at);
    assert!(balance >= (1000 - 63) as f64 / 7.0 - 1.0, "{balance}");
    assert!(balance <= 1000.0 / 7.0 + 1.0, "{balance}");
}

#[test]
fn deposits_at_random_intervals_count_for_the_whole_ttl() {
    for seed in 0..5 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let t0 = Instant::now();
        let mut t = t0;
        let mut deposits = Vec::new();
        for _ in 0..300 {
            t += Duration::from_micros(rng.u64(0..40_000));
            deposits.push(t);
        }
        check_window(2, &deposits, t0, t + ms(2500));
    }
}

#[test]
fn withdrawals_count_for_the_window_then_the_reserve_returns() {
    let t0 = Instant::now();
    let b = budget(2, 5, 0.1); // reserve 10
    assert_eq!(drain(&b, t0), 10);
    assert!(
        !b.withdraw_at(t0 + ms(1800)),
        "still spent inside the window"
    );
    assert_eq!(
        drain(&b, t0 + ms(2000)),
        10,
        "spent retries expire with the window"
    );
}

#[test]
fn clones_share_one_budget() {
    let t0 = Instant::now();
    let a = budget(10, 0, 1.0);
    let b = a.clone();
    a.deposit_at(t0);
    a.deposit_at(t0);
    assert!(b.withdraw_at(t0));
    assert_eq!(a.balance_at(t0), 1.0);
    assert!(a.withdraw_at(t0));
    assert!(!b.withdraw_at(t0));
}

#[test]
fn works_through_arc_dyn_budget_and_default_record_failure_is_a_no_op() {
    let t0 = Instant::now();
    // A floor lent always: failures change nothing.
    let b: Arc<dyn Budget> = Arc::new(
        RetryBudget::new(BudgetConfig {
            floor: Floor::Always,
            ..config(10, 1, 0.1)
        })
        .expect("valid"),
    );
    for _ in 0..100 {
        b.record_failure_at(t0);
    }
    assert_eq!(b.balance_at(t0), 10.0);
    assert!(b.withdraw_at(t0));
    assert!(format!("{b:?}").contains("RetryBudget"));
}

#[tokio::test(start_paused = true)]
async fn convenience_forms_follow_tokio_paused_time() {
    let b = budget(1, 0, 1.0);
    b.deposit();
    assert_eq!(b.balance(), 1.0);
    tokio::time::advance(ms(500)).await;
    assert_eq!(b.balance(), 1.0);
    tokio::time::advance(ms(600)).await;
    assert_eq!(b.balance(), 0.0, "expired on the paused clock");
    b.deposit();
    assert!(b.withdraw());
    assert!(!b.withdraw());
}

#[test]
fn a_late_deposit_is_dropped_and_a_late_withdrawal_is_charged_at_the_latest_time() {
    let t0 = Instant::now();
    let b = budget(1, 0, 1.0);
    b.deposit_at(t0);
    b.deposit_at(t0 + ms(5000));
    // A late deposit for t0 lands on a slot already reused by t0 + 5 s: dropped.
    b.deposit_at(t0);
    assert_eq!(b.balance_at(t0 + ms(5000)), 1.0);
    // A late withdrawal spends from the window at the latest instant seen (t0 + 5 s),
    // never from the expired one at t0.
    assert!(b.withdraw_at(t0));
    assert!(!b.withdraw_at(t0));
    assert_eq!(b.balance_at(t0 + ms(5000)), 0.0);
    // A late balance read sums the window as it was then: t0's deposit (the late one
    // was dropped) and the withdrawal charged at t0 + 5 s, which counts as spent.
    assert_eq!(b.balance_at(t0), 0.0);
}

#[test]
fn instants_before_the_first_call_do_not_panic() {
    let t0 = Instant::now();
    let b = budget(1, 1, 1.0);
    b.deposit_at(t0 + ms(100));
    b.deposit_at(t0);
    // Each deposit counts from its own instant: at t0 only the one made at t0 existed.
    assert_eq!(b.balance_at(t0), 2.0);
    assert_eq!(b.balance_at(t0 + ms(100)), 3.0);
    // Far older than a window: nothing to count, and no panic.
    b.deposit_at(t0.checked_sub(Duration::from_secs(5)).unwrap_or(t0));
    assert_eq!(b.balance_at(t0 + ms(100)), 3.0);
}

#[test]
fn a_deposit_made_before_the_first_instant_seen_expires_a_window_after_its_own_instant() {
    let t1 = Instant::now() + Duration::from_secs(20);
    let t0 = t1 - Duration::from_secs(1);
    let b = budget(10, 0, 1.0);
    // The first use is at t1; another thread had read the clock at t0 and deposits now.
    assert!(!b.withdraw_at(t1));
    b.deposit_at(t0);
    assert_eq!(b.balance_at(t1), 1.0);
    // 10 s after t0 (less one slot) it still counts; 10 s after t0 it is gone, not
    // 10 s after t1.
    assert_eq!(b.balance_at(t0 + Duration::from_secs(9)), 1.0);
    assert_eq!(b.balance_at(t0 + Duration::from_secs(10)), 0.0);
    assert_eq!(b.balance_at(t1 + Duration::from_millis(9500)), 0.0);
}

#[test]
fn a_refund_returns_the_retry_once_and_never_outlives_it() {
    let t0 = Instant::now();
    let b = budget(1, 1, 1.0); // one retry in reserve
    assert!(b.withdraw_at(t0));
    assert!(!b.withdraw_at(t0));
    b.refund_at(t0);
    assert_eq!(b.balance_at(t0), 1.0);
    // A second refund of the same grant finds nothing more to give back.
    b.refund_at(t0);
    assert_eq!(b.balance_at(t0), 1.0);
    // A grant charged at a later head is found from the grant's own instant.
    assert!(b.withdraw_at(t0 + ms(300)));
    assert!(!b.withdraw_at(t0 + ms(300)));
    b.refund_at(t0 + ms(300));
    assert_eq!(b.balance_at(t0 + ms(300)), 1.0);
    // A refund of a withdrawal that has expired gives nothing extra.
    assert!(b.withdraw_at(t0 + ms(400)));
    b.refund_at(t0.checked_sub(Duration::from_secs(5)).unwrap_or(t0));
    assert_eq!(b.balance_at(t0 + ms(5000)), 1.0);
    assert!(b.withdraw_at(t0 + ms(5000)));
    assert!(!b.withdraw_at(t0 + ms(5000)));
}

#[test]
fn interleaved_withdrawals_cannot_both_take_the_last_retry() {
    // Replays the lock-free protocol step by step: two callers count their withdrawal
    // before either re-reads. Both then see both withdrawals and at most one may win.
    let t0 = Instant::now();
    let b = budget(10, 0, 1.0);
    b.deposit_at(t0);
    let s = &*b.shared;
    let head = s.advance_head(s.epoch(t0));
    assert!(s.head_balance_micros(head) >= MICROS_PER_RETRY); // both pass the pre-check
    assert!(s.withdrawals.add(head as u32)); // caller A counts
    assert!(s.withdrawals.add(head as u32)); // caller B counts
    assert!(!s.confirm(head, 0)); // A re-reads: refuses and undoes
    s.withdrawals.remove(head as u32);
    assert!(s.confirm(head, 0)); // B re-reads after A's undo: granted
    assert!(!b.withdraw_at(t0), "the single retry is spent");
    assert_eq!(b.balance_at(t0), 0.0);
}

#[test]
fn an_undone_withdrawal_does_not_stay_counted_after_the_head_moves() {
    // Caller A counts itself in the head slot; caller B moves the head to a later slot
    // and reads the balance (with A counted); A sees the head moved and undoes itself.
    // The undo must be visible at the new head: no retry may be lost for the window.
    let t0 = Instant::now();
    let b = budget(1, 0, 1.0);
    for _ in 0..3 {
        b.deposit_at(t0);
    }
    let s = &*b.shared;
    let head = s.advance_head(s.epoch(t0));
    assert!(s.withdrawals.add(head as u32)); // A counts itself
    let later = t0 + ms(100);
    assert_eq!(b.balance_at(later), 2.0, "B reads with A counted");
    assert!(!s.confirm(head, 0), "A's head moved: refused");
    s.withdrawals.remove(head as u32); // A's undo
    assert_eq!(b.balance_at(later), 3.0);
    assert_eq!(drain(&b, later), 3);
}

#[test]
fn a_withdrawal_racing_a_slot_boundary_is_refused() {
    // One retry in the budget. Caller A passes the pre-check at the head slot; before
    // A counts itself, caller B moves the head to a later slot, reads the slots
    // (without A) and takes the retry. A then counts itself in the old slot: it
    // must see that the head moved and refuse, or the one retry is spent twice.
    let t0 = Instant::now();
    let b = budget(1, 0, 1.0);
    b.deposit_at(t0);
    let s = &*b.shared;
    let head = s.advance_head(s.epoch(t0));
    assert!(s.head_balance_micros(head) >= MICROS_PER_RETRY); // A's pre-check
    assert!(
        b.withdraw_at(t0 + ms(100)),
        "B, two slots later, takes the retry"
    );
    assert!(s.withdrawals.add(head as u32)); // A counts itself
    assert!(!s.confirm(head, 0), "A's head moved: refused");
    s.withdrawals.remove(head as u32); // A's undo
    assert_eq!(b.balance_at(t0 + ms(100)), 0.0);
    assert!(!b.withdraw_at(t0 + ms(100)));
}

#[test]
fn concurrent_callers_never_over_allocate() {
    const THREADS: usize = 4;
    const OPS: u32 = 2000;
    let t0 = Instant::now();
    let b = budget(10, 5, 0.1); // 50 + 0.1 × 8000 = 850 retries in the window
    let barrier = Barrier::new(THREADS);
    let granted: u32 = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|i| {
                let b = b.clone();
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    let mut granted = 0;
                    for j in 0..OPS {
                        let now = t0 + Duration::from_micros(u64::from(j) * 450 + i as u64);
                        b.deposit_at(now);
                        for _ in 0..2 {
                            if b.withdraw_at(now) {
                                granted += 1;
                            }
                        }
                    }
                    granted
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("worker")).sum()
    });
    let allowed = 50 + THREADS as u32 * OPS / 10;
    assert!(granted <= allowed, "granted {granted} > {allowed}");
    // No count was lost: what is left is exactly the rest of the window.
    let rest = drain(&b, t0 + ms(900));
    assert_eq!(granted + rest, allowed);
}

#[test]
fn simultaneous_withdrawals_never_take_more_than_was_deposited() {
    // Rounds of: one deposit (one retry at ratio 1), then every thread tries to
    // withdraw at the same moment. A check-then-act budget hands the same retry to
    // several threads; the count-then-verify protocol never does.
    const THREADS: usize = 4;
    const ROUNDS: u32 = 3000;
    let t0 = Instant::now();
    let b = budget(10, 0, 1.0);
    let start = Barrier::new(THREADS + 1);
    let end = Barrier::new(THREADS + 1);
    let granted = std::sync::atomic::AtomicU32::new(0);
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            let (b, start, end, granted) = (b.clone(), &start, &end, &granted);
            scope.spawn(move || {
                for _ in 0..ROUNDS {
                    start.wait();
                    if b.withdraw_at(t0) {
                        granted.fetch_add(1, Ordering::SeqCst);
                    }
                    end.wait();
                }
            });
        }
        // No assertion inside the rounds: a panic here would leave the workers
        // waiting on the barrier forever.
        let mut first_excess = None;
        for round in 1..=ROUNDS {
            b.deposit_at(t0);
            start.wait();
            end.wait();
            let granted = granted.load(Ordering::SeqCst);
            if granted > round && first_excess.is_none() {
                first_excess = Some((round, granted));
            }
        }
        assert_eq!(first_excess, None, "(round, retries granted by then)");
    });
    let granted = granted.load(Ordering::SeqCst);
    assert_eq!(granted + drain(&b, t0), ROUNDS, "no count was lost");
}

#[cfg(feature = "tower")]
#[tokio::test(start_paused = true)]
async fn through_tower_retry_retries_stop_when_the_budget_is_spent() {
    use super::tower_harness::call;
    let b = Arc::new(budget(10, 0, 0.5));
    // No reserve: a failing call is not retried until successes have paid for it.
    assert_eq!(call(&b, false).await, (1, false));
    // Four successes through the tower stack mint two retries.
    for _ in 0..4 {
        assert_eq!(call(&b, true).await, (1, true));
    }
    assert_eq!(b.balance(), 2.0);
    // The dependency fails: the next call takes both retries, the one after gets none.
    assert_eq!(call(&b, false).await, (3, false));
    assert_eq!(b.balance(), 0.0);
    assert_eq!(call(&b, false).await, (1, false));
    // A window later the deposits have expired with the retries they paid for.
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(call(&b, false).await, (1, false));
    for _ in 0..2 {
        assert_eq!(call(&b, true).await, (1, true));
    }
    assert_eq!(call(&b, false).await, (2, false));
}

#[derive(Debug, Clone)]
enum Op {
    Deposit(u64),
    Withdraw(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u64..5_000_000).prop_map(Op::Deposit),
        (0u64..5_000_000).prop_map(Op::Withdraw),
    ]
}

/// The reference window, in exact integer arithmetic: `ttl` is cut into `SLOTS`
/// slots of `ttl / SLOTS` ns (a fraction when `ttl` is not a multiple of `SLOTS` ns),
/// each starting at the first whole nanosecond at or after its exact start; an event
/// at `at` ns after the origin counts until `ttl` after the start of its slot. Returns
/// (the start of the slot after `at`'s, the first nanosecond `at` no longer counts).
fn reference_slot(ttl_nanos: u64, at: u64) -> (u64, u64) {
    let (ttl, at, slots) = (u128::from(ttl_nanos), u128::from(at), SLOTS as u128);
    let slot = at * slots / ttl;
    let start = (slot * ttl).div_ceil(slots);
    let next = ((slot + 1) * ttl).div_ceil(slots);
    (next as u64, (start + ttl) as u64)
}

/// How the next event's instant follows the previous one.
#[derive(Debug, Clone)]
enum Gap {
    /// Any nanosecond up to a third of a window later.
    Within(u64),
    /// This many ns before the next slot boundary (or the one after it, if that one is
    /// too close): where rounding in the slot arithmetic shows.
    BeforeBoundary(u64),
}

#[derive(Debug, Clone, Copy)]
enum Event {
    Deposit,
    Withdraw,
    Read,
}

fn gap() -> impl Strategy<Value = Gap> {
    prop_oneof![
        any::<u64>().prop_map(Gap::Within),
        (0u64..64).prop_map(Gap::BeforeBoundary),
        Just(Gap::Within(0)),
    ]
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        Just(Event::Deposit),
        Just(Event::Withdraw),
        Just(Event::Read)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Deposits and withdrawals at arbitrary nanoseconds, under any `ttl` (a whole
    /// number of slots in nanoseconds or not): the balance read at the last nanosecond
    /// each one counts and at the first it does not, and every grant, agree exactly
    /// with the reference window; and that window is the documented one: an event
    /// counts for more than `ttl` less one slot and at most `ttl`.
    #[test]
    fn deposits_and_withdrawals_stop_counting_exactly_when_the_reference_says(
        ttl_nanos in 1_000_000_000u64..=60_000_000_000,
        min in 0u32..3,
        steps in proptest::collection::vec((gap(), event()), 1..60),
    ) {
        let ttl = Duration::from_nanos(ttl_nanos);
        let b = RetryBudget::new(BudgetConfig {
            ttl,
            min_retries_per_second: min,
            retry_ratio: 1.0,
            ..BudgetConfig::default()
        })
        .expect("valid test config");
        // Far enough from the clock's zero for `t0 - ttl`, the origin, to exist.
        let t0 = Instant::now() + Duration::from_secs(61);
        let at = |n: u64| t0 + Duration::from_nanos(n - ttl_nanos);
        let reserve = i128::from(min) * i128::from(ttl_nanos / 1000);
        prop_assert_eq!(b.balance_at(t0), reserve as f64 / MICROS_PER_RETRY as f64);
        // Times are ns after the origin, `t0 - ttl`. Each deposit and withdrawal brings
        // two reads: at the last nanosecond it counts and at the first it does not.
        let mut timeline = Vec::new();
        let mut n = ttl_nanos;
        for (gap, event) in steps {
            n = match gap {
                Gap::Within(g) => n + g % (ttl_nanos / 3),
                Gap::BeforeBoundary(k) => {
                    let (next, _) = reference_slot(ttl_nanos, n);
                    let (after, _) = reference_slot(ttl_nanos, next);
                    if next - k >= n { next - k } else { after - k }
                }
            };
            timeline.push((n, event));
            if !matches!(event, Event::Read) {
                let (_, end) = reference_slot(ttl_nanos, n);
                let width = ttl_nanos.div_ceil(SLOTS as u64);
                prop_assert!(end - n <= ttl_nanos && end - n > ttl_nanos - width);
                timeline.push((end - 1, Event::Read));
                timeline.push((end, Event::Read));
            }
        }
        timeline.sort_by_key(|&(n, _)| n);
        let (mut deposits, mut withdrawals) = (Vec::new(), Vec::new());
        for (n, event) in timeline {
            let counting = |ends: &Vec<u64>| ends.iter().filter(|&&end| n < end).count() as i128;
            let micros = reserve + MICROS_PER_RETRY * (counting(&deposits) - counting(&withdrawals));
            match event {
                Event::Deposit => {
                    b.deposit_at(at(n));
                    deposits.push(reference_slot(ttl_nanos, n).1);
                }
                Event::Withdraw => {
                    let granted = b.withdraw_at(at(n));
                    prop_assert_eq!(granted, micros >= MICROS_PER_RETRY, "withdrawal at {} ns", n);
                    if granted {
                        withdrawals.push(reference_slot(ttl_nanos, n).1);
                    }
                }
                Event::Read => {
                    let expected = micros.max(0) as f64 / MICROS_PER_RETRY as f64;
                    prop_assert_eq!(b.balance_at(at(n)), expected, "read at {} ns", n);
                }
            }
        }
    }

    /// Within one window nothing expires: the budget agrees exactly with an integer
    /// model, and grants never exceed reserve + ratio × deposits.
    #[test]
    fn within_one_window_grants_match_the_model(
        ops in proptest::collection::vec(op(), 0..300),
        min in 0u32..5,
        ratio_milli in 1u32..3000,
    ) {
        let ratio = f64::from(ratio_milli) / 1000.0;
        let b = budget(10, min, ratio);
        let t0 = Instant::now();
        let reserve = i128::from(min) * 10 * 1000;
        let (mut deposits, mut granted) = (0i128, 0i128);
        for op in ops {
            // Offsets below 5 s keep every call inside the 10 s window.
            match op {
                Op::Deposit(us) => {
                    b.deposit_at(t0 + Duration::from_micros(us));
                    deposits += 1;
                }
                Op::Withdraw(us) => {
                    let expect = reserve + i128::from(ratio_milli) * deposits - 1000 * granted >= 1000;
                    let got = b.withdraw_at(t0 + Duration::from_micros(5_000_000 + us % 1000));
                    prop_assert_eq!(got, expect);
                    if got { granted += 1; }
                }
            }
            prop_assert!(1000 * granted <= reserve + i128::from(ratio_milli) * deposits);
        }
    }

    /// Over several windows, in any order of time: the retries granted in the last
    /// `ttl - slot` never exceed the reserve plus what the deposits of the last `ttl`
    /// minted.
    #[test]
    fn across_windows_grants_stay_within_the_window(
        steps in proptest::collection::vec((0u64..400, any::<bool>()), 0..400),
        min in 0u32..3,
        ratio_milli in 1u32..2000,
    ) {
        let ttl = Duration::from_secs(1);
        let slot = ttl / SLOTS as u32;
        let b = budget(1, min, f64::from(ratio_milli) / 1000.0);
        let t0 = Instant::now();
        let mut t = t0;
        let mut deposits = Vec::new();
        let mut grants = Vec::new();
        for (gap, is_deposit) in steps {
            t += ms(gap);
            if is_deposit {
                b.deposit_at(t);
                deposits.push(t);
            } else if b.withdraw_at(t) {
                grants.push(t);
                let g = grants.iter().filter(|&&w| t - w < ttl - slot).count() as i128;
                let d = deposits.iter().filter(|&&d| t - d < ttl).count() as i128;
                prop_assert!(1000 * g <= i128::from(min) * 1000 + i128::from(ratio_milli) * d);
            }
        }
    }
}
