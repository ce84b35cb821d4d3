#![allow(clippy::unwrap_used)]
use super::*;
use stormguard_core::{RetryThreshold, WorkerLimit};

const MS: Duration = Duration::from_millis(1);

fn one_worker(depth: Option<usize>) -> SimServer {
    SimServer::shedding(AdmissionConfig {
        workers: WorkerLimit::Fixed(1),
        queue_capacity: 8,
        retry_threshold: RetryThreshold {
            depth,
            queue_delay: None,
        },
        min_time_left: 2 * MS,
        ..AdmissionConfig::default()
    })
    .unwrap()
}

fn job(n: u32) -> Job {
    Job {
        slot: n,
        id: n.into(),
    }
}

#[test]
fn work_expired_on_arrival_is_answered_at_once_even_with_a_worker_free() {
    // The server's check, which the simulator used to lack: 1 ms left, under
    // min_time_left, is refused whether or not a worker is free.
    let mut s = one_worker(None);
    let t0 = Instant::now();
    let mut out = Vec::new();
    s.arrive(t0, job(0), AttemptClass::First, Some(t0 + MS), &mut out);
    assert_eq!(out, [ServerAction::Expired(job(0))]);
    assert_eq!((s.running(), s.depth()), (0, 0));
}

#[test]
fn expired_work_behind_live_work_is_not_counted_as_depth() {
    // Retries shed from 2 queued. A (no deadline) and B (10 ms) queue behind the
    // running call; 20 ms later B has expired behind A, so a retry sees depth 1.
    let mut s = one_worker(Some(2));
    let t0 = Instant::now();
    let mut out = Vec::new();
    s.arrive(t0, job(0), AttemptClass::First, None, &mut out);
    s.arrive(t0, job(1), AttemptClass::First, None, &mut out);
    s.arrive(
        t0,
        job(2),
        AttemptClass::First,
        Some(t0 + 10 * MS),
        &mut out,
    );
    assert_eq!(s.depth(), 2);
    out.clear();
    let later = t0 + 20 * MS;
    s.arrive(
        later,
        job(3),
        AttemptClass::Retry,
        Some(later + 500 * MS),
        &mut out,
    );
    assert!(
        matches!(
            out.as_slice(),
            [ServerAction::Expired(b), ServerAction::Queued(r, _)] if *b == job(2) && *r == job(3)
        ),
        "{out:?}"
    );
    // Its timer, firing late, finds nothing to do.
    out.clear();
    s.timer(later, job(2), &mut out);
    assert!(out.is_empty());
}

#[test]
fn a_cancelled_running_job_frees_its_worker_and_its_end_is_ignored() {
    let mut s = one_worker(None);
    let t0 = Instant::now();
    let mut out = Vec::new();
    s.arrive(t0, job(0), AttemptClass::First, None, &mut out);
    s.arrive(t0, job(1), AttemptClass::First, None, &mut out);
    s.arrive(t0, job(2), AttemptClass::First, None, &mut out);
    out.clear();
    // Job 1 leaves the queue; job 0's caller leaves mid-run: the worker goes to 2.
    s.cancel(t0 + MS, job(1), &mut out);
    assert!(out.is_empty());
    s.cancel(t0 + 2 * MS, job(0), &mut out);
    assert_eq!(out, [ServerAction::Start(job(2))]);
    out.clear();
    assert!(!s.done(t0 + 10 * MS, job(0), &mut out));
    assert!(s.done(t0 + 10 * MS, job(2), &mut out));
    assert!(out.is_empty());
    assert_eq!((s.running(), s.depth()), (0, 0));
}

