use super::*;

/// The slot a refusal at `now` takes, for a call that can wait for any.
fn taken(backoff: &ConnectBackoff, now: Instant) -> Instant {
    let never = now + Duration::from_secs(86_400);
    backoff.refused_at(now, never).unwrap_or(never)
}

#[test]
fn waits_grow_per_refusal_in_a_row_up_to_the_cap_and_an_answer_resets_them() {
    let backoff = ConnectBackoff::new(7);
    let mut now = Instant::now();
    let mut waits = Vec::new();
    for _ in 0..10 {
        let next = taken(&backoff, now);
        waits.push(next - now);
        now = next;
    }
    // Refused together, connecting one step apart.
    let first = taken(&backoff, now);
    let second = taken(&backoff, now);
    assert!(
        second - first >= MAX.mul_f64(1.0 - JITTER),
        "{:?}",
        second - first
    );
    now = second;
    for (n, wait) in waits.iter().enumerate() {
        let nominal = (MULTIPLIER.powi(n as i32)).min(MAX.as_secs_f64());
        let secs = wait.as_secs_f64();
        assert!(
            secs >= nominal * (1.0 - JITTER) && secs <= nominal * (1.0 + JITTER),
            "{n}: {wait:?}"
        );
    }
    backoff.connected();
    let wait = taken(&backoff, now) - now;
    assert!(wait <= INITIAL.mul_f64(1.0 + JITTER), "{wait:?}");
}

#[test]
fn in_backoff_first_attempts_are_refused_but_one_probe_per_slot() {
    let backoff = ConnectBackoff::new(3);
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    // Connections are made: every first attempt goes.
    assert!((0..5).all(|i| backoff.admits_first_at(t0 + ms(i))));
    taken(&backoff, t0);
    // Before the slot (1 s ± 20 %): none; at it: one probe, and no second one beside it.
    assert!(!backoff.admits_first_at(t0 + ms(1)));
    assert!(!backoff.admits_first_at(t0 + ms(799)));
    let probe = t0 + ms(1_200);
    assert!(backoff.admits_first_at(probe));
    assert!(!backoff.admits_first_at(probe + ms(1)));
    // The probe is refused: the next slot is one grown step later (1.6 s ± 20 %).
    let refused = probe + ms(10);
    taken(&backoff, refused);
    assert!(!backoff.admits_first_at(refused + ms(1_279)));
    let next = refused + ms(1_920);
    assert!(backoff.admits_first_at(next));
    // A probe that never reports frees its slot one step (2.56 s) later.
    assert!(!backoff.admits_first_at(next + ms(100)));
    let later = next + Duration::from_secs_f64(nominal(2));
    assert!(backoff.admits_first_at(later));
    // An answer ends the backoff: every first attempt goes again.
    backoff.connected();
    assert!((0..5).all(|i| backoff.admits_first_at(later + ms(i))));
}

#[test]
fn calls_refused_together_do_not_put_the_probe_off() {
    // The calls in flight when the dependency went away are refused together: each
    // takes a slot for its transparent retry, but the first probe still goes one step
    // after the first refusal, not after the last slot handed out.
    let backoff = ConnectBackoff::new(5);
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let slots: Vec<_> = (0..10).map(|i| taken(&backoff, t0 + ms(i))).collect();
    assert!(
        slots[9] - t0 > Duration::from_secs(30),
        "{:?}",
        slots[9] - t0
    );
    assert!(backoff.admits_first_at(t0 + ms(1_200)));
}

#[test]
fn a_slot_past_its_calls_limit_is_left_free() {
    // A call that cannot wait for its slot gives up: the slot goes to the next refused
    // call that can, not one step later.
    let backoff = ConnectBackoff::new(9);
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let first = taken(&backoff, t0);
    let short = backoff.refused_at(t0, t0 + ms(100));
    assert!(short.is_err_and(|slot| slot > first), "{short:?}");
    let next = taken(&backoff, t0);
    // One step after the first (the third refusal's, 2.56 s ± 20 %), not two (at
    // least 1.28 s + 2.048 s, had the short call taken its slot).
    let gap = next - first;
    assert!((ms(2_048)..=ms(3_072)).contains(&gap), "{gap:?}");
}
