//! Config files: JSON, YAML and TOML read by one loader (`from_path`) for the client and the
//! server, with errors that name the field as the document spells it and the file. YAML
//! and TOML are features (on by default): the tests that read them run when they are on.
#![allow(clippy::unwrap_used)]
// Without YAML or TOML, what only their tests use is unused.
#![cfg_attr(not(all(feature = "yaml", feature = "toml")), allow(unused))]

use std::path::PathBuf;
use std::time::Duration;

use stormguard_core::ConfigError;
use stormguard_core::{AdmissionConfig, QueueOrder};
use stormguard_core::{BudgetChoice, ClientConfig, Format, Notice};
use stormguard_core::{CallTimes, Instant, RetryController};

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

/// The error inside a [`ConfigError::File`], which must name a file ending in `name`.
fn in_file(e: ConfigError, name: &str) -> ConfigError {
    match e {
        ConfigError::File { path, error } if path.to_string_lossy().ends_with(name) => *error,
        other => panic!("expected an error in {name}, got {other}"),
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

#[cfg(all(feature = "yaml", feature = "toml"))]
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

#[cfg(all(feature = "yaml", feature = "toml"))]
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

#[cfg(feature = "yaml")]
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
fn a_hedging_policy_is_read_and_one_beside_a_retry_policy_is_refused() {
    let json = r#"{ "methodConfig": [{ "name": [{ "service": "s" }],
        "hedgingPolicy": { "maxAttempts": 3, "hedgingDelay": "0.1s" } }] }"#;
    let config = ClientConfig::from_service_config_json(json).unwrap();
    let hedging = config.methods.lookup_hedging("/s/M").unwrap();
    assert_eq!(hedging.max_attempts, 3);
    assert!(config.methods.lookup("/s/M").is_none());
    #[cfg(feature = "yaml")]
    {
        let yaml = "methodConfig:\n  - name: [{}]\n    hedgingPolicy: { maxAttempts: 2 }\n    \
                    retryPolicy: { maxAttempts: 2, initialBackoff: 0.1s, maxBackoff: 1s, \
                    backoffMultiplier: 2, retryableStatusCodes: [UNAVAILABLE] }\n";
        let e = ClientConfig::from_text(yaml, Format::Yaml).unwrap_err();
        assert_eq!(field(e), "methodConfig[0]");
    }
}

