//! Config files: JSON, YAML and TOML read by one loader (`from_path`) for the client and the
//! server, with errors that name the field as the document spells it.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Duration;

use stormguard_core::admission::{AdmissionConfig, QueueOrder};
use stormguard_core::config::{BudgetChoice, ClientConfig, Format};
use stormguard_core::error::ConfigError;

/// A file of this test's own, removed when dropped.
struct File(PathBuf);

impl File {
    fn new(name: &str, text: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "stormguard-config-files-{}-{name}",
            std::process::id()
        ));
        std::fs::write(&path, text).unwrap();
        File(path)
    }
}

impl Drop for File {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn field(e: ConfigError) -> String {
    match e {
        ConfigError::Invalid { field, .. } => field,
        other => panic!("expected a field error, got {other}"),
    }
}

const YAML: &str = "
retry:
  budget:
    ttl: 10s
    min_retries_per_second: 5      # floor so low-traffic paths still retry
    retry_ratio: 0.1               # retries <= 10% of successes
  backoff: full_jitter             # sleep = rand(0, base * 2^n)
  base: 100ms
  max_attempts: 3
  budget_exhausted: fail_fast
";

const TOML: &str = r#"
[retry]
backoff = "full_jitter"
base = "100ms"
max_attempts = 3
budget_exhausted = "fail_fast"

[retry.budget]
ttl = "10s"
min_retries_per_second = 5
retry_ratio = 0.1
"#;

const JSON: &str = r#"{ "retry": { "budget": { "ttl": "10s", "min_retries_per_second": 5,
    "retry_ratio": 0.1 }, "backoff": "full_jitter", "base": "100ms", "max_attempts": 3,
    "budget_exhausted": "fail_fast" } }"#;

#[test]
fn the_same_config_reads_the_same_from_json_yaml_and_toml_files() {
    let want = ClientConfig::from_json(JSON).unwrap();
    let BudgetChoice::Stormguard(budget) = &want.budget else {
        panic!("stormguard budget")
    };
    assert_eq!(budget.ttl, Duration::from_secs(10));
    assert_eq!(budget.min_retries_per_second, 5);
    for (name, text) in [
        ("retry.json", JSON),
        ("retry.yaml", YAML),
        ("retry.yml", YAML),
        ("retry.toml", TOML),
    ] {
        let file = File::new(name, text);
        assert_eq!(ClientConfig::from_path(&file.0).unwrap(), want, "{name}");
    }
}

#[test]
fn errors_name_the_field_as_the_document_spells_it() {
    let cases = [
        (
            "retry:\n  budget:\n    ttl: soon\n",
            Format::Yaml,
            "retry.budget.ttl",
        ),
        (
            "retry:\n  max_atempts: 3\n",
            Format::Yaml,
            "retry.max_atempts",
        ),
        ("retry:\n  base: -1s\n", Format::Yaml, "retry.base"),
        (
            "[retry]\nretryable_codes = [\"NOPE\"]\n",
            Format::Toml,
            "retry.retryable_codes[0]",
        ),
        (
            "[retry.budget]\nretry_ratio = -1.0\n",
            Format::Toml,
            "retry.budget.retry_ratio",
        ),
        (
            "[breaker]\nfailure_rate = 2.0\n",
            Format::Toml,
            "breaker.failure_rate",
        ),
    ];
    for (text, format, want) in cases {
        let got = ClientConfig::from_text(text, format).unwrap_err();
        assert_eq!(field(got), want, "{text}");
    }
}

#[test]
fn a_service_config_file_in_any_format_is_read_as_one() {
    let yaml = "
methodConfig:
  - name: [{ service: stormguard.demo.v1.Inventory }]
    retryPolicy:
      maxAttempts: 4
      initialBackoff: 0.1s
      maxBackoff: 1s
      backoffMultiplier: 2
      retryableStatusCodes: [UNAVAILABLE]
retryThrottling: { maxTokens: 10, tokenRatio: 0.1 }
";
    let file = File::new("service.yaml", yaml);
    let config = ClientConfig::from_path(&file.0).unwrap();
    let policy = config
        .methods
        .lookup("/stormguard.demo.v1.Inventory/Reserve")
        .unwrap();
    assert_eq!(policy.max_attempts, 4);
    assert!(matches!(config.budget, BudgetChoice::A6(_)));
}

