#![allow(clippy::unwrap_used)]
use super::*;
use proptest::prelude::*;

#[test]
fn decodes_every_unit() {
    assert_eq!(decode_grpc_timeout(b"1H"), Ok(Duration::from_secs(3600)));
    assert_eq!(decode_grpc_timeout(b"2M"), Ok(Duration::from_secs(120)));
    assert_eq!(decode_grpc_timeout(b"3S"), Ok(Duration::from_secs(3)));
    assert_eq!(decode_grpc_timeout(b"4m"), Ok(Duration::from_millis(4)));
    assert_eq!(decode_grpc_timeout(b"5u"), Ok(Duration::from_micros(5)));
    assert_eq!(decode_grpc_timeout(b"6n"), Ok(Duration::from_nanos(6)));
    assert_eq!(
        decode_grpc_timeout(b"99999999H"),
        Ok(Duration::from_secs(99_999_999 * 3600))
    );
    assert_eq!(decode_grpc_timeout(b"0m"), Ok(Duration::ZERO));
}

#[test]
fn rejects_malformed_timeouts() {
    assert_eq!(decode_grpc_timeout(b""), Err(TimeoutError::Empty));
    for bad in ["m", "123456789S", "-1S", "+1S", " 1S", "1.5S"] {
        assert!(
            matches!(
                decode_grpc_timeout(bad.as_bytes()),
                Err(TimeoutError::BadValue(_))
            ),
            "{bad:?}"
        );
    }
    assert_eq!(decode_grpc_timeout(b"10s"), Err(TimeoutError::BadUnit('s')));
    assert_eq!(
        decode_grpc_timeout("10é".as_bytes()),
        Err(TimeoutError::BadUnit('é'))
    );
}

#[test]
fn raw_bytes_decode_only_when_utf8_and_well_formed() {
    assert_eq!(
        decode_grpc_timeout(b"99999999H").ok(),
        Some(Duration::from_secs(99_999_999 * 3600))
    );
    for bad in [&b""[..], b"10s", b"1\xffS", b"\xe9", "10é".as_bytes()] {
        assert_eq!(decode_grpc_timeout(bad).ok(), None, "{bad:?}");
    }
}

#[test]
fn encodes_timeouts_in_the_finest_unit_that_fits() {
    assert_eq!(encode_grpc_timeout(Duration::from_nanos(1)).as_str(), "1n");
    assert_eq!(
        encode_grpc_timeout(Duration::from_nanos(99_999_999)).as_str(),
        "99999999n"
    );
    assert_eq!(
        encode_grpc_timeout(Duration::from_nanos(100_000_000)).as_str(),
        "100000u"
    );
    assert_eq!(
        encode_grpc_timeout(Duration::from_millis(1500)).as_str(),
        "1500000u"
    );
    assert_eq!(encode_grpc_timeout(Duration::ZERO).as_str(), "0n");
    assert_eq!(
        encode_grpc_timeout(Duration::from_secs(u64::MAX)).as_str(),
        "99999999H"
    );
    assert_eq!(
        format!("{:?}", encode_grpc_timeout(Duration::from_secs(2))),
        "GrpcTimeout(\"2000000u\")"
    );
}

#[test]
fn coarsening_a_timeout_rounds_up_never_to_zero() {
    // 100 000 000 ns + 1 ns does not fit in ns; in µs it rounds up.
    assert_eq!(
        encode_grpc_timeout(Duration::from_nanos(100_000_001)).as_str(),
        "100001u"
    );
}

fn pushback(v: &str) -> Option<Pushback> {
    parse_pushback([v.as_bytes()])
}

#[test]
fn well_formed_pushbacks_are_exact() {
    assert_eq!(pushback("0"), Some(Pushback::RetryAfter(Duration::ZERO)));
    assert_eq!(
        pushback("1"),
        Some(Pushback::RetryAfter(Duration::from_millis(1)))
    );
    assert_eq!(
        pushback("007"),
        Some(Pushback::RetryAfter(Duration::from_millis(7)))
    );
    assert_eq!(
        pushback("2147483647"),
        Some(Pushback::RetryAfter(Duration::from_millis(2_147_483_647)))
    );
}

