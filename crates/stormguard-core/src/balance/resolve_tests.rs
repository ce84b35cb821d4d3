#![allow(clippy::unwrap_used)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::*;

const TTL: Duration = Duration::from_secs(5);

fn refresh(seed: u64, now: Instant) -> Refresh<u32> {
    let config = RefreshConfig {
        seed: Some(seed),
        ..RefreshConfig::default()
    };
    Refresh::new(config, now).unwrap()
}

fn found(records: &[u32]) -> RefreshAnswer<u32> {
    RefreshAnswer::Found {
        records: records.to_vec(),
        ttl: TTL,
    }
}

/// Begins the resolution that is due and answers it at once.
fn resolve(dns: &mut Refresh<u32>, answer: RefreshAnswer<u32>) -> (Instant, RefreshUpdate<u32>) {
    let at = dns.due_at();
    dns.begin_at(at);
    (at, dns.answer_at(answer, at))
}

#[test]
fn an_answer_is_diffed_against_the_set() {
    let t0 = Instant::now();
    let mut dns = refresh(1, t0);
    let (_, first) = resolve(&mut dns, found(&[1, 2, 3]));
    assert_eq!((first.added, first.removed), (vec![1, 2, 3], vec![]));
    let (_, up) = resolve(&mut dns, found(&[1, 2, 3, 4, 5]));
    assert_eq!((up.added, up.removed), (vec![4, 5], vec![]));
    let (_, down) = resolve(&mut dns, found(&[3, 4, 5]));
    assert_eq!((down.added, down.removed), (vec![], vec![1, 2]));
    // An address back after its removal is added again (a new replica to the channel).
    let (_, back) = resolve(&mut dns, found(&[1, 3, 4, 5]));
    assert_eq!((back.added, back.removed), (vec![1], vec![]));
    let counts = dns.counts();
    assert_eq!(
        (counts.added, counts.removed, counts.resolutions),
        (6, 2, 4)
    );
    assert!(dns.contains(&1) && !dns.contains(&2));
}

#[test]
fn a_failure_or_an_empty_answer_keeps_the_set_and_is_reported_once() {
    let t0 = Instant::now();
    let mut dns = refresh(2, t0);
    resolve(&mut dns, found(&[1, 2]));
    let mut health = Vec::new();
    for answer in [
        RefreshAnswer::Failed,
        found(&[]),
        RefreshAnswer::Failed,
        found(&[2]),
        found(&[2]),
    ] {
        let (_, update) = resolve(&mut dns, answer);
        health.push(update.health);
    }
    use RefreshHealth::*;
    assert_eq!(health, [Some(Failing), None, None, Some(Recovered), None]);
    assert_eq!(dns.records().copied().collect::<Vec<_>>(), [2]);
    assert_eq!(dns.counts().failures, 3);
}

#[test]
fn the_next_resolution_is_within_the_ttl_and_the_bounds() {
    let t0 = Instant::now();
    let mut dns = refresh(3, t0);
    for ttl_secs in [0, 1, 5, 3600] {
        for _ in 0..50 {
            let ttl = Duration::from_secs(ttl_secs);
            let (at, _) = resolve(
                &mut dns,
                RefreshAnswer::Found {
                    records: vec![1],
                    ttl,
                },
            );
            let wait = dns.due_at() - at;
            let config = RefreshConfig::default();
            let bound = ttl.clamp(config.min_interval, config.max_interval);
            // Where `min_interval` lifts the draw's start, the draw keeps its width.
            let top = bound.max(config.min_interval + bound / 2);
            assert!(wait <= top, "{wait:?} after a {ttl:?} TTL");
            assert!(wait >= config.min_interval.max(bound / 2), "{wait:?}");
        }
    }
}

#[test]
fn failures_back_off_from_the_min_interval_to_the_max() {
    let t0 = Instant::now();
    let mut dns = refresh(4, t0);
    resolve(&mut dns, found(&[1]));
    let mut waits = Vec::new();
    for _ in 0..8 {
        let (at, _) = resolve(&mut dns, RefreshAnswer::Failed);
        waits.push((dns.due_at() - at).as_secs_f64());
    }
    // 1 s, 2 s, 4 s, ... (each in its upper half; 1 s to 1.5 s for the first, where the
    // min interval lifts the draw), capped at 30 s.
    for (i, wait) in waits.iter().enumerate() {
        let interval = (1u64 << i).min(30) as f64;
        let top = interval.max(1.0 + interval / 2.0);
        assert!(
            *wait <= top && *wait >= (interval / 2.0).max(1.0),
            "{waits:?}"
        );
    }
}

