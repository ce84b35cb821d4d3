#![allow(clippy::unwrap_used)]
use super::*;
use crate::admission::config::AdmissionConfig;
use crate::admission::config::{QueueOrder, RetryThreshold};
use crate::admission::limit::AdaptiveLimitConfig;
use proptest::prelude::*;

const MS: Duration = Duration::from_millis(1);

fn config(workers: usize, capacity: usize) -> AdmissionConfig {
    AdmissionConfig {
        workers: WorkerLimit::Fixed(workers),
        queue_capacity: capacity,
        retry_threshold: RetryThreshold {
            depth: Some(capacity / 2),
            queue_delay: None,
        },
        queue_order: QueueOrder::Fifo,
        max_time_queued: 100 * MS,
        min_time_left: 2 * MS,
        ..AdmissionConfig::default()
    }
}

fn queue(config: AdmissionConfig) -> AdmissionQueue<u32> {
    AdmissionQueue::new(AdmissionController::new(config).unwrap())
}

/// Everything reported to a sink, as (waiter, ran).
fn collect(into: &mut Vec<(u32, bool)>) -> impl FnMut(Dispatch<u32>) + '_ {
    |d| match d {
        Dispatch::Run(l) => into.push((l.waiter, true)),
        Dispatch::Expired(l) | Dispatch::Shed(l, _) => into.push((l.waiter, false)),
    }
}

fn none(_: Dispatch<u32>) {
    panic!("nothing should leave the queue here");
}

fn queued(a: Arrival) -> QueuedId {
    match a {
        Arrival::Queued { id, .. } => id,
        other => panic!("not queued: {other:?}"),
    }
}

#[test]
fn runs_up_to_the_limit_then_queues_then_sheds() {
    let mut q = queue(config(2, 4));
    let t0 = Instant::now();
    let first = AttemptClass::First;
    let retry = AttemptClass::Retry;
    assert_eq!(q.arrive_at(t0, first, None, 0, none), Arrival::Run);
    assert_eq!(q.arrive_at(t0, retry, None, 1, none), Arrival::Run);
    assert_eq!((q.running(), q.load().free_workers), (2, 0));
    queued(q.arrive_at(t0, first, None, 2, none));
    queued(q.arrive_at(t0, retry, None, 3, none));
    // Depth 2 is the retry threshold: retries are shed, first attempts still queue.
    let shed = q.arrive_at(t0, retry, None, 4, none);
    assert!(
        matches!(shed, Arrival::Shed(s) if s.reason == ShedReason::RetryThreshold),
        "{shed:?}"
    );
    queued(q.arrive_at(t0, first, None, 5, none));
    queued(q.arrive_at(t0, first, None, 6, none));
    let full = q.arrive_at(t0, first, None, 7, none);
    assert!(
        matches!(full, Arrival::Shed(s) if s.reason == ShedReason::QueueFull),
        "{full:?}"
    );
    assert_eq!(q.load().depth, 4);
}

#[test]
fn work_without_time_left_is_refused_even_with_a_worker_free() {
    let mut q = queue(config(2, 4));
    let t0 = Instant::now();
    let close = Some(t0 + MS);
    assert_eq!(
        q.arrive_at(t0, AttemptClass::First, close, 0, none),
        Arrival::Expired
    );
    assert_eq!(q.running(), 0);
    let ok = Some(t0 + 3 * MS);
    assert_eq!(
        q.arrive_at(t0, AttemptClass::First, ok, 1, none),
        Arrival::Run
    );
}

#[test]
fn a_freed_worker_goes_to_the_oldest_live_waiter_fifo() {
    let mut q = queue(config(1, 8));
    let t0 = Instant::now();
    q.arrive_at(t0, AttemptClass::First, None, 0, none);
    for i in 1..=3 {
        queued(q.arrive_at(t0 + i * MS, AttemptClass::First, None, i, none));
    }
    let mut out = Vec::new();
    q.finish_at(t0 + 10 * MS, t0, collect(&mut out));
    assert_eq!(out, [(1, true)]);
    assert_eq!((q.running(), q.load().depth), (1, 2));
}

