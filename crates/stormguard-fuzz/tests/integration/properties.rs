//! Property tests on generated inputs, through the same contract checks as the fuzz
//! targets, and the absurd values a hostile peer may send.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use proptest::prelude::*;
use stormguard_core::ClientConfig;
use stormguard_core::Code;
use stormguard_core::Pushback;
use stormguard_core::{AttemptEnd, CallTimes, Decision, Failure, Refusal, RetryController};
use stormguard_core::{wire::AttemptClass, wire::attempt_class, wire::decode_grpc_timeout};
use stormguard_fuzz::targets;
use tokio::time::Instant;

/// A number as a peer might write it: small, at a type's edge, huge, signed, padded.
fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        (0u32..=40).prop_map(|e| format!("{}", 2u128.pow(e.min(127)))),
        Just("18446744073709551616".to_owned()),
        Just("340282366920938463463374607431768211456".to_owned()),
        "[0-9]{1,30}",
        "[ \t]{0,2}[+-]?[0-9]{1,12}[ \t]{0,2}",
        "\\PC{0,12}",
    ]
}

fn duration_text() -> impl Strategy<Value = String> {
    (
        number(),
        prop::sample::select(vec!["s", "ms", "us", "ns", "m", "h", "", "S", "H"]),
    )
        .prop_map(|(n, unit)| format!("{n}{unit}"))
}

/// A service config whose every value is drawn from `number` / `duration_text`.
fn service_config() -> impl Strategy<Value = String> {
    (
        number(),
        duration_text(),
        duration_text(),
        number(),
        prop::sample::select(vec!["\"UNAVAILABLE\"", "14", "\"NOPE\"", "-1", "99"]),
        proptest::option::of(duration_text()),
        proptest::option::of((number(), number())),
        any::<bool>(),
    )
        .prop_map(|(attempts, initial, max, mult, code, timeout, throttle, hedge)| {
            let mut method = format!(
                r#""name":[{{"service":"stormguard.demo.v1.Inventory"}}],"retryPolicy":{{"maxAttempts":{attempts},"initialBackoff":"{initial}","maxBackoff":"{max}","backoffMultiplier":{mult},"retryableStatusCodes":[{code}]}}"#
            );
            if let Some(t) = timeout {
                method += &format!(r#","timeout":"{t}""#);
            }
            if hedge {
                method += r#","hedgingPolicy":{"maxAttempts":2}"#;
            }
            let mut doc = format!(r#"{{"methodConfig":[{{{method}}}]"#);
            if let Some((tokens, ratio)) = throttle {
                doc += &format!(r#","retryThrottling":{{"maxTokens":{tokens},"tokenRatio":{ratio}}}"#);
            }
            doc + "}"
        })
}

fn stormguard_json() -> impl Strategy<Value = String> {
    (number(), duration_text(), duration_text(), duration_text(), number(), number(), number())
        .prop_map(|(attempts, base, cap, ttl, floor, ratio, fleet)| {
            format!(
                r#"{{"retry":{{"max_attempts":{attempts},"base":"{base}","cap":"{cap}","budget":{{"ttl":"{ttl}","min_retries_per_second":{floor},"retry_ratio":{ratio},"fleet_size":{fleet}}}}}}}"#
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn pushback_values_read_as_documented(values in prop::collection::vec(number(), 0..4)) {
        let joined = values.join("\0");
        targets::pushback(joined.as_bytes());
    }

    #[test]
    fn attempt_headers_read_as_documented(
        flags in 0u8..4, previous in number(), x_retry in number(),
    ) {
        let mut input = vec![flags];
        input.extend_from_slice(previous.as_bytes());
        input.push(0);
        input.extend_from_slice(x_retry.as_bytes());
        targets::attempt(&input);
    }

    #[test]
    fn grpc_timeouts_read_as_documented(
        n in number(), unit in prop::sample::select(vec!['H', 'M', 'S', 'm', 'u', 'n', 'x', 'é']),
    ) {
        targets::grpc_timeout(format!("{n}{unit}").as_bytes());
    }

    #[test]
    fn durations_read_as_documented(d in duration_text()) {
        targets::duration(d.as_bytes());
    }

    #[test]
    fn service_configs_build_or_name_their_error(doc in service_config()) {
        targets::service_config(doc.as_bytes());
    }

    #[test]
    fn stormguard_configs_build_or_name_their_error(doc in stormguard_json()) {
        targets::stormguard_json(doc.as_bytes());
    }
}

#[test]
fn a_pushback_of_2_pow_31_ms_means_no_retry() {
    // A6 makes the header a signed 32-bit integer: 2^31 is not a valid value.
    for v in ["2147483648", "4294967296", "18446744073709551616"] {
        assert_eq!(
            targets::pushback_header([v.as_bytes()]),
            Some(Pushback::DoNotRetry),
            "{v}"
        );
    }
    // The largest valid one, 24.8 days, is longer than any policy waits: no retry either,
    // and no instant arithmetic on it.
    let pushback = targets::pushback_header([b"2147483647".as_slice()]);
    assert_eq!(
        pushback,
        Some(Pushback::RetryAfter(Duration::from_millis((1 << 31) - 1)))
    );
    let controller = RetryController::from_config(&ClientConfig::default().with_seed(1)).unwrap();
    let now = Instant::now();
    for inbound in [None, Some(now + Duration::from_secs(3600))] {
        let times = CallTimes {
            inbound,
            ..CallTimes::default()
        };
        let mut call = controller
            .begin_call_at("/stormguard.demo.v1.Inventory/Reserve", &times, now)
            .unwrap();
        let failure = Failure {
            pushback,
            ..Failure::status(Code::Unavailable)
        };
        assert!(matches!(
            call.on_attempt_end_at(AttemptEnd::Failed(failure), now)
                .decision,
            Decision::GiveUp(Refusal::Pushback | Refusal::Deadline)
        ));
    }
}

#[test]
fn a_grpc_timeout_of_99999999_hours_fits_on_the_clock() {
    let d = decode_grpc_timeout(b"99999999H").unwrap();
    assert_eq!(d, Duration::from_secs(99_999_999 * 3600));
    assert!(Instant::now().checked_add(d).is_some());
    assert!(decode_grpc_timeout(b"999999999H").is_err());
}

#[test]
fn an_attempt_number_of_2_pow_64_is_a_retry() {
    for value in ["18446744073709551616", "18446744073709551615", "4294967296"] {
        assert_eq!(
            attempt_class(Some(value.as_bytes()), None),
            AttemptClass::Retry
        );
    }
}
