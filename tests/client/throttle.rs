//! The client-side adaptive throttle over real tonic on loopback: a server that sheds
//! (answers `UNAVAILABLE` with a pushback, as a `ShedLayer` does) makes the layer refuse
//! calls locally at the share the SRE formula gives, the calls refused never reach the
//! server, application errors do not count, critical calls are refused last, every
//! attempt (retries too) is recorded, and the config reads from JSON, YAML and TOML.
#![allow(clippy::unwrap_used)]

use crate::client_support;

use std::time::Duration;

use client_support::{Client, Scripted, Step, pushback_of, quick_policy, reserve, setup};
use stormguard_client::RetryLayer;
use stormguard_core::Instant;
use stormguard_core::adaptive_throttle::{AdaptiveThrottle, AdaptiveThrottleConfig};
use stormguard_core::config::{ClientConfig, Format};
use stormguard_core::criticality::Criticality;
use tonic::{Code, Request};

/// The default settings with a window long enough that a slow machine's run fits in it.
fn config() -> AdaptiveThrottleConfig {
    AdaptiveThrottleConfig {
        window: Duration::from_secs(60),
        ..AdaptiveThrottleConfig::default()
    }
}

/// A layer that never retries, with the throttle of `config`.
fn layer(config: AdaptiveThrottleConfig) -> RetryLayer {
    let mut client_config = ClientConfig::no_retries();
    client_config.adaptive_throttle = Some(config);
    RetryLayer::from_config_seeded(&client_config, 7).unwrap()
}

fn request(class: Option<&'static str>) -> Request<stormguard_demo::ReserveRequest> {
    let mut request = Request::new(reserve("r"));
    if let Some(class) = class {
        request
            .metadata_mut()
            .insert("stormguard-criticality", class.parse().unwrap());
    }
    request
}

async fn call(client: &mut Client, class: Option<&'static str>) -> Result<(), tonic::Status> {
    client.reserve(request(class)).await.map(|_| ())
}

#[tokio::test]
async fn a_shedding_server_makes_the_client_refuse_locally_at_the_formula_s_share() {
    let server = Scripted::always(Step::pushback(Code::Unavailable, "100"));
    let layer = layer(config());
    let stats = layer.stats();
    let throttle = layer.adaptive_throttle().unwrap().clone();
    let mut client = setup(&server, layer).await;
    let calls = 1000;
    let mut local = 0;
    for _ in 0..calls {
        let status = call(&mut client, None).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        if status.message().contains("adaptive throttle") {
            local += 1;
            // Refused locally: callers above are told not to retry it.
            assert_eq!(pushback_of(&status).as_deref(), Some("-1"));
            assert!(status.message().starts_with("stormguard: call not sent"));
        } else {
            assert_eq!(pushback_of(&status).as_deref(), Some("100"), "the server's");
        }
    }
    let snapshot = stats.snapshot();
    assert_eq!(snapshot.throttled.default, local);
    assert_eq!(snapshot.throttled.total(), local);
    assert_eq!(snapshot.logical, calls);
    // Never sent: the server saw exactly the calls the throttle let through.
    assert_eq!(server.seen().len() as u64, calls - local);
    assert_eq!(snapshot.attempts, calls - local);
    // Every request was refused, locally or by the server: p = n / (n + 1), capped at
    // 0.9 after the first few, so about nine calls in ten are refused locally.
    let share = local as f64 / calls as f64;
    assert!(
        (0.86..0.93).contains(&share),
        "{local} of {calls} refused locally"
    );
    let counts = throttle.counts_at(Criticality::Default, Instant::now());
    assert_eq!((counts.requests, counts.accepts), (calls, 0));
}

#[tokio::test]
async fn application_errors_and_successes_never_trigger_it() {
    // NOT_FOUND, INTERNAL and a handler's own UNAVAILABLE (no pushback, no shed marker)
    // are answers the server chose to give after doing the work.
    let steps = [
        Step::Fail(Code::NotFound),
        Step::Fail(Code::Internal),
        Step::Fail(Code::Unavailable),
        Step::Ok,
    ];
    let script: Vec<Step> = steps.iter().cycle().take(400).cloned().collect();
    let server = Scripted::new(script, Step::Ok);
    let layer = layer(config());
    let stats = layer.stats();
    let throttle = layer.adaptive_throttle().unwrap().clone();
    let mut client = setup(&server, layer).await;
    for i in 0..400 {
        let result = call(&mut client, None).await;
        assert_eq!(result.is_ok(), i % 4 == 3, "call {i}: {result:?}");
    }
    assert_eq!(stats.snapshot().throttled.total(), 0);
    assert_eq!(server.seen().len(), 400, "every call reached the server");
    let counts = throttle.counts_at(Criticality::Default, Instant::now());
    assert_eq!((counts.requests, counts.accepts), (400, 400));
}