#[test]
fn an_early_resolution_is_rate_limited_by_the_min_interval() {
    let t0 = Instant::now();
    let mut dns = refresh(5, t0);
    let (at, _) = resolve(&mut dns, found(&[1, 2]));
    assert!(dns.due_at() > at + Duration::from_secs(2));
    // A replica refuses right after the resolution: the next one is a min_interval later.
    assert!(dns.early_at(at + Duration::from_millis(10)));
    assert_eq!(dns.due_at(), at + Duration::from_secs(1));
    // Asking again changes nothing.
    assert!(!dns.early_at(at + Duration::from_millis(20)));
    // Later than that: at once.
    let later = at + Duration::from_secs(3);
    let mut dns = refresh(5, t0);
    resolve(&mut dns, found(&[1, 2]));
    if dns.due_at() > later {
        assert!(dns.early_at(later));
        assert_eq!(dns.due_at(), later);
    }
    // Not while a resolution is under way: its deadline stands.
    let t = dns.due_at();
    let deadline = dns.begin_at(t);
    assert!(!dns.early_at(t + Duration::from_millis(1)));
    assert_eq!(dns.due_at(), deadline);
}

#[test]
fn bad_settings_are_refused_with_the_field() {
    let bad = [
        RefreshConfig {
            min_interval: Duration::ZERO,
            ..RefreshConfig::default()
        },
        RefreshConfig {
            max_interval: Duration::from_millis(500),
            ..RefreshConfig::default()
        },
        RefreshConfig {
            jitter: f64::NAN,
            ..RefreshConfig::default()
        },
        RefreshConfig {
            timeout: Duration::ZERO,
            ..RefreshConfig::default()
        },
    ];
    for (config, field) in
        bad.into_iter()
            .zip(["min_interval", "max_interval", "jitter", "timeout"])
    {
        let err = Refresh::<u32>::new(config, Instant::now()).unwrap_err();
        assert!(err.to_string().contains(field), "{err}");
    }
}

/// 1,000 clients' resolvers started in the same instant (a deploy that restarts them all),
/// on a virtual clock, for 10 minutes, with a 5 s TTL: no second holds more than 3× the
/// mean query rate. The first queries, all at start, are the clients' own first
/// resolutions and are not counted (no timer can spread those).
#[test]
fn a_thousand_resolvers_spread_their_queries() {
    let (busiest, mean, total) = thousand_resolvers(TTL, Duration::from_secs(1), 0);
    assert!(
        f64::from(busiest) <= 3.0 * mean,
        "busiest second {busiest}, mean {mean:.0}/s"
    );
    // Every client asked at least once per TTL.
    assert!(total >= 1_000 * 600 / 5, "{total}");
}

/// The same at a 1 s TTL, where `min_interval` (1 s) is above the jittered share's start:
/// the draw still spreads the queries. A fifth of the TTL is the slot (a second was the
/// fifth of 5 s); from the 10th second on (the clients' first draws are still bunched
/// before that), no slot holds more than 2× the mean. Without the spread every query of a
/// round falls in one slot: 5× the mean.
#[test]
fn a_thousand_resolvers_spread_their_queries_at_the_shortest_ttl() {
    let ttl = Duration::from_secs(1);
    let (busiest, mean, total) = thousand_resolvers(ttl, Duration::from_millis(200), 50);
    assert!(
        f64::from(busiest) <= 2.0 * mean,
        "busiest 200 ms {busiest}, mean {mean:.0} per 200 ms"
    );
    // Never closer than `min_interval`, and at least every 1.5 s.
    assert!(total >= 1_000 * 590 * 2 / 3, "{total}");
}

/// 1,000 resolvers (seeds 0..1000) answered at once with `ttl` on a virtual clock for
/// 600 s, their queries counted per `slot` from slot `skip` on: the busiest slot, the mean
/// per slot, the total.
fn thousand_resolvers(ttl: Duration, slot: Duration, skip: usize) -> (u32, f64, usize) {
    const CLIENTS: u64 = 1_000;
    let slots = (Duration::from_secs(600).as_nanos() / slot.as_nanos()) as usize;
    let answer = || RefreshAnswer::Found {
        records: vec![1, 2, 3],
        ttl,
    };
    let t0 = Instant::now();
    let mut clients: Vec<Refresh<u32>> = (0..CLIENTS).map(|seed| refresh(seed, t0)).collect();
    let mut queue: BinaryHeap<Reverse<(Instant, usize)>> = BinaryHeap::new();
    for (i, dns) in clients.iter_mut().enumerate() {
        let at = dns.due_at();
        dns.begin_at(at);
        dns.answer_at(answer(), at);
        queue.push(Reverse((dns.due_at(), i)));
    }
    let mut per_slot = vec![0u32; slots];
    while let Some(Reverse((at, i))) = queue.pop() {
        let n = ((at - t0).as_nanos() / slot.as_nanos()) as usize;
        if n >= slots {
            break;
        }
        per_slot[n] += 1;
        let dns = &mut clients[i];
        let last = dns.due_at();
        dns.begin_at(at);
        dns.answer_at(answer(), at);
        assert!(
            dns.due_at() - last >= Duration::from_secs(1),
            "min_interval holds"
        );
        queue.push(Reverse((dns.due_at(), i)));
    }
    let counted = &per_slot[skip..];
    let total: u32 = counted.iter().sum();
    let mean = f64::from(total) / counted.len() as f64;
    let busiest = counted.iter().copied().max().unwrap();
    (busiest, mean, total as usize)
}
