use super::*;

fn second(t: u32, offered: u64, goodput: u64) -> Second {
    Second {
        t,
        offered,
        goodput,
        attempts: offered,
        shed: 0,
    }
}

#[test]
fn recovery_needs_three_good_seconds_in_a_row() {
    let shares = [100, 100, 10, 10, 96, 99, 40, 95, 100, 97, 100];
    let t: Vec<Second> = shares
        .iter()
        .enumerate()
        .map(|(i, g)| second(i as u32, 100, *g))
        .collect();
    // Trigger ends at 4: 4, 5 good, 6 bad, 7..9 good: recovered 3 s after the end.
    assert_eq!(recovery_s(&t, 4), Some(3));
    assert_eq!(recovery_s(&t, 7), Some(0));
    // Only two seconds left after 9: never.
    assert_eq!(recovery_s(&t, 9), None);
    assert_eq!(recovery_s(&t, 40), None);
}

#[test]
fn a_second_without_calls_is_not_good() {
    let t = vec![second(0, 0, 0), second(1, 10, 10), second(2, 10, 10)];
    assert_eq!(recovery_s(&t, 0), None);
}

#[test]
fn windows_split_at_the_trigger() {
    let mut t: Vec<Second> = (0..6).map(|i| second(i, 10, 10)).collect();
    t[2].goodput = 2;
    t[2].attempts = 30;
    t[3].goodput = 0;
    t[3].attempts = 20;
    let run = PolicyRun {
        policy: Policy::Naive,
        timeline: t,
        budget_refusals: None,
        connection_errors: 0,
        reject_cpu: Duration::from_millis(3),
        throttled: None,
        saturated_refusals: None,
        hedges: None,
    };
    let s = summarize(&run, 2, 4);
    assert_eq!(s.goodput_before, 1.0);
    assert_eq!(s.goodput_during, 0.1);
    assert_eq!(s.amplification_during_trigger, 2.5);
    assert_eq!(s.amplification_after_trigger, 1.0);
    assert_eq!(s.recovery_s, None);
    assert_eq!(s.reject_cpu_ms, 3.0);
    // 42 successes in 6 s at a capacity of 10/s.
    let report = storm_report(std::slice::from_ref(&run), 2, 4, 10.0, 5.0, 10.0);
    assert!((report.policies[0].goodput_share_of_capacity - 42.0 / 60.0).abs() < 1e-9);
    let json = serde_json::to_value(&s).expect("serializes");
    assert!(json["recovery_s"].is_null());
}
