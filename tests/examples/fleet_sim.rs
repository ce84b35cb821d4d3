//! The fleet runs on turmoil (`examples/fleet_sim.rs`), made small enough for a debug
//! build: real tonic and both layers on every simulated host, in one thread on virtual
//! time, so every figure is the same on any machine, loaded or not, for a seed.
//!
//! What is asserted is what the layers guarantee, with the margins the model allows: the
//! naive fleet amplifies through the trigger and never recovers, stormguard's fleet holds
//! its attempts near one per call, keeps serving through the trigger and is back at once;
//! against a dead dependency a per-process floor sends about 5 retries/s per client and a
//! fleet-aware floor 5 retries/s for the whole fleet; and the same seed gives the same
//! figures, second by second.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use stormguard_demo::storm::Policy;
use stormguard_demo::storm::fleet_sim::{
    DeadDependencyConfig, DeadVariant, Network, fleet_storm_report, run_blip, run_dead_dependency,
    run_refusing_dependency, run_storm_policy,
};
use stormguard_sim::StormConfig;

/// A coarser network than the example's (2 ms each way, a 2 ms tick): turmoil steps every
/// host once per tick, and in a debug build those steps, not the calls, are most of the
/// cost.
fn coarse(ms: u64) -> Network {
    Network {
        latency: Duration::from_millis(ms),
        tick: Duration::from_millis(ms),
        ..Network::default()
    }
}

/// 4 client hosts over 2 servers of 2 workers × 10 ms (400 calls/s, 312 offered): the
/// standard run's shape at a quarter of its calls and a fifth of its clients; 1 s before,
/// 2 s of trigger, 3 s after.
fn small_storm() -> StormConfig {
    StormConfig {
        clients: 4,
        workers: 2,
        warmup_s: 1,
        trigger_s: 2,
        after_s: 3,
        ..StormConfig::fleet_quick()
    }
}

#[test]
fn stormguard_serves_through_the_trigger_and_naive_amplifies_it_into_an_outage() {
    let config = small_storm();
    let runs: Vec<_> = [Policy::Naive, Policy::Stormguard]
        .into_iter()
        .map(|p| {
            let (run, virtual_time) = run_storm_policy(p, &config, &coarse(2)).unwrap();
            // Every call of the last second ended within its deadline.
            assert!(virtual_time >= Duration::from_secs(u64::from(config.total_s())));
            assert!(virtual_time <= Duration::from_secs(u64::from(config.total_s()) + 1));
            run
        })
        .collect();
    let report = fleet_storm_report(&runs, &config);
    let (naive, stormguard) = (&report.policies[0], &report.policies[1]);
    for p in [naive, stormguard] {
        assert!(p.goodput_before >= 0.99, "{}: {p:?}", p.name);
        assert_eq!(p.connection_errors, 0, "{}", p.name);
    }
    // Naive: three attempts a call through the trigger and after it, no recovery.
    assert!(naive.amplification_during_trigger >= 2.5, "{naive:?}");
    assert!(naive.goodput_after <= 0.1, "{naive:?}");
    assert_eq!(naive.recovery_s, None, "{naive:?}");
    // stormguard: the budget holds the attempts (10 % of the successes plus each client's
    // floor, a reserve of 50: at most 200 retries for the trigger's ~620 calls), the
    // ShedLayer serves through the trigger (30 % of the offered load in this small fleet,
    // where naive serves 1 %), back at once.
    assert!(
        stormguard.amplification_during_trigger <= 1.45,
        "{stormguard:?}"
    );
    assert!(stormguard.goodput_during >= 0.25, "{stormguard:?}");
    assert!(stormguard.goodput_after >= 0.99, "{stormguard:?}");
    assert!(
        stormguard.recovery_s.is_some_and(|s| s <= 2),
        "{stormguard:?}"
    );
}

#[test]
fn the_same_seed_gives_the_same_figures() {
    let config = StormConfig {
        clients: 4,
        workers: 1,
        warmup_s: 1,
        trigger_s: 1,
        after_s: 1,
        ..StormConfig::fleet_quick()
    };
    let (a, _) = run_storm_policy(Policy::Stormguard, &config, &coarse(2)).unwrap();
    let (b, _) = run_storm_policy(Policy::Stormguard, &config, &coarse(2)).unwrap();
    assert_eq!(a, b);
    let other = StormConfig { seed: 2, ..config };
    let (c, _) = run_storm_policy(Policy::Stormguard, &other, &coarse(2)).unwrap();
    assert_ne!(a.timeline, c.timeline, "another seed, other arrivals");
}