#[cfg(feature = "yaml")]
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
    // A call that carries no deadline of its own gets the method's.
    let controller = RetryController::from_config(&config).unwrap();
    let now = Instant::now();
    let deadline = |path: &str| {
        let call = controller.begin_call_at(path, &CallTimes::default(), now);
        call.unwrap().deadline()
    };
    assert_eq!(
        deadline("/pkg.Svc/Get"),
        Some(now + Duration::from_millis(1500))
    );
    // The most specific entry wins, as for the retry policy: this one has no timeout.
    assert_eq!(deadline("/pkg.Svc/Stream"), None);
    assert_eq!(
        deadline("/other.Svc/Get"),
        Some(now + Duration::from_secs(10))
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

    // What is wrong inside a file comes with the file's name.
    let broken = File::new("broken.json", r#"{"retry": [unclosed"#);
    let e = ClientConfig::from_path(&broken.0).unwrap_err();
    assert!(
        e.to_string()
            .contains("broken.json: malformed config: JSON"),
        "{e}"
    );
    assert!(matches!(
        in_file(e, "broken.json"),
        ConfigError::Malformed(_)
    ));

    let invalid = File::new("invalid.json", r#"{"retry": {"budget": {"ttl": "0.5s"}}}"#);
    let e = ClientConfig::from_path(&invalid.0).unwrap_err();
    assert!(
        e.to_string()
            .contains("invalid.json: invalid `retry.budget.ttl`"),
        "{e}"
    );
    assert_eq!(field(in_file(e, "invalid.json")), "retry.budget.ttl");

    let admission = File::new("admission.json", r#"{"admission": {"workers": 0}}"#);
    let e = AdmissionConfig::from_path(&admission.0).unwrap_err();
    assert_eq!(field(in_file(e, "admission.json")), "admission.workers");

    #[cfg(feature = "yaml")]
    {
        let broken = File::new("broken.yaml", "retry: [unclosed\n");
        let e = ClientConfig::from_path(&broken.0).unwrap_err();
        assert!(
            matches!(in_file(e, "broken.yaml"), ConfigError::Malformed(m) if m.contains("YAML"))
        );
        let list = ClientConfig::from_text("- retry\n", Format::Yaml).unwrap_err();
        assert!(matches!(list, ConfigError::Malformed(_)), "{list}");
    }
    #[cfg(not(feature = "yaml"))]
    {
        let yaml = File::new("retry.yaml", "retry: {}\n");
        let e = ClientConfig::from_path(&yaml.0).unwrap_err();
        assert!(matches!(
            in_file(e, "retry.yaml"),
            ConfigError::FormatDisabled {
                feature: "yaml",
                ..
            }
        ));
    }
}

#[cfg(all(feature = "yaml", feature = "toml"))]
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

#[cfg(all(feature = "yaml", feature = "toml"))]
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
        assert_eq!(config.workers.fixed(), Some(6));
        assert_eq!(config.queue_capacity, 24);
        assert_eq!(config.max_time_queued, Duration::from_millis(400));
        assert_eq!(config.queue_order, QueueOrder::Fifo);
    }
    let e = AdmissionConfig::from_text("admission:\n  workers: lots\n", Format::Yaml).unwrap_err();
    assert_eq!(field(e), "admission.workers");
}

/// The example YAML retries no answer, and says so; one entry under `methods` makes the
/// method that is safe to repeat have its answers retried, in YAML and in TOML.
#[cfg(all(feature = "yaml", feature = "toml"))]
#[test]
fn the_example_config_says_it_retries_no_answer_until_a_method_is_marked() {
    let example = ClientConfig::from_text(YAML, Format::Yaml).unwrap();
    assert!(matches!(
        example.notices()[..],
        [Notice::NoAnswerRetried {
            max_attempts: 3,
            ..
        }]
    ));
    let reserve = "/stormguard.demo.v1.Inventory/Reserve";
    let yaml = format!("{YAML}methods:\n  {reserve}: {{ idempotent: true }}\n");
    let toml = format!("{TOML}\n[methods.\"{reserve}\"]\nidempotent = true\n");
    for (text, format) in [(yaml.as_str(), Format::Yaml), (toml.as_str(), Format::Toml)] {
        let config = ClientConfig::from_text(text, format).unwrap();
        assert!(config.notices().is_empty(), "{format:?}");
        assert!(config.methods.lookup(reserve).unwrap().idempotent);
        assert!(
            !config
                .methods
                .lookup("/stormguard.demo.v1.Inventory/Cancel")
                .unwrap()
                .idempotent
        );
        // Everything else is the example's.
        assert_eq!(config.budget, example.budget, "{format:?}");
    }
}

/// A team holds stormguard's section in its own config, read by its own format's
/// deserializer, with stormguard's checks.
#[derive(Debug, serde::Deserialize)]
struct App {
    service: String,
    stormguard: ClientConfig,
    admission: AdmissionConfig,
}

#[cfg(feature = "yaml")]
#[test]
fn an_application_s_yaml_holds_stormguard_s_sections() {
    let yaml = "
service: checkout
stormguard:
  retry: { max_attempts: 3, base: 100ms, budget: { ttl: 10s } }
  methods:
    /shop.Cart/Add: { idempotent: true }
admission:
  workers: 8
  queue_order: fifo
";
    let app: App = serde_norway::from_str(yaml).unwrap();
    assert_eq!(app.service, "checkout");
    assert!(
        app.stormguard
            .methods
            .lookup("/shop.Cart/Add")
            .unwrap()
            .idempotent
    );
    assert_eq!(app.admission.workers.fixed(), Some(8));
    assert_eq!(app.admission.queue_order, QueueOrder::Fifo);
    let bad = yaml.replace("ttl: 10s", "ttl: 90s");
    let e = serde_norway::from_str::<App>(&bad).unwrap_err().to_string();
    assert!(e.contains("retry.budget.ttl"), "{e}");
    let typo = yaml.replace("workers", "worker");
    let e = serde_norway::from_str::<App>(&typo)
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown field `worker`"), "{e}");
}

#[cfg(feature = "toml")]
#[test]
fn an_application_s_toml_holds_stormguard_s_sections() {
    let toml = r#"
service = "checkout"

[stormguard.retry]
max_attempts = 3
base = "100ms"

[stormguard.methods."/shop.Cart/Add"]
idempotent = true

[admission]
workers = 8
"#;
    let app: App = toml::from_str(toml).unwrap();
    assert!(
        app.stormguard
            .methods
            .lookup("/shop.Cart/Add")
            .unwrap()
            .idempotent
    );
    assert_eq!(app.admission.workers.fixed(), Some(8));
    let bad = toml.replace("workers = 8", "workers = 0");
    let e = toml::from_str::<App>(&bad).unwrap_err().to_string();
    assert!(e.contains("admission.workers"), "{e}");
}
