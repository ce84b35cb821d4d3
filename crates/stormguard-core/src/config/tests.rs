#![allow(clippy::unwrap_used)]

use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::config::notice::IDEMPOTENT_SETTING;
use crate::retry::BackoffConfig;
use crate::retry::{HedgeDelay, LearnedDelay};
use crate::wire::code::{Code, CodeSet};

/// The field an error names, or the whole message for an error that names none.
fn field_of(e: ConfigError) -> String {
    match e {
        ConfigError::Invalid { field, .. } => field,
        other => other.to_string(),
    }
}

const INVENTORY: &str = "stormguard.demo.v1.Inventory";

/// A service config retry policy with `extra` fields, for one `name` entry.
fn retry_policy(name: &str, extra: &str) -> String {
    format!(
        r#"{{"methodConfig": [{{"name": [{name}], "retryPolicy": {{"maxAttempts": 3,
            "initialBackoff": "0.01s", "maxBackoff": "1s", "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"]{extra}}}}}]}}"#
    )
}

#[test]
fn service_config_matches_names_like_grpc() {
    let json = r#"{"methodConfig": [
        {"name": [{}], "retryPolicy": {"maxAttempts": 2, "initialBackoff": "1s", "maxBackoff": "2s",
          "backoffMultiplier": 1.5, "retryableStatusCodes": [14]}},
        {"name": [{"service": "stormguard.demo.v1.Inventory"}], "retryPolicy": {"maxAttempts": 3,
          "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
          "retryableStatusCodes": ["unavailable", "Resource_Exhausted"]}},
        {"name": [{"service": "stormguard.demo.v1.Inventory", "method": "WatchStock"}]}
    ]}"#;
    let c = ClientConfig::from_service_config_json(json).unwrap();
    let p = c.methods.lookup(&format!("/{INVENTORY}/Reserve")).unwrap();
    assert_eq!(p.max_attempts, 3);
    assert!(p.retryable_codes.contains(Code::ResourceExhausted));
    assert_eq!(
        p.backoff,
        BackoffConfig::A6 {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
            multiplier: 2.0
        }
    );
    assert!(
        c.methods
            .lookup(&format!("/{INVENTORY}/WatchStock"))
            .is_none()
    );
    assert_eq!(c.methods.lookup("/x.Y/Z").unwrap().max_attempts, 2);
    assert_eq!(c.budget, BudgetChoice::Stormguard(BudgetConfig::default()));
    assert!(c.not_applied().is_empty());
}

#[test]
fn service_config_throttling_becomes_a6() {
    let json = r#"{"retryThrottling": {"maxTokens": 10, "tokenRatio": "0.1"}}"#;
    let c = ClientConfig::from_service_config_json(json).unwrap();
    assert_eq!(
        c.budget,
        BudgetChoice::A6(A6BudgetConfig {
            max_tokens: 10.0,
            token_ratio: 0.1
        })
    );
    assert!(c.methods.lookup("/a.B/C").is_none());
}

#[test]
fn service_config_errors_name_the_field() {
    let cases = [
        (r#"{"methodConfig": {}}"#, "methodConfig"),
        (
            r#"{"methodConfig": [{"name": [{"service": "s"}], "retryPolicy": {"maxAttempts": 1,
                "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
            "methodConfig[0].retryPolicy.maxAttempts",
        ),
        (
            r#"{"methodConfig": [{"name": [{"service": "s"}], "retryPolicy": {"maxAttempts": 3,
                "initialBackoff": "100ms", "maxBackoff": "1s", "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
            "methodConfig[0].retryPolicy.initialBackoff",
        ),
        (
            r#"{"methodConfig": [{"name": [{"service": "s"}], "retryPolicy": {"maxAttempts": 3,
                "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE", "NOPE"]}}]}"#,
            "methodConfig[0].retryPolicy.retryableStatusCodes[1]",
        ),
        (
            r#"{"methodConfig": [{"name": [{"service": "s"}], "retryPolicy": {"maxAttempts": 3,
                "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 2}}]}"#,
            "methodConfig[0].retryPolicy.retryableStatusCodes",
        ),
        (
            r#"{"methodConfig": [{"name": [{"service": "s"}], "retryPolicy": {"maxAttempts": 3,
                "initialBackoff": "0s", "maxBackoff": "1s", "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
            "methodConfig[0].retryPolicy.initialBackoff",
        ),
        (
            r#"{"methodConfig": [{"name": [{"service": "s"}], "retryPolicy": {"maxAttempts": 3,
                "initialBackoff": "2s", "maxBackoff": "1s", "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
            "methodConfig[0].retryPolicy.maxBackoff",
        ),
        (
            r#"{"methodConfig": [{"name": [{"service": "s"}], "retryPolicy": {"maxAttempts": 3,
                "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 0,
                "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
            "methodConfig[0].retryPolicy.backoffMultiplier",
        ),
        (
            r#"{"methodConfig": [{"name": [{"method": "M"}]}]}"#,
            "methodConfig[0].name[0].service",
        ),
        (r#"{"methodConfig": [{}]}"#, "methodConfig[0].name"),
        (
            r#"{"methodConfig": [{"name": [{"service": 7}]}]}"#,
            "methodConfig[0].name[0].service",
        ),
        (
            r#"{"retryThrottling": {"maxTokens": 0, "tokenRatio": 0.1}}"#,
            "retryThrottling.maxTokens",
        ),
        (
            r#"{"retryThrottling": {"maxTokens": 10}}"#,
            "retryThrottling.tokenRatio",
        ),
        (
            r#"{"retryThrottling": {"maxTokens": "ten", "tokenRatio": 0.1}}"#,
            "retryThrottling.maxTokens",
        ),
    ];
    for (json, field) in cases {
        let e = ClientConfig::from_service_config_json(json).unwrap_err();
        assert_eq!(field_of(e), field, "{json}");
    }
    let e = ClientConfig::from_service_config_json(r#"{"retryThrottling": {"maxTokens": 10}}"#);
    assert_eq!(
        e.unwrap_err().to_string(),
        "invalid `retryThrottling.tokenRatio`: is required"
    );
    for malformed in ["[1]", "{", "null"] {
        assert!(
            matches!(
                ClientConfig::from_service_config_json(malformed),
                Err(ConfigError::Malformed(_))
            ),
            "{malformed}"
        );
    }
}

