//! The shapes of the tables, on the `--quick` runs.

use std::sync::OnceLock;
use std::time::Duration;

use stormguard_core::{Code, CodeSet};
use stormguard_sim::{
    AmplificationRow, FleetVariant, HedgeVariant, Options, PolicyName, RecoveryVariant,
    ShardVariant, Tables, amplification_scenario, recovery_scenario, run,
};

const QUICK: Options = Options {
    quick: true,
    seed: 1,
};

/// The quick tables, run once and shared by the tests (the determinism test runs them a
/// second time and compares the bytes).
fn tables() -> &'static Tables {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    TABLES.get_or_init(|| Tables::run(&QUICK).expect("valid scenarios"))
}

fn row(rows: &[AmplificationRow], policy: PolicyName, rate: f64) -> &AmplificationRow {
    rows.iter()
        .find(|r| r.policy == policy && r.failure_rate == rate)
        .expect("every policy is run at every failure rate")
}

#[test]
fn amplification_table_matches_the_published_shapes() {
    let rows = &tables().amplification;
    assert_eq!(rows.len(), 4 * 12);

    // No retries: one attempt per call, success = 1 - failure rate.
    for r in rows.iter().filter(|r| r.policy == PolicyName::NoRetries) {
        assert_eq!(r.amplification, 1.0);
        assert!((r.success - (1.0 - r.failure_rate)).abs() < 0.02, "{r:?}");
    }

    // Three attempts: 1 + p + p², so 1.11x at 10 %, 1.75x at 50 %, 3.0x at 100 %.
    for r in rows
        .iter()
        .filter(|r| r.policy == PolicyName::ThreeAttempts)
    {
        let p = r.failure_rate;
        assert!((r.amplification - (1.0 + p + p * p)).abs() < 0.05, "{r:?}");
    }
    let naive_dead = row(rows, PolicyName::ThreeAttempts, 1.0);
    assert!(
        (naive_dead.amplification - 3.0).abs() <= 0.05,
        "{naive_dead:?}"
    );
    assert_eq!(naive_dead.success, 0.0);

    // stormguard: at most 1.1x when everything fails, and >= 99.9 % success at 5 %.
    let sg_dead = row(rows, PolicyName::Stormguard, 1.0);
    assert!(sg_dead.amplification <= 1.1, "{sg_dead:?}");
    let sg_five = row(rows, PolicyName::Stormguard, 0.05);
    assert!(sg_five.success >= 0.999, "{sg_five:?}");
    // Nowhere does the budget let the load grow past ~1.15x.
    for r in rows.iter().filter(|r| r.policy == PolicyName::Stormguard) {
        assert!(r.amplification <= 1.15, "{r:?}");
    }

    // The A6 throttle stops retrying early: cheap under failure, but it loses successes
    // that stormguard keeps at 10-20 % failure.
    for rate in [0.3, 0.5, 1.0] {
        assert!(row(rows, PolicyName::A6Throttle, rate).amplification <= 1.01);
    }
    for rate in [0.1, 0.2] {
        let a6 = row(rows, PolicyName::A6Throttle, rate);
        let sg = row(rows, PolicyName::Stormguard, rate);
        assert!(sg.success > a6.success + 0.05, "{sg:?} vs {a6:?}");
    }
}

#[test]
fn fleet_floor_table_scales_with_the_fleet_and_the_breaker_cuts_it() {
    let rows = &tables().fleet_floor;
    let get = |size, variant| {
        rows.iter()
            .find(|r| r.fleet_size == size && r.variant == variant)
            .expect("every variant at every size")
    };
    for size in [1, 10, 100] {
        let naive = get(size, FleetVariant::ThreeAttempts);
        assert!((naive.amplification - 3.0).abs() < 1e-9, "{naive:?}");
        // The per-process floor: 5 retries/s from every process, whatever the fleet.
        let floor = get(size, FleetVariant::PerProcessFloor);
        let expected = 5.0 * size as f64;
        assert!(
            (floor.retries_per_second - expected).abs() <= 0.05 * expected,
            "{floor:?}"
        );
        // The fleet-aware floor: the fleet together gets at most the floor of one process.
        let fleet = get(size, FleetVariant::FleetAwareFloor);
        assert!(fleet.retries_per_second <= 5.0 * 1.05, "{fleet:?}");
        if size >= 100 {
            assert!(fleet.amplification < 1.01, "{fleet:?}");
        }
        // The breaker turns a dead dependency into fast failures: almost no attempts.
        let breaker = get(size, FleetVariant::PerProcessFloorWithBreaker);
        assert!(breaker.amplification < 0.1, "{breaker:?}");
        // The defaults, told nothing of the fleet: the floor is withheld while nothing
        // succeeds, so every process sends its calls and no retries.
        let defaults = get(size, FleetVariant::Defaults);
        assert!(defaults.amplification <= 1.01, "{defaults:?}");
    }
}