#[test]
fn a_fleet_aware_floor_sends_only_the_fleets_share_of_retries_to_a_dead_dependency() {
    // 5 clients × 10 calls/s, measured from 5 s to 15 s as table 2's quick run (the
    // budgets' reserves refill once in the window, at 10 s); 5 ms each way and a 5 ms
    // tick: nothing here depends on finer timing.
    let config = DeadDependencyConfig {
        clients: 5,
        network: coarse(5),
        ..DeadDependencyConfig::quick()
    };
    let per_process = run_dead_dependency(DeadVariant::PerProcessFloor, &config).unwrap();
    let fleet_aware = run_dead_dependency(DeadVariant::FleetAwareFloor, &config).unwrap();
    assert!(
        (40.0..=60.0).contains(&per_process.calls_per_second),
        "{per_process:?}"
    );
    // 5 retries/s per client...
    assert!(
        (22.0..=28.0).contains(&per_process.retries_per_second),
        "{per_process:?}"
    );
    // ...against the fleet's 5/s shared by all of them: each client's share of the
    // reserve is 10 per 10 s window.
    assert!(fleet_aware.retries_per_second <= 6.0, "{fleet_aware:?}");
    assert!(fleet_aware.amplification <= 1.12, "{fleet_aware:?}");
    assert!(per_process.amplification >= 1.4, "{per_process:?}");
}

#[test]
fn fifty_hosts_on_the_defaults_send_about_one_attempt_per_call_to_a_dead_dependency() {
    // 50 hosts × 10 calls/s, as the example's table, measured from 1 s to 3 s: by then
    // every host has seen its dependency fail and never answer. (With the floor lent
    // always, the old default and `PerProcessFloor` here, it is about 1.5.)
    let config = DeadDependencyConfig {
        network: coarse(5),
        warmup_s: 1,
        measured_s: 2,
        ..DeadDependencyConfig::quick()
    };
    let defaults = run_dead_dependency(DeadVariant::Defaults, &config).unwrap();
    assert!(
        (400.0..=600.0).contains(&defaults.calls_per_second),
        "{defaults:?}"
    );
    assert!(defaults.amplification <= 1.1, "{defaults:?}");
}

#[test]
fn fifty_hosts_on_the_defaults_wait_out_a_dependency_that_refuses_connections() {
    // 50 hosts × 10 calls/s for 4 s against a host that listens on nothing.
    let config = DeadDependencyConfig {
        network: coarse(5),
        warmup_s: 1,
        measured_s: 3,
        ..DeadDependencyConfig::quick()
    };
    let defaults = run_refusing_dependency(DeadVariant::Defaults, &config).unwrap();
    eprintln!("{defaults:?}");
    assert!(
        (400.0..=600.0).contains(&defaults.calls_per_second),
        "{defaults:?}"
    );
    // While the connection is in backoff a call's first attempt fails at once, but for
    // one probe per backoff slot, and transparent retries wait for a slot: a host dials
    // about once a slot, not once a call (as often as its Poisson arrivals come).
    assert!(defaults.connections_per_call <= 0.25, "{defaults:?}");
    assert!(
        defaults.max_connections_per_host_second <= 20,
        "{defaults:?}"
    );
}

#[test]
fn the_defaults_lose_no_call_to_a_blip_that_the_floor_lent_always_saves() {
    // 10 hosts × 10 calls/s; every answer UNAVAILABLE from 2 s to 3 s; 2 s after it.
    let config = DeadDependencyConfig {
        clients: 10,
        network: coarse(5),
        warmup_s: 2,
        measured_s: 3,
        ..DeadDependencyConfig::quick()
    };
    let defaults = run_blip(DeadVariant::Defaults, &config).unwrap();
    let always = run_blip(DeadVariant::PerProcessFloor, &config).unwrap();
    // The dependency answered before the blip: the floor stays lent through it, and
    // every call is decided as with the floor lent always.
    assert_eq!(defaults, always);
    // Every call that arrived a deadline or more before the blip, or after it, succeeded;
    // the retries saved some of those that arrived in it.
    for s in &defaults {
        if s.t < 1 || s.t >= 3 {
            assert_eq!(s.goodput, s.offered, "{defaults:?}");
        }
    }
    assert!(defaults[2].goodput > 0, "{defaults:?}");
}