#[tokio::test]
async fn sheddable_calls_are_refused_first_and_critical_ones_last() {
    // The server accepts two calls in five and sheds the rest, whatever their class: 40 %
    // accepted is below 1/K for sheddable (1.5) and default (2) calls, above it for
    // critical ones (3).
    let pattern = [
        Step::Ok,
        Step::pushback(Code::Unavailable, "10"),
        Step::pushback(Code::Unavailable, "10"),
        Step::Ok,
        Step::pushback(Code::Unavailable, "10"),
    ];
    let script: Vec<Step> = pattern.iter().cycle().take(5000).cloned().collect();
    let server = Scripted::new(script, Step::Ok);
    let layer = layer(config());
    let stats = layer.stats();
    let mut client = setup(&server, layer).await;
    for _ in 0..300 {
        for class in ["sheddable", "default", "critical"] {
            let _ = call(&mut client, Some(class)).await;
        }
    }
    let throttled = stats.snapshot().throttled;
    assert_eq!(throttled.critical, 0, "{throttled:?}");
    assert!(throttled.default > 0, "{throttled:?}");
    assert!(throttled.sheddable > throttled.default, "{throttled:?}");
    let sent = server.seen().len() as u64;
    assert_eq!(sent, 900 - throttled.total());
}

#[tokio::test]
async fn every_attempt_counts_as_a_request_retries_included() {
    // A retried method: each shed answer (pushback 1 ms) is retried up to 3 attempts.
    let server = Scripted::always(Step::pushback(Code::Unavailable, "1"));
    let throttle = AdaptiveThrottle::new(config(), 3).unwrap();
    let layer = RetryLayer::new(client_support::controller(quick_policy()))
        .with_adaptive_throttle(throttle.clone());
    let mut client = setup(&server, layer).await;
    let status = call(&mut client, None).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(server.seen().len(), 3, "three attempts");
    let counts = throttle.counts_at(Criticality::Default, Instant::now());
    assert_eq!((counts.requests, counts.accepts), (3, 0));
}

#[tokio::test]
async fn without_a_throttle_a_shedding_server_sees_every_call() {
    let server = Scripted::always(Step::pushback(Code::Unavailable, "100"));
    let layer = RetryLayer::from_config_seeded(&ClientConfig::no_retries(), 7).unwrap();
    assert!(layer.adaptive_throttle().is_none(), "off by default");
    let stats = layer.stats();
    let mut client = setup(&server, layer).await;
    for _ in 0..200 {
        let _ = call(&mut client, None).await;
    }
    assert_eq!(server.seen().len(), 200);
    assert_eq!(stats.snapshot().throttled.total(), 0);
}

#[test]
fn the_config_reads_from_json_yaml_and_toml() {
    let expected = AdaptiveThrottleConfig {
        k: 1.8,
        sheddable_k: 1.2,
        critical_k: 4.0,
        max_reject_probability: 0.8,
        window: Duration::from_secs(30),
        reject_codes: [stormguard_core::code::Code::ResourceExhausted]
            .into_iter()
            .collect(),
        shed_codes: [
            stormguard_core::code::Code::Unavailable,
            stormguard_core::code::Code::Aborted,
        ]
        .into_iter()
        .collect(),
    };
    let json = r#"{ "adaptive_throttle": { "k": 1.8, "sheddable_k": 1.2, "critical_k": 4,
        "max_reject_probability": 0.8, "window": "30s",
        "reject_codes": ["RESOURCE_EXHAUSTED"], "shed_codes": ["UNAVAILABLE", "aborted"] } }"#;
    let yaml = "adaptive_throttle:\n  k: 1.8\n  sheddable_k: 1.2\n  critical_k: 4\n  \
                max_reject_probability: 0.8\n  window: 30s\n  reject_codes: [RESOURCE_EXHAUSTED]\n  \
                shed_codes: [UNAVAILABLE, ABORTED]\n";
    let toml = "[adaptive_throttle]\nk = 1.8\nsheddable_k = 1.2\ncritical_k = 4\n\
                max_reject_probability = 0.8\nwindow = \"30s\"\n\
                reject_codes = [\"RESOURCE_EXHAUSTED\"]\nshed_codes = [\"UNAVAILABLE\", 10]\n";
    for (text, format) in [
        (json, Format::Json),
        (yaml, Format::Yaml),
        (toml, Format::Toml),
    ] {
        let config = ClientConfig::from_text(text, format).unwrap();
        assert_eq!(
            config.adaptive_throttle.as_ref(),
            Some(&expected),
            "{format:?}"
        );
        let layer = RetryLayer::from_config(&config).unwrap();
        assert_eq!(layer.adaptive_throttle().unwrap().config(), &expected);
    }
    // Every key is optional; an empty section is the defaults.
    let config = ClientConfig::from_json(r#"{ "adaptive_throttle": {} }"#).unwrap();
    assert_eq!(
        config.adaptive_throttle,
        Some(AdaptiveThrottleConfig::default())
    );
    // Errors name the field; unknown keys are refused.
    let error = |json: &str| ClientConfig::from_json(json).unwrap_err().to_string();
    assert!(
        error(r#"{ "adaptive_throttle": { "k": 0.5 } }"#).contains("adaptive_throttle.k"),
        "{}",
        error(r#"{ "adaptive_throttle": { "k": 0.5 } }"#)
    );
    assert!(
        error(r#"{ "adaptive_throttle": { "window": "100ms" } }"#)
            .contains("adaptive_throttle.window")
    );
    assert!(error(r#"{ "adaptive_throttle": { "kk": 2 } }"#).contains("kk"));
    // Deserialized inside an application's own config, it is validated too.
    #[derive(serde::Deserialize)]
    struct App {
        #[allow(dead_code)]
        inventory: ClientConfig,
    }
    let bad = serde_json::from_str::<App>(
        r#"{ "inventory": { "adaptive_throttle": { "sheddable_k": 3 } } }"#,
    );
    assert!(
        bad.err()
            .unwrap()
            .to_string()
            .contains("adaptive_throttle.sheddable_k")
    );
}