#[test]
fn recovery_table_naive_stays_down_shedding_recovers_first() {
    let rows = &tables().recovery;
    let get = |variant| {
        rows.iter()
            .find(|r| r.variant == variant)
            .expect("every variant")
    };
    // Three attempts keep the server saturated after the trigger: metastable.
    let naive = get(RecoveryVariant::ThreeAttempts);
    assert!(!naive.recovered, "{naive:?}");
    assert_eq!(naive.time_to_recover_s, None);
    assert!(naive.amplification_after_trigger > 2.5, "{naive:?}");

    for variant in [
        RecoveryVariant::NoRetries,
        RecoveryVariant::A6Throttle,
        RecoveryVariant::Stormguard,
        RecoveryVariant::StormguardShedding,
    ] {
        assert!(get(variant).recovered, "{:?}", get(variant));
    }
    // With the admission policy the server keeps serving through the drop and is healthy
    // as soon as it ends.
    let shedding = get(RecoveryVariant::StormguardShedding);
    assert_eq!(shedding.time_to_recover_s, Some(0.0), "{shedding:?}");
    let during = &shedding.success_by_second[5..8];
    assert!(during.iter().all(|s| *s >= 0.4), "{shedding:?}");
    // Served oldest first, a queue deeper than the deadline allows wastes the drop on
    // work whose callers have left; adaptive LIFO (the default) serves the newest.
    let fifo = get(RecoveryVariant::StormguardSheddingFifo);
    assert!(
        fifo.success_by_second[5..8].iter().all(|s| *s < 0.3),
        "{fifo:?}"
    );
    assert!(fifo.recovered, "{fifo:?}");
    for variant in [RecoveryVariant::NoRetries, RecoveryVariant::A6Throttle] {
        let other = get(variant);
        assert!(
            other.time_to_recover_s > shedding.time_to_recover_s,
            "{other:?}"
        );
        assert!(other.success_after_trigger < shedding.success_after_trigger);
    }
}

#[test]
fn recovery_attempt_timeouts_are_the_retry_policys_and_retried_without_deadline_exceeded() {
    // One source for the attempt timeout: the retry policy's, as the client layer reads
    // it; only the client without a policy takes the layer's own. A timed-out attempt is
    // retried whatever the codes, so no policy needs DEADLINE_EXCEEDED listed to retry it.
    let timeout = Some(Duration::from_millis(50));
    for variant in RecoveryVariant::ALL {
        let policy = recovery_scenario(variant, &QUICK).policy;
        match &policy.retry {
            Some(retry) => {
                assert_eq!(retry.per_attempt_timeout, timeout, "{variant:?}");
                assert_eq!(
                    retry.retryable_codes,
                    CodeSet::single(Code::Unavailable),
                    "{variant:?}"
                );
                assert_eq!(policy.layer_per_attempt_timeout, None, "{variant:?}");
            }
            None => {
                assert_eq!(variant, RecoveryVariant::NoRetries);
                assert_eq!(policy.layer_per_attempt_timeout, timeout);
            }
        }
    }
}