#[test]
fn a_hedging_policy_is_refused_not_dropped() {
    let json = r#"{ "methodConfig": [{ "name": [{ "service": "s" }],
        "hedgingPolicy": { "maxAttempts": 3, "hedgingDelay": "0.1s" } }] }"#;
    let e = ClientConfig::from_service_config_json(json).unwrap_err();
    assert!(e.to_string().contains("hedging is not supported"), "{e}");
    assert_eq!(field(e), "methodConfig[0].hedgingPolicy");
    let yaml = "methodConfig:\n  - name: [{}]\n    hedgingPolicy: { maxAttempts: 2 }\n";
    let e = ClientConfig::from_text(yaml, Format::Yaml).unwrap_err();
    assert_eq!(field(e), "methodConfig[0].hedgingPolicy");
}

#[test]
fn a_method_timeout_becomes_its_default_deadline() {
    let yaml = "
methodConfig:
  - name: [{ service: pkg.Svc }]
    timeout: 1.5s
  - name: [{ service: pkg.Svc, method: Stream }]
  - name: [{}]
    timeout: 10s
";
    let config = ClientConfig::from_text(yaml, Format::Yaml).unwrap();
    assert_eq!(
        config.methods.timeout("/pkg.Svc/Get"),
        Some(Duration::from_millis(1500))
    );
    // The most specific entry wins, as for the retry policy: this one has no timeout.
    assert_eq!(config.methods.timeout("/pkg.Svc/Stream"), None);
    assert_eq!(
        config.methods.timeout("/other.Svc/Get"),
        Some(Duration::from_secs(10))
    );
    for (bad, why) in [("0s", "greater than 0"), ("soon", "")] {
        let json = format!(r#"{{"methodConfig":[{{"name":[{{}}],"timeout":"{bad}"}}]}}"#);
        let e = ClientConfig::from_service_config_json(&json).unwrap_err();
        assert!(e.to_string().contains(why), "{e}");
        assert_eq!(field(e), "methodConfig[0].timeout");
    }
}

#[test]
fn files_that_cannot_be_read_say_which_and_why() {
    let missing = std::env::temp_dir().join("stormguard-config-files-missing.yaml");
    let e = ClientConfig::from_path(&missing).unwrap_err();
    assert!(
        matches!(&e, ConfigError::Read { path, .. } if path.ends_with("missing.yaml")),
        "{e}"
    );

    let ini = File::new("retry.ini", "retry = 1");
    let e = ClientConfig::from_path(&ini.0).unwrap_err();
    assert!(e.to_string().contains(".json, .yaml, .yml or .toml"), "{e}");

    let broken = File::new("broken.yaml", "retry: [unclosed\n");
    let e = ClientConfig::from_path(&broken.0).unwrap_err();
    assert!(
        matches!(&e, ConfigError::Malformed(m) if m.contains("broken.yaml") && m.contains("YAML")),
        "{e}"
    );

    let list = ClientConfig::from_text("- retry\n", Format::Yaml).unwrap_err();
    assert!(matches!(list, ConfigError::Malformed(_)), "{list}");
}

#[test]
fn an_empty_document_is_the_standard_config() {
    assert_eq!(
        ClientConfig::from_text("", Format::Yaml).unwrap(),
        ClientConfig::from_json("{}").unwrap()
    );
    assert_eq!(
        ClientConfig::from_text("", Format::Toml).unwrap(),
        ClientConfig::from_json("{}").unwrap()
    );
}

#[test]
fn the_server_reads_its_admission_config_from_the_same_loader() {
    let yaml = File::new(
        "admission.yaml",
        "admission:\n  workers: 6\n  queue_capacity: 24\n  max_time_queued: 400ms\n  queue_order: fifo\n",
    );
    let toml = File::new(
        "admission.toml",
        "[admission]\nworkers = 6\nqueue_capacity = 24\nmax_time_queued = \"400ms\"\nqueue_order = \"fifo\"\n",
    );
    for file in [&yaml, &toml] {
        let config = AdmissionConfig::from_path(&file.0).unwrap();
        assert_eq!(config.workers, 6);
        assert_eq!(config.queue_capacity, 24);
        assert_eq!(config.max_time_queued, Duration::from_millis(400));
        assert_eq!(config.queue_order, QueueOrder::Fifo);
    }
    let e = AdmissionConfig::from_text("admission:\n  workers: lots\n", Format::Yaml).unwrap_err();
    assert_eq!(field(e), "admission.workers");
}
