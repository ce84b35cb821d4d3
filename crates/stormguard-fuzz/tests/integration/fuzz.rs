//! Every fuzz target on fixed seeds: no panic, no hang, every answer as documented, and the
//! driver reached both sides of each parser (accepted and refused inputs).
#![allow(clippy::unwrap_used)]

use stormguard_fuzz::driver;
use stormguard_fuzz::targets::TARGETS;

const INPUTS: u64 = 20_000;

#[test]
fn every_target_runs_clean_on_fixed_seeds() {
    for target in TARGETS {
        for seed in [1, 2] {
            let report = match driver::run(target, seed, INPUTS) {
                Ok(report) => report,
                Err(crash) => panic!("{crash}\n(seed {seed})"),
            };
            assert_eq!(report.inputs, INPUTS);
            assert!(report.features >= 2, "{report:?}");
            // Classifiers (attempt, criticality) map every input to a class: nothing to refuse.
            if !matches!(target.name, "attempt" | "criticality") {
                assert!(report.accepted > 0 && report.rejected > 0, "{report:?}");
            }
        }
    }
}

#[test]
fn the_same_seed_runs_the_same_inputs() {
    for target in TARGETS {
        let a = driver::run(target, 9, 2_000).map(|r| (r.accepted, r.features));
        let b = driver::run(target, 9, 2_000).map(|r| (r.accepted, r.features));
        assert_eq!(a, b, "{}", target.name);
    }
}

/// The hedge target's seeds reach each way a hedge is refused and each way a call ends,
/// with both kinds of budget granting hedges: the invariants are checked on real grants.
#[test]
fn the_hedge_seeds_reach_every_refusal_and_both_budgets() {
    use stormguard_core::{BudgetChoice, ClientConfig, Format};
    use stormguard_core::{Refusal, RetryController};
    use stormguard_fuzz::{hedged, targets};

    let mut refusals = std::collections::BTreeSet::new();
    let mut ends = std::collections::BTreeSet::new();
    let (mut stormguard, mut a6) = (0, 0);
    for seed in targets::target("hedge").unwrap().seeds {
        let (text, script) = seed.split_once('\0').unwrap();
        let config = ClientConfig::from_text(text, Format::Json).unwrap();
        let controller = RetryController::from_config(&config.clone().with_seed(7)).unwrap();
        let mut clock = tokio::time::Instant::now();
        let summary =
            hedged::drive_script(&controller, &config, script.as_bytes(), &mut clock, text);
        match config.budget {
            BudgetChoice::Stormguard(_) => stormguard += summary.granted,
            BudgetChoice::A6(_) => a6 += summary.granted,
        }
        refusals.extend(summary.refusals);
        ends.extend(summary.ends);
    }
    assert!(stormguard > 0 && a6 > 0, "{stormguard} {a6}");
    for why in [
        Refusal::Budget,
        Refusal::Pushback,
        Refusal::Allowance,
        Refusal::Deadline,
    ] {
        assert!(refusals.contains(&why), "{why}: {refusals:?}");
    }
    for end in ["won", "expired", "dropped", "gave up: budget"] {
        assert!(ends.contains(end), "{end}: {ends:?}");
    }
}