#[test]
fn partial_failure_table_shared_budget_starves_healthy_shards() {
    let rows = &tables().partial_failure;
    let get = |variant| {
        rows.iter()
            .find(|r| r.variant == variant)
            .expect("every variant")
    };
    let shared = get(ShardVariant::SharedBudget);
    let per_shard = get(ShardVariant::PerShardBudget);
    for r in rows {
        assert_eq!(r.bad_success, 0.0, "the bad shard is down: {r:?}");
    }
    // The dead shard spends the shared budget: healthy shards lose their retries.
    assert!(shared.healthy_success < 0.99, "{shared:?}");
    assert!(per_shard.healthy_success >= 0.999, "{per_shard:?}");
    // Per-shard budgets also bound the load on the dead shard to its own floor.
    assert!(per_shard.bad_amplification < shared.bad_amplification);
    // Sharing each shard's floor across the fleet keeps the isolation and cuts the load
    // on the dead shard to a few percent.
    let fleet = get(ShardVariant::PerShardFleetFloor);
    assert!(fleet.healthy_success >= 0.999, "{fleet:?}");
    assert!(fleet.bad_amplification < 1.05, "{fleet:?}");
    assert!(get(ShardVariant::ThreeAttempts).bad_amplification > 2.9);
}

#[test]
fn call_chain_multiplies_naive_retries_and_stormguard_retries_once() {
    let rows = &tables().call_chain;
    let get = |policy, rate| {
        rows.iter()
            .find(|r| r.policy == policy && r.failure_rate == rate)
            .expect("every policy at every rate")
    };
    // 3 attempts at each of 3 hops: 27 attempts at the bottom for one call.
    let naive = get(PolicyName::ThreeAttempts, 1.0);
    assert!((naive.bottom_amplification - 27.0).abs() < 0.1, "{naive:?}");
    // stormguard: only the hop next to the failure retries, "do not retry" goes up.
    let sg = get(PolicyName::Stormguard, 1.0);
    assert!(sg.bottom_amplification <= 1.1, "{sg:?}");
    assert!(get(PolicyName::Stormguard, 0.05).success >= 0.999);
    assert_eq!(get(PolicyName::NoRetries, 0.5).bottom_amplification, 1.0);
}

#[test]
fn hedging_table_unbudgeted_hedges_stay_down_budgeted_ones_recover() {
    let rows = &tables().hedging;
    let get = |v: HedgeVariant| rows.iter().find(|r| r.variant == v).expect("every variant");
    let none = get(HedgeVariant::NoHedging);
    let unbudgeted = get(HedgeVariant::Unbudgeted);
    let budgeted = get(HedgeVariant::Budgeted);
    let shedding = get(HedgeVariant::BudgetedShedding);
    assert_eq!(none.hedges_per_call, 0.0);
    assert!(
        unbudgeted.amplification_after_trigger > 1.5,
        "{unbudgeted:?}"
    );
    assert_eq!(unbudgeted.time_to_recover_s, None, "{unbudgeted:?}");
    for r in [budgeted, shedding] {
        assert!(r.amplification_after_trigger < 1.25, "{r:?}");
        assert!(r.time_to_recover_s.is_some(), "{r:?}");
    }
    assert!(shedding.success_after_trigger > none.success_after_trigger);
    let text = tables().to_string();
    assert!(text.contains("Table 6: hedging"), "{text}");
}

#[test]
fn same_seed_same_json_bytes_other_seed_other_figures() {
    let once = tables().to_json();
    let twice = Tables::run(&QUICK).expect("valid").to_json();
    assert_eq!(once, twice);
    let json: serde_json::Value = serde_json::from_str(&once).expect("valid JSON");
    let first = &json["amplification"][0];
    let mut keys: Vec<&str> = first
        .as_object()
        .expect("rows are objects")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(keys, ["amplification", "failure_rate", "policy", "success"]);
    let policies: Vec<&str> = json["amplification"]
        .as_array()
        .expect("an array")
        .iter()
        .map(|r| r["policy"].as_str().expect("a name"))
        .collect();
    for name in ["no-retries", "three-attempts", "a6-throttle", "stormguard"] {
        assert!(policies.contains(&name), "{name} missing");
    }
    for table in [
        "fleet_floor",
        "recovery",
        "partial_failure",
        "call_chain",
        "hedging",
    ] {
        assert!(
            !json[table].as_array().expect("an array").is_empty(),
            "{table}"
        );
    }

    let scenario = amplification_scenario(PolicyName::Stormguard, 0.3, &QUICK);
    let other = amplification_scenario(PolicyName::Stormguard, 0.3, &Options { seed: 2, ..QUICK });
    assert_eq!(
        run(&scenario).expect("valid"),
        run(&scenario).expect("valid")
    );
    assert_ne!(run(&scenario).expect("valid"), run(&other).expect("valid"));
}
