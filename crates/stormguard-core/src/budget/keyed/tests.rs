#![allow(clippy::unwrap_used)]
use super::*;
use std::time::Duration;

#[test]
fn each_key_spends_what_it_earned_plus_the_floor() {
    // Floor 1/s over 10 s: 10 retries per key with no success at all.
    let config = BudgetConfig {
        min_retries_per_second: 1,
        ..BudgetConfig::default()
    };
    let keys = KeyedBudgets::new(config, 8).unwrap();
    let now = Instant::now();
    for _ in 0..200 {
        keys.deposit_at(1, now);
    }
    let granted = |k| (0..100).filter(|_| keys.withdraw_at(k, now)).count();
    assert_eq!(granted(2), 10, "a key that never succeeded: the floor only");
    assert_eq!(granted(1), 30, "200 successes at 0.1, plus the floor");
    keys.refund_at(2, now);
    assert_eq!(granted(2), 1);
}

#[test]
fn the_map_is_bounded_and_forgets_the_oldest_key() {
    let keys = KeyedBudgets::new(BudgetConfig::default(), 3).unwrap();
    let t0 = Instant::now();
    for k in 0..3u64 {
        keys.deposit_at(k, t0 + Duration::from_millis(k));
    }
    keys.deposit_at(0, t0 + Duration::from_millis(10)); // 0 used again: 1 is oldest
    keys.deposit_at(99, t0 + Duration::from_millis(11));
    assert_eq!(keys.len(), 3);
    assert!(keys.balance_at(1, t0).is_none());
    assert!(keys.balance_at(0, t0).is_some());
    for k in 1000..2000 {
        keys.withdraw_at(k, t0);
    }
    assert_eq!(keys.len(), 3);
    assert!(KeyedBudgets::new(BudgetConfig::default(), 0).is_err());
}
