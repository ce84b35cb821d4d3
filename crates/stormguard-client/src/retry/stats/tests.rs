use super::*;

#[test]
fn counts_from_many_threads_all_add_up() {
    let stats = RetryStats::new();
    let threads: Vec<_> = (0..2 * SHARDS + 3)
        .map(|_| {
            let stats = stats.clone();
            std::thread::spawn(move || {
                for _ in 0..100 {
                    stats.logical();
                    stats.attempt(false);
                    stats.refused(Refusal::Budget);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("counting thread");
    }
    let s = stats.snapshot();
    let n = (2 * SHARDS as u64 + 3) * 100;
    assert_eq!((s.logical, s.attempts, s.refused.budget), (n, n, n));
}

#[test]
fn clones_share_counters_and_refusals_land_in_their_own_slot() {
    let stats = RetryStats::new();
    let other = stats.clone();
    stats.logical();
    stats.attempt(false);
    other.attempt(true);
    for r in Refusal::ALL {
        other.refused(r);
    }
    other.refused(Refusal::Budget);
    let s = stats.snapshot();
    assert_eq!((s.logical, s.attempts, s.retries), (1, 2, 1));
    assert_eq!(s.amplification(), 2.0);
    let by_name: Vec<_> = s.refused.iter().collect();
    assert_eq!(by_name.len(), Refusal::ALL.len());
    for (name, n) in by_name {
        assert_eq!(n, if name == "budget" { 2 } else { 1 }, "{name}");
    }
}
