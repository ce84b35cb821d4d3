//! The `fleet` example's quick run, as the example binary (its replicas are child
//! processes of it, so it cannot run in this test's process).
//!
//! It checks the shape of the JSON the example writes (every scenario, every policy, the
//! fields of the JSON contract, a timeline whose counts add up) and what holds by construction
//! or in any healthy phase: the calls before the fault succeed, every replica gets some of
//! them, a killed replica receives nothing, a restarted one receives attempts
//! again. Never how fast anything ran. The load is 2 % of the fleet's capacity (about 120
//! calls/s): this test runs the debug build on a machine shared with other builds; the
//! default run's figures are the release build's, in `docs/examples.md`.
#![allow(clippy::unwrap_used)]

use crate::support;

use serde_json::Value;

/// The keys of a JSON object.
fn keys(value: &Value) -> Vec<&str> {
    value
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect()
}

fn number(value: &Value, key: &str) -> f64 {
    value[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number: {value:#}"))
}

fn count(value: &Value, key: &str) -> u64 {
    value[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not a count: {value:#}"))
}

/// The fields of the JSON contract (docs/examples.md), in every policy.
const POLICY_FIELDS: [&str; 10] = [
    "name",
    "success",
    "attempts_per_call",
    "retries_to_tried_replica_share",
    "bad_replica_share_after_2s",
    "failed_calls",
    "failed_calls_after_1s",
    "p99_ms",
    "ejected_after_s",
    "timeline",
];
const BUCKET_FIELDS: [&str; 5] = ["t", "offered", "ok", "attempts", "bad_replica_attempts"];
const POLICIES: [&str; 3] = ["naive", "layer", "stormguard"];

#[test]
fn quick_fleet_writes_the_report_of_every_scenario_and_policy() {
    let report = support::run_with_report("fleet", &["--quick", "--load", "0.02", "--seed", "3"]);

    assert_eq!(report["replicas"], 5);
    let buckets = (5.0 / number(&report, "bucket_s")).round() as usize;
    let scenarios = report["scenarios"].as_array().unwrap();
    let names: Vec<&str> = scenarios
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["fail-fast", "slow", "killed", "restart", "rolling"]);
    let fault_s = 1.0;
    let fault_bucket = 10;
    for scenario in scenarios {
        let name = scenario["name"].as_str().unwrap();
        assert_eq!(number(scenario, "fault_s"), fault_s);
        let policies = scenario["policies"].as_array().unwrap();
        let policy_names: Vec<&str> = policies
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(policy_names, POLICIES, "{name}");
        for p in policies {
            let at = format!("{name} / {}", p["name"]);
            let fields = keys(p);
            for field in POLICY_FIELDS {
                assert!(fields.contains(&field), "{at}: no {field} in {fields:?}");
            }
            for share in [
                "success",
                "retries_to_tried_replica_share",
                "bad_replica_share_after_2s",
                "success_before_fault",
            ] {
                let x = number(p, share);
                assert!((0.0..=1.0).contains(&x), "{at}: {share} {x}");
            }
            assert!(number(p, "p99_ms") >= 0.0, "{at}");
            let ejected = &p["ejected_after_s"];
            if p["name"] == "stormguard" {
                assert!(
                    ejected.is_null() || ejected.as_f64().is_some_and(|s| s >= 0.0),
                    "{at}"
                );
            } else {
                assert!(ejected.is_null(), "{at}: only stormguard ejects");
            }
            let returned = &p["returned_share_after_s"];
            if !matches!(name, "restart" | "rolling") {
                assert!(returned.is_null(), "{at}: nothing returned");
            }

            // The timeline adds up to the summary.
            let timeline = p["timeline"].as_array().unwrap();
            assert_eq!(timeline.len(), buckets, "{at}");
            let (mut offered, mut ok) = (0, 0);
            for (i, b) in timeline.iter().enumerate() {
                let fields = keys(b);
                for field in BUCKET_FIELDS {
                    assert!(fields.contains(&field), "{at}: no {field} in {fields:?}");
                }
                assert!(
                    (number(b, "t") - i as f64 * 0.1).abs() < 1e-6,
                    "{at}: bucket {i}"
                );
                assert!(count(b, "ok") <= count(b, "offered"), "{at}: bucket {i}");
                offered += count(b, "offered");
                ok += count(b, "ok");
            }
            assert_eq!(offered, count(p, "calls"), "{at}");
            assert_eq!(offered - ok, count(p, "failed_calls"), "{at}");
            assert!(
                count(p, "failed_calls_after_1s") <= count(p, "failed_calls"),
                "{at}"
            );

            // The healthy phase: calls succeed, one attempt each, spread over every replica.
            assert!(number(p, "success_before_fault") >= 0.9, "{at}: {p:#}");
            let a = number(p, "attempts_per_call_before_fault");
            assert!((0.8..=1.5).contains(&a), "{at}: {a} attempts per call");
            // `balance_list` draws its two candidates at random and, at this load, finds
            // no request pending on either: every replica gets about 1/5. The
            // endpoint-aware channel prefers the replica of lower peak-EWMA latency, and
            // on a shared machine one slow answer keeps a replica out of the choice for
            // about a second (the latency decays over 1 s), which is the whole healthy phase
            // of the quick run: only that the load was spread holds (no replica took more
            // than 0.6 of it, and at most one, slow once, was left out).
            let shares: Vec<f64> = p["replica_shares_before_fault"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_f64().unwrap())
                .collect();
            assert_eq!(shares.len(), 5);
            if p["name"] == "stormguard" {
                let chosen = shares.iter().filter(|s| **s > 0.0).count();
                assert!(
                    chosen >= 4 && shares.iter().all(|s| *s <= 0.6),
                    "{at}: the replicas' shares {shares:?}"
                );
            } else {
                for s in &shares {
                    assert!(
                        (0.05..=0.45).contains(s),
                        "{at}: the replicas' shares {shares:?}"
                    );
                }
            }

            // What holds by construction.
            let bad_received = |from: usize| -> u64 {
                timeline[from..]
                    .iter()
                    .map(|b| b["replica_attempts"][0].as_u64().unwrap())
                    .sum()
            };
            match name {
                // A killed replica's process receives nothing; a restarted one, again.
                "killed" => assert_eq!(bad_received(fault_bucket + 1), 0, "{at}"),
                "restart" => assert!(bad_received(2 * fault_bucket + 1) > 0, "{at}"),
                // balance_list keeps sending to a replica that fails every call.
                "fail-fast" if p["name"] == "naive" => {
                    assert!(number(p, "bad_replica_share_after_2s") > 0.0, "{at}");
                }
                // The endpoint-aware channel ejects a replica that fails every call.
                "fail-fast" if p["name"] == "stormguard" => {
                    assert!(p["ejected_after_s"].is_f64(), "{at}: never ejected");
                    assert!(count(p, "ejections") >= 1, "{at}");
                }
                _ => {}
            }
            // The endpoint-aware channel never sends a retry to a replica the call tried.
            if p["name"] == "stormguard" {
                assert_eq!(number(p, "retries_to_tried_replica_share"), 0.0, "{at}");
            }
        }
        // What the example exists to show: once a replica fails every call, the
        // endpoint-aware channel sends it a smaller share of the attempts than
        // `balance_list` does, with or without the retry layer.
        if name == "fail-fast" {
            let share = |policy: &str| {
                let p = policies.iter().find(|p| p["name"] == policy).unwrap();
                number(p, "bad_replica_share_after_2s")
            };
            for other in ["naive", "layer"] {
                assert!(
                    share("stormguard") < share(other),
                    "{name}: stormguard {} against {other} {}",
                    share("stormguard"),
                    share(other)
                );
            }
        }
    }
}

/// `--discovery dns`, three of its scenarios, quick: the JSON contract other tools read
/// (`scenarios[].policies[]` with the fleet's fields, per scenario the resolutions and
/// failed ones, per policy the attempts that reached a removed address and those that
/// reached a replica after its `NOT_SERVING` report), that the client resolved during
/// each run, and that with client-side health checks the replica that said `NOT_SERVING`
/// received after the client had the report at most the attempts already on their way
/// (without them, about a dozen more arrive at this load). Never how fast.
#[test]
fn quick_fleet_over_dns_writes_the_contract() {
    let exe =
        support::build_examples(&["fleet"]).join(format!("fleet{}", std::env::consts::EXE_SUFFIX));
    let json =
        std::env::temp_dir().join(format!("stormguard-fleet-dns-{}.json", std::process::id()));
    let out = std::process::Command::new(&exe)
        .args([
            "--discovery",
            "dns",
            "--quick",
            "--load",
            "0.02",
            "--seed",
            "3",
        ])
        .args(["--scenarios", "scale-down,dns-down,not-serving", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).unwrap();
    let scenarios = report["scenarios"].as_array().unwrap();
    let names: Vec<&str> = scenarios
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["scale-down", "dns-down", "not-serving"]);
    for scenario in scenarios {
        // At the 1 s TTL each re-resolution is drawn from 1 to 1.5 s after the last one:
        // in `dns-down`, whose DNS server stops answering 1 s in, the first may come after.
        if scenario["name"] != "dns-down" {
            assert!(count(scenario, "resolutions") >= 1, "{scenario:#}");
        }
        assert!(count(scenario, "dns_failures") <= count(scenario, "resolutions"));
        let policies = scenario["policies"].as_array().unwrap();
        assert_eq!(policies.len(), 1);
        let p = &policies[0];
        assert_eq!(p["name"], "stormguard");
        assert!((0.0..=1.0).contains(&number(p, "success")), "{p:#}");
        assert!(count(p, "failed_calls_after_1s") <= count(p, "failed_calls"));
        assert!(count(p, "failed_calls") <= count(p, "calls"));
        assert!(number(p, "p99_ms") >= 0.0);
        count(p, "attempts_to_removed_after_resolution");
        let after_report = count(p, "attempts_after_not_serving");
        // The count is of attempts that *arrived* after the client had the report: one
        // chosen just before it may still be on its way (at about 120 calls/s over five
        // replicas, rarely more than one to one replica; a loaded machine saw one).
        if scenario["name"] == "not-serving" {
            assert!(after_report <= 2, "{p:#}");
        }
    }
}
