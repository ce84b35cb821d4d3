#![allow(clippy::unwrap_used)]
#[cfg(all(feature = "yaml", feature = "toml"))]
use std::time::Duration;

use super::*;

#[cfg(all(feature = "yaml", feature = "toml"))]
#[test]
fn the_same_settings_read_from_json_yaml_and_toml() {
    let json = r#"{ "idempotency": { "max_entries": 64, "max_bytes": 65536,
            "max_record_bytes": 1024, "ttl": "90s", "in_flight_pushback": "20ms",
            "max_request_bytes": 2048 } }"#;
    let yaml = "idempotency:\n  max_entries: 64\n  max_bytes: 65536\n  max_record_bytes: 1024\n  ttl: 90s\n  in_flight_pushback: 20ms\n  max_request_bytes: 2048\n";
    let toml = "[idempotency]\nmax_entries = 64\nmax_bytes = 65536\nmax_record_bytes = 1024\nttl = \"90s\"\nin_flight_pushback = \"20ms\"\nmax_request_bytes = 2048\n";
    let c = IdempotencyConfig::from_json(json).unwrap();
    assert_eq!(c, IdempotencyConfig::from_text(yaml, Format::Yaml).unwrap());
    assert_eq!(c, IdempotencyConfig::from_text(toml, Format::Toml).unwrap());
    assert_eq!(
        c,
        IdempotencyConfig {
            max_entries: 64,
            max_bytes: 65536,
            max_record_bytes: 1024,
            ttl: Duration::from_secs(90),
            in_flight_pushback: Duration::from_millis(20),
            max_request_bytes: 2048,
        }
    );
    assert_eq!(
        IdempotencyConfig::from_json("{}").unwrap(),
        IdempotencyConfig::default()
    );
}

#[test]
fn errors_name_the_field() {
    for (json, field) in [
        (r#"{ "idempotency": { "ttl": "soon" } }"#, "idempotency.ttl"),
        (
            r#"{ "idempotency": { "max_entries": 0 } }"#,
            "idempotency.max_entries",
        ),
        (
            r#"{ "idempotency": { "max_bytes": 10 } }"#,
            "idempotency.max_record_bytes",
        ),
        (r#"{ "idempotency": { "tll": "1s" } }"#, "tll"),
    ] {
        let e = IdempotencyConfig::from_json(json).unwrap_err().to_string();
        assert!(e.contains(field), "{json}: {e}");
    }
}
