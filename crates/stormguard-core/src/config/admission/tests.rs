#![allow(clippy::unwrap_used)]
use std::time::Duration;

use super::*;

#[test]
fn json_reads_every_field() {
    let json = r#"{ "admission": {
            "workers": 16, "queue_capacity": 64,
            "retry_threshold": { "depth": 12, "queue_delay": "20ms" },
            "max_time_queued": "1.5s", "min_time_left": "750us",
            "queue_order": "adaptive_lifo", "lifo_from_depth": 4,
            "pushback_max": "2s", "shed_code": "resource_exhausted", "no_retry_depth": 48,
            "no_retry_code": "ABORTED", "no_retry_margin": "3ms", "no_retry_after_shedding": "2s",
            "seed": "18446744073709551615", "retry_info": true,
            "sheddable_threshold": { "depth": 2, "queue_delay": "5ms" },
            "adaptive": { "min_limit": 3, "max_limit": 200, "window": "50ms",
                          "min_window_samples": 10, "probe_interval": "10s" } } }"#;
    let c = AdmissionConfig::from_json(json).unwrap();
    assert_eq!(
        c,
        AdmissionConfig {
            workers: WorkerLimit::Adaptive(AdaptiveLimitConfig {
                initial_limit: 16,
                min_limit: 3,
                max_limit: 200,
                window: Duration::from_millis(50),
                min_window_samples: 10,
                probe_interval: Duration::from_secs(10),
            }),
            queue_capacity: 64,
            retry_threshold: RetryThreshold {
                depth: Some(12),
                queue_delay: Some(Duration::from_millis(20)),
            },
            max_time_queued: Duration::from_millis(1500),
            min_time_left: Duration::from_micros(750),
            queue_order: QueueOrder::AdaptiveLifo { from_depth: 4 },
            pushback_max: Duration::from_secs(2),
            shed_code: Code::ResourceExhausted,
            no_retry_code: Some(Code::Aborted),
            no_retry_depth: Some(48),
            no_retry_margin: Some(Duration::from_millis(3)),
            no_retry_after_shedding: Some(Duration::from_secs(2)),
            seed: Some(u64::MAX),
            retry_info: true,
            sheddable_threshold: RetryThreshold {
                depth: Some(2),
                queue_delay: Some(Duration::from_millis(5)),
            },
        }
    );
    // Defaults, FIFO, nulls and a code by number.
    assert_eq!(
        AdmissionConfig::from_json("{}").unwrap(),
        AdmissionConfig::default()
    );
    assert_eq!(
        AdmissionConfig::from_json(r#"{"admission": {}}"#).unwrap(),
        AdmissionConfig::default()
    );
    let c = AdmissionConfig::from_json(
        r#"{"admission": {"queue_order": "fifo", "shed_code": 8,
                "retry_threshold": {"depth": null, "queue_delay": null}, "no_retry_depth": null,
                "no_retry_margin": null, "no_retry_after_shedding": null,
                "no_retry_code": null}}"#,
    )
    .unwrap();
    assert_eq!((c.no_retry_margin, c.no_retry_after_shedding), (None, None));
    assert_eq!(c.no_retry_code, None);
    assert_eq!(c.queue_order, QueueOrder::Fifo);
    assert_eq!(c.shed_code, Code::ResourceExhausted);
    assert_eq!(
        c.retry_threshold,
        RetryThreshold {
            depth: None,
            queue_delay: None
        }
    );
    let c = AdmissionConfig::from_json(r#"{"admission": {"lifo_from_depth": 2}}"#).unwrap();
    assert_eq!(c.queue_order, QueueOrder::AdaptiveLifo { from_depth: 2 });
    let c =
        AdmissionConfig::from_json(r#"{"admission": {"queue_order": "lifo_when_late"}}"#).unwrap();
    assert_eq!(c.queue_order, QueueOrder::LifoWhenLate);
    assert_eq!(
        AdmissionConfig::default().queue_order,
        QueueOrder::LifoWhenLate
    );
}

#[test]
fn json_errors_name_the_field_as_written() {
    let field = |json: &str| match AdmissionConfig::from_json(json).unwrap_err() {
        ConfigError::Invalid { field, .. } => field,
        other => other.to_string(),
    };
    let cases = [
        (r#"{"admision": {}}"#, "admision"),
        (r#"{"admission": []}"#, "admission"),
        (r#"{"admission": {"worker": 4}}"#, "admission.worker"),
        (r#"{"admission": {"workers": 0}}"#, "admission.workers"),
        (r#"{"admission": {"workers": -1}}"#, "admission.workers"),
        (r#"{"admission": {"workers": 2.5}}"#, "admission.workers"),
        (
            r#"{"admission": {"queue_capacity": 4}}"#,
            "admission.retry_threshold.depth",
        ),
        (
            r#"{"admission": {"retry_threshold": {"depth": 8, "delay": "1ms"}}}"#,
            "admission.retry_threshold.delay",
        ),
        (
            r#"{"admission": {"retry_threshold": {"queue_delay": 20}}}"#,
            "admission.retry_threshold.queue_delay",
        ),
        (
            r#"{"admission": {"retry_threshold": "8"}}"#,
            "admission.retry_threshold",
        ),
        (
            r#"{"admission": {"max_time_queued": "0ms"}}"#,
            "admission.max_time_queued",
        ),
        (
            r#"{"admission": {"max_time_queued": "2h"}}"#,
            "admission.max_time_queued",
        ),
        (
            r#"{"admission": {"min_time_left": "2 ms"}}"#,
            "admission.min_time_left",
        ),
        (
            r#"{"admission": {"queue_order": "lifo"}}"#,
            "admission.queue_order",
        ),
        (
            r#"{"admission": {"queue_order": "fifo", "lifo_from_depth": 3}}"#,
            "admission.lifo_from_depth",
        ),
        (
            r#"{"admission": {"queue_order": "lifo_when_late", "lifo_from_depth": 3}}"#,
            "admission.lifo_from_depth",
        ),
        (
            r#"{"admission": {"pushback_max": "500us"}}"#,
            "admission.pushback_max",
        ),
        (
            r#"{"admission": {"shed_code": "OK"}}"#,
            "admission.shed_code",
        ),
        (
            r#"{"admission": {"shed_code": "NOPE"}}"#,
            "admission.shed_code",
        ),
        (r#"{"admission": {"shed_code": 17}}"#, "admission.shed_code"),
        (
            r#"{"admission": {"no_retry_code": "OK"}}"#,
            "admission.no_retry_code",
        ),
        (
            r#"{"admission": {"no_retry_depth": 1025}}"#,
            "admission.no_retry_depth",
        ),
        (r#"{"admission": {"seed": -3}}"#, "admission.seed"),
        (
            r#"{"admission": {"no_retry_margin": "2h"}}"#,
            "admission.no_retry_margin",
        ),
        (
            r#"{"admission": {"no_retry_margin": 5}}"#,
            "admission.no_retry_margin",
        ),
        (
            r#"{"admission": {"no_retry_after_shedding": "61m"}}"#,
            "admission.no_retry_after_shedding",
        ),
        (
            r#"{"admission": {"no_retry_after_shedding": "soon"}}"#,
            "admission.no_retry_after_shedding",
        ),
        (
            r#"{"admission": {"sheddable_threshold": {"depth": 1025}}}"#,
            "admission.sheddable_threshold.depth",
        ),
        (
            r#"{"admission": {"adaptive": {"min_limit": 0}}}"#,
            "admission.adaptive.min_limit",
        ),
        (
            r#"{"admission": {"adaptive": {"max": 10}}}"#,
            "admission.adaptive.max",
        ),
        (
            r#"{"admission": {"adaptive": {"window": "fast"}}}"#,
            "admission.adaptive.window",
        ),
        // The probe jitter is seeded by `admission.seed`, like every other jitter.
        (
            r#"{"admission": {"adaptive": {"seed": 4}}}"#,
            "admission.adaptive.seed",
        ),
    ];
    for (json, want) in cases {
        assert_eq!(field(json), want, "{json}");
    }
    for malformed in ["", "{", "[1]", r#""admission""#] {
        assert!(
            matches!(
                AdmissionConfig::from_json(malformed),
                Err(ConfigError::Malformed(_))
            ),
            "{malformed:?}"
        );
    }
}

#[cfg(all(feature = "yaml", feature = "toml"))]
#[test]
fn yaml_and_toml_read_and_turn_off_the_no_retry_rules() {
    let yaml = "admission:\n  no_retry_margin: 8ms\n  no_retry_after_shedding: null\n";
    let c = AdmissionConfig::from_text(yaml, Format::Yaml).unwrap();
    assert_eq!(c.no_retry_margin, Some(Duration::from_millis(8)));
    assert_eq!(c.no_retry_after_shedding, None);
    let toml = "[admission]\nno_retry_after_shedding = \"750ms\"\n";
    let c = AdmissionConfig::from_text(toml, Format::Toml).unwrap();
    assert_eq!(c.no_retry_after_shedding, Some(Duration::from_millis(750)));
    assert_eq!(
        c.no_retry_margin,
        AdmissionConfig::default().no_retry_margin
    );
    let bad = AdmissionConfig::from_text("[admission]\nno_retry_margin = \"2h\"\n", Format::Toml);
    assert!(
        bad.unwrap_err()
            .to_string()
            .contains("admission.no_retry_margin")
    );
}

#[test]
fn an_application_config_holds_the_admission_fields_with_the_same_checks() {
    #[derive(Debug, Deserialize)]
    struct Server {
        admission: AdmissionConfig,
    }
    let fields = r#"{"workers": 8, "queue_capacity": 32, "queue_order": "fifo",
            "sheddable_threshold": {"queue_delay": "5ms"}}"#;
    let server: Server = serde_json::from_str(&format!(r#"{{"admission": {fields}}}"#)).unwrap();
    let want = AdmissionConfig::from_json(&format!(r#"{{"admission": {fields}}}"#)).unwrap();
    assert_eq!(server.admission, want);
    // A threshold's keys are set over its own default.
    assert_eq!(
        want.sheddable_threshold,
        RetryThreshold {
            depth: Some(0),
            queue_delay: Some(Duration::from_millis(5))
        }
    );
    let bad = serde_json::from_str::<Server>(r#"{"admission": {"queue_capacity": 4}}"#);
    let message = bad.unwrap_err().to_string();
    assert!(
        message.contains("admission.retry_threshold.depth"),
        "{message}"
    );
}

#[test]
fn a_document_without_workers_is_adaptive_and_one_with_workers_is_fixed() {
    let limit = |json: &str| AdmissionConfig::from_json(json).unwrap().workers;
    let adaptive = WorkerLimit::Adaptive(AdaptiveLimitConfig::default());
    assert_eq!(limit("{}"), adaptive);
    assert_eq!(limit(r#"{"admission": {"queue_capacity": 8}}"#), adaptive);
    assert_eq!(
        limit(r#"{"admission": {"workers": 8}}"#),
        WorkerLimit::Fixed(8)
    );
    // The keys of earlier versions: an `adaptive` object selects the adaptive limit, with
    // `workers` where it starts; `adaptive: null` is the fixed limit, 64 by default.
    assert_eq!(limit(r#"{"admission": {"adaptive": {}}}"#), adaptive);
    assert_eq!(
        limit(r#"{"admission": {"workers": 32, "adaptive": {"max_limit": 100}}}"#),
        WorkerLimit::Adaptive(AdaptiveLimitConfig {
            initial_limit: 32,
            max_limit: 100,
            ..AdaptiveLimitConfig::default()
        })
    );
    assert_eq!(
        limit(r#"{"admission": {"adaptive": null}}"#),
        WorkerLimit::Fixed(64)
    );
    assert_eq!(
        limit(r#"{"admission": {"workers": 8, "adaptive": null}}"#),
        WorkerLimit::Fixed(8)
    );
    let e = AdmissionConfig::from_json(r#"{"admission": {"workers": 0}}"#).unwrap_err();
    assert!(e.to_string().contains("admission.workers"), "{e}");
}

#[test]
fn retry_info_is_off_unless_the_document_turns_it_on() {
    assert!(!AdmissionConfig::default().retry_info);
    let on = AdmissionConfig::from_json(r#"{"admission": {"retry_info": true}}"#).unwrap();
    assert!(on.retry_info);
    #[cfg(feature = "yaml")]
    assert!(
        AdmissionConfig::from_text("admission:\n  retry_info: true\n", Format::Yaml)
            .unwrap()
            .retry_info
    );
    #[cfg(feature = "toml")]
    assert!(
        AdmissionConfig::from_text("[admission]\nretry_info = true\n", Format::Toml)
            .unwrap()
            .retry_info
    );
    let bad = AdmissionConfig::from_json(r#"{"admission": {"retry_info": "yes"}}"#);
    assert!(
        bad.unwrap_err()
            .to_string()
            .contains("admission.retry_info")
    );
}
