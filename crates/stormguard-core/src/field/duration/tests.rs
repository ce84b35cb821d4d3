#![allow(clippy::unwrap_used)]
use super::*;
use proptest::prelude::*;

#[test]
fn durations_parse_exactly() {
    assert_eq!(parse_duration("50ms"), Some(Duration::from_millis(50)));
    assert_eq!(parse_duration("0.1s"), Some(Duration::from_millis(100)));
    assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
    assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
    assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
    assert_eq!(parse_duration("250us"), Some(Duration::from_micros(250)));
    assert_eq!(parse_duration("7ns"), Some(Duration::from_nanos(7)));
    assert_eq!(parse_duration(".5s"), Some(Duration::from_millis(500)));
    for bad in [
        "",
        "s",
        "10",
        "-1s",
        "1e3s",
        "1.2.3s",
        "ms",
        "1,5s",
        "1.0000000001s",
    ] {
        assert_eq!(parse_duration(bad), None, "{bad:?}");
    }
    assert_eq!(
        parse_proto_duration("0.000000001s"),
        Some(Duration::from_nanos(1))
    );
    // The service config's durations are seconds only.
    assert_eq!(parse_proto_duration("100ms"), None);
    assert_eq!(parse_proto_duration("1m"), None);
}

#[test]
fn the_forms_are_what_each_document_accepts() {
    let human = |json: &str| serde_json::from_str::<Human>(json).map(|h| h.0);
    let proto = |json: &str| serde_json::from_str::<Proto>(json).map(|p| p.0);
    assert_eq!(human(r#""50ms""#).unwrap(), Duration::from_millis(50));
    assert_eq!(proto(r#""0.05s""#).unwrap(), Duration::from_millis(50));
    let e = proto(r#""50ms""#).unwrap_err().to_string();
    assert!(e.contains("decimal seconds"), "{e}");
    let e = human("50").unwrap_err().to_string();
    assert!(
        e.contains(r#"a duration with a unit such as "50ms""#),
        "{e}"
    );
}

proptest! {
    #[test]
    fn duration_parser_never_panics(s in ".{0,24}") {
        let _ = parse_duration(&s);
    }

    #[test]
    fn milliseconds_round_trip(ms in 0u64..1_000_000_000) {
        prop_assert_eq!(parse_duration(&format!("{ms}ms")), Some(Duration::from_millis(ms)));
        let secs = format!("{}.{:03}s", ms / 1000, ms % 1000);
        prop_assert_eq!(parse_duration(&secs), Some(Duration::from_millis(ms)));
    }

    #[test]
    fn what_is_written_reads_back(secs in 0u64..1_000_000_000_000, nanos in 0u32..1_000_000_000) {
        let d = Duration::new(secs, nanos);
        prop_assert_eq!(parse_duration(&format_duration(d)), Some(d));
    }
}