#[test]
fn adaptive_lifo_serves_the_newest_while_deep() {
    let mut q = queue(AdmissionConfig {
        queue_order: QueueOrder::AdaptiveLifo { from_depth: 3 },
        ..config(1, 8)
    });
    let t0 = Instant::now();
    q.arrive_at(t0, AttemptClass::First, None, 0, none);
    for i in 1..=4 {
        queued(q.arrive_at(t0, AttemptClass::First, None, i, none));
    }
    let mut out = Vec::new();
    for _ in 0..4 {
        q.finish_at(t0 + MS, t0, collect(&mut out));
    }
    // Depths 4, 3: newest first; then 2, 1: oldest first.
    assert_eq!(out, [(4, true), (3, true), (1, true), (2, true)]);
}

#[test]
fn expired_waiters_are_not_load_and_never_get_a_worker() {
    // One worker, retries shed from 2 queued (capacity 4).
    let mut q = queue(config(1, 4));
    let t0 = Instant::now();
    q.arrive_at(t0, AttemptClass::First, None, 0, none);
    queued(q.arrive_at(t0, AttemptClass::First, None, 1, none));
    // Expires at 10 ms - 2 ms.
    queued(q.arrive_at(t0, AttemptClass::First, Some(t0 + 10 * MS), 2, none));
    // At 20 ms the second waiter's time is up: it is reported and the retry sees
    // depth 1, under the threshold.
    let mut out = Vec::new();
    let a = q.arrive_at(
        t0 + 20 * MS,
        AttemptClass::Retry,
        None,
        3,
        collect(&mut out),
    );
    queued(a);
    assert_eq!(out, [(2, false)]);
    // The worker goes to waiter 1, then 3.
    out.clear();
    q.finish_at(t0 + 30 * MS, t0, collect(&mut out));
    q.finish_at(t0 + 30 * MS, t0, collect(&mut out));
    assert_eq!(out, [(1, true), (3, true)]);
}

#[test]
fn expired_waiters_are_skipped_when_a_worker_frees_up() {
    let mut q = queue(config(1, 4));
    let t0 = Instant::now();
    q.arrive_at(t0, AttemptClass::First, None, 0, none);
    queued(q.arrive_at(t0, AttemptClass::First, Some(t0 + 5 * MS), 1, none));
    queued(q.arrive_at(t0, AttemptClass::First, None, 2, none));
    let mut out = Vec::new();
    q.finish_at(t0 + 4 * MS, t0, collect(&mut out));
    assert_eq!(out, [(1, false), (2, true)]);
    // max_time_queued (100 ms) applies without a deadline.
    let id = queued(q.arrive_at(t0 + 4 * MS, AttemptClass::First, None, 3, none));
    assert!(q.is_waiting(id));
    out.clear();
    q.expire_due_at(t0 + 103 * MS, collect(&mut out));
    assert!(out.is_empty());
    q.expire_due_at(t0 + 104 * MS, collect(&mut out));
    assert_eq!(out, [(3, false)]);
    assert!(!q.is_waiting(id));
}

#[test]
fn withdrawn_waiters_leave_and_given_back_workers_move_on() {
    let mut q = queue(config(1, 4));
    let t0 = Instant::now();
    q.arrive_at(t0, AttemptClass::First, None, 0, none);
    let a = queued(q.arrive_at(t0, AttemptClass::First, None, 1, none));
    queued(q.arrive_at(t0, AttemptClass::First, None, 2, none));
    let left = q.withdraw_at(t0 + 3 * MS, a).unwrap();
    assert_eq!((left.waiter, left.waited), (1, 3 * MS));
    assert!(q.withdraw_at(t0 + 3 * MS, a).is_none());
    // The running call finishes; waiter 2 is handed the worker but never uses it.
    let mut out = Vec::new();
    q.finish_at(t0 + 5 * MS, t0, collect(&mut out));
    assert_eq!(out, [(2, true)]);
    assert!(q.policy().completion_rate().mean_gap_at(t0).is_none());
    q.give_back_at(t0 + 6 * MS, none);
    assert_eq!(
        (q.running(), q.load().free_workers, q.load().depth),
        (0, 1, 0)
    );
    // One completion so far: a give-back is not one.
    q.arrive_at(t0 + 7 * MS, AttemptClass::First, None, 3, none);
    q.finish_at(t0 + 9 * MS, t0, none);
    assert_eq!(
        q.policy().completion_rate().mean_gap_at(t0 + 9 * MS),
        Some(4 * MS)
    );
}

