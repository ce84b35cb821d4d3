#![allow(clippy::unwrap_used)]
use super::*;

const MS: Duration = Duration::from_millis(1);
const US: Duration = Duration::from_micros(1);

/// A server of `capacity` slots with service time `service` and the limit in
/// front: every window, `limit` calls run, each taking `service · max(1, L/C)`.
/// Returns the limit after each window.
fn drive(
    limit: &mut AdaptiveLimit,
    t0: &mut Instant,
    capacity: f64,
    service: impl Fn(Instant) -> Duration,
    windows: usize,
    offered: Option<usize>,
) -> Vec<usize> {
    let mut seen = Vec::new();
    for _ in 0..windows * 40 {
        let l = limit.limit();
        let running = offered.map_or(l, |o| o.min(l));
        let latency = service(*t0).mul_f64((running as f64 / capacity).max(1.0));
        // One call finishes every latency/running.
        *t0 += latency / u32::try_from(running.max(1)).unwrap();
        let before = limit.limit();
        let after = limit.sample_at(*t0, *t0 - latency, running - 1);
        if after != before {
            seen.push(after);
        }
    }
    seen
}

/// A limit of `config` starting at `initial`.
fn starting(config: AdaptiveLimitConfig, initial: usize) -> AdaptiveLimit {
    AdaptiveLimit::new(
        AdaptiveLimitConfig {
            initial_limit: initial,
            ..config
        },
        0,
    )
    .unwrap()
}

fn config() -> AdaptiveLimitConfig {
    AdaptiveLimitConfig {
        initial_limit: 16,
        min_limit: 1,
        max_limit: 500,
        window: 50 * MS,
        min_window_samples: 8,
        probe_interval: Duration::from_secs(5),
        seed: 1,
    }
}

#[test]
fn settles_a_few_calls_above_capacity_from_above_and_below() {
    for initial in [1, 16, 200] {
        let mut limit = starting(config(), initial);
        let mut t = Instant::now();
        drive(&mut limit, &mut t, 16.0, |_| 10 * MS, 400, None);
        let l = limit.limit();
        assert!((17..=24).contains(&l), "from {initial}: settled at {l}");
        let m = limit.min_latency().unwrap();
        assert!(m >= 10 * MS && m < 11 * MS, "{m:?}");
    }
}

#[test]
fn a_slower_floor_is_found_without_a_probe_and_the_limit_follows_it_both_ways() {
    // No scheduled probe during the run: only the first one, at the first call.
    let config = AdaptiveLimitConfig {
        probe_interval: Duration::from_secs(3600),
        ..config()
    };
    let mut limit = starting(config, 16);
    let mut t0 = Instant::now();
    let start = t0;
    // Every call takes 2.5x longer from 2 s to 6 s: the same 16 slots, slower.
    let slow = (
        start + Duration::from_secs(2),
        start + Duration::from_secs(6),
    );
    let service = |t: Instant| {
        if t >= slow.0 && t < slow.1 {
            25 * MS
        } else {
            10 * MS
        }
    };
    drive(&mut limit, &mut t0, 16.0, service, 40, None);
    let before = limit.limit();
    assert!((17..=24).contains(&before), "{before}");
    let mut during = Vec::new();
    while t0 < slow.1 - Duration::from_millis(300) {
        during.extend(drive(&mut limit, &mut t0, 16.0, service, 1, None));
    }
    // Vegas first reads the slower calls as queueing and cuts the limit below the
    // capacity; the window after the cut shows that the latency did not fall with
    // it, which is the new floor, and the limit returns above the capacity without
    // a probe (which would have dropped it to the floor of 1).
    let m = limit.min_latency().unwrap();
    assert!(
        m >= 25 * MS && m < 27 * MS,
        "floor during the slowdown: {m:?}"
    );
    assert!(
        !during.contains(&1),
        "probed during the slowdown: {during:?}"
    );
    let now = limit.limit();
    assert!((17..=24).contains(&now), "during the slowdown: {now}");
    let back = t0;
    while t0 < back + Duration::from_millis(1500) {
        drive(&mut limit, &mut t0, 16.0, service, 1, None);
    }
    // Once calls are faster than the floor, it follows them down; every window
    // stays saturated, so a probe finds the floor itself a second later.
    let m = limit.min_latency().unwrap();
    assert!(m < 11 * MS, "floor after: {m:?}");
    assert!(
        (17..=24).contains(&limit.limit()),
        "after: {}",
        limit.limit()
    );
}