#[test]
fn pushbacks_beyond_a_signed_32_bit_integer_mean_do_not_retry() {
    for v in [
        "2147483648",
        "4294967295",
        "4294967296",
        "99999999999999999999",
    ] {
        assert_eq!(pushback(v), Some(Pushback::DoNotRetry), "{v}");
    }
    assert_eq!(
        encode_pushback(Pushback::RetryAfter(Duration::MAX)),
        "2147483647"
    );
}

#[test]
fn every_other_pushback_means_do_not_retry() {
    for bad in [
        "-1",
        "-0",
        "+5",
        " 5",
        "5 ",
        "5ms",
        "1.5",
        "",
        "abc",
        "4294967296",
        "99999999999999999999999",
        "0x10",
    ] {
        assert_eq!(pushback(bad), Some(Pushback::DoNotRetry), "value {bad:?}");
    }
    assert_eq!(
        parse_pushback([&[0xff, 0xfe][..]]),
        Some(Pushback::DoNotRetry)
    );
    assert_eq!(pushback(DO_NOT_RETRY), Some(Pushback::DoNotRetry));
}

#[test]
fn a_repeated_pushback_means_do_not_retry_and_an_absent_one_is_none() {
    assert_eq!(
        parse_pushback([b"10".as_slice(), b"20".as_slice()]),
        Some(Pushback::DoNotRetry)
    );
    assert_eq!(parse_pushback(Vec::<&[u8]>::new()), None);
}

#[test]
fn attempt_headers_count_as_retries_unless_they_say_zero() {
    use AttemptClass::*;
    type Case = (Option<&'static [u8]>, Option<&'static [u8]>, AttemptClass);
    let cases: &[Case] = &[
        (None, None, First),
        (Some(b"0"), None, First),
        (Some(b"000"), None, First),
        (Some(b" 0 "), None, First),
        (Some(b"1"), None, Retry),
        (Some(b"4294967296000"), None, Retry),
        (Some(b""), None, Retry),
        (Some(b"-1"), None, Retry),
        (Some(b"+0"), None, Retry),
        (Some(b"0x0"), None, Retry),
        (Some(b"\xff"), None, Retry),
        (None, Some(b"0"), First),
        (None, Some(b"3"), Retry),
        (None, Some(b"zero"), Retry),
        // The standard header wins over the older one.
        (Some(b"0"), Some(b"2"), First),
        (Some(b"1"), Some(b"0"), Retry),
    ];
    for (prev, x, want) in cases {
        assert_eq!(attempt_class(*prev, *x), *want, "{prev:?} {x:?}");
    }
    assert_eq!((First.as_str(), Retry.as_str()), ("first", "retry"));
}

#[test]
fn allowances_from_peers_are_read_strictly() {
    for (raw, want) in [
        (&b"0"[..], Some(0)),
        (b" 7 ", Some(7)),
        (b"1000", Some(1000)),
        (b"1001", None),
        (b"4294967296", None),
        (b"99999999999999999999", None),
        (b"-1", None),
        (b"+1", None),
        (b"1.5", None),
        (b"", None),
        (b"\xff", None),
    ] {
        assert_eq!(parse_allowance(raw), want, "{raw:?}");
    }
}

#[test]
fn criticality_claims_are_read_strictly() {
    use Criticality::*;
    let cases: &[(Option<&[u8]>, Criticality)] = &[
        (None, Default),
        (Some(b"critical"), Critical),
        (Some(b"default"), Default),
        (Some(b"sheddable"), Sheddable),
        (Some(b""), Default),
        (Some(b"CRITICAL"), Default),
        (Some(b"Critical"), Default),
        (Some(b" critical"), Default),
        (Some(b"critical "), Default),
        (Some(b"critical,critical"), Default),
        (Some(b"critical\0"), Default),
        (Some(b"crit"), Default),
        (Some(b"\xff\xfe"), Default),
        (Some(b"sheddable "), Default),
    ];
    for (value, want) in cases {
        assert_eq!(parse_criticality(*value), *want, "{value:?}");
    }
}