#[test]
fn the_worker_limit_changes_at_run_time() {
    let mut q = queue(config(1, 8));
    let t0 = Instant::now();
    q.arrive_at(t0, AttemptClass::First, None, 0, none);
    for i in 1..=4 {
        queued(q.arrive_at(t0, AttemptClass::First, None, i, none));
    }
    // Raised to 3: two waiters run at once.
    let mut out = Vec::new();
    q.set_worker_limit_at(t0 + MS, NonZeroUsize::new(3).unwrap(), collect(&mut out));
    assert_eq!(out, [(1, true), (2, true)]);
    assert_eq!((q.worker_limit(), q.running(), q.load().depth), (3, 3, 2));
    // Lowered to 1: nothing stops, and finishing calls hand out no worker until
    // fewer than one runs.
    q.set_worker_limit_at(t0 + MS, NonZeroUsize::MIN, none);
    q.finish_at(t0 + 2 * MS, t0, none);
    q.finish_at(t0 + 3 * MS, t0, none);
    assert_eq!(
        (q.running(), q.load().free_workers, q.load().depth),
        (1, 0, 2)
    );
    out.clear();
    q.finish_at(t0 + 4 * MS, t0, collect(&mut out));
    assert_eq!(out, [(3, true)]);
    // A new arrival queues behind the remaining waiter: no free worker.
    queued(q.arrive_at(t0 + 4 * MS, AttemptClass::First, None, 5, none));
}

fn class(attempt: AttemptClass, criticality: Criticality) -> CallClass {
    CallClass::new(attempt, criticality)
}

#[test]
fn sheddable_work_is_shed_first_then_retries_then_the_rest() {
    // Retries shed from 2 queued; sheddable as soon as no worker is free.
    let mut q = queue(config(1, 4));
    let t0 = Instant::now();
    let shed = |a: Arrival| match a {
        Arrival::Shed(s) => s.reason,
        other => panic!("not shed: {other:?}"),
    };
    let (first, retry) = (AttemptClass::First, AttemptClass::Retry);
    let sheddable = class(first, Criticality::Sheddable);
    let critical = class(first, Criticality::Critical);
    // A free worker: even sheddable work runs.
    assert_eq!(q.arrive_at(t0, sheddable, None, 0, none), Arrival::Run);
    // No worker free, nothing queued: sheddable is shed, a retry still queues.
    assert_eq!(
        shed(q.arrive_at(t0, sheddable, None, 1, none)),
        ShedReason::Sheddable
    );
    queued(q.arrive_at(t0, retry, None, 2, none));
    queued(q.arrive_at(t0, class(retry, Criticality::Critical), None, 3, none));
    // Depth 2: retries are shed, critical or not; first attempts queue.
    assert_eq!(
        shed(q.arrive_at(t0, class(retry, Criticality::Critical), None, 4, none)),
        ShedReason::RetryThreshold
    );
    queued(q.arrive_at(t0, first, None, 5, none));
    queued(q.arrive_at(t0, first, None, 6, none));
    assert_eq!(q.load().depth, 4);
    // Full. Between calls of one criticality nothing gives way.
    assert_eq!(
        shed(q.arrive_at(t0, first, None, 7, none)),
        ShedReason::QueueFull
    );
    // A critical call takes the place of the lowest-ranked waiter of a lower
    // criticality: the default retry (2); the critical retry (3) is not one, so then
    // the oldest default first attempt (5), then the next (6).
    for (i, want) in [(8, 2), (9, 5), (10, 6)] {
        let mut out = Vec::new();
        queued(q.arrive_at(t0, critical, None, i, collect(&mut out)));
        assert_eq!(out, [(want, false)]);
    }
    // Now only critical calls wait: a critical arrival is shed like any other.
    assert_eq!(
        shed(q.arrive_at(t0, critical, None, 11, none)),
        ShedReason::QueueFull
    );
    assert_eq!(q.load().depth, 4);
    let mut out = Vec::new();
    for _ in 0..5 {
        q.finish_at(t0 + MS, t0, collect(&mut out));
    }
    assert_eq!(out, [(3, true), (8, true), (9, true), (10, true)]);
}