#[test]
fn a_window_whose_callers_left_neither_grows_the_limit_nor_shows_a_floor() {
    let mut limit = starting(config(), 30);
    let t0 = Instant::now();
    // A probe at the floor of 1 measures m = 10 ms.
    limit.sample_at(t0, t0, 0);
    for i in 0..8u32 {
        let start = t0 + i * 10 * MS;
        limit.sample_at(start + 10 * MS, start, 0);
    }
    assert_eq!((limit.limit(), limit.min_latency()), (30, Some(10 * MS)));
    // Windows of 30 calls running, each 10.1 ms so far, a third abandoned: hardly
    // anything seems queued, which would grow the limit, but the mean is only a
    // lower bound.
    let mut t = t0 + 100 * MS;
    for i in 0..60u32 {
        t += 2 * MS;
        if i % 3 == 0 {
            limit.abandoned_at(t, t - 10100 * US, 29);
        } else {
            limit.sample_at(t, t - 10100 * US, 29);
        }
    }
    assert_eq!(limit.limit(), 30);
    // The same windows with every call finished grow it.
    for _ in 0..60u32 {
        t += 2 * MS;
        limit.sample_at(t, t - 10100 * US, 29);
    }
    assert!(limit.limit() > 30, "{}", limit.limit());
}

#[test]
fn an_idle_limit_does_not_grow() {
    let mut limit = starting(config(), 10);
    let mut t = Instant::now();
    // Only 3 calls at a time are offered, far under capacity: no queueing inside,
    // but the limit of 10 is never used, so it stays.
    drive(&mut limit, &mut t, 16.0, |_| 10 * MS, 100, Some(3));
    assert_eq!(limit.limit(), 10);
}

#[test]
fn a_probe_drops_to_the_floor_and_measures_only_clean_calls() {
    let mut limit = starting(config(), 30);
    let t0 = Instant::now();
    // The first sample starts a probe; 20 calls still run, so nothing counts yet.
    assert_eq!(limit.sample_at(t0, t0 - 50 * MS, 20), 1);
    assert!(limit.probing());
    for i in 1..=8u32 {
        limit.sample_at(t0 + i * MS, t0 - 50 * MS, 20);
    }
    assert!(limit.probing() && limit.min_latency().is_none());
    // Once at most one runs, calls started from then on count.
    let clean = t0 + 10 * MS;
    limit.sample_at(clean, t0, 1);
    for i in 0..8u32 {
        let start = clean + i * 12 * MS;
        let latency = if i == 3 { 40 * MS } else { 12 * MS };
        assert!(limit.probing());
        limit.sample_at(start + latency, start, 0);
    }
    assert!(!limit.probing());
    assert_eq!(limit.min_latency(), Some(12 * MS));
    assert_eq!(limit.limit(), 30);
}

#[test]
fn bounds_hold_and_config_is_checked() {
    let c = AdaptiveLimitConfig {
        min_limit: 4,
        max_limit: 6,
        ..config()
    };
    let mut limit = starting(c.clone(), 100);
    assert_eq!(limit.limit(), 6);
    let mut t = Instant::now();
    for l in drive(&mut limit, &mut t, 2.0, |_| 10 * MS, 50, None) {
        assert!((4..=6).contains(&l));
    }
    for (bad, field) in [
        (
            AdaptiveLimitConfig {
                min_limit: 0,
                ..c.clone()
            },
            "min_limit",
        ),
        (
            AdaptiveLimitConfig {
                max_limit: 3,
                ..c.clone()
            },
            "max_limit",
        ),
        (
            AdaptiveLimitConfig {
                window: Duration::ZERO,
                ..c.clone()
            },
            "window",
        ),
        (
            AdaptiveLimitConfig {
                min_window_samples: 0,
                ..c.clone()
            },
            "min_window_samples",
        ),
        (
            AdaptiveLimitConfig {
                probe_interval: Duration::ZERO,
                ..c.clone()
            },
            "probe_interval",
        ),
    ] {
        let err = bad.validate().unwrap_err().to_string();
        assert!(
            err.contains(&format!("admission.adaptive.{field}")),
            "{err}"
        );
    }
}
