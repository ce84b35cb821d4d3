#![allow(clippy::unwrap_used)]
use super::*;
use proptest::prelude::*;

/// The digest of the message every call in these tests carries.
fn fp() -> Digest {
    Digest::of([b"the message".as_slice()])
}

fn config(max_entries: usize, max_bytes: usize, max_record_bytes: usize) -> IdempotencyConfig {
    IdempotencyConfig {
        max_entries,
        max_bytes,
        max_record_bytes,
        ..IdempotencyConfig::default()
    }
}

#[test]
fn a_key_runs_once_then_answers_from_the_record() {
    let mut t = DedupTable::new(IdempotencyConfig::default()).unwrap();
    let now = Instant::now();
    assert!(matches!(t.begin_at("k", fp(), now), Begin::New));
    assert!(matches!(t.begin_at("k", fp(), now), Begin::InFlight));
    assert!(t.complete_at("k", fp(), 7u32, 4, now));
    assert!(matches!(t.begin_at("k", fp(), now), Begin::Completed(a) if *a == 7));
    assert_eq!(t.counts().bytes, 4);
    // A completed key is not abandoned.
    t.abandon("k", fp());
    assert!(matches!(t.begin_at("k", fp(), now), Begin::Completed(_)));
}

#[test]
fn a_key_with_another_message_is_a_mismatch_never_the_holder_s_answer() {
    let mut t = DedupTable::<String, u32>::new(IdempotencyConfig::default()).unwrap();
    let now = Instant::now();
    let other = Digest::of([b"another message".as_slice()]);
    assert!(matches!(t.begin_at("k", fp(), now), Begin::New));
    assert!(
        matches!(t.begin_at("k", other, now), Begin::Mismatch),
        "in flight"
    );
    // A call of the other message can neither release nor fill the holder's entry.
    t.abandon("k", other);
    assert!(!t.complete_at("k", other, 9, 4, now));
    assert!(matches!(t.begin_at("k", fp(), now), Begin::InFlight));
    assert!(t.complete_at("k", fp(), 7, 4, now));
    assert!(
        matches!(t.begin_at("k", other, now), Begin::Mismatch),
        "completed"
    );
    assert!(matches!(t.begin_at("k", fp(), now), Begin::Completed(a) if *a == 7));
    assert_eq!(t.counts().entries, 1);
}

#[test]
fn an_abandoned_key_runs_again() {
    let mut t = DedupTable::<String, u32>::new(IdempotencyConfig::default()).unwrap();
    let now = Instant::now();
    assert!(matches!(t.begin_at("k", fp(), now), Begin::New));
    t.abandon("k", fp());
    assert!(matches!(t.begin_at("k", fp(), now), Begin::New));
    assert_eq!(t.counts().entries, 1);
}

#[test]
fn the_oldest_entry_goes_when_the_record_is_full() {
    let mut t = DedupTable::new(config(3, 1000, 100)).unwrap();
    let now = Instant::now();
    for k in ["a", "b", "c"] {
        assert!(matches!(t.begin_at(k, fp(), now), Begin::New));
        t.complete_at(k, fp(), k.to_owned(), 1, now);
    }
    assert!(matches!(t.begin_at("d", fp(), now), Begin::New));
    assert_eq!(t.counts().entries, 3);
    assert_eq!(t.counts().evictions, 1);
    assert!(
        matches!(t.begin_at("a", fp(), now), Begin::New),
        "a was evicted"
    );
    assert!(matches!(t.begin_at("c", fp(), now), Begin::Completed(_)));
}

#[test]
fn bytes_are_bounded_in_total_and_per_answer() {
    let mut t = DedupTable::new(config(100, 10, 4)).unwrap();
    let now = Instant::now();
    assert!(matches!(t.begin_at("big", fp(), now), Begin::New));
    assert!(
        !t.complete_at("big", fp(), (), 5, now),
        "over max_record_bytes"
    );
    assert!(
        matches!(t.begin_at("big", fp(), now), Begin::New),
        "not kept: runs again"
    );
    // The server's own small answer is kept past the bound on one answer.
    t.record_at("big", fp(), (), 5, now);
    assert!(matches!(t.begin_at("big", fp(), now), Begin::Completed(_)));
    for k in ["a", "b", "c"] {
        t.begin_at(k, fp(), now);
        assert!(t.complete_at(k, fp(), (), 4, now));
    }
    let c = t.counts();
    assert!(c.bytes <= 10, "{c:?}");
    assert!(
        matches!(t.begin_at("a", fp(), now), Begin::New),
        "oldest evicted for bytes"
    );
    assert!(matches!(t.begin_at("c", fp(), now), Begin::Completed(_)));
}

#[test]
fn keys_expire_after_their_time_to_live() {
    let mut t = DedupTable::new(IdempotencyConfig {
        ttl: Duration::from_secs(10),
        ..IdempotencyConfig::default()
    })
    .unwrap();
    let t0 = Instant::now();
    t.begin_at("k", fp(), t0);
    t.complete_at("k", fp(), (), 1, t0);
    let almost = t0 + Duration::from_millis(9_999);
    assert!(matches!(t.begin_at("k", fp(), almost), Begin::Completed(_)));
    assert!(matches!(
        t.begin_at("k", fp(), t0 + Duration::from_secs(10)),
        Begin::New
    ));
    assert_eq!(t.counts().expired, 1);
    assert_eq!(t.counts().bytes, 0);
}

#[test]
fn validation_names_the_field() {
    let field = |c: IdempotencyConfig| match c.validate() {
        Err(ConfigError::Invalid { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(field(config(0, 10, 1)), "idempotency.max_entries");
    assert_eq!(field(config(1, 10, 11)), "idempotency.max_record_bytes");
    assert_eq!(field(config(1, 10, 0)), "idempotency.max_record_bytes");
    let c = IdempotencyConfig {
        ttl: Duration::ZERO,
        ..IdempotencyConfig::default()
    };
    assert_eq!(field(c), "idempotency.ttl");
}

proptest! {
    /// Whatever the calls, every bound holds after each one, and the bytes counted
    /// are the bytes held.
    #[test]
    fn bounds_always_hold(ops in proptest::collection::vec((0u8..4, 0u8..12, 0usize..8, 0u64..30), 1..200)) {
        let cfg = IdempotencyConfig {
            ttl: Duration::from_secs(20),
            ..config(5, 16, 6)
        };
        let mut t = DedupTable::new(cfg).unwrap();
        let t0 = Instant::now();
        let mut clock = 0u64;
        for (op, key, bytes, step) in ops {
            clock += step;
            let now = t0 + Duration::from_secs(clock);
            let key = format!("k{key}");
            match op {
                0 => { t.begin_at(&key, fp(), now); }
                1 => { t.complete_at(&key, fp(), (), bytes, now); }
                2 => t.abandon(&key, fp()),
                _ => { t.record_at(&key, fp(), (), bytes, now); }
            }
            let c = t.counts();
            prop_assert!(c.entries <= 5);
            prop_assert!(c.bytes <= 16);
            let held: usize = t.entries.values().map(|e| match e.state {
                State::Done { bytes, .. } => bytes,
                State::InFlight => 0,
            }).sum();
            prop_assert_eq!(held, c.bytes);
            // Memory is bounded: stale items are dropped as keys come in.
            prop_assert!(t.order.len() <= 2 * 5 + 17);
        }
    }
}
