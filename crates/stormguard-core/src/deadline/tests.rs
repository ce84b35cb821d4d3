use super::*;

#[test]
fn deadline_arithmetic() {
    let t0 = Instant::now();
    let d = Deadline::after_at(t0, Duration::from_millis(100));
    assert_eq!(d.remaining_at(t0), Duration::from_millis(100));
    assert_eq!(d.remaining_at(t0 + Duration::from_secs(1)), Duration::ZERO);
    assert!(!d.is_expired_at(t0 + Duration::from_millis(99)));
    assert!(d.is_expired_at(t0 + Duration::from_millis(100)));
    assert_eq!(
        d.grpc_timeout_at(t0 + Duration::from_millis(40))
            .map(|t| t.to_string()),
        Some("60000000n".to_owned())
    );
    assert_eq!(d.grpc_timeout_at(t0 + Duration::from_millis(100)), None);
    let shorter = Deadline::after_at(t0, Duration::from_millis(10));
    assert_eq!(d.min(shorter), shorter);
    assert_eq!(shorter.min(d), shorter);
    // An absurd timeout from a peer does not overflow.
    let far = Deadline::after_at(t0, Duration::MAX);
    assert!(far.remaining_at(t0) > Duration::from_secs(365 * 24 * 3600));
}

#[test]
fn a_deadline_near_the_end_of_the_clock_stops_there() {
    // About the last instant the clock can hold: each step adds what still fits.
    let t0 = Instant::now();
    let end = (0..64).rev().fold(t0, |t, bit| {
        t.checked_add(Duration::from_secs(1 << bit)).unwrap_or(t)
    });
    let end = (0..30).rev().fold(end, |t, bit| {
        t.checked_add(Duration::from_nanos(1 << bit)).unwrap_or(t)
    });
    assert!(end.checked_add(Duration::from_secs(1)).is_none());
    for timeout in [Duration::from_secs(10), MAX_DEADLINE, Duration::MAX] {
        let d = Deadline::after_at(end, timeout);
        assert!(d.instant() >= end, "{timeout:?}");
        assert!(d.remaining_at(end) < Duration::from_secs(1), "{timeout:?}");
    }
    // A second before the end, a timeout that fits is kept exactly.
    let before = end - Duration::from_secs(1);
    let half = Duration::from_millis(500);
    assert_eq!(Deadline::after_at(before, half).instant(), before + half);
}

#[test]
fn what_is_left_of_a_deadline() {
    let t0 = Instant::now();
    let d = Deadline::after_at(t0, Duration::from_millis(500));
    assert_eq!(
        d.remaining_at(t0 + Duration::from_millis(200)),
        Duration::from_millis(300)
    );
    assert!(d.is_expired_at(t0 + Duration::from_millis(500)));
}
