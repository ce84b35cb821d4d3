//! Every fuzz target on fixed seeds: no panic, no hang, every answer as documented, and the
//! driver reached both sides of each parser (accepted and refused inputs).

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
