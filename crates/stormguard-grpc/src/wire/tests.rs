use super::*;

#[test]
fn codes_keep_their_numbers_both_ways() {
    for code in Code::ALL.into_iter().filter(|c| *c != Code::Ok) {
        assert_eq!(code_from_grpc(code_to_grpc(code)), code);
    }
}

#[test]
fn pushback_reads_the_header_and_retry_info_the_longer_winning() {
    let mut md = MetadataMap::new();
    assert_eq!(pushback(&md), None);
    md.insert(
        wire::GRPC_RETRY_PUSHBACK_MS,
        AsciiMetadataValue::from_static("20"),
    );
    assert_eq!(
        pushback(&md),
        Some(Pushback::RetryAfter(Duration::from_millis(20)))
    );
    let info = wire::encode_retry_info(Code::Unavailable, "busy", Duration::from_millis(800));
    let decoded = STANDARD_NO_PAD
        .decode(info.trim_end_matches('='))
        .expect("the encoder writes base64");
    md.insert_bin(
        wire::GRPC_STATUS_DETAILS_BIN,
        grpc::metadata::BinaryMetadataValue::from_bytes(&decoded),
    );
    assert_eq!(
        pushback(&md),
        Some(Pushback::RetryAfter(Duration::from_millis(800)))
    );
    md.insert(
        wire::GRPC_RETRY_PUSHBACK_MS,
        AsciiMetadataValue::from_static("-1"),
    );
    assert_eq!(pushback(&md), Some(Pushback::DoNotRetry));
}

#[test]
fn a_plan_is_stamped_as_the_tonic_layer_stamps_it() {
    let mut md = MetadataMap::new();
    let plan = AttemptPlan {
        previous_attempts: 2,
        grpc_timeout: Some(Duration::from_millis(250)),
        fire_at: None,
        attempt_limit: None,
        transparent: false,
    };
    stamp(&mut md, &plan);
    assert_eq!(
        md.get(wire::GRPC_PREVIOUS_RPC_ATTEMPTS).map(|v| v.to_str()),
        Some("2")
    );
    let timeout = md.get(wire::GRPC_TIMEOUT).map(|v| v.as_bytes().to_vec());
    let decoded = timeout.and_then(|t| wire::decode_grpc_timeout(&t).ok());
    assert_eq!(decoded, Some(Duration::from_millis(250)));
    assert_eq!(caller_timeout(&md), Some(Duration::from_millis(250)));
}

#[test]
fn a_give_up_is_marked_do_not_retry() {
    let mut t = failure(Code::Unavailable, "down");
    mark_do_not_retry(&mut t);
    assert_eq!(pushback(t.metadata()), Some(Pushback::DoNotRetry));
    assert_eq!(trailers_code(&t), Code::Unavailable);
}
