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
fn what_is_left_of_a_deadline() {
    let t0 = Instant::now();
    let d = Deadline::after_at(t0, Duration::from_millis(500));
    assert_eq!(
        d.remaining_at(t0 + Duration::from_millis(200)),
        Duration::from_millis(300)
    );
    assert!(d.is_expired_at(t0 + Duration::from_millis(500)));
}
