#![allow(clippy::unwrap_used)]
use super::*;

fn set(seed: u64) -> ReplicaSet {
    ReplicaSet::new(ReplicaConfig {
        seed: Some(seed),
        ..ReplicaConfig::default()
    })
    .unwrap()
}

const MS: Duration = Duration::from_millis(1);

fn load(utilization: f64) -> crate::wire::orca::LoadReport {
    crate::wire::orca::LoadReport {
        utilization,
        rps: 100.0,
        eps: 0.0,
        queue_depth: None,
    }
}

#[test]
fn reports_lower_a_share_after_the_blackout_and_never_raise_one() {
    let mut s = set(3);
    let t0 = Instant::now();
    let (a, b, c) = (s.insert_at(t0), s.insert_at(t0), s.insert_at(t0));
    s.record_load_at(a, &load(0.9), t0);
    s.record_load_at(b, &load(0.1), t0);
    // Within the blackout nothing changes.
    assert_eq!(s.report_factor_at(a, t0 + 9 * 1000 * MS), Some(1.0));
    let t1 = t0 + Duration::from_secs(10);
    let fa = s.report_factor_at(a, t1).unwrap();
    assert!((fa - 0.1 / 0.9).abs() < 1e-9, "{fa}");
    assert_eq!(
        s.report_factor_at(b, t1),
        Some(1.0),
        "the best keeps its share"
    );
    assert_eq!(
        s.report_factor_at(c, t1),
        Some(1.0),
        "no reports: untouched"
    );
    // A replica claiming no load at all is capped at its report-free share.
    s.record_load_at(c, &load(1e-6), t0);
    assert_eq!(s.report_factor_at(c, t1), Some(1.0));
    assert!(s.report_factor_at(b, t1).unwrap() >= s.config().reports.min_factor);
    // Reports expire: a's share comes back, and its blackout starts again.
    let late = t0 + Duration::from_secs(181);
    assert_eq!(s.report_factor_at(a, late), Some(1.0));
    s.record_load_at(a, &load(0.9), late);
    s.record_load_at(b, &load(0.1), late);
    assert_eq!(
        s.report_factor_at(a, late + MS),
        Some(1.0),
        "in blackout again"
    );
    // The choice follows: with a at a ninth of b's weight, b takes most of the calls.
    let t2 = late + Duration::from_secs(10);
    let per = run(&mut s, &[a, b, c], 2000, t2, |_| ReplicaOutcome::Success);
    assert!(per[1] > 3 * per[0], "{per:?}");
}

#[test]
fn disabled_reports_weight_nothing() {
    let mut s = ReplicaSet::new(ReplicaConfig {
        reports: ReportWeightConfig {
            enabled: false,
            blackout_period: Duration::ZERO,
            ..ReportWeightConfig::default()
        },
        ..ReplicaConfig::default()
    })
    .unwrap();
    let t0 = Instant::now();
    let (a, b) = (s.insert_at(t0), s.insert_at(t0));
    s.record_load_at(a, &load(0.9), t0);
    s.record_load_at(b, &load(0.1), t0);
    assert_eq!(s.report_factor_at(a, t0 + MS), Some(1.0));
    let bad = ReplicaConfig {
        reports: ReportWeightConfig {
            min_factor: 0.0,
            ..ReportWeightConfig::default()
        },
        ..ReplicaConfig::default()
    };
    assert!(
        bad.validate()
            .unwrap_err()
            .to_string()
            .contains("replicas.reports.min_factor")
    );
}

/// Sends `n` attempts from `now`, one every 200 µs, answering each with `answer(id)`
/// after 2 ms (so about ten are in flight at once); returns the attempts per replica.
fn run(
    s: &mut ReplicaSet,
    ids: &[ReplicaId],
    n: usize,
    now: Instant,
    answer: impl Fn(ReplicaId) -> ReplicaOutcome,
) -> Vec<usize> {
    let mut per = vec![0; ids.len()];
    let mut in_flight: std::collections::VecDeque<(ReplicaId, Instant)> = Default::default();
    let mut t = now;
    for _ in 0..n {
        while let Some(&(id, sent)) = in_flight.front() {
            if sent + 2 * MS > t {
                break;
            }
            in_flight.pop_front();
            s.end_at(id, answer(id), sent, sent + 2 * MS);
        }
        let id = s.pick_at(&[], t).unwrap();
        per[ids.iter().position(|&x| x == id).unwrap()] += 1;
        in_flight.push_back((id, t));
        t += Duration::from_micros(200);
    }
    for (id, sent) in in_flight {
        s.end_at(id, answer(id), sent, sent + 2 * MS);
    }
    per
}