#[test]
fn grpc_status_values_read_as_their_code_or_unknown() {
    assert_eq!(parse_grpc_status(b"0"), Code::Ok);
    assert_eq!(parse_grpc_status(b"14"), Code::Unavailable);
    assert_eq!(parse_grpc_status(b" 4 "), Code::DeadlineExceeded);
    for bad in [&b""[..], b"x", b"99", b"-1", b"unavailable", b"\xff"] {
        assert_eq!(parse_grpc_status(bad), Code::Unknown, "{bad:?}");
    }
}

#[test]
fn grpc_status_values_are_the_code_numbers_and_read_back() {
    for code in Code::ALL {
        let value = encode_grpc_status(code);
        assert_eq!(value, code.as_i32().to_string());
        assert_eq!(parse_grpc_status(value.as_bytes()), code);
    }
}

/// A `HeaderMap` of `pairs`, appended in order.
#[cfg(feature = "http")]
fn header_map(pairs: &[(&'static str, &'static str)]) -> ::http::HeaderMap {
    let mut h = ::http::HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, ::http::HeaderValue::from_static(v));
    }
    h
}

#[cfg(feature = "http")]
#[test]
fn trailers_only_status_is_read_from_headers() {
    use super::http::grpc_status;
    assert_eq!(
        grpc_status(&header_map(&[("grpc-status", "14")])),
        Some(Code::Unavailable)
    );
    assert_eq!(
        grpc_status(&header_map(&[("grpc-status", "0")])),
        Some(Code::Ok)
    );
    assert_eq!(
        grpc_status(&header_map(&[("content-type", "application/grpc")])),
        None
    );
}

#[cfg(feature = "http")]
#[test]
fn a_malformed_status_reads_as_unknown() {
    use super::http::grpc_status;
    assert_eq!(
        grpc_status(&header_map(&[("grpc-status", "x")])),
        Some(Code::Unknown)
    );
    assert_eq!(
        grpc_status(&header_map(&[("grpc-status", "99")])),
        Some(Code::Unknown)
    );
}

#[cfg(feature = "http")]
#[test]
fn first_values_are_what_get_finds() {
    use ::http::{HeaderMap, HeaderName, HeaderValue};
    let names = [
        &http::GRPC_STATUS,
        &http::GRPC_TIMEOUT,
        &http::ENDPOINT_LOAD_METRICS_BIN,
        &http::X_RETRY_BUDGET,
    ];
    let mut headers = HeaderMap::new();
    assert_eq!(http::first_values(&headers, names), [None; 4]);
    headers.insert("content-type", HeaderValue::from_static("application/grpc"));
    headers.append(http::GRPC_TIMEOUT, HeaderValue::from_static("1S"));
    headers.append("te", HeaderValue::from_static("trailers"));
    headers.append(http::GRPC_TIMEOUT, HeaderValue::from_static("2S"));
    headers.append(
        http::ENDPOINT_LOAD_METRICS_BIN,
        HeaderValue::from_static("a"),
    );
    headers.append(
        http::ENDPOINT_LOAD_METRICS_BIN,
        HeaderValue::from_static("b"),
    );
    // A name removed and added again moves: the first value is still the one `get` sees.
    headers.remove("content-type");
    headers.append(
        HeaderName::from_static("content-type"),
        HeaderValue::from_static("x"),
    );
    let found = http::first_values(&headers, names);
    for (name, value) in names.iter().zip(found) {
        assert_eq!(value, headers.get(*name), "{name}");
    }
    assert_eq!(found[1].map(HeaderValue::as_bytes), Some(&b"1S"[..]));
}

