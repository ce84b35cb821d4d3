#![allow(clippy::unwrap_used)]
use super::*;
use crate::wire::response_pushback;
use base64::Engine as _;
use prost::Message as _;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The header value of a Status with `details`.
fn status_with(details: Vec<Any>) -> String {
    let status = RpcStatus {
        code: 14,
        message: "busy".to_owned(),
        details,
    };
    BIN_BASE64.encode(status.encode_to_vec())
}

fn retry_info(seconds: i64, nanos: i32) -> Any {
    Any {
        type_url: RETRY_INFO_TYPE_URL.to_owned(),
        value: RetryInfo {
            retry_delay: Some(ProtoDuration { seconds, nanos }),
        }
        .encode_to_vec(),
    }
}

fn read(value: &str) -> Result<Option<Pushback>, StatusDetailsError> {
    parse_retry_info([value.as_bytes()])
}

#[test]
fn a_retry_info_is_a_pushback_of_its_delay() {
    let other = Any {
        type_url: "type.googleapis.com/google.rpc.ErrorInfo".to_owned(),
        value: vec![10, 3, b'f', b'o', b'o'],
    };
    let value = status_with(vec![other.clone(), retry_info(1, 500_000_000)]);
    assert_eq!(read(&value), Ok(Some(Pushback::RetryAfter(ms(1500)))));
    assert_eq!(
        read(&status_with(vec![retry_info(0, 0)])),
        Ok(Some(Pushback::RetryAfter(Duration::ZERO)))
    );
    // Padding, as some encoders write it, is read too.
    let padded = base64::engine::general_purpose::STANDARD
        .encode(BIN_BASE64.decode(value.as_bytes()).unwrap());
    assert_eq!(read(&padded), read(&value));
    // No RetryInfo: the Status says nothing about retrying.
    assert_eq!(read(&status_with(vec![other])), Ok(None));
    assert_eq!(read(&status_with(vec![])), Ok(None));
    assert_eq!(parse_retry_info(std::iter::empty::<&[u8]>()), Ok(None));
}

#[test]
fn the_encoder_round_trips_and_keeps_code_and_message() {
    for delay in [
        Duration::ZERO,
        ms(1),
        ms(250),
        Duration::new(3, 7),
        ms(MAX_PUSHBACK_MS),
    ] {
        let value = encode_retry_info(Code::ResourceExhausted, "shed", delay);
        assert_eq!(
            read(&value),
            Ok(Some(Pushback::RetryAfter(delay))),
            "{delay:?}"
        );
        assert!(!value.ends_with('='), "unpadded, as tonic writes -bin keys");
        let status = RpcStatus::decode(BIN_BASE64.decode(&value).unwrap().as_slice()).unwrap();
        assert_eq!((status.code, status.message.as_str()), (8, "shed"));
    }
    // Beyond the bound, the encoder writes the bound: a reader takes it at face value.
    let value = encode_retry_info(Code::Unavailable, "", Duration::MAX);
    assert_eq!(
        read(&value),
        Ok(Some(Pushback::RetryAfter(ms(MAX_PUSHBACK_MS))))
    );
}

#[test]
fn a_malformed_retry_info_means_do_not_retry() {
    let dnr = Ok(Some(Pushback::DoNotRetry));
    let cases = [
        ("negative seconds", retry_info(-1, 0)),
        ("negative nanos", retry_info(0, -1)),
        ("mixed signs", retry_info(1, -5)),
        ("nanos of a second or more", retry_info(0, 1_000_000_000)),
        ("i64::MAX seconds", retry_info(i64::MAX, 999_999_999)),
        ("i64::MIN seconds", retry_info(i64::MIN, 0)),
        ("one ms above the bound", {
            let over = MAX_PUSHBACK_MS + 1;
            retry_info((over / 1000) as i64, ((over % 1000) * 1_000_000) as i32)
        }),
        (
            "no retry_delay",
            Any {
                type_url: RETRY_INFO_TYPE_URL.to_owned(),
                value: Vec::new(),
            },
        ),
        (
            "not a RetryInfo",
            Any {
                type_url: RETRY_INFO_TYPE_URL.to_owned(),
                value: vec![0x0a, 0x05, 0x08],
            },
        ),
    ];
    for (what, any) in cases {
        assert_eq!(read(&status_with(vec![any])), dnr, "{what}");
    }
    // The bound itself is a valid delay.
    let at = MAX_PUSHBACK_MS;
    let value = status_with(vec![retry_info(
        (at / 1000) as i64,
        ((at % 1000) * 1_000_000) as i32,
    )]);
    assert_eq!(read(&value), Ok(Some(Pushback::RetryAfter(ms(at)))));
    // Two RetryInfos, like a repeated header.
    let two = status_with(vec![retry_info(1, 0), retry_info(1, 0)]);
    assert_eq!(read(&two), dnr);
}