/// Sends one attempt to `id` (every other replica counted as tried, so the choice
/// falls on it while it is in the choice) and answers it with `outcome`.
fn force(
    s: &mut ReplicaSet,
    id: ReplicaId,
    outcome: ReplicaOutcome,
    now: Instant,
) -> (ReplicaId, Option<ReplicaEvent>) {
    let others: Vec<_> = s.ids().filter(|&x| x != id).collect();
    let picked = s.pick_at(&others, now).unwrap();
    let outcome = if picked == id {
        outcome
    } else {
        ReplicaOutcome::Success
    };
    (picked, s.end_at(picked, outcome, now, now + MS))
}

#[test]
fn healthy_replicas_share_evenly() {
    let mut s = set(1);
    let now = Instant::now();
    let ids: Vec<_> = (0..5).map(|_| s.insert_at(now)).collect();
    let per = run(&mut s, &ids, 5000, now, |_| ReplicaOutcome::Success);
    for n in per {
        assert!((800..1200).contains(&n), "{n}");
    }
}

#[test]
fn a_retry_avoids_the_replicas_it_tried() {
    let mut s = set(2);
    let now = Instant::now();
    let ids: Vec<_> = (0..3).map(|_| s.insert_at(now)).collect();
    for _ in 0..200 {
        let first = s.pick_at(&[], now).unwrap();
        let second = s.pick_at(&[first], now).unwrap();
        assert_ne!(first, second);
        let third = s.pick_at(&[first, second], now).unwrap();
        assert!(third != first && third != second);
        // With every replica tried, one is still chosen.
        assert!(s.pick_at(&ids, now).is_some());
        for id in [first, second, third] {
            s.end_at(id, ReplicaOutcome::Success, now, now);
        }
    }
}

#[test]
fn consecutive_failures_eject_then_a_probe_returns_the_replica() {
    let mut s = set(3);
    let t0 = Instant::now();
    let ids: Vec<_> = (0..5).map(|_| s.insert_at(t0)).collect();
    let bad = ids[0];
    for i in 0..5 {
        let (picked, t) = force(&mut s, bad, ReplicaOutcome::Failure, t0);
        assert_eq!(picked, bad);
        assert_eq!(t.is_some(), i == 4, "ejected by the fifth failure in a row");
    }
    let snap = s.snapshot_at(bad, t0).unwrap();
    assert!(snap.state.is_ejected());
    assert_eq!((snap.ejections, snap.failures), (1, 5));
    let transitions = s.take_transitions();
    assert!(matches!(
        transitions[..],
        [ReplicaEvent::Ejected {
            reason: EjectReason::ConsecutiveFailures,
            ..
        }]
    ));
    // While it is out, even a retry that tried every other replica avoids it.
    assert_ne!(force(&mut s, bad, ReplicaOutcome::Success, t0).0, bad);
    // Between 500 ms and 750 ms out (jitter), then a single probe at a time.
    let ReplicaState::Ejected { until } = snap.state else {
        unreachable!()
    };
    let out = until - t0;
    assert!(out >= Duration::from_millis(500) && out <= Duration::from_millis(750));
    let later = until;
    let others: Vec<_> = ids[1..].to_vec();
    assert_eq!(s.pick_at(&others, later), Some(bad), "the probe");
    for _ in 0..50 {
        assert_ne!(s.pick_at(&others, later), Some(bad), "one probe at a time");
    }
    assert_eq!(
        s.end_at(bad, ReplicaOutcome::Success, later, later),
        Some(ReplicaEvent::Returned { id: bad })
    );
    assert!(matches!(
        s.snapshot_at(bad, later).unwrap().state,
        ReplicaState::Warming { .. }
    ));
}

