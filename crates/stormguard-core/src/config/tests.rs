#![allow(clippy::unwrap_used)]

use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::backoff::BackoffConfig;
use crate::code::Code;

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
        BudgetChoice::A6(ThrottleConfig {
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
    assert_eq!(c, ClientConfig::standard());
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
        "retry_ratio": 0.2, "fleet_size": "40"}, "budget_exhausted": "fail_fast"},
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
    assert_eq!(c, ClientConfig::standard());
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
    let mut in_code = ClientConfig::standard();
    assert_eq!(in_code.notices().len(), 1);
    in_code.methods.insert_method(
        "pkg.Svc",
        "Get",
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
