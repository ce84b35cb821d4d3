//! The `tail` example's quick run, as the example binary.
//!
//! It checks the shape of the JSON the example writes (every policy, in order, with the
//! fields of the JSON contract) and what holds by construction, in counts: a plain channel
//! sends one attempt per call, and its p99 is a slow attempt (at least 1.5 % of the
//! attempts take 100 ms, by the server's seeded sequence); stormguard's hedging answers
//! slow calls with hedges and stays within its budget, and under twice the capacity it
//! sends fewer extra attempts than tower's `hedge`, which has no budget. How much shorter
//! the tail gets is a real-time figure, left to the example's report.
//!
//! Not p99.9: the quick run has about 750 calls per policy, so its p99.9 is the slowest
//! call, and with a dozen slow first attempts a hedge that is slow too (1.5 % each) happens
//! in one run of six. The default run's p99.9, in release, is in `docs/examples.md`.
#![allow(clippy::unwrap_used)]

use crate::support;

use serde_json::Value;

fn number(value: &Value, key: &str) -> f64 {
    value[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number: {value:#}"))
}

/// The fields of the JSON contract (docs/examples.md), in every policy.
const POLICY_FIELDS: [&str; 6] = [
    "name",
    "p50_ms",
    "p99_ms",
    "p999_ms",
    "extra_attempts_per_call",
    "overload",
];
const OVERLOAD_FIELDS: [&str; 2] = ["extra_attempts_per_call", "goodput"];
const POLICIES: [&str; 5] = [
    "none",
    "tower-hedge",
    "hedging",
    "hedging-learned",
    "resilience-hedge",
];

#[test]
fn quick_tail_reports_every_policy_and_hedges_within_its_budget() {
    let policies = POLICIES.join(",");
    let report =
        support::run_with_report("tail", &["--quick", "--seed", "3", "--policies", &policies]);

    let policies = report["policies"].as_array().unwrap();
    let names: Vec<&str> = policies
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, POLICIES);
    let by_name = |name: &str| policies.iter().find(|p| p["name"] == name).unwrap();
    for p in policies {
        let at = p["name"].as_str().unwrap();
        let fields: Vec<&str> = p.as_object().unwrap().keys().map(String::as_str).collect();
        for field in POLICY_FIELDS {
            assert!(fields.contains(&field), "{at}: no {field} in {fields:?}");
        }
        for field in OVERLOAD_FIELDS {
            number(&p["overload"], field);
        }
        // A call takes at least its 10 ms of service; percentiles are in order.
        let (p50, p99, p999) = (
            number(p, "p50_ms"),
            number(p, "p99_ms"),
            number(p, "p999_ms"),
        );
        assert!(10.0 <= p50 && p50 <= p99 && p99 <= p999, "{at}: {p:#}");
        // Well under capacity every call succeeds; but for the peer's hedge, which no
        // budget holds: on a slow (debug) build under load its fixed 15 ms delay hedges a
        // third of the calls, which loads the server it hedges against.
        if at != "resilience-hedge" {
            assert!(number(p, "success") >= 0.99, "{at}: {p:#}");
        }
        // Every policy but `none` hedges a slow attempt (100 ms, past every delay).
        if at != "none" {
            assert!(number(p, "extra_attempts_per_call") > 0.0, "{at}: {p:#}");
        }
        let goodput = number(&p["overload"], "goodput");
        assert!((0.0..=1.5).contains(&goodput), "{at}: {p:#}");
    }

    // By construction: one attempt per call, a slow 1.5 % of them, so p99 is a slow one.
    let none = by_name("none");
    assert_eq!(number(none, "extra_attempts_per_call"), 0.0, "{none:#}");
    assert_eq!(
        number(&none["overload"], "extra_attempts_per_call"),
        0.0,
        "{none:#}"
    );
    assert_eq!(number(none, "attempts"), number(none, "calls"), "{none:#}");
    let slow_share = number(none, "slow_attempts") / number(none, "attempts");
    assert!((0.005..=0.03).contains(&slow_share), "{none:#}");
    assert!(number(none, "p99_ms") >= 95.0, "{none:#}");
    // The server sheds what it cannot run and keeps serving under twice its capacity.
    // How much it serves depends on the machine keeping up with the calls (a CI machine
    // busy with builds served 5 % in one run, an idle one 30-50 %): only that it serves.
    assert!(number(&none["overload"], "goodput") > 0.0, "{none:#}");

    // What the budget guarantees, however slow the machine: the quick run fits in one of
    // its 10 s windows, which grants 0.1 hedge per success plus a floor of 50, so at most
    // about a fifth of the measured calls get a copy, and under overload (where hardly
    // more calls succeed than at the normal load) fewer than tower's, which hedges
    // whatever the load.
    let tower = by_name("tower-hedge");
    for name in ["hedging", "hedging-learned"] {
        let p = by_name(name);
        assert!(
            number(p, "extra_attempts_per_call") <= 0.25,
            "{name}: {p:#}"
        );
        let overload = number(&p["overload"], "extra_attempts_per_call");
        assert!(overload <= 0.15, "{name}: {p:#}");
        assert!(
            overload < number(&tower["overload"], "extra_attempts_per_call"),
            "{name}: {p:#}\ntower-hedge: {tower:#}"
        );
    }
    // The tail, in counts (how much it shortens the p99 is the report's, in real time): a
    // slow attempt is hedged after the delay and the hedge answers the call. Both policies
    // send hedges, each answer comes from one copy, and the learned delay, which follows
    // the machine's latency, hedges slow attempts and wins with them. The fixed 15 ms
    // assumes a normal attempt takes 10-12 ms: on a machine too busy for that most calls
    // are hedged until the budget is spent, so its hedges may all go to calls that were
    // not slow.
    for name in ["hedging", "hedging-learned"] {
        let p = by_name(name);
        let (hedges, won) = (number(p, "hedges"), number(p, "hedges_won"));
        assert!(hedges > 0.0 && won <= hedges, "{name}: {p:#}");
    }
    let learned = by_name("hedging-learned");
    assert!(number(learned, "hedges_won") > 0.0, "{learned:#}");
}