#[test]
fn repeated_ejections_grow_and_a_healthy_window_resets_them() {
    let mut s = set(4);
    let t0 = Instant::now();
    let ids: Vec<_> = (0..4).map(|_| s.insert_at(t0)).collect();
    let bad = ids[1];
    let mut now = t0;
    let mut lengths = Vec::new();
    for _ in 0..5 {
        // Fail until ejected (the first time by five in a row, then by the probe).
        for tries in 0.. {
            assert!(tries < 10, "{lengths:?} {:?}", s.snapshot_at(bad, now));
            if let (_, Some(ReplicaEvent::Ejected { duration, .. })) =
                force(&mut s, bad, ReplicaOutcome::Failure, now)
            {
                lengths.push(duration);
                // `force` answers 1 ms after `now`; the ejection counts from there.
                now += duration + MS;
                break;
            }
        }
    }
    assert_eq!(lengths.len(), 5);
    for pair in lengths.windows(2) {
        // Doubling with up to 50 % jitter: each at least 4/3 of the one before.
        assert!(
            pair[1].as_secs_f64() >= pair[0].as_secs_f64() * 1.3,
            "{lengths:?}"
        );
    }
    // Back, then healthy for a window: the next ejection starts from 500 ms again.
    assert_eq!(
        force(&mut s, bad, ReplicaOutcome::Success, now),
        (bad, Some(ReplicaEvent::Returned { id: bad }))
    );
    now += Duration::from_secs(11);
    let mut last = None;
    while last.is_none() {
        last = force(&mut s, bad, ReplicaOutcome::Failure, now).1;
    }
    let Some(ReplicaEvent::Ejected { duration, .. }) = last else {
        unreachable!()
    };
    assert!(duration <= Duration::from_millis(750), "{duration:?}");
}

#[test]
fn a_replica_refusing_connections_is_probed_every_base_time() {
    let mut s = set(12);
    let t0 = Instant::now();
    let ids: Vec<_> = (0..3).map(|_| s.insert_at(t0)).collect();
    let down = ids[0];
    let mut now = t0;
    let mut lengths = Vec::new();
    while lengths.len() < 4 {
        if let (_, Some(ReplicaEvent::Ejected { duration, .. })) =
            force(&mut s, down, ReplicaOutcome::Refused, now)
        {
            lengths.push(duration);
            now += duration + MS;
        }
    }
    // No doubling: each ejection is 500 ms plus up to 50 % jitter.
    assert!(
        lengths.iter().all(|d| *d <= Duration::from_millis(750)),
        "{lengths:?}"
    );
    // Back up: the next probe returns it.
    assert_eq!(
        force(&mut s, down, ReplicaOutcome::Success, now),
        (down, Some(ReplicaEvent::Returned { id: down }))
    );
}

#[test]
fn at_most_the_configured_share_is_ejected_and_never_the_last() {
    let mut s = set(5);
    let now = Instant::now();
    let ids: Vec<_> = (0..5).map(|_| s.insert_at(now)).collect();
    run(&mut s, &ids, 2000, now, |_| ReplicaOutcome::Failure);
    let out = ids
        .iter()
        .filter(|&&id| s.snapshot_at(id, now).unwrap().state.is_ejected())
        .count();
    assert_eq!(out, 2, "half of 5, rounded down");
    let mut one = set(6);
    let only = one.insert_at(now);
    for _ in 0..50 {
        let id = one.pick_at(&[], now).unwrap();
        one.end_at(id, ReplicaOutcome::Failure, now, now);
    }
    assert_eq!(
        one.snapshot_at(only, now).unwrap().state,
        ReplicaState::Active
    );
}

#[test]
fn a_failure_share_ejects_a_replica_that_fails_every_other_call() {
    let mut s = set(7);
    let now = Instant::now();
    let ids: Vec<_> = (0..3).map(|_| s.insert_at(now)).collect();
    let flaky = ids[2];
    let mut transition = None;
    let mut answers = 0;
    while transition.is_none() && answers < 100 {
        let outcome = if answers % 2 == 0 {
            ReplicaOutcome::Failure
        } else {
            ReplicaOutcome::Success
        };
        transition = force(&mut s, flaky, outcome, now).1;
        answers += 1;
    }
    assert!(matches!(
        transition,
        Some(ReplicaEvent::Ejected {
            reason: EjectReason::FailureShare,
            ..
        })
    ));
    // Judged on a failure once the window holds `min_requests` answers: 11 of 21.
    assert_eq!(answers, 21);
}

#[test]
fn overload_answers_steer_away_but_never_eject() {
    let mut s = set(8);
    let now = Instant::now();
    let ids: Vec<_> = (0..5).map(|_| s.insert_at(now)).collect();
    let busy = ids[4];
    let per = run(&mut s, &ids, 5000, now, |id| {
        if id == busy {
            ReplicaOutcome::Overload
        } else {
            ReplicaOutcome::Success
        }
    });
    let snap = s.snapshot_at(busy, now).unwrap();
    assert_eq!(snap.ejections, 0);
    assert!(!snap.state.is_ejected());
    // Chosen only when drawn with... never: its cost is 100x. Far below a fair share.
    assert!(per[4] < 100, "{per:?}");
    // Once its overload is old news, it is back in the choice.
    let later = now + Duration::from_secs(30);
    let per = run(&mut s, &ids, 5000, later, |_| ReplicaOutcome::Success);
    assert!(per[4] > 700, "{per:?}");
}

