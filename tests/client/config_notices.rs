//! A layer built from a config that says something that will not happen says so once, at
//! WARN, when it is built: service-config fields it does not act on, and the seed design's
//! own YAML, whose `max_attempts: 3` retries no answer until a method is marked idempotent.
#![allow(clippy::unwrap_used)]

use crate::tracing_support;

use stormguard_client::RetryLayer;
use stormguard_core::config::{ClientConfig, Format};
use tracing::Level;
use tracing_support::Recorder;

const SEED_YAML: &str = "
retry:
  budget:
    ttl: 10s
    min_retries_per_second: 5
    retry_ratio: 0.1
  backoff: full_jitter
  base: 100ms
  max_attempts: 3
  budget_exhausted: fail_fast
";

fn warnings_of(config: &ClientConfig) -> Vec<String> {
    let recorder = Recorder::default();
    tracing::subscriber::with_default(recorder.clone(), || {
        RetryLayer::from_config_seeded(config, 1).unwrap();
    });
    recorder
        .take_info()
        .into_iter()
        .filter(|e| e.level == Level::WARN)
        .map(|e| e.get("config.notice").unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn the_seed_config_warns_that_it_retries_no_answer_and_names_the_setting() {
    let config = ClientConfig::from_text(SEED_YAML, Format::Yaml).unwrap();
    let warnings = warnings_of(&config);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("idempotent"), "{}", warnings[0]);
    // The one line that makes it do what it says: a method marked idempotent.
    let fixed = format!(
        "{SEED_YAML}methods:\n  /stormguard.demo.v1.Inventory/Reserve:\n    idempotent: true\n"
    );
    let config = ClientConfig::from_text(&fixed, Format::Yaml).unwrap();
    assert_eq!(warnings_of(&config), Vec::<String>::new());
}

#[test]
fn service_config_fields_not_applied_are_listed_in_one_warning() {
    let json = r#"{"methodConfig":[{"name":[{}],"waitForReady":true,"maxRequestMessageBytes":1024,
        "retryPolicyy":{},"retryPolicy":{"maxAttempts":2,"initialBackoff":"0.1s","maxBackoff":"1s",
        "backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}}]}"#;
    let config = ClientConfig::from_service_config_json(json).unwrap();
    let warnings = warnings_of(&config);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    for field in ["waitForReady", "maxRequestMessageBytes", "retryPolicyy"] {
        assert!(
            warnings[0].contains(field),
            "{field} missing: {}",
            warnings[0]
        );
    }
}