#[test]
fn a_running_job_is_cut_at_cut_at_and_its_worker_goes_to_the_next() {
    // Job 0 (deadline 10 ms) runs, job 1 waits. At `cut_at` (10 ms less the 2 ms of
    // `min_time_left`) job 0 is cut and the worker goes to job 1; its end is ignored.
    let mut s = one_worker(None);
    let t0 = Instant::now();
    let mut out = Vec::new();
    s.arrive(
        t0,
        job(0),
        AttemptClass::First,
        Some(t0 + 10 * MS),
        &mut out,
    );
    s.arrive(t0, job(1), AttemptClass::First, None, &mut out);
    assert_eq!(s.cut_at(job(0)), Some(t0 + 8 * MS));
    assert_eq!(s.cut_at(job(1)), None, "waiting, and without a deadline");
    out.clear();
    assert!(!s.cut(t0 + 7 * MS, job(0), &mut out), "not yet");
    assert!(s.cut(t0 + 8 * MS, job(0), &mut out));
    assert_eq!(out, [ServerAction::Start(job(1))]);
    assert_eq!(s.cut_at(job(0)), None);
    out.clear();
    assert!(!s.done(t0 + 10 * MS, job(0), &mut out));
    assert!(
        !s.cut(t0 + 10 * MS, job(1), &mut out),
        "no deadline: never cut"
    );
    assert!(s.done(t0 + 18 * MS, job(1), &mut out));
    assert_eq!((s.running(), s.depth()), (0, 0));
}

#[test]
fn a_job_that_waited_is_cut_at_its_own_deadline_once_it_runs() {
    let mut s = one_worker(None);
    let t0 = Instant::now();
    let mut out = Vec::new();
    s.arrive(t0, job(0), AttemptClass::First, None, &mut out);
    s.arrive(
        t0,
        job(1),
        AttemptClass::First,
        Some(t0 + 50 * MS),
        &mut out,
    );
    assert_eq!(s.cut_at(job(1)), None, "waiting");
    out.clear();
    assert!(s.done(t0 + 10 * MS, job(0), &mut out));
    assert_eq!(out, [ServerAction::Start(job(1))]);
    assert_eq!(s.cut_at(job(1)), Some(t0 + 48 * MS));
    out.clear();
    assert!(s.cut(t0 + 48 * MS, job(1), &mut out));
    assert!(out.is_empty());
    assert_eq!((s.running(), s.depth()), (0, 0));
}

#[test]
fn a_cancelling_plain_server_drops_the_work_of_callers_that_reset() {
    let mut s = SimServer::plain_cancelling(1, 2);
    let t0 = Instant::now();
    let mut out = Vec::new();
    for n in 0..3 {
        s.arrive(t0, job(n), AttemptClass::First, None, &mut out);
    }
    assert_eq!(out, [ServerAction::Start(job(0))]);
    out.clear();
    // A waiting job leaves the queue without running.
    s.cancel(t0, job(1), &mut out);
    assert!(out.is_empty());
    assert_eq!((s.running(), s.depth()), (1, 1));
    // A running one gives its worker to the next in line; its end is ignored.
    s.cancel(t0 + MS, job(0), &mut out);
    assert_eq!(out, [ServerAction::Start(job(2))]);
    out.clear();
    assert!(!s.done(t0 + 10 * MS, job(0), &mut out));
    assert!(out.is_empty());
    assert_eq!((s.running(), s.depth()), (1, 0));
    assert!(s.done(t0 + 11 * MS, job(2), &mut out));
    assert_eq!((s.running(), s.depth()), (0, 0));
}

#[test]
fn a_plain_server_queues_refuses_and_ignores_cancels() {
    let mut s = SimServer::plain(1, 1);
    let t0 = Instant::now();
    let mut out = Vec::new();
    s.arrive(t0, job(0), AttemptClass::Retry, None, &mut out);
    s.arrive(t0, job(1), AttemptClass::Retry, Some(t0), &mut out);
    s.arrive(t0, job(2), AttemptClass::First, None, &mut out);
    s.cancel(t0, job(1), &mut out);
    assert_eq!(
        out,
        [ServerAction::Start(job(0)), ServerAction::Refused(job(2))]
    );
    out.clear();
    assert!(s.done(t0 + MS, job(0), &mut out));
    assert_eq!(out, [ServerAction::Start(job(1))]);
}
