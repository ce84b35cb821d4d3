use super::*;
use proptest::prelude::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn full_jitter_spreads_over_the_whole_window() {
    let config = BackoffConfig::FullJitter {
        base: ms(100),
        cap: ms(1000),
        multiplier: 2.0,
    };
    // The first delay over many seeded sequences covers [0, 100 ms) evenly.
    let mut buckets = [0u32; 10];
    for seed in 0..10_000 {
        let d = Backoff::new(config, seed).next_delay();
        assert!(d < ms(100));
        buckets[(d.as_millis() / 10) as usize] += 1;
    }
    for count in buckets {
        assert!((800..1200).contains(&count), "uneven spread {buckets:?}");
    }
}

#[test]
fn absurd_configs_that_validate_saturate_instead_of_panicking() {
    let configs = [
        BackoffConfig::A6 {
            initial: ms(100),
            max: Duration::MAX,
            multiplier: 2.0,
        },
        BackoffConfig::A6 {
            initial: Duration::MAX,
            max: Duration::MAX,
            multiplier: 1.0,
        },
        BackoffConfig::A6 {
            initial: ms(1),
            max: Duration::from_secs(u64::MAX / 2),
            multiplier: 1e300,
        },
        BackoffConfig::FullJitter {
            base: Duration::MAX,
            cap: Duration::MAX,
            multiplier: f64::MAX,
        },
    ];
    for config in configs {
        assert!(config.validate("b").is_ok(), "{config:?}");
        for seed in 0..50 {
            let mut b = Backoff::new(config, seed);
            for _ in 0..70 {
                let window = b.next_window();
                assert!(b.next_delay() <= window, "{config:?}");
            }
        }
    }
}

#[test]
fn full_jitter_window_grows_then_caps() {
    let config = BackoffConfig::FullJitter {
        base: ms(10),
        cap: ms(50),
        multiplier: 3.0,
    };
    let mut b = Backoff::new(config, 1);
    let mut windows = vec![];
    for _ in 0..5 {
        windows.push(b.next_window());
        b.next_delay();
    }
    assert_eq!(windows, [ms(10), ms(30), ms(50), ms(50), ms(50)]);
}

#[test]
fn a6_is_exponential_with_twenty_percent_jitter() {
    let config = BackoffConfig::A6 {
        initial: ms(100),
        max: ms(1000),
        multiplier: 2.0,
    };
    for seed in 0..200 {
        let mut b = Backoff::new(config, seed);
        for step in [100.0, 200.0, 400.0, 800.0, 1000.0, 1000.0] {
            let d = b.next_delay().as_secs_f64() * 1000.0;
            assert!(
                d >= step * 0.8 - 1e-6 && d <= step * 1.2 + 1e-6,
                "{d} vs {step}"
            );
        }
    }
}

#[test]
fn reset_restarts_the_sequence() {
    let config = BackoffConfig::FullJitter {
        base: ms(10),
        cap: ms(1000),
        multiplier: 2.0,
    };
    let mut b = Backoff::new(config, 3);
    for _ in 0..4 {
        b.next_delay();
    }
    assert_eq!(b.next_window(), ms(160));
    b.reset();
    assert_eq!(b.next_window(), ms(10));
}

#[test]
fn same_seed_same_sequence() {
    let a: Vec<_> = {
        let mut b = Backoff::new(BackoffConfig::default(), 42);
        (0..8).map(|_| b.next_delay()).collect()
    };
    let mut b = Backoff::new(BackoffConfig::default(), 42);
    let again: Vec<_> = (0..8).map(|_| b.next_delay()).collect();
    assert_eq!(a, again);
    let mut c = Backoff::new(BackoffConfig::default(), 43);
    let other: Vec<_> = (0..8).map(|_| c.next_delay()).collect();
    assert_ne!(a, other);
}

#[test]
fn validation_names_the_field() {
    let bad = BackoffConfig::FullJitter {
        base: ms(0),
        cap: ms(10),
        multiplier: 2.0,
    };
    assert_eq!(
        bad.validate("retry.backoff"),
        Err(ConfigError::invalid(
            "retry.backoff.base",
            "must be greater than zero"
        ))
    );
    let bad = BackoffConfig::A6 {
        initial: ms(10),
        max: ms(5),
        multiplier: 2.0,
    };
    assert!(matches!(
        bad.validate("retryPolicy"),
        Err(ConfigError::Invalid { field, .. }) if field == "retryPolicy.maxBackoff"
    ));
    let bad = BackoffConfig::FullJitter {
        base: ms(10),
        cap: ms(50),
        multiplier: f64::NAN,
    };
    assert!(bad.validate("b").is_err());
    assert!(BackoffConfig::default().validate("b").is_ok());
}

proptest! {
    #[test]
    fn full_jitter_stays_in_bounds(base_ms in 1u64..10_000, cap_extra in 0u64..100_000,
                                   mult in 1.0f64..10.0, seed: u64, n in 0usize..80) {
        let base = ms(base_ms);
        let cap = base + ms(cap_extra);
        let mut b = Backoff::new(BackoffConfig::FullJitter { base, cap, multiplier: mult }, seed);
        let mut window = base;
        for _ in 0..n {
            let w = b.next_window();
            prop_assert!(w >= window.min(cap) && w <= cap);
            window = w;
            prop_assert!(b.next_delay() <= w);
        }
    }

    #[test]
    fn a6_stays_in_bounds(initial_ms in 1u64..10_000, max_extra in 0u64..100_000,
                          mult in 0.1f64..10.0, seed: u64, n in 0usize..80) {
        let initial = ms(initial_ms);
        let max = initial + ms(max_extra);
        let mut b = Backoff::new(BackoffConfig::A6 { initial, max, multiplier: mult }, seed);
        for _ in 0..n {
            let d = b.next_delay();
            prop_assert!(d <= max.mul_f64(1.2) + Duration::from_nanos(1));
        }
    }
}