#[test]
fn a_displaced_waiter_is_told_when_to_come_back() {
    // Sheddable work may queue here: its threshold is off.
    let mut q = queue(AdmissionConfig {
        sheddable_threshold: RetryThreshold {
            depth: None,
            queue_delay: None,
        },
        ..config(1, 2)
    });
    let t0 = Instant::now();
    let sheddable = |a| class(a, Criticality::Sheddable);
    q.arrive_at(t0, AttemptClass::First, None, 0, none);
    queued(q.arrive_at(t0, sheddable(AttemptClass::First), None, 1, none));
    queued(q.arrive_at(t0, AttemptClass::First, None, 2, none));
    let mut seen = Vec::new();
    queued(q.arrive_at(t0 + MS, AttemptClass::First, None, 3, |d| seen.push(d)));
    match seen.as_slice() {
        [Dispatch::Shed(left, shed)] => {
            assert_eq!((left.waiter, left.waited), (1, MS));
            assert_eq!(left.class, sheddable(AttemptClass::First));
            assert_eq!(shed.reason, ShedReason::Sheddable);
            assert!(shed.pushback.millis() >= 1);
        }
        other => panic!("{other:?}"),
    }
    // The displaced waiter never gets a worker.
    let mut out = Vec::new();
    q.finish_at(t0 + 2 * MS, t0, collect(&mut out));
    q.finish_at(t0 + 3 * MS, t0, collect(&mut out));
    assert_eq!(out, [(2, true), (3, true)]);
}

#[test]
fn an_adaptive_limit_is_fed_by_finishing_calls() {
    let mut q = queue(AdmissionConfig {
        workers: WorkerLimit::Adaptive(AdaptiveLimitConfig {
            initial_limit: 8,
            min_limit: 2,
            max_limit: 64,
            min_window_samples: 4,
            ..AdaptiveLimitConfig::default()
        }),
        ..config(8, 64)
    });
    assert_eq!(q.worker_limit(), 8);
    let t0 = Instant::now();
    for i in 0..8 {
        assert_eq!(
            q.arrive_at(t0, AttemptClass::First, None, i, none),
            Arrival::Run
        );
    }
    for i in 8..20 {
        queued(q.arrive_at(t0, AttemptClass::First, None, i, none));
    }
    // The first finish starts a probe: the limit drops to the floor and no waiter
    // gets the freed worker.
    q.finish_at(t0 + 10 * MS, t0, none);
    assert_eq!(q.worker_limit(), 2);
    assert!(q.adaptive.as_ref().unwrap().probing());
    // Calls drain to the floor; then 4 clean calls of 10 ms measure the no-load
    // latency and the limit returns to 8.
    let mut now = t0 + 10 * MS;
    for _ in 0..5 {
        q.finish_at(now, t0, none);
    }
    assert_eq!(q.running(), 2);
    // Two calls that started before the floor was reached: not clean samples.
    let mut out = Vec::new();
    q.finish_at(now, t0, collect(&mut out));
    q.finish_at(now, t0, collect(&mut out));
    assert_eq!(out, [(8, true), (9, true)]);
    assert!(q.adaptive.as_ref().unwrap().probing());
    // Four clean ones (two rounds of two) end the probe; the limit is back at 8 and
    // the freed workers go to waiters at once.
    for _ in 0..2 {
        now += 10 * MS;
        q.finish_at(now, now - 10 * MS, |_| {});
        q.finish_at(now, now - 10 * MS, |_| {});
    }
    assert!(!q.adaptive.as_ref().unwrap().probing());
    assert_eq!(q.min_latency(), Some(10 * MS));
    assert_eq!(q.worker_limit(), 8);
    assert_eq!(q.running(), 8);
}

