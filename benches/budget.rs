//! Retry budget hot path: stormguard's lock-free `RetryBudget` against tower's `TpsBudget`
//! (a `Mutex` per call), same parameters, same run.
//!
//! Each iteration is one deposit and one withdrawal through the convenience forms that
//! read the clock (`tokio::time::Instant::now()` for both). With two threads, both share
//! one budget and each does N pairs; the time reported is the wall time / N.
//!
//! Two extra groups attribute the cost: `clock` (two clock reads, the floor both budgets
//! pay) and `no_clock` (stormguard's `_at` forms with a fixed instant).
//!
//! Run: `cargo bench --bench budget`.

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant as StdInstant};

use criterion::{Criterion, criterion_group, criterion_main};
use stormguard_core::Instant;
use stormguard_core::{Budget, BudgetConfig, RetryBudget};
use tower::retry::budget::{Budget as TowerBudget, TpsBudget};

const TTL: Duration = Duration::from_secs(10);
const MIN_PER_SEC: u32 = 5;
const RATIO: f64 = 0.1;

fn stormguard() -> RetryBudget {
    RetryBudget::new(BudgetConfig {
        ttl: TTL,
        min_retries_per_second: MIN_PER_SEC,
        retry_ratio: RATIO,
        ..BudgetConfig::default()
    })
    .expect("valid bench config")
}

fn tower() -> TpsBudget {
    TpsBudget::new(TTL, MIN_PER_SEC, RATIO as f32)
}

// Through each trait by name: with `stormguard/tower-budget` on, `RetryBudget` implements
// tower's `Budget` too, and both traits call these methods `deposit` and `withdraw`.
fn stormguard_pair(b: &RetryBudget) -> bool {
    Budget::deposit(b);
    Budget::withdraw(b)
}

fn tower_pair(b: &TpsBudget) -> bool {
    TowerBudget::deposit(b);
    TowerBudget::withdraw(b)
}

/// Two threads each run `iters` pairs on the shared budget; returns the wall time.
fn two_threads<B: Send + Sync + 'static>(
    budget: &Arc<B>,
    iters: u64,
    pair: fn(&B) -> bool,
) -> Duration {
    let barrier = Arc::new(Barrier::new(3));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (budget, barrier) = (Arc::clone(budget), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                for _ in 0..iters {
                    black_box(pair(&budget));
                }
            })
        })
        .collect();
    barrier.wait();
    let start = StdInstant::now();
    for w in workers {
        w.join().expect("bench worker");
    }
    start.elapsed()
}

fn one_thread(c: &mut Criterion) {
    let mut group = c.benchmark_group("deposit+withdraw/1-thread");
    let sg = stormguard();
    group.bench_function("stormguard RetryBudget", |b| {
        b.iter(|| black_box(stormguard_pair(&sg)))
    });
    let tw = tower();
    group.bench_function("tower TpsBudget", |b| b.iter(|| black_box(tower_pair(&tw))));
    group.finish();
}

fn two_threads_shared(c: &mut Criterion) {
    let mut group = c.benchmark_group("deposit+withdraw/2-threads");
    let sg = Arc::new(stormguard());
    group.bench_function("stormguard RetryBudget", |b| {
        b.iter_custom(|iters| two_threads(&sg, iters, stormguard_pair))
    });
    let tw = Arc::new(tower());
    group.bench_function("tower TpsBudget", |b| {
        b.iter_custom(|iters| two_threads(&tw, iters, tower_pair))
    });
    group.finish();
}

/// Where the time goes: the clock alone, and stormguard without the clock.
fn attribution(c: &mut Criterion) {
    let mut group = c.benchmark_group("attribution/1-thread");
    group.bench_function("clock: 2x tokio Instant::now", |b| {
        b.iter(|| (black_box(Instant::now()), black_box(Instant::now())))
    });
    group.bench_function("clock: 2x std Instant::now", |b| {
        b.iter(|| (black_box(StdInstant::now()), black_box(StdInstant::now())))
    });
    let sg = stormguard();
    let now = Instant::now();
    group.bench_function("stormguard deposit_at+withdraw_at, no clock", |b| {
        b.iter(|| {
            sg.deposit_at(black_box(now));
            black_box(sg.withdraw_at(black_box(now)))
        })
    });
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = one_thread, two_threads_shared, attribution
}
criterion_main!(benches);
