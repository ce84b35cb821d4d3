//! `promtool check rules` on the rules, and `promtool test rules` on their unit tests
//! (`ops/prometheus/tests/`): every alert fires on the series that should fire it and
//! stays silent on a healthy series and on a single blip.

use std::process::Command;

use crate::prometheus::{ops_dir, tool};

fn run(args: &[&str]) -> String {
    let out = Command::new(tool("promtool"))
        .current_dir(ops_dir().join("prometheus"))
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn rules_are_valid() {
    let out = run(&["check", "rules", "stormguard.rules.yml"]);
    assert!(out.contains("SUCCESS"), "{out}");
}

/// Every alert of the rules file has a unit test, and every unit test passes.
#[test]
fn every_alert_is_unit_tested_and_passes() {
    let dir = ops_dir().join("prometheus");
    let rules = std::fs::read_to_string(dir.join("stormguard.rules.yml")).unwrap();
    let mut tests = Vec::new();
    let mut tested = String::new();
    for entry in std::fs::read_dir(dir.join("tests")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yml") {
            tested.push_str(&std::fs::read_to_string(&path).unwrap());
            tests.push(format!(
                "tests/{}",
                path.file_name().unwrap().to_string_lossy()
            ));
        }
    }
    tests.sort();
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert!(alerts.len() >= 7, "alerts found: {alerts:?}");
    for alert in &alerts {
        let fires = format!("alertname: {alert}\n        exp_alerts:\n          - exp_labels");
        assert!(
            tested.contains(&fires),
            "no unit test in ops/prometheus/tests/ expects {alert} to fire"
        );
        let silent = format!("alertname: {alert}\n        exp_alerts: []");
        assert!(
            tested.contains(&silent),
            "no unit test in ops/prometheus/tests/ expects {alert} to stay silent"
        );
    }
    let mut args = vec!["test", "rules"];
    args.extend(tests.iter().map(String::as_str));
    let out = run(&args);
    assert!(!out.contains("FAILED"), "{out}");
}