#[test]
fn a_slow_replica_gets_less_and_recovers_when_fast_again() {
    let mut s = set(9);
    let now = Instant::now();
    let ids: Vec<_> = (0..5).map(|_| s.insert_at(now)).collect();
    let slow = ids[0];
    let mut per = [0usize; 5];
    let mut t = now;
    for _ in 0..5000 {
        let id = s.pick_at(&[], t).unwrap();
        per[ids.iter().position(|&x| x == id).unwrap()] += 1;
        let took = if id == slow { 20 * MS } else { 2 * MS };
        s.end_at(id, ReplicaOutcome::Success, t, t + took);
        t += Duration::from_micros(200);
    }
    assert!(per[0] < per[1] / 3, "{per:?}");
    // A cut-off attempt counts its time as latency too.
    let id = s.pick_at(&[ids[1], ids[2], ids[3], ids[4]], t).unwrap();
    assert_eq!(id, slow);
    s.end_at(slow, ReplicaOutcome::CutOff, t, t + 50 * MS);
    assert!(s.snapshot_at(slow, t + 50 * MS).unwrap().latency >= 49 * MS);
    assert!(!s.snapshot_at(slow, t).unwrap().state.is_ejected());
}

#[test]
fn a_warming_replica_ramps_up_over_the_window() {
    let mut s = set(10);
    let t0 = Instant::now();
    let ids: Vec<_> = (0..4).map(|_| s.insert_at(t0)).collect();
    let new = s.insert_warming_at(t0);
    // 2,000 attempts over 400 ms around `at`.
    let share = |s: &mut ReplicaSet, at: Instant| {
        let mut ids = s.ids().collect::<Vec<_>>();
        ids.sort();
        let per = run(s, &ids, 2000, at, |_| ReplicaOutcome::Success);
        per[4] as f64 / 2000.0
    };
    let early = share(&mut s, t0);
    let mid = share(&mut s, t0 + Duration::from_millis(2500));
    let done = share(&mut s, t0 + Duration::from_secs(6));
    assert!(early < 0.08, "{early}");
    assert!(mid > early && mid < done, "{early} {mid} {done}");
    assert!((0.16..0.24).contains(&done), "{done}");
    assert_eq!(
        s.snapshot_at(new, t0 + Duration::from_secs(6))
            .unwrap()
            .state,
        ReplicaState::Active
    );
    let _ = ids;
}

#[test]
fn removed_replicas_leave_the_choice_and_late_answers_are_ignored() {
    let mut s = set(11);
    let now = Instant::now();
    let a = s.insert_at(now);
    let b = s.insert_at(now);
    let picked = s.pick_at(&[b], now).unwrap();
    assert_eq!(picked, a);
    assert!(s.remove(a));
    assert_eq!(s.end_at(a, ReplicaOutcome::Failure, now, now), None);
    for _ in 0..10 {
        assert_eq!(s.pick_at(&[], now), Some(b));
    }
    assert!(s.remove(b));
    assert_eq!(s.pick_at(&[], now), None);
}