#[test]
fn only_methods_marked_idempotent_have_their_answers_retried() {
    // stormguard's shape applies to every method: not idempotent unless it says so.
    let c = ClientConfig::from_json("{}").unwrap();
    assert!(!c.methods.lookup("/a.B/C").unwrap().idempotent);
    assert_eq!(c, ClientConfig::default());
    let c = ClientConfig::from_json(r#"{"retry": {"idempotent": true}}"#).unwrap();
    assert!(c.methods.lookup("/a.B/C").unwrap().idempotent);
    // The gRPC service config names the methods it retries: gRPC retries them.
    let json = retry_policy(r#"{"service": "a.B"}"#, "");
    let c = ClientConfig::from_service_config_json(&json).unwrap();
    assert!(c.methods.lookup("/a.B/C").unwrap().idempotent);
    assert!(c.methods.lookup("/x.Y/Z").is_none());
}

#[test]
fn per_attempt_timeout_is_read_from_both_shapes() {
    let json = retry_policy("{}", r#", "perAttemptRecvTimeout": "0.05s""#);
    let c = ClientConfig::from_service_config_json(&json).unwrap();
    assert_eq!(
        c.methods.lookup("/a.B/C").unwrap().per_attempt_timeout,
        Some(Duration::from_millis(50))
    );
    let c = ClientConfig::from_json(r#"{"retry": {"per_attempt_timeout": "50ms"}}"#).unwrap();
    assert_eq!(
        c.methods.lookup("/a.B/C").unwrap().per_attempt_timeout,
        Some(Duration::from_millis(50))
    );
    // Absent: no per-attempt timeout.
    assert_eq!(
        ClientConfig::from_json("{}")
            .unwrap()
            .methods
            .lookup("/a.B/C")
            .unwrap()
            .per_attempt_timeout,
        None
    );
    for bad in ["0s", "50ms"] {
        let json = retry_policy("{}", &format!(r#", "perAttemptRecvTimeout": "{bad}""#));
        assert_eq!(
            field_of(ClientConfig::from_service_config_json(&json).unwrap_err()),
            "methodConfig[0].retryPolicy.perAttemptRecvTimeout",
            "{bad}"
        );
    }
    for json in [
        r#"{"retry": {"per_attempt_timeout": "0ms"}}"#,
        r#"{"retry": {"per_attempt_timeout": 50}}"#,
    ] {
        assert_eq!(
            field_of(ClientConfig::from_json(json).unwrap_err()),
            "retry.per_attempt_timeout",
            "{json}"
        );
    }
}

#[test]
fn max_attempts_above_five_count_as_five() {
    let json = r#"{"methodConfig": [{"name": [{}], "retryPolicy": {"maxAttempts": 8,
        "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#;
    let c = ClientConfig::from_service_config_json(json).unwrap();
    assert_eq!(
        c.methods.lookup("/a.B/C").unwrap().effective_max_attempts(),
        5
    );
}

#[test]
fn stormguard_shape_reads_every_field() {
    let json = r#"{"retry": {"max_attempts": 4, "backoff": "full_jitter", "base": "20ms", "cap": "1s", "max_pushback": "5s",
        "retryable_codes": ["UNAVAILABLE", 8], "min_attempt_time": "2ms", "budget": {"ttl": "5s", "min_retries_per_second": 2,
        "retry_ratio": 0.2, "fleet_size": "40", "floor": "always"}, "budget_exhausted": "fail_fast"},
        "breaker": {"failure_rate": 0.6, "min_requests": 10, "open_for": "2s"}}"#;
    let c = ClientConfig::from_json(json).unwrap();
    let p = c.methods.lookup("/any.Svc/Any").unwrap();
    assert_eq!(p.max_attempts, 4);
    assert_eq!(
        p.backoff,
        BackoffConfig::FullJitter {
            base: Duration::from_millis(20),
            cap: Duration::from_secs(1),
            multiplier: 2.0
        }
    );
    assert!(p.retryable_codes.contains(Code::ResourceExhausted));
    assert_eq!(p.max_pushback, Duration::from_secs(5));
    assert_eq!(p.min_attempt_time, Duration::from_millis(2));
    assert_eq!(
        c.budget,
        BudgetChoice::Stormguard(BudgetConfig {
            ttl: Duration::from_secs(5),
            min_retries_per_second: 2,
            retry_ratio: 0.2,
            fleet_size: 40,
            floor: crate::budget::Floor::Always,
        })
    );
    let b = c.breaker.unwrap();
    assert_eq!(b.failure_rate, 0.6);
    assert_eq!(b.min_requests, 10);
    assert_eq!(b.open_for, Duration::from_secs(2));
    assert_eq!(b.window, BreakerConfig::default().window);
    // The A6 backoff by either name, from the same fields.
    for name in ["a6", "exponential"] {
        let json = format!(r#"{{"retry": {{"backoff": "{name}", "base": "20ms"}}}}"#);
        let c = ClientConfig::from_json(&json).unwrap();
        assert_eq!(
            c.methods.lookup("/a.B/C").unwrap().backoff,
            BackoffConfig::A6 {
                initial: Duration::from_millis(20),
                max: Duration::from_secs(2),
                multiplier: 2.0
            }
        );
    }
}

#[test]
fn stormguard_shape_defaults_and_errors() {
    let c = ClientConfig::from_json("{}").unwrap();
    assert_eq!(c, ClientConfig::default());
    let cases = [
        (r#"{"retry": {"max_atempts": 3}}"#, "retry.max_atempts"),
        (r#"{"retri": {}}"#, "retri"),
        (r#"{"retry": []}"#, "retry"),
        (
            r#"{"retry": {"budget": {"ttl": "0.5s"}}}"#,
            "retry.budget.ttl",
        ),
        (
            r#"{"retry": {"budget": {"ttl": "ten seconds"}}}"#,
            "retry.budget.ttl",
        ),
        (
            r#"{"retry": {"budget": {"retry_ratio": -1}}}"#,
            "retry.budget.retry_ratio",
        ),
        (
            r#"{"retry": {"budget": {"tll": "1s"}}}"#,
            "retry.budget.tll",
        ),
        (
            r#"{"retry": {"budget_exhausted": "queue"}}"#,
            "retry.budget_exhausted",
        ),
        (r#"{"retry": {"backoff": "linear"}}"#, "retry.backoff"),
        (r#"{"retry": {"max_attempts": -2}}"#, "retry.max_attempts"),
        (r#"{"retry": {"max_attempts": 1}}"#, "retry.max_attempts"),
        (r#"{"retry": {"max_attempts": 2.5}}"#, "retry.max_attempts"),
        (r#"{"retry": {"idempotent": "yes"}}"#, "retry.idempotent"),
        // Errors found by validation name the field as this document spells it.
        (r#"{"retry": {"base": "0ms"}}"#, "retry.base"),
        (r#"{"retry": {"base": "2s", "cap": "1s"}}"#, "retry.cap"),
        (r#"{"retry": {"multiplier": 0.5}}"#, "retry.multiplier"),
        (
            r#"{"retry": {"retryable_codes": []}}"#,
            "retry.retryable_codes",
        ),
        (
            r#"{"retry": {"retryable_codes": ["OK"]}}"#,
            "retry.retryable_codes",
        ),
        (
            r#"{"retry": {"retryable_codes": "UNAVAILABLE"}}"#,
            "retry.retryable_codes",
        ),
        (
            r#"{"breaker": {"failure_rate": 2}}"#,
            "breaker.failure_rate",
        ),
        (r#"{"breaker": {"rate": 0.5}}"#, "breaker.rate"),
        (r#"{"methodConfig_": []}"#, "methodConfig_"),
    ];
    for (json, field) in cases {
        let e = ClientConfig::from_json(json).unwrap_err();
        assert_eq!(field_of(e), field, "{json}");
    }
    // A service config is not stormguard's shape.
    assert_eq!(
        field_of(ClientConfig::from_json(r#"{"methodConfig": []}"#).unwrap_err()),
        "methodConfig"
    );
}

#[test]
fn a_method_entry_changes_what_it_names_over_retry() {
    let json = r#"{
        "retry": {"max_attempts": 4, "base": "20ms", "retryable_codes": ["UNAVAILABLE"]},
        "methods": {
            "/pkg.Svc/": {"max_attempts": 2},
            "/pkg.Svc/Reserve": {"idempotent": true, "cap": "500ms"},
            "/pkg.Svc/Watch": null,
            "/other.Svc/Get": {"backoff": "a6", "retryable_codes": ["UNAVAILABLE", "ABORTED"]}
        }
    }"#;
    let c = ClientConfig::from_json(json).unwrap();
    let get = |path: &str| c.methods.lookup(path).map(|p| RetryPolicy::clone(p));
    let everything = get("/any.Svc/Any").unwrap();
    assert_eq!(everything.max_attempts, 4);
    assert!(!everything.idempotent);
    // The service's entry, over `retry`.
    let list = get("/pkg.Svc/List").unwrap();
    assert_eq!(list.max_attempts, 2);
    assert!(!list.idempotent);
    // The exact method wins over its service; what it does not set comes from `retry`.
    let reserve = get("/pkg.Svc/Reserve").unwrap();
    assert!(reserve.idempotent);
    assert_eq!(reserve.max_attempts, 4);
    assert_eq!(
        reserve.backoff,
        BackoffConfig::FullJitter {
            base: Duration::from_millis(20),
            cap: Duration::from_millis(500),
            multiplier: 2.0
        }
    );
    assert!(get("/pkg.Svc/Watch").is_none(), "null: not retried");
    let other = get("/other.Svc/Get").unwrap();
    assert!(other.retryable_codes.contains(Code::Aborted));
    assert!(
        matches!(other.backoff, BackoffConfig::A6 { initial, .. } if initial == Duration::from_millis(20))
    );
    assert!(
        !get("/other.Svc/Put")
            .unwrap()
            .retryable_codes
            .contains(Code::Aborted)
    );
}

#[test]
fn method_entries_name_their_errors_by_path() {
    let cases = [
        (r#"{"methods": {"pkg.Svc/Get": {}}}"#, "methods.pkg.Svc/Get"),
        (r#"{"methods": {"/pkg.Svc": {}}}"#, "methods./pkg.Svc"),
        (r#"{"methods": {"//Get": {}}}"#, "methods.//Get"),
        (r#"{"methods": {"/a/b/c": {}}}"#, "methods./a/b/c"),
        (
            r#"{"methods": {"/pkg.Svc/Get": {"idempotant": true}}}"#,
            "methods./pkg.Svc/Get.idempotant",
        ),
        (
            r#"{"methods": {"/pkg.Svc/Get": {"base": "0s"}}}"#,
            "methods./pkg.Svc/Get.base",
        ),
        (
            r#"{"methods": {"/pkg.Svc/Get": {"max_attempts": 1}}}"#,
            "methods./pkg.Svc/Get.max_attempts",
        ),
        (
            r#"{"retry": {"base": "1s"}, "methods": {"/pkg.Svc/Get": {"cap": "500ms"}}}"#,
            "methods./pkg.Svc/Get.cap",
        ),
        (
            r#"{"methods": {"/pkg.Svc/Get": {"budget": {"ttl": "5s"}}}}"#,
            "methods./pkg.Svc/Get.budget",
        ),
        (
            r#"{"methods": {"/pkg.Svc/": {"budget_exhausted": "fail_fast"}}}"#,
            "methods./pkg.Svc/.budget_exhausted",
        ),
        (
            r#"{"methods": {"/pkg.Svc/Get": true}}"#,
            "methods./pkg.Svc/Get",
        ),
        (r#"{"methods": []}"#, "methods"),
    ];
    for (json, field) in cases {
        let e = ClientConfig::from_json(json).unwrap_err();
        assert_eq!(field_of(e), field, "{json}");
    }
}

#[test]
fn service_config_fields_not_applied_are_listed_not_dropped() {
    let json = r#"{
        "loadBalancingConfig": [{"round_robin": {}}],
        "methodConfig": [{
            "name": [{"service": "pkg.Svc", "methd": "Get"}],
            "waitForReady": true,
            "maxRequestMessageBytes": 1024,
            "maxResponseMessageBytes": "2048",
            "timeout": "1s",
            "retryPolicyy": {"maxAttempts": 3}
        }, {
            "name": [{"service": "other.Svc"}],
            "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
                "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"], "jitter": 0.2}
        }],
        "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1, "burst": 3}
    }"#;
    let c = ClientConfig::from_service_config_json(json).unwrap();
    let mut got: Vec<(&str, NotAppliedReason)> = c
        .not_applied()
        .iter()
        .map(|n| (n.path.as_str(), n.reason))
        .collect();
    got.sort_by_key(|(path, _)| *path);
    use NotAppliedReason::*;
    assert_eq!(
        got,
        [
            ("loadBalancingConfig", LoadBalancing),
            ("methodConfig[0].maxRequestMessageBytes", MessageSize),
            ("methodConfig[0].maxResponseMessageBytes", MessageSize),
            ("methodConfig[0].name[0].methd", Unknown),
            ("methodConfig[0].retryPolicyy", Unknown),
            ("methodConfig[0].waitForReady", WaitForReady),
            ("methodConfig[1].retryPolicy.jitter", Unknown),
            ("retryThrottling.burst", Unknown),
        ]
    );
    // What is applied is applied as without the rest.
    assert!(c.methods.lookup("/pkg.Svc/Get").is_none(), "no retryPolicy");
    assert_eq!(
        c.methods.timeout("/pkg.Svc/Get"),
        Some(Duration::from_secs(1))
    );
    assert_eq!(c.methods.lookup("/other.Svc/Get").unwrap().max_attempts, 3);
    assert!(matches!(c.budget, BudgetChoice::A6(_)));
    // Each is a notice, and says what it is.
    let notices = c.notices();
    assert_eq!(notices.len(), 8);
    let wait = notices
        .iter()
        .find(|n| matches!(n, Notice::NotApplied(n) if n.reason == WaitForReady))
        .unwrap()
        .to_string();
    assert!(
        wait.starts_with("`methodConfig[0].waitForReady` is not applied: "),
        "{wait}"
    );
    // The same names at another level are unknown there.
    let c = ClientConfig::from_service_config_json(r#"{"waitForReady": true, "methodConfig": []}"#);
    assert_eq!(c.unwrap().not_applied()[0].reason, Unknown);
    // stormguard's own shape refuses what it does not know instead.
    assert!(ClientConfig::from_json(r#"{"retry": {"waitForReady": true}}"#).is_err());
}

#[test]
fn no_answer_retried_is_a_notice_naming_the_setting() {
    let seed = r#"{ "retry": { "budget": { "ttl": "10s", "min_retries_per_second": 5,
        "retry_ratio": 0.1 }, "backoff": "full_jitter", "base": "100ms", "max_attempts": 3,
        "budget_exhausted": "fail_fast" } }"#;
    let c = ClientConfig::from_json(seed).unwrap();
    let notices = c.notices();
    assert_eq!(
        notices,
        [Notice::NoAnswerRetried {
            max_attempts: 3,
            setting: IDEMPOTENT_SETTING
        }]
    );
    let text = notices[0].to_string();
    assert!(
        text.contains(r#"methods."/package.Service/Method".idempotent: true"#),
        "{text}"
    );
    // One method marked idempotent is enough, in the document or in code.
    let marked = seed.replacen(
        "{ \"retry\"",
        r#"{ "methods": { "/stormguard.demo.v1.Inventory/Reserve": { "idempotent": true } }, "retry""#,
        1,
    );
    assert!(
        ClientConfig::from_json(&marked)
            .unwrap()
            .notices()
            .is_empty()
    );
    let mut in_code = ClientConfig::default();
    assert_eq!(in_code.notices().len(), 1);
    in_code.methods.set_retry(
        MethodScope::Method("pkg.Svc", "Get"),
        Some(RetryPolicy {
            idempotent: true,
            ..RetryPolicy::default()
        }),
    );
    assert!(in_code.notices().is_empty());
    // No retry policy at all, or a service config (whose policies are the opt-in): nothing
    // to say.
    assert!(ClientConfig::no_retries().notices().is_empty());
    let json = retry_policy("{}", "");
    assert!(
        ClientConfig::from_service_config_json(&json)
            .unwrap()
            .notices()
            .is_empty()
    );
    // Capped attempts are what is reported.
    let c = ClientConfig::from_json(r#"{"retry": {"max_attempts": 9}}"#).unwrap();
    assert!(matches!(
        c.notices()[..],
        [Notice::NoAnswerRetried {
            max_attempts: 5,
            ..
        }]
    ));
}

/// The hedging policy of `path` (cloned), if the method is hedged.
fn hedging_of(c: &ClientConfig, path: &str) -> Option<HedgingPolicy> {
    c.methods
        .lookup_hedging(path)
        .map(|h| HedgingPolicy::clone(h))
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn the_a6_proposal_s_hedging_examples_parse() {
    // The two `hedgingPolicy` examples of gRPC A6 ("Configuration Language"), as written
    // there, in a service config with A6's `retryThrottling` example.
    let json = r#"{"methodConfig": [{
        "name": [{"service": "pkg.Spaced"}],
        "hedgingPolicy": {
          "maxAttempts": 4,
          "hedgingDelay": ".5s",
          "nonFatalStatusCodes": [
            "UNAVAILABLE",
            "INTERNAL",
            "ABORTED"
          ]
        }
      }, {
        "name": [{"service": "pkg.AllAtOnce"}],
        "hedgingPolicy": {
          "maxAttempts": 4,
          "hedgingDelay": "0s",
          "nonFatalStatusCodes": [
            "UNAVAILABLE",
            "INTERNAL",
            "ABORTED"
          ]
        }
      }],
      "retryThrottling": {
        "maxTokens": 10,
        "tokenRatio": 0.1
      }}"#;
    let c = ClientConfig::from_service_config_json(json).unwrap();
    let spaced = hedging_of(&c, "/pkg.Spaced/Get").unwrap();
    assert_eq!(spaced.max_attempts, 4);
    assert_eq!(spaced.delay, HedgeDelay::Fixed(ms(500)));
    assert_eq!(
        spaced.non_fatal_codes,
        CodeSet::from_iter([Code::Unavailable, Code::Internal, Code::Aborted])
    );
    // What A6 does not set is stormguard's default.
    assert_eq!(
        spaced.min_attempt_time,
        HedgingPolicy::default().min_attempt_time
    );
    assert_eq!(spaced.max_pushback, HedgingPolicy::default().max_pushback);
    let at_once = hedging_of(&c, "/pkg.AllAtOnce/Get").unwrap();
    assert_eq!(at_once.delay, HedgeDelay::Fixed(Duration::ZERO));
    // Hedged, so not retried; names no entry gives are neither.
    assert!(c.methods.lookup("/pkg.Spaced/Get").is_none());
    assert!(hedging_of(&c, "/pkg.Other/Get").is_none());
    assert!(c.methods.lookup("/pkg.Other/Get").is_none());
    // The throttle pays for hedges as for retries.
    assert!(matches!(c.budget, BudgetChoice::A6(_)));
    assert!(c.not_applied().is_empty());
    assert_eq!(c.validate(), Ok(()));
}

#[test]
fn service_config_hedging_defaults_and_limits() {
    // Only `maxAttempts` is required: no delay (every copy at once), no non-fatal codes.
    let json = r#"{"methodConfig": [{"name": [{}], "hedgingPolicy": {"maxAttempts": 9}}]}"#;
    let c = ClientConfig::from_service_config_json(json).unwrap();
    let h = hedging_of(&c, "/any.Svc/Any").unwrap();
    assert_eq!(h.delay, HedgeDelay::Fixed(Duration::ZERO));
    assert_eq!(h.non_fatal_codes, CodeSet::EMPTY);
    // Above 5 counts as 5, as for retries.
    assert_eq!(h.max_attempts, 9);
    assert_eq!(h.effective_max_attempts(), 5);
    // Codes by name in any case or by number, as in `retryableStatusCodes`; numbers as
    // strings, as proto3 JSON allows.
    let json = r#"{"methodConfig": [{"name": [{}], "hedgingPolicy": {"maxAttempts": "3",
        "hedgingDelay": "0.010s", "nonFatalStatusCodes": [14, "internal"]}}]}"#;
    let h = hedging_of(
        &ClientConfig::from_service_config_json(json).unwrap(),
        "/a.B/C",
    )
    .unwrap();
    assert_eq!(h.max_attempts, 3);
    assert_eq!(h.delay, HedgeDelay::Fixed(ms(10)));
    assert_eq!(
        h.non_fatal_codes,
        CodeSet::from_iter([Code::Unavailable, Code::Internal])
    );
    // Fields A6 does not define are skipped and listed, as everywhere in a service config.
    let json = r#"{"methodConfig": [{"name": [{}], "hedgingPolicy": {"maxAttempts": 2,
        "hedgingDelayy": "1s"}}]}"#;
    let c = ClientConfig::from_service_config_json(json).unwrap();
    assert_eq!(c.not_applied().len(), 1);
    assert_eq!(
        c.not_applied()[0].path,
        "methodConfig[0].hedgingPolicy.hedgingDelayy"
    );
    assert_eq!(
        hedging_of(&c, "/a.B/C").unwrap().delay,
        HedgeDelay::Fixed(Duration::ZERO)
    );
}

#[test]
fn service_config_hedging_is_set_like_retry_and_the_most_specific_entry_decides() {
    let json = r#"{"methodConfig": [
        {"name": [{}], "retryPolicy": {"maxAttempts": 2, "initialBackoff": "0.1s",
          "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}},
        {"name": [{"service": "pkg.Read"}, {"service": "pkg.Write", "method": "Get"}],
          "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.02s"}, "timeout": "1s"},
        {"name": [{"service": "pkg.Read", "method": "Put"}], "retryPolicy": {"maxAttempts": 4,
          "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
          "retryableStatusCodes": ["UNAVAILABLE"]}},
        {"name": [{"service": "pkg.Read", "method": "Watch"}]}
    ]}"#;
    let c = ClientConfig::from_service_config_json(json).unwrap();
    // The service's entry hedges it, over the default's retries.
    let read = hedging_of(&c, "/pkg.Read/Get").unwrap();
    assert_eq!(read.max_attempts, 3);
    assert_eq!(read.delay, HedgeDelay::Fixed(ms(20)));
    assert!(c.methods.lookup("/pkg.Read/Get").is_none());
    assert_eq!(
        c.methods.timeout("/pkg.Read/Get"),
        Some(Duration::from_secs(1))
    );
    // One method of another service, by the same entry.
    assert!(hedging_of(&c, "/pkg.Write/Get").is_some());
    assert!(hedging_of(&c, "/pkg.Write/Put").is_none());
    assert_eq!(c.methods.lookup("/pkg.Write/Put").unwrap().max_attempts, 2);
    // A method's entry decides over its service's, whichever kind each is.
    assert!(hedging_of(&c, "/pkg.Read/Put").is_none());
    assert_eq!(c.methods.lookup("/pkg.Read/Put").unwrap().max_attempts, 4);
    // An entry with neither policy: neither retried nor hedged.
    assert!(hedging_of(&c, "/pkg.Read/Watch").is_none());
    assert!(c.methods.lookup("/pkg.Read/Watch").is_none());
    // A hedging default for every method.
    let json = r#"{"methodConfig": [{"name": [{}], "hedgingPolicy": {"maxAttempts": 2}}]}"#;
    let c = ClientConfig::from_service_config_json(json).unwrap();
    assert!(hedging_of(&c, "/any.Svc/Any").is_some());
    assert!(c.methods.lookup("/any.Svc/Any").is_none());
}

#[test]
fn service_config_refuses_both_policies_and_bad_hedging_values_by_field() {
    let retry = r#""retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
        "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}"#;
    let both = format!(
        r#"{{"methodConfig": [{{"name": [{{}}], {retry}}},
            {{"name": [{{"service": "s"}}], {retry}, "hedgingPolicy": {{"maxAttempts": 2}}}}]}}"#
    );
    let e = ClientConfig::from_service_config_json(&both).unwrap_err();
    let message = e.to_string();
    assert!(message.contains("retried or hedged, not both"), "{message}");
    assert_eq!(field_of(e), "methodConfig[1]");
    let hedging = |policy: &str| {
        format!(
            r#"{{"methodConfig": [{{"name": [{{"service": "s"}}], "hedgingPolicy": {policy}}}]}}"#
        )
    };
    let cases = [
        (
            r#"{"maxAttempts": 1}"#,
            "methodConfig[0].hedgingPolicy.maxAttempts",
        ),
        (
            r#"{"maxAttempts": 0}"#,
            "methodConfig[0].hedgingPolicy.maxAttempts",
        ),
        (
            r#"{"maxAttempts": -3}"#,
            "methodConfig[0].hedgingPolicy.maxAttempts",
        ),
        (
            r#"{"hedgingDelay": "0.1s"}"#,
            "methodConfig[0].hedgingPolicy.maxAttempts",
        ),
        (
            r#"{"maxAttempts": 2, "hedgingDelay": "10ms"}"#,
            "methodConfig[0].hedgingPolicy.hedgingDelay",
        ),
        (
            r#"{"maxAttempts": 2, "hedgingDelay": 0.1}"#,
            "methodConfig[0].hedgingPolicy.hedgingDelay",
        ),
        (
            r#"{"maxAttempts": 2, "nonFatalStatusCodes": ["OK"]}"#,
            "methodConfig[0].hedgingPolicy.nonFatalStatusCodes",
        ),
        (
            r#"{"maxAttempts": 2, "nonFatalStatusCodes": ["UNAVAILABLE", "NOPE"]}"#,
            "methodConfig[0].hedgingPolicy.nonFatalStatusCodes[1]",
        ),
        (
            r#"{"maxAttempts": 2, "nonFatalStatusCodes": "UNAVAILABLE"}"#,
            "methodConfig[0].hedgingPolicy.nonFatalStatusCodes",
        ),
        ("[]", "methodConfig[0].hedgingPolicy"),
    ];
    for (policy, field) in cases {
        let json = hedging(policy);
        let e = ClientConfig::from_service_config_json(&json).unwrap_err();
        assert_eq!(field_of(e), field, "{json}");
    }
    let e = ClientConfig::from_service_config_json(&hedging("{}")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid `methodConfig[0].hedgingPolicy.maxAttempts`: is required"
    );
    // `null` is no policy: the other one stands alone.
    let json =
        format!(r#"{{"methodConfig": [{{"name": [{{}}], {retry}, "hedgingPolicy": null}}]}}"#);
    assert!(ClientConfig::from_service_config_json(&json).is_ok());
}

#[test]
fn a_method_entry_with_hedging_is_hedged_not_retried() {
    let json = r#"{
        "retry": {"max_attempts": 4, "idempotent": true},
        "methods": {
            "/pkg.Catalog/": {"hedging": {"max_attempts": 3, "delay": "10ms",
                "non_fatal_codes": ["UNAVAILABLE", 13], "min_attempt_time": "2ms",
                "max_pushback": "1s"}},
            "/pkg.Catalog/Update": {"max_attempts": 2},
            "/pkg.Search/Query": {"hedging": {"delay": "learned", "percentile": 0.99,
                "floor": "2ms", "ceiling": "200ms", "min_samples": 50, "window": "30s"}},
            "/pkg.Search/Suggest": {"hedging": {"delay": "learned"}},
            "/pkg.Search/Index": {"hedging": {}},
            "/pkg.Catalog/Watch": null
        }
    }"#;
    let c = ClientConfig::from_json(json).unwrap();
    assert_eq!(
        hedging_of(&c, "/pkg.Catalog/List").unwrap(),
        HedgingPolicy {
            max_attempts: 3,
            delay: HedgeDelay::Fixed(ms(10)),
            non_fatal_codes: CodeSet::from_iter([Code::Unavailable, Code::Internal]),
            min_attempt_time: ms(2),
            max_pushback: Duration::from_secs(1),
        }
    );
    assert!(
        c.methods.lookup("/pkg.Catalog/List").is_none(),
        "hedged, so not retried"
    );
    // A method's entry decides over its service's: retried, over `retry`'s settings.
    assert!(hedging_of(&c, "/pkg.Catalog/Update").is_none());
    let update = c.methods.lookup("/pkg.Catalog/Update").unwrap();
    assert_eq!((update.max_attempts, update.idempotent), (2, true));
    assert!(
        hedging_of(&c, "/pkg.Catalog/Watch").is_none(),
        "null: neither"
    );
    assert!(c.methods.lookup("/pkg.Catalog/Watch").is_none());
    // A learned delay, its settings beside `delay`.
    assert_eq!(
        hedging_of(&c, "/pkg.Search/Query").unwrap().delay,
        HedgeDelay::Learned(LearnedDelay {
            percentile: 0.99,
            floor: ms(2),
            ceiling: ms(200),
            min_samples: 50,
            window: Duration::from_secs(30),
        })
    );
    assert_eq!(
        hedging_of(&c, "/pkg.Search/Suggest").unwrap().delay,
        HedgeDelay::Learned(LearnedDelay::default())
    );
    // Every key is optional; nothing comes from `retry`.
    assert_eq!(
        hedging_of(&c, "/pkg.Search/Index").unwrap(),
        HedgingPolicy::default()
    );
    // Other methods keep `retry`.
    assert!(hedging_of(&c, "/pkg.Search/Other").is_none());
    assert_eq!(
        c.methods.lookup("/pkg.Search/Other").unwrap().max_attempts,
        4
    );
    assert_eq!(c.validate(), Ok(()));
    // The same from an application's own config: deserializing runs the same build.
    let app: App =
        serde_json::from_str(&format!(r#"{{"name": "x", "stormguard": {json}}}"#)).unwrap();
    assert_eq!(app.stormguard, c);
}

#[cfg(all(feature = "yaml", feature = "toml"))]
#[test]
fn hedging_reads_the_same_from_yaml_and_toml() {
    let yaml = "
methods:
  /pkg.Catalog/Get:
    hedging: { max_attempts: 3, delay: 10ms, non_fatal_codes: [UNAVAILABLE] }
  /pkg.Search/:
    hedging:
      delay: learned
      percentile: 0.9
      ceiling: 100ms
";
    let toml = r#"
[methods."/pkg.Catalog/Get".hedging]
max_attempts = 3
delay = "10ms"
non_fatal_codes = ["UNAVAILABLE"]

[methods."/pkg.Search/".hedging]
delay = "learned"
percentile = 0.9
ceiling = "100ms"
"#;
    let from_yaml = ClientConfig::from_text(yaml, Format::Yaml).unwrap();
    let from_toml = ClientConfig::from_text(toml, Format::Toml).unwrap();
    assert_eq!(from_yaml, from_toml);
    let get = hedging_of(&from_yaml, "/pkg.Catalog/Get").unwrap();
    assert_eq!(
        (get.max_attempts, get.delay),
        (3, HedgeDelay::Fixed(ms(10)))
    );
    let HedgeDelay::Learned(learned) = hedging_of(&from_yaml, "/pkg.Search/Find").unwrap().delay
    else {
        panic!("a learned delay");
    };
    assert_eq!((learned.percentile, learned.ceiling), (0.9, ms(100)));
    // And the service config, in YAML.
    let yaml = "methodConfig:\n  - name: [{}]\n    hedgingPolicy: { maxAttempts: 2, hedgingDelay: 0.5s }\n";
    let c = ClientConfig::from_text(yaml, Format::Yaml).unwrap();
    assert_eq!(
        hedging_of(&c, "/a.B/C").unwrap().delay,
        HedgeDelay::Fixed(ms(500))
    );
}

#[test]
fn hedging_in_stormguard_s_shape_names_its_errors_by_field() {
    let entry = |body: &str| format!(r#"{{"methods": {{"/pkg.Svc/Get": {body}}}}}"#);
    let cases = [
        // Retried or hedged, not both: every retry setting beside `hedging` is refused.
        (
            r#"{"hedging": {}, "max_attempts": 3}"#,
            "methods./pkg.Svc/Get.max_attempts",
        ),
        (
            r#"{"hedging": {}, "idempotent": true}"#,
            "methods./pkg.Svc/Get.idempotent",
        ),
        (
            r#"{"hedging": {}, "base": "10ms"}"#,
            "methods./pkg.Svc/Get.base",
        ),
        (
            r#"{"hedging": {}, "retryable_codes": ["UNAVAILABLE"]}"#,
            "methods./pkg.Svc/Get.retryable_codes",
        ),
        (
            r#"{"hedging": {}, "per_attempt_timeout": "10ms"}"#,
            "methods./pkg.Svc/Get.per_attempt_timeout",
        ),
        (
            r#"{"hedging": {}, "budget": {}}"#,
            "methods./pkg.Svc/Get.budget",
        ),
        // Values.
        (
            r#"{"hedging": {"max_attempts": 1}}"#,
            "methods./pkg.Svc/Get.hedging.max_attempts",
        ),
        (
            r#"{"hedging": {"max_attempts": "two"}}"#,
            "methods./pkg.Svc/Get.hedging.max_attempts",
        ),
        (
            r#"{"hedging": {"delay": "soon"}}"#,
            "methods./pkg.Svc/Get.hedging.delay",
        ),
        (
            r#"{"hedging": {"delay": 10}}"#,
            "methods./pkg.Svc/Get.hedging.delay",
        ),
        (
            r#"{"hedging": {"delay": "0.1"}}"#,
            "methods./pkg.Svc/Get.hedging.delay",
        ),
        (
            r#"{"hedging": {"non_fatal_codes": ["OK"]}}"#,
            "methods./pkg.Svc/Get.hedging.non_fatal_codes",
        ),
        (
            r#"{"hedging": {"non_fatal_codes": ["NOPE"]}}"#,
            "methods./pkg.Svc/Get.hedging.non_fatal_codes[0]",
        ),
        (
            r#"{"hedging": {"max_pushback": "1"}}"#,
            "methods./pkg.Svc/Get.hedging.max_pushback",
        ),
        // The learned delay's settings need `delay: learned`, and their ranges.
        (
            r#"{"hedging": {"percentile": 0.9}}"#,
            "methods./pkg.Svc/Get.hedging.percentile",
        ),
        (
            r#"{"hedging": {"delay": "10ms", "window": "5s"}}"#,
            "methods./pkg.Svc/Get.hedging.window",
        ),
        (
            r#"{"hedging": {"delay": "learned", "percentile": 1}}"#,
            "methods./pkg.Svc/Get.hedging.percentile",
        ),
        (
            r#"{"hedging": {"delay": "learned", "percentile": 0}}"#,
            "methods./pkg.Svc/Get.hedging.percentile",
        ),
        (
            r#"{"hedging": {"delay": "learned", "floor": "2s", "ceiling": "1s"}}"#,
            "methods./pkg.Svc/Get.hedging.floor",
        ),
        (
            r#"{"hedging": {"delay": "learned", "window": "0s"}}"#,
            "methods./pkg.Svc/Get.hedging.window",
        ),
        (
            r#"{"hedging": {"delay": "learned", "min_samples": -1}}"#,
            "methods./pkg.Svc/Get.hedging.min_samples",
        ),
        // Unknown keys, as everywhere in this shape.
        (
            r#"{"hedging": {"dealy": "10ms"}}"#,
            "methods./pkg.Svc/Get.hedging.dealy",
        ),
        (
            r#"{"hedging": {"delay": "learned", "learned": {}}}"#,
            "methods./pkg.Svc/Get.hedging.learned",
        ),
        (r#"{"hedging": true}"#, "methods./pkg.Svc/Get.hedging"),
    ];
    for (body, field) in cases {
        let json = entry(body);
        let e = ClientConfig::from_json(&json).unwrap_err();
        assert_eq!(field_of(e), field, "{json}");
    }
    let e = ClientConfig::from_json(&entry(r#"{"hedging": {}, "max_attempts": 3}"#)).unwrap_err();
    let message = e.to_string();
    assert!(message.contains("retried or hedged, not both"), "{message}");
    assert!(message.contains("`hedging.max_attempts`"), "{message}");
    // Hedging is chosen per method or service, not for the whole layer.
    for (json, field) in [
        (r#"{"hedging": {"max_attempts": 2}}"#, "hedging"),
        (r#"{"retry": {"hedging": {}}}"#, "retry.hedging"),
    ] {
        let e = ClientConfig::from_json(json).unwrap_err();
        let message = e.to_string();
        assert!(message.contains("under `methods`"), "{message}");
        assert_eq!(field_of(e), field, "{json}");
    }
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct App {
    name: String,
    stormguard: ClientConfig,
}

#[test]
fn an_application_config_holds_stormguard_s_section_with_the_same_checks() {
    let section = r#"{ "retry": { "max_attempts": 4, "budget": { "ttl": "5s" } },
        "methods": { "/pkg.Svc/Get": { "idempotent": true } },
        "breaker": { "open_for": "2s" } }"#;
    let app: App = serde_json::from_str(&format!(
        r#"{{ "name": "checkout", "stormguard": {section} }}"#
    ))
    .unwrap();
    assert_eq!(app.name, "checkout");
    assert_eq!(app.stormguard, ClientConfig::from_json(section).unwrap());
    // The checks run as part of deserializing; every error `from_json` finds is found.
    for (section, field) in [
        (
            r#"{"retry": {"budget": {"ttl": "0.5s"}}}"#,
            "retry.budget.ttl",
        ),
        (r#"{"retry": {"base": "2s", "cap": "1s"}}"#, "retry.cap"),
        (
            r#"{"breaker": {"failure_rate": 2}}"#,
            "breaker.failure_rate",
        ),
        (r#"{"methods": {"pkg.Svc/Get": {}}}"#, "methods.pkg.Svc/Get"),
        (r#"{"retry": {"max_atempts": 3}}"#, "retry.max_atempts"),
    ] {
        assert_eq!(
            field_of(ClientConfig::from_json(section).unwrap_err()),
            field
        );
        let json = format!(r#"{{ "name": "x", "stormguard": {section} }}"#);
        let de = &mut serde_json::Deserializer::from_str(&json);
        let e = serde_path_to_error::deserialize::<_, App>(de).unwrap_err();
        let message = e.to_string();
        assert!(message.starts_with("stormguard"), "{message}");
        assert!(message.contains(field), "{section}: {message}");
    }
}

#[cfg(not(feature = "yaml"))]
#[test]
fn yaml_without_its_feature_is_a_clear_error() {
    let e = ClientConfig::from_text("retry: {}\n", Format::Yaml).unwrap_err();
    assert_eq!(
        e,
        ConfigError::FormatDisabled {
            format: "YAML",
            feature: "yaml"
        }
    );
    assert!(e.to_string().contains("enable the `yaml` feature"), "{e}");
}

#[cfg(not(feature = "toml"))]
#[test]
fn toml_without_its_feature_is_a_clear_error() {
    let e = ClientConfig::from_text("[retry]\n", Format::Toml).unwrap_err();
    assert!(
        matches!(
            e,
            ConfigError::FormatDisabled {
                feature: "toml",
                ..
            }
        ),
        "{e}"
    );
}

proptest! {
    #[test]
    fn any_hedging_policy_in_range_reads_from_both_shapes(
        attempts in 2u32..20, delay_ms in 0u64..100_000, code in 1i32..17,
    ) {
        let json = format!(r#"{{"methodConfig": [{{"name": [{{"service": "s"}}],
            "hedgingPolicy": {{"maxAttempts": {attempts}, "hedgingDelay": "{}.{:03}s",
            "nonFatalStatusCodes": [{code}]}}}}]}}"#, delay_ms / 1000, delay_ms % 1000);
        let c = ClientConfig::from_service_config_json(&json).unwrap();
        let h = hedging_of(&c, "/s/M").unwrap();
        prop_assert_eq!(h.effective_max_attempts(), attempts.min(5));
        prop_assert_eq!(&h.delay, &HedgeDelay::Fixed(ms(delay_ms)));
        prop_assert!(h.non_fatal_codes.contains(Code::from_i32(code).unwrap()));
        let json = format!(r#"{{"methods": {{"/s/": {{"hedging": {{"max_attempts": {attempts},
            "delay": "{delay_ms}ms", "non_fatal_codes": [{code}]}}}}}}}}"#);
        let own = ClientConfig::from_json(&json).unwrap();
        prop_assert_eq!(hedging_of(&own, "/s/M"), Some(h));
    }

    #[test]
    fn service_config_parser_never_panics(json in r#"\{"(methodConfig|retryThrottling)": .{0,40}\}"#) {
        let _ = ClientConfig::from_service_config_json(&json);
    }

    #[test]
    fn stormguard_parser_never_panics(json in r#"\{"(retry|methods|breaker)": .{0,40}\}"#) {
        if let Ok(c) = ClientConfig::from_json(&json) {
            prop_assert_eq!(c.validate(), Ok(()));
        }
    }
}

#[cfg(all(feature = "yaml", feature = "toml"))]
#[test]
fn idempotency_keys_are_read_per_method_in_every_format() {
    let json = r#"{ "retry": { "idempotency_key": false },
        "methods": {
            "/pkg.Payments/": { "idempotency_key": true },
            "/pkg.Payments/Lookup": { "idempotency_key": false, "idempotent": true },
            "/pkg.Search/Find": { "idempotency_key": true, "hedging": { "delay": "10ms" } }
        } }"#;
    let yaml = "
retry: { idempotency_key: false }
methods:
  /pkg.Payments/: { idempotency_key: true }
  /pkg.Payments/Lookup: { idempotency_key: false, idempotent: true }
  /pkg.Search/Find: { idempotency_key: true, hedging: { delay: 10ms } }
";
    let toml = r#"
[retry]
idempotency_key = false
[methods."/pkg.Payments/"]
idempotency_key = true
[methods."/pkg.Payments/Lookup"]
idempotency_key = false
idempotent = true
[methods."/pkg.Search/Find"]
idempotency_key = true
hedging = { delay = "10ms" }
"#;
    let from_json = ClientConfig::from_json(json).unwrap();
    assert_eq!(
        from_json,
        ClientConfig::from_text(yaml, Format::Yaml).unwrap()
    );
    assert_eq!(
        from_json,
        ClientConfig::from_text(toml, Format::Toml).unwrap()
    );
    let m = &from_json.methods;
    assert!(m.idempotency_key("/pkg.Payments/Charge"));
    assert!(!m.idempotency_key("/pkg.Payments/Lookup"));
    assert!(
        m.idempotency_key("/pkg.Search/Find"),
        "a hedged method may be keyed"
    );
    assert!(m.lookup_hedging("/pkg.Search/Find").is_some());
    assert!(!m.idempotency_key("/pkg.Other/Charge"));
    // A keyed method's answers are retried: no notice that none is.
    assert!(from_json.notices().is_empty());
    // A wrong type names the field.
    let e =
        ClientConfig::from_json(r#"{ "methods": { "/pkg.S/M": { "idempotency_key": "yes" } } }"#)
            .unwrap_err();
    assert!(e.to_string().contains("idempotency_key"), "{e}");
    // Every method keyed from `retry`.
    let c = ClientConfig::from_json(r#"{ "retry": { "idempotency_key": true } }"#).unwrap();
    assert!(c.methods.idempotency_key("/any.Svc/Any"));
}
#[test]
fn hedging_in_the_service_config_sits_where_a_retry_policy_would() -> Result<(), ConfigError> {
    use super::ClientConfig;
    use crate::retry::HedgeDelay;
    use std::time::Duration;

    let config = ClientConfig::from_service_config_json(
        r#"{ "methodConfig": [{
        "name": [{ "service": "stormguard.demo.v1.Catalog" }],
        "hedgingPolicy": { "maxAttempts": 3, "hedgingDelay": "0.010s",
                           "nonFatalStatusCodes": ["UNAVAILABLE"] } }] }"#,
    )?;
    let hedging = config
        .methods
        .lookup_hedging("/stormguard.demo.v1.Catalog/Get")
        .unwrap();
    assert_eq!(hedging.delay, HedgeDelay::Fixed(Duration::from_millis(10)));
    assert!(
        config
            .methods
            .lookup("/stormguard.demo.v1.Catalog/Get")
            .is_none(),
        "not retried"
    );
    Ok(())
}

#[test]
fn hedging_in_stormguard_s_shape_is_per_method_and_alone_in_its_entry() -> Result<(), ConfigError> {
    use super::ClientConfig;
    use crate::retry::HedgeDelay;

    let config = ClientConfig::from_json(
        r#"{ "methods": {
        "/stormguard.demo.v1.Search/": { "hedging": { "delay": "learned", "ceiling": "200ms" } } } }"#,
    )?;
    let hedging = config
        .methods
        .lookup_hedging("/stormguard.demo.v1.Search/Query")
        .unwrap();
    assert!(matches!(hedging.delay, HedgeDelay::Learned(_)));
    assert!(
        config
            .methods
            .lookup("/stormguard.demo.v1.Inventory/Reserve")
            .is_some(),
        "`retry`"
    );

    let both = ClientConfig::from_json(
        r#"{ "methods": {
        "/pkg.Svc/Get": { "hedging": {}, "max_attempts": 3 } } }"#,
    );
    assert!(
        both.unwrap_err()
            .to_string()
            .contains("methods./pkg.Svc/Get.max_attempts")
    );
    Ok(())
}

#[test]
fn the_adaptive_throttle_is_read_and_checked() -> Result<(), ConfigError> {
    use super::ClientConfig;

    let config = ClientConfig::from_json(
        r#"{ "adaptive_throttle": { "k": 1.5, "sheddable_k": 1.2,
        "window": "30s" } }"#,
    )?;
    assert_eq!(config.adaptive_throttle.unwrap().k, 1.5);
    assert!(
        ClientConfig::from_json("{}")?.adaptive_throttle.is_none(),
        "off by default"
    );

    let bad =
        ClientConfig::from_json(r#"{ "adaptive_throttle": { "max_reject_probability": 1 } }"#);
    assert!(
        bad.unwrap_err()
            .to_string()
            .contains("adaptive_throttle.max_reject_probability")
    );
    Ok(())
}

#[test]
fn an_application_config_embeds_a_client_config_and_deserializing_validates() {
    use super::ClientConfig;
    use serde::Deserialize;

    #[derive(Deserialize)]
    #[allow(dead_code)] // `listen` stands for the application's own fields.
    struct App {
        listen: String,
        inventory: ClientConfig,
    }

    let app: App = serde_json::from_str(r#"{ "listen": "[::1]:50051",
        "inventory": { "retry": { "max_attempts": 3 },
                       "methods": { "/stormguard.demo.v1.Inventory/Reserve": { "idempotent": true } } } }"#)
        .unwrap();
    assert!(
        app.inventory
            .methods
            .lookup("/stormguard.demo.v1.Inventory/Reserve")
            .unwrap()
            .idempotent
    );

    // Deserializing validates: a bad value cannot get past it unnoticed.
    let bad = serde_json::from_str::<App>(
        r#"{ "listen": "",
        "inventory": { "retry": { "budget": { "ttl": "0.5s" } } } }"#,
    );
    assert!(bad.err().unwrap().to_string().contains("retry.budget.ttl"));
}

#[test]
fn format_follows_the_file_extension() {
    use std::path::Path;

    assert_eq!(
        document::Format::from_path(Path::new("retry.yml")).unwrap(),
        Format::Yaml
    );
    assert!(document::Format::from_path(Path::new("retry.ini")).is_err());
}