#[cfg(feature = "http")]
#[test]
fn http_names_are_the_str_names() {
    let pairs = [
        (http::GRPC_TIMEOUT, GRPC_TIMEOUT),
        (http::GRPC_PREVIOUS_RPC_ATTEMPTS, GRPC_PREVIOUS_RPC_ATTEMPTS),
        (http::GRPC_RETRY_PUSHBACK_MS, GRPC_RETRY_PUSHBACK_MS),
        (http::GRPC_STATUS, GRPC_STATUS),
        (http::GRPC_MESSAGE, GRPC_MESSAGE),
        (http::X_RETRY_ATTEMPT, X_RETRY_ATTEMPT),
        (http::X_RETRY_BUDGET, X_RETRY_BUDGET),
        (http::STORMGUARD_CRITICALITY, STORMGUARD_CRITICALITY),
        (http::STORMGUARD_UNPROCESSED, STORMGUARD_UNPROCESSED),
    ];
    for (name, text) in pairs {
        assert_eq!(name.as_str(), text);
    }
    assert_eq!(http::DO_NOT_RETRY, DO_NOT_RETRY);
}

proptest! {
    /// The short forms read without the parser read as the parser reads them.
    #[test]
    fn grpc_status_reads_as_the_decimal_parser_does(
        value in proptest::collection::vec(
            prop_oneof![4 => 0x30u8..0x3a, 1 => Just(b' '), 1 => Just(b'+'), 1 => any::<u8>()],
            0..4,
        ),
    ) {
        let parsed = std::str::from_utf8(&value)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .and_then(Code::from_i32)
            .unwrap_or(Code::Unknown);
        prop_assert_eq!(parse_grpc_status(&value), parsed);
    }

    #[test]
    fn attempt_class_never_panics(
        prev in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..24)),
        x in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..24)),
    ) {
        let class = attempt_class(prev.as_deref(), x.as_deref());
        if prev.is_none() && x.is_none() {
            prop_assert_eq!(class, AttemptClass::First);
        }
    }

    #[test]
    fn attempt_digits_count_as_their_value(n in any::<u64>()) {
        let want = if n == 0 { AttemptClass::First } else { AttemptClass::Retry };
        prop_assert_eq!(attempt_class_of_value(n.to_string().as_bytes()), want);
    }

    #[test]
    fn timeout_decoding_never_panics(s in ".{0,16}") {
        let _ = decode_grpc_timeout(s.as_bytes());
    }

    #[test]
    fn timeout_encoding_is_well_formed_and_never_shorter(nanos in 0u64..u64::MAX) {
        let d = Duration::from_nanos(nanos);
        let enc = encode_grpc_timeout(d);
        prop_assert!(enc.as_str().len() <= 9);
        let back = decode_grpc_timeout(enc.as_str().as_bytes()).expect("encoder output decodes");
        prop_assert!(back >= d);
        // A coarser unit is chosen only when the finer value passed 8 digits, so rounding
        // up adds less than one part in 10^5.
        prop_assert!(back - d <= d / 100_000 + Duration::from_nanos(1));
    }

    #[test]
    fn any_bytes_parse_as_a_pushback_without_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..32),
    ) {
        let _ = parse_pushback([bytes.as_slice()]);
    }

    #[test]
    fn pushback_encoding_round_trips(ms in 0u64..=MAX_PUSHBACK_MS) {
        let p = Pushback::RetryAfter(Duration::from_millis(ms));
        prop_assert_eq!(parse_pushback([encode_pushback(p).as_bytes()]), Some(p));
    }

    /// Whatever a peer sends, it never gets above the table's class, and only the
    /// three exact tokens are read as anything but the default.
    #[test]
    fn criticality_claims_are_capped(
        value in proptest::collection::vec(any::<u8>(), 0..12),
        cap in 0usize..3,
    ) {
        let cap = Criticality::ALL[cap];
        let table = crate::criticality::CriticalityTable::new(cap);
        let got = table.resolve("/x.Y/Z", parse_criticality(Some(&value)));
        prop_assert!(got <= cap);
        match Criticality::from_value(&value) {
            Some(c) => prop_assert_eq!(c.as_str().as_bytes(), value.as_slice()),
            None => prop_assert_eq!(got, Criticality::Default.min(cap)),
        }
    }

    /// Whatever a peer sends as a key, reading it never panics, and what is accepted
    /// is exactly 1 to 128 visible ASCII bytes, returned unchanged.
    #[test]
    fn idempotency_keys_are_visible_ascii_or_refused(
        value in proptest::collection::vec(any::<u8>(), 0..160),
    ) {
        let ok = !value.is_empty()
            && value.len() <= MAX_IDEMPOTENCY_KEY_LEN
            && value.iter().all(|b| (b'!'..=b'~').contains(b));
        match parse_idempotency_key([value.as_slice()]) {
            Ok(Some(key)) => {
                prop_assert!(ok);
                prop_assert_eq!(key.as_bytes(), value.as_slice());
            }
            Ok(None) => prop_assert!(false, "one value is never no key"),
            Err(_) => prop_assert!(!ok),
        }
    }

    /// Every generated key is a well-formed version 4 UUID, and one accepted as a key.
    #[test]
    fn generated_keys_are_uuid_v4(random in any::<u128>()) {
        let key = uuid_v4(random);
        let s = key.as_str();
        prop_assert_eq!(s.len(), 36);
        prop_assert_eq!(&s[14..15], "4");
        prop_assert!(matches!(&s[19..20], "8" | "9" | "a" | "b"));
        for (i, c) in s.char_indices() {
            if matches!(i, 8 | 13 | 18 | 23) {
                prop_assert_eq!(c, '-');
            } else {
                prop_assert!(c.is_ascii_hexdigit() && !c.is_ascii_uppercase());
            }
        }
        prop_assert_eq!(parse_idempotency_key([s.as_bytes()]), Ok(Some(s)));
    }

    #[test]
    fn negative_pushbacks_never_retry(n in i64::MIN..0) {
        prop_assert_eq!(pushback(&n.to_string()), Some(Pushback::DoNotRetry));
    }
}