#[test]
fn a_type_url_must_match_exactly() {
    for url in [
        "type.googleapis.com/google.rpc.RetryInfo2",
        "type.googleapis.com/google.rpc.retryinfo",
        "google.rpc.RetryInfo",
        "",
    ] {
        let mut any = retry_info(5, 0);
        any.type_url = url.to_owned();
        assert_eq!(read(&status_with(vec![any])), Ok(None), "{url:?}");
    }
}

#[test]
fn a_status_that_cannot_be_read_is_an_error_and_says_nothing() {
    let good = status_with(vec![retry_info(1, 0)]);
    assert_eq!(
        parse_retry_info([good.as_bytes(), good.as_bytes()]),
        Err(StatusDetailsError::Repeated)
    );
    assert_eq!(read("not base64!"), Err(StatusDetailsError::Base64));
    assert!(matches!(
        read(&BIN_BASE64.encode([0xff, 0xff, 0xff])),
        Err(StatusDetailsError::Decode(_))
    ));
    // A message string that is not UTF-8 is no Status.
    assert!(matches!(
        read(&BIN_BASE64.encode([0x12, 0x01, 0xff])),
        Err(StatusDetailsError::Decode(_))
    ));
    // Too long to be read, whatever it holds: refused before decoding.
    let huge = "A".repeat(MAX_STATUS_DETAILS_BYTES.div_ceil(3) * 4 + 4);
    assert_eq!(read(&huge), Err(StatusDetailsError::Oversize));
    // At the bound, a Status of many small details is read.
    // Each detail is 5 bytes on the wire.
    let many: Vec<Any> = (0..(MAX_STATUS_DETAILS_BYTES - 16) / 5)
        .map(|_| Any {
            type_url: "x".to_owned(),
            value: Vec::new(),
        })
        .collect();
    let value = status_with(many);
    assert!(value.len() <= MAX_STATUS_DETAILS_BYTES.div_ceil(3) * 4);
    assert_eq!(read(&value), Ok(None));
}

#[test]
fn with_the_header_the_longer_delay_wins() {
    let info = |d: Duration| encode_retry_info(Code::Unavailable, "busy", d);
    let both =
        |header: &str, details: &str| response_pushback([header.as_bytes()], [details.as_bytes()]);
    let after = |n| Some(Pushback::RetryAfter(ms(n)));
    assert_eq!(both("100", &info(ms(900))), after(900));
    assert_eq!(both("900", &info(ms(100))), after(900));
    assert_eq!(both("0", &info(ms(40))), after(40));
    assert_eq!(both("-1", &info(ms(40))), Some(Pushback::DoNotRetry));
    assert_eq!(both("soon", &info(ms(40))), Some(Pushback::DoNotRetry));
    let negative = status_with(vec![retry_info(-3, 0)]);
    assert_eq!(both("100", &negative), Some(Pushback::DoNotRetry));
    // A Status that cannot be read leaves the header alone.
    assert_eq!(both("100", "%%%"), after(100));
    assert_eq!(
        response_pushback(std::iter::empty(), [info(ms(70)).as_bytes()]),
        after(70)
    );
    assert_eq!(
        response_pushback(std::iter::empty(), std::iter::empty()),
        None
    );
}
