//! Deterministic network faults with the real layers: tonic servers behind the `ShedLayer`
//! and tonic clients behind the `RetryLayer` on turmoil's simulated network (virtual time,
//! one seed per scenario), with a partition, held messages, a crashed and restarted server,
//! and a latency spike on one of two replicas.
//!
//! Every scenario asserts, counted (see `faults_support`):
//!
//! - every logical call ends exactly once, with a status, no later than its deadline plus
//!   10 ms of virtual time (none missing when the simulation ends, none recorded twice);
//! - no non-idempotent call runs twice: the servers count handler entries per `request_id`,
//!   and the writes (a layer whose config does not mark `Reserve` idempotent) have none
//!   beyond the first; the idempotent calls' repeats are counted, not asserted;
//! - no keyed write commits twice: the keyed writes (`Reserve` not idempotent but keyed,
//!   through a third layer; the servers with an `IdempotencyLayer` over a store that
//!   outlives their crashes, and losing 5 % of these calls' answers after the handler
//!   ran) have no handler run that answered beyond the first per call; they were retried,
//!   and outside the fault's span they succeed at least as often as the unkeyed writes
//!   (over the whole run too, but in the partition, see `faults_support`);
//! - after the fault and a quiet period longer than the budget's window: each layer's budget
//!   is back at its standing reserve, each breaker closed, each replica active, each server's
//!   queue empty with every worker free and no request body drain left, and every host runs
//!   as many tasks as before the fault;
//! - two runs of the same seed give the same figures.
//!
//! The clients use HTTP/2 keepalive and a connect timeout as a production client would:
//! turmoil's TCP does not retransmit what a partition dropped, so only keepalive finds a
//! connection broken by one (see `faults_support`). `docs/faults.md` has the figures.
#![allow(clippy::unwrap_used)]

use crate::faults_support;

use std::time::Duration;

use faults_support::{
    Fault, Figures, Kind, Run, Target, World, add_client, add_server, assert_guarantees,
    assert_keyed_ok_at_least_unkeyed, drive, sim,
};

/// Runs one scenario on `seed`: builds the hosts, applies `faults`, and returns what it
/// measured.
fn run(
    seed: u64,
    servers: &[(&'static str, Duration)],
    target: Target,
    faults: &[(u64, Fault)],
) -> Run {
    let world = World::new(seed);
    let mut sim = sim(seed);
    for (host, service_time) in servers {
        add_server(&mut sim, host, &world, *service_time, seed);
    }
    add_client(&mut sim, &world, target, seed);
    let faults = faults
        .iter()
        .map(|(ms, f)| (Duration::from_millis(*ms), f.clone()))
        .collect();
    drive(&mut sim, faults);
    Run::take(&world)
}

/// Runs the scenario twice on its seed, asserts the guarantees on the first run and equal
/// figures on both, and returns the figures.
fn scenario(
    name: &str,
    seed: u64,
    servers: &[(&'static str, Duration)],
    target: Target,
    faults: &[(u64, Fault)],
) -> Figures {
    let first = run(seed, servers, target.clone(), faults);
    assert_guarantees(name, &first);
    let figures = first.figures();
    let again = run(seed, servers, target, faults).figures();
    assert_eq!(figures, again, "{name}: the same seed gave other figures");
    println!("{name} (seed {seed}): {figures:#?}");
    print!("{}", figures.rows(name, seed));
    figures
}

fn failed(figures: &Figures, kind: Kind) -> u64 {
    let k = figures.kind(kind);
    k.calls - k.codes.get("OK").copied().unwrap_or(0)
}

/// A partition between the client and the server from 1 s to 2 s, calls going on through
/// it. The connection it broke is found by keepalive and replaced after the repair.
#[test]
fn partition_then_repair() {
    let f = scenario(
        "partition",
        21,
        &[("server", Duration::from_millis(5))],
        Target::One("server"),
        &[
            (1000, Fault::Partition("client", "server")),
            (2000, Fault::Repair("client", "server")),
        ],
    );
    // The fault bit: calls of both kinds failed during it, and none ran twice.
    assert!(
        failed(&f, Kind::Write) > 0 && failed(&f, Kind::Idempotent) > 0,
        "{f:#?}"
    );
}

/// Every message between the client and the server held from 1 s to 1.25 s (longer than
/// the 100 ms per-attempt timeout), then released: the held requests reach the server
/// after their callers gave up on them.
#[test]
fn held_messages_released_after_the_callers_gave_up() {
    let f = scenario(
        "hold",
        22,
        &[("server", Duration::from_millis(5))],
        Target::One("server"),
        &[
            (1000, Fault::Hold("client", "server")),
            (1250, Fault::Release("client", "server")),
        ],
    );
    let w = f.kind(Kind::Write);
    // The fault bit: writes ran after their callers had their answer; never twice.
    assert!(w.executed_after_end > 0, "{f:#?}");
    assert!(w.refused_not_idempotent > 0, "{f:#?}");
    // The same fault on keyed writes: retried, run once, answered.
    assert_keyed_ok_at_least_unkeyed("hold", &f);
}

/// The server host crashed with calls in flight (50 ms each), twice: at 1 s, restarted
/// 50 ms later (retries would reach the new process within their deadline), and at 2 s,
/// restarted 500 ms later (longer than a call's deadline).
#[test]
fn server_crashed_mid_call_and_restarted() {
    let f = scenario(
        "crash",
        23,
        &[("server", Duration::from_millis(50))],
        Target::One("server"),
        &[
            (1000, Fault::Crash("server")),
            (1050, Fault::Bounce("server")),
            (2000, Fault::Crash("server")),
            (2500, Fault::Bounce("server")),
        ],
    );
    assert_eq!(f.servers["server"].boots, 3, "{f:#?}");
    // Mid-call: writes ran on a server that crashed before answering; their callers got a
    // failure, and they were not repeated.
    let w = f.kind(Kind::Write);
    assert!(w.executed > w.codes["OK"], "{f:#?}");
    assert_keyed_ok_at_least_unkeyed("crash", &f);
}

/// Two replicas behind the endpoint-aware channel; from 1 s to 2 s every message to and
/// from `replica-b` takes 400 ms, beyond the calls' 300 ms deadline.
#[test]
fn latency_spike_on_one_of_two_replicas() {
    let f = scenario(
        "latency",
        24,
        &[
            ("replica-a", Duration::from_millis(50)),
            ("replica-b", Duration::from_millis(50)),
        ],
        Target::Replicas(vec!["replica-a", "replica-b"]),
        &[
            (
                1000,
                Fault::Latency("client", "replica-b", Duration::from_millis(400)),
            ),
            (
                2000,
                Fault::Latency("client", "replica-b", Duration::from_millis(2)),
            ),
        ],
    );
    let (w, i) = (f.kind(Kind::Write), f.kind(Kind::Idempotent));
    assert!(w.attempt_timeouts > 0 && i.retries > 0, "{f:#?}");
    // Each retry goes to the replica the call has not tried: every idempotent call is
    // answered within its deadline.
    assert_eq!(i.codes.get("OK"), Some(&i.calls), "{f:#?}");
    assert_keyed_ok_at_least_unkeyed("latency", &f);
}