#[derive(Clone, Debug)]
enum Op {
    Arrive {
        retry: bool,
        deadline_ms: Option<u64>,
        criticality: Criticality,
    },
    Finish,
    Withdraw(usize),
    GiveBack,
    Limit(usize),
    Wait(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<bool>(), proptest::option::of(0u64..60), 0usize..3)
            .prop_map(|(retry, deadline_ms, c)| Op::Arrive {
                retry,
                deadline_ms,
                criticality: Criticality::ALL[c],
            }),
        2 => Just(Op::Finish),
        1 => (0usize..16).prop_map(Op::Withdraw),
        1 => Just(Op::GiveBack),
        1 => (1usize..6).prop_map(Op::Limit),
        2 => (0u64..30).prop_map(Op::Wait),
    ]
}

proptest! {
    /// Whatever the driver does: the queue never exceeds its capacity, never leaves a
    /// worker free while someone waits, never keeps a waiter past its expiry after
    /// an operation, and every queued call leaves exactly once.
    #[test]
    fn invariants_hold(ops in proptest::collection::vec(op(), 1..200), lifo in any::<bool>()) {
        let mut q = queue(AdmissionConfig {
            queue_order: if lifo {
                QueueOrder::AdaptiveLifo { from_depth: 3 }
            } else {
                QueueOrder::Fifo
            },
            max_time_queued: 40 * MS,
            ..config(2, 6)
        });
        let mut now = Instant::now();
        let mut queued_ids: Vec<QueuedId> = Vec::new();
        let mut expiries = std::collections::HashMap::new();
        let mut left = std::collections::HashSet::new();
        let mut granted = 0usize;
        for op in ops {
            // Operations that take a sink take the expired waiters out first.
            let mut purged = matches!(op, Op::Arrive { .. } | Op::Limit(_));
            let mut seen = Vec::new();
            let mut sink = |d: Dispatch<u32>| seen.push(d);
            match op {
                Op::Arrive { retry, deadline_ms, criticality } => {
                    let attempt = if retry { AttemptClass::Retry } else { AttemptClass::First };
                    let class = CallClass::new(attempt, criticality);
                    let deadline = deadline_ms.map(|d| now + Duration::from_millis(d));
                    let before = q.load().depth;
                    match q.arrive_at(now, class, deadline, 0, &mut sink) {
                        Arrival::Queued { id, expiry } => {
                            prop_assert!(expiry > now);
                            queued_ids.push(id);
                            expiries.insert(id, expiry);
                        }
                        Arrival::Expired => {
                            prop_assert!(deadline.is_some_and(|d| d <= now + 2 * MS));
                        }
                        Arrival::Run | Arrival::Shed(_) => {}
                    }
                    prop_assert!(q.load().depth <= before + 1);
                }
                Op::Finish => {
                    if q.running() > 0 {
                        purged = true;
                        q.finish_at(now, now, &mut sink);
                    }
                }
                Op::Withdraw(i) => {
                    if let Some(&id) = queued_ids.get(i)
                        && let Some(l) = q.withdraw_at(now, id)
                    {
                        prop_assert!(left.insert(l.id), "left twice: {:?}", l.id);
                    }
                }
                Op::GiveBack => {
                    if granted > 0 && q.running() > 0 {
                        granted -= 1;
                        purged = true;
                        q.give_back_at(now, &mut sink);
                    }
                }
                Op::Limit(n) => {
                    q.set_worker_limit_at(now, NonZeroUsize::new(n).unwrap(), &mut sink);
                }
                Op::Wait(ms) => now += Duration::from_millis(ms),
            }
            for d in seen {
                let l = match d {
                    Dispatch::Run(l) => {
                        granted += 1;
                        prop_assert!(expiries[&l.id] > now, "ran after its expiry");
                        l
                    }
                    Dispatch::Expired(l) => {
                        prop_assert!(expiries[&l.id] <= now, "expired early");
                        l
                    }
                    Dispatch::Shed(l, shed) => {
                        prop_assert_eq!(shed.reason, ShedReason::Sheddable);
                        l
                    }
                };
                prop_assert!(left.insert(l.id), "left twice: {:?}", l.id);
            }
            prop_assert!(q.load().depth <= 6);
            if q.load().free_workers > 0 {
                prop_assert_eq!(q.load().depth, 0);
            }
            if purged {
                let first = q.by_expiry.first().map(|(e, _)| *e);
                prop_assert!(first.is_none_or(|e| e > now), "an expired waiter stayed");
            }
            prop_assert_eq!(q.by_expiry.len(), q.waiting.len());
        }
    }
}