#[test]
fn the_same_seed_makes_the_same_choices() {
    let choices = |seed| {
        let mut s = set(seed);
        let now = Instant::now();
        for _ in 0..5 {
            s.insert_at(now);
        }
        (0..100)
            .map(|_| {
                let id = s.pick_at(&[], now).unwrap();
                s.end_at(id, ReplicaOutcome::Success, now, now);
                id
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(choices(42), choices(42));
    assert_ne!(choices(42), choices(43));
}

#[test]
fn invalid_settings_name_their_field() {
    let bad = |f: fn(&mut ReplicaConfig)| {
        let mut c = ReplicaConfig::default();
        f(&mut c);
        c.validate().unwrap_err().to_string()
    };
    assert!(bad(|c| c.ejection.failure_share = 0.0).contains("failure_share"));
    assert!(bad(|c| c.ejection.failure_share = f64::NAN).contains("failure_share"));
    assert!(bad(|c| c.ejection.max_time = Duration::from_millis(1)).contains("max_time"));
    assert!(bad(|c| c.ejection.jitter = 2.0).contains("jitter"));
    assert!(bad(|c| c.slow_start.min_weight = 0.0).contains("min_weight"));
    assert!(bad(|c| c.load.decay = Duration::ZERO).contains("decay"));
    assert!(ReplicaConfig::default().validate().is_ok());
}

#[test]
fn deserializes_with_units_and_refuses_unknown_fields() {
    let c: ReplicaConfig = serde_json::from_str(
            r#"{"ejection":{"consecutive_failures":3,"base_time":"500ms"},"slow_start":{"window":"0s"},"seed":1}"#,
        )
        .unwrap();
    assert_eq!(c.ejection.consecutive_failures, 3);
    assert_eq!(c.ejection.base_time, Duration::from_millis(500));
    assert!(c.slow_start.window.is_zero());
    assert!(serde_json::from_str::<ReplicaConfig>(r#"{"ejections":{}}"#).is_err());
}

/// gRFC A17: a replica whose health check does not say `SERVING` takes no new attempts,
/// even when every other replica is ejected; it takes them again once it does; with no
/// replica serving, the pick fails rather than send to one that said it is not.
#[test]
fn a_replica_that_is_not_serving_gets_no_new_attempts() {
    let mut s = set(11);
    let t0 = Instant::now();
    let (a, b) = (s.insert_at(t0), s.insert_at(t0));
    for id in [a, b] {
        assert_eq!(
            s.snapshot_at(id, t0).unwrap().serving,
            ServingStatus::Unchecked
        );
    }
    // An attempt in flight on `a` when it stops serving still ends normally.
    let in_flight = loop {
        if let Some(id) = s.pick_at(&[], t0).filter(|id| *id == a) {
            break id;
        }
    };
    assert_eq!(
        s.set_serving(a, ServingStatus::NotServing),
        Some(ServingStatus::Unchecked)
    );
    assert_eq!(
        s.set_serving(a, ServingStatus::NotServing),
        None,
        "no change"
    );
    for _ in 0..200 {
        let id = s.pick_at(&[], t0).unwrap();
        assert_eq!(id, b, "a retry that tried b still avoids a");
        assert_eq!(s.pick_at(&[b], t0), Some(b));
        s.end_at(b, ReplicaOutcome::Success, t0, t0);
        s.end_at(b, ReplicaOutcome::Success, t0, t0);
    }
    s.end_at(in_flight, ReplicaOutcome::Success, t0, t0);
    assert_eq!(s.snapshot_at(a, t0).unwrap().in_flight, 0);
    // `b` ejected (the only one left in the choice) still beats a replica not serving.
    for _ in 0..5 {
        assert_eq!(s.pick_at(&[], t0), Some(b));
        s.end_at(b, ReplicaOutcome::Failure, t0, t0);
    }
    assert!(s.snapshot_at(b, t0).unwrap().state.is_ejected());
    assert_eq!(s.pick_at(&[], t0), Some(b));
    s.end_at(b, ReplicaOutcome::CutOff, t0, t0);
    // Nothing serving (b has not answered its check yet): no pick.
    s.set_serving(b, ServingStatus::Unknown);
    assert_eq!(s.pick_at(&[], t0), None);
    s.set_serving(b, ServingStatus::ServiceUnknown);
    assert_eq!(s.pick_at(&[], t0), None);
    // `a` serving again: it takes attempts at once.
    s.set_serving(a, ServingStatus::Serving);
    assert_eq!(s.pick_at(&[], t0), Some(a));
    let snap = s.snapshot_at(a, t0).unwrap();
    assert_eq!(
        (snap.serving, snap.serving_changes),
        (ServingStatus::Serving, 2)
    );
    assert_eq!(s.snapshot_at(b, t0).unwrap().serving_changes, 2);
}

/// With health checks on, a new replica takes no attempt before its check answers.
#[test]
fn with_health_checks_on_a_replica_waits_for_its_first_answer() {
    let mut s = ReplicaSet::new(ReplicaConfig {
        seed: Some(5),
        health_check: Some(crate::balance::HealthCheckConfig::service("")),
        ..ReplicaConfig::default()
    })
    .unwrap();
    let t0 = Instant::now();
    let (a, b) = (s.insert_at(t0), s.insert_warming_at(t0));
    assert_eq!(
        s.snapshot_at(a, t0).unwrap().serving,
        ServingStatus::Unknown
    );
    assert_eq!(s.pick_at(&[], t0), None);
    s.set_serving(b, ServingStatus::Serving);
    assert_eq!(s.pick_at(&[], t0), Some(b));
    assert_eq!(s.snapshot_at(b, t0).unwrap().serving_changes, 1);
}
