//! End-to-end: the example client (`examples/client.rs`, compiled in here as a module)
//! against a server that always answers UNAVAILABLE. This is the "amplification stays near
//! 1.1×" measurement: at a 100 % failure rate the budget's standing reserve
//! (5 retries/s over a 10 s window = 50 retries) is all that retries can spend.
#![allow(clippy::unwrap_used)]

use crate::client_support;

#[allow(dead_code, unreachable_pub, missing_docs)]
#[path = "../../examples/client.rs"]
mod example;

use client_support::*;
use tonic::Code;

/// The default budget's standing reserve: 5 retries per second × 10 s.
const RESERVE: f64 = 50.0;

fn args(addr: std::net::SocketAddr, extra: &[&str]) -> example::Args {
    let mut v: Vec<String> = [
        "--target",
        &format!("http://{addr}"),
        "--requests",
        "1000",
        "--concurrency",
        "16",
        "--deadline-ms",
        "1000",
        "--seed",
        "7",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(extra.iter().map(|s| s.to_string()));
    example::parse_args(v).unwrap()
}

fn n(report: &serde_json::Value, key: &str) -> f64 {
    report[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} in {report}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_policy_against_an_always_unavailable_server_stays_within_the_budget() {
    let svc = Scripted::always(Step::Fail(Code::Unavailable));
    let addr = serve(svc.clone()).await;
    let report = example::run(&args(addr, &[])).await.unwrap();
    println!("default policy: {report}");

    let (logical, attempts) = (n(&report, "logical"), n(&report, "attempts"));
    assert_eq!(logical, 1000.0);
    assert_eq!(n(&report, "failed"), 1000.0);
    assert_eq!(n(&report, "ok"), 0.0);
    assert!(attempts <= 1.1 * logical + RESERVE, "{report}");
    assert!(
        n(&report, "retries") >= 1.0,
        "the reserve pays for some retries: {report}"
    );
    assert!(
        report["refused"]["budget"].as_u64().unwrap() > 0,
        "{report}"
    );
    assert_eq!(
        svc.seen().len() as f64,
        attempts,
        "the server saw every attempt"
    );
    assert_eq!(report["codes"]["UNAVAILABLE"].as_u64(), Some(1000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_none_sends_exactly_one_attempt_per_call() {
    let svc = Scripted::always(Step::Fail(Code::Unavailable));
    let addr = serve(svc.clone()).await;
    let report = example::run(&args(addr, &["--policy", "none"]))
        .await
        .unwrap();
    println!("policy none: {report}");
    assert_eq!(n(&report, "attempts"), 1000.0);
    assert_eq!(n(&report, "retries"), 0.0);
    assert_eq!(svc.seen().len(), 1000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_config_with_retry_throttling_is_loaded() {
    let svc = Scripted::always(Step::Fail(Code::Unavailable));
    let addr = serve(svc.clone()).await;
    let path = std::env::temp_dir().join(format!("stormguard-client-{}.json", std::process::id()));
    std::fs::write(
        &path,
        r#"{"methodConfig":[{"name":[{"service":"stormguard.demo.v1.Inventory"}],
            "retryPolicy":{"maxAttempts":4,"initialBackoff":"0.001s","maxBackoff":"0.01s",
            "backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}}],
            "retryThrottling":{"maxTokens":10,"tokenRatio":0.1}}"#,
    )
    .unwrap();
    let report = example::run(&args(addr, &["--service-config", path.to_str().unwrap()]))
        .await
        .unwrap();
    std::fs::remove_file(&path).ok();
    println!("service config (A6 throttle): {report}");
    // A6 throttling stops retrying once the token count falls to half of maxTokens: at a
    // 100 % failure rate that is a handful of retries in total.
    let (logical, attempts) = (n(&report, "logical"), n(&report, "attempts"));
    assert_eq!(logical, 1000.0);
    assert!(attempts <= logical + 10.0, "{report}");
    assert!(
        report["refused"]["budget"].as_u64().unwrap() > 900,
        "{report}"
    );
}

#[test]
fn the_command_line_keeps_its_flags_and_names_them_in_errors() {
    let parsed = example::parse_args(
        [
            "--target",
            "http://h:1",
            "--requests",
            "5",
            "--concurrency",
            "2",
            "--deadline-ms",
            "250",
        ]
        .map(String::from),
    )
    .unwrap();
    assert_eq!(parsed.target, "http://h:1");
    assert_eq!((parsed.requests, parsed.concurrency), (5, 2));
    assert_eq!(parsed.deadline, std::time::Duration::from_millis(250));
    assert_eq!(parsed.policy(), example::PolicyArg::Default);
    let defaults = example::parse_args(Vec::new()).unwrap();
    assert_eq!(defaults.target, "http://127.0.0.1:50051");
    assert_eq!((defaults.requests, defaults.concurrency), (1000, 16));
    assert_eq!(defaults.deadline, std::time::Duration::from_millis(1000));
    assert_eq!((defaults.seed, defaults.payload_bytes), (None, 0));
    let file = example::parse_args(["--service-config", "f.json"].map(String::from)).unwrap();
    assert_eq!(
        file.policy(),
        example::PolicyArg::ServiceConfig("f.json".into())
    );
    let none = example::parse_args(["--policy", "none"].map(String::from)).unwrap();
    assert_eq!(none.policy(), example::PolicyArg::None);

    // Every error exits 2 and says what was wrong with which flag.
    let err = |a: &[&str]| {
        let error = example::parse_args(a.iter().map(|s| s.to_string())).unwrap_err();
        assert_eq!(error.exit_code(), 2, "{a:?}: {error}");
        error.to_string()
    };
    let e = err(&["--requests", "many"]);
    assert!(e.contains("--requests") && e.contains("many"), "{e}");
    assert!(err(&["--requests"]).contains("a value is required for '--requests"));
    let e = err(&["--policy", "sometimes"]);
    assert!(e.contains("--policy") && e.contains("default, none"), "{e}");
    assert!(err(&["--bogus"]).contains("unexpected argument '--bogus'"));
    let e = err(&["--policy", "none", "--service-config", "f.json"]);
    assert!(e.contains("cannot be used with"), "{e}");
    let e = err(&["--concurrency", "0"]);
    assert!(
        e.contains("--concurrency") && e.contains("not in 1.."),
        "{e}"
    );
    let e = err(&["--deadline-ms", "0"]);
    assert!(
        e.contains("--deadline-ms") && e.contains("at least 1"),
        "{e}"
    );
}
