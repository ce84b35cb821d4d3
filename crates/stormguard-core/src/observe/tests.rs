#![allow(clippy::unwrap_used)]
use super::*;

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);

#[test]
fn one_summary_per_interval_with_every_event_counted_once() {
    let t0 = Instant::now();
    let s: EventSummary<3> = EventSummary::new(SEC, t0);
    let mut summaries = Vec::new();
    // 10 events a second for 5 s, causes in turn.
    for i in 0..50u32 {
        let at = t0 + 100 * MS * i;
        if let Some(summary) = s.record_at(i as usize % 3, at) {
            summaries.push((at, summary));
        }
    }
    let times: Vec<_> = summaries.iter().map(|(at, _)| *at - t0).collect();
    assert_eq!(times, [SEC, 2 * SEC, 3 * SEC, 4 * SEC]);
    // The first holds events 0..=10 (0 s to 1 s); each later one ten more.
    let totals: Vec<_> = summaries.iter().map(|(_, s)| s.total()).collect();
    assert_eq!(totals, [11, 10, 10, 10]);
    assert_eq!(summaries[0].1.counts, [4, 4, 3]);
    assert!(summaries.iter().all(|(_, s)| s.elapsed == SEC));
    // The 9 events after 4 s wait for the next event past 5 s.
    let next = s.record_at(0, t0 + 5 * SEC).unwrap();
    assert_eq!(next.total(), 10);
}

#[test]
fn a_lone_event_after_quiet_is_summarised_at_once() {
    let t0 = Instant::now();
    let s: EventSummary<1> = EventSummary::new(SEC, t0);
    let lone = s.record_at(0, t0 + 3600 * SEC).unwrap();
    assert_eq!((lone.counts, lone.elapsed), ([1], 3600 * SEC));
    assert!(s.record_at(0, t0 + 3600 * SEC + MS).is_none());
}

#[test]
fn unknown_causes_and_clocks_running_back_change_nothing() {
    let t0 = Instant::now() + 10 * SEC;
    let s: EventSummary<2> = EventSummary::new(SEC, t0);
    assert!(
        s.record_at(2, t0 + 2 * SEC).is_none(),
        "cause 2 is outside 0..2"
    );
    assert!(s.record_at(0, t0 - 5 * SEC).is_none(), "before the origin");
    let due = s.record_at(1, t0 + SEC).unwrap();
    assert_eq!(due.counts, [1, 1]);
}

#[test]
fn a_zero_interval_summarises_every_event() {
    let t0 = Instant::now();
    let s: EventSummary<1> = EventSummary::new(Duration::ZERO, t0);
    for _ in 0..3 {
        assert_eq!(s.record_at(0, t0).unwrap().counts, [1]);
    }
}

#[test]
fn threads_racing_lose_no_event_and_share_no_summary() {
    let t0 = Instant::now();
    let s = Arc::new(EventSummary::<2>::new(MS, t0));
    let threads: Vec<_> = (0..4)
        .map(|n| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                let mut got = 0;
                for i in 0..10_000u32 {
                    // Every thread walks the same virtual clock: many are due at once.
                    let at = t0 + Duration::from_micros(u64::from(i) * 10);
                    if let Some(summary) = s.record_at(n % 2, at) {
                        got += summary.total();
                    }
                }
                got
            })
        })
        .collect();
    let summarised: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let rest = s.record_at(0, t0 + 3600 * SEC).unwrap().total() - 1;
    assert_eq!(summarised + rest, 40_000);
}

#[test]
fn paths_split_into_service_and_method() {
    assert_eq!(split_path("/pkg.Svc/Get"), ("pkg.Svc", "Get"));
    assert_eq!(split_path("pkg.Svc/Get"), ("pkg.Svc", "Get"));
    assert_eq!(split_path("/odd"), ("", "odd"));
    assert_eq!(split_path(""), ("", ""));
}

#[test]
fn a_layer_is_named_once_by_its_first_call_unless_given_a_name() {
    let unnamed = LayerName::default();
    assert!(unnamed.get().is_none());
    assert_eq!(
        &**unnamed.get_or_name_after("/pkg.Inventory/Get"),
        "pkg.Inventory"
    );
    assert_eq!(
        &**unnamed.get_or_name_after("/other.Svc/Get"),
        "pkg.Inventory"
    );
    let named = LayerName::named("checkout-db");
    assert_eq!(
        &**named.get_or_name_after("/pkg.Inventory/Get"),
        "checkout-db"
    );
}