#[test]
fn uuid_v4_sets_the_version_and_variant_bits() {
    let key = uuid_v4(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
    assert_eq!(key.as_str(), "01234567-89ab-4def-8123-456789abcdef");
    assert_eq!(
        uuid_v4(u128::MAX).as_str(),
        "ffffffff-ffff-4fff-bfff-ffffffffffff"
    );
    assert!(parse_idempotency_key([key.as_str().as_bytes()]).is_ok());
}

#[test]
fn one_attempt_header_value_is_classified() {
    assert_eq!(attempt_class_of_value(b" 00 "), AttemptClass::First);
    assert_eq!(attempt_class_of_value(b""), AttemptClass::Retry);
}

#[test]
fn one_well_formed_pushback_header_is_a_delay_anything_else_do_not_retry() {
    let ms = |n| Some(Pushback::RetryAfter(Duration::from_millis(n)));
    assert_eq!(parse_pushback([b"120".as_slice()]), ms(120));
    assert_eq!(parse_pushback([b"0".as_slice()]), ms(0));
    assert_eq!(
        parse_pushback([b"-1".as_slice()]),
        Some(Pushback::DoNotRetry)
    );
    assert_eq!(
        parse_pushback([b"soon".as_slice()]),
        Some(Pushback::DoNotRetry)
    );
    assert_eq!(
        parse_pushback([b"5".as_slice(), b"5".as_slice()]),
        Some(Pushback::DoNotRetry)
    );
    assert_eq!(parse_pushback(std::iter::empty::<&[u8]>()), None);
}
