//! End-to-end: a `google.rpc.RetryInfo` in `grpc-status-details-bin` is a pushback, over
//! real tonic on loopback. The Status is encoded here by hand, byte by byte as the
//! protobuf wire format lays it out, so the test checks the wire, not stormguard's own
//! encoder.
#![allow(clippy::unwrap_used)]

use crate::client_support;

use std::time::Duration;

use client_support::*;
use stormguard_client::{RetryLayer, RetryStats};
use tonic::Code;

/// A protobuf varint.
fn varint(mut n: u64, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// A length-delimited field.
fn field(tag: u8, bytes: &[u8], out: &mut Vec<u8>) {
    out.push(tag << 3 | 2);
    varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// A `google.rpc.Status` of `code` with one `google.rpc.RetryInfo` of `seconds`, `nanos`
/// (signed, as `google.protobuf.Duration` has them).
fn status_with_retry_info(code: Code, seconds: i64, nanos: i32) -> Vec<u8> {
    let mut duration = vec![0x08];
    varint(seconds as u64, &mut duration);
    duration.push(0x10);
    varint(i64::from(nanos) as u64, &mut duration);
    let mut retry_info = Vec::new();
    field(1, &duration, &mut retry_info);
    let mut any = Vec::new();
    field(1, b"type.googleapis.com/google.rpc.RetryInfo", &mut any);
    field(2, &retry_info, &mut any);
    let mut status = vec![0x08];
    varint(code as u64, &mut status);
    field(2, b"come back later", &mut status);
    field(3, &any, &mut status);
    status
}

/// A server whose first answer is `UNAVAILABLE` with a RetryInfo of `seconds`, `nanos` and
/// no `grpc-retry-pushback-ms`, then OK; a client through a `RetryLayer`, and its counters.
async fn only_retry_info(seconds: i64, nanos: i32) -> (Scripted, RetryStats, Client) {
    let details = status_with_retry_info(Code::Unavailable, seconds, nanos);
    let svc = Scripted::new(
        [Step::Details(Code::Unavailable, details, vec![])],
        Step::Ok,
    );
    let layer = RetryLayer::new(controller(idempotent_policy()));
    let stats = layer.stats();
    let client = setup(&svc, layer).await;
    (svc, stats, client)
}

/// Paused time: the only timer is the retry delay, so the virtual gap between the two
/// attempts the server saw is exactly the delay the client waited.
#[tokio::test(start_paused = true)]
async fn the_delay_is_the_retry_info_of_a_server_that_sends_only_that() {
    // 20.25 s is far beyond the 2 s backoff cap: only the RetryInfo can explain such a wait.
    let (svc, stats, mut client) = only_retry_info(20, 250_000_000).await;

    client.reserve(reserve("a")).await.expect("retried");
    let seen = svc.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].at - seen[0].at, Duration::from_millis(20_250));
    assert_eq!(stats.snapshot().delayed_by_pushback, 1);
}

#[tokio::test(start_paused = true)]
async fn a_negative_retry_info_is_not_retried() {
    for (seconds, nanos) in [(-1, 0), (0, -5), (i64::MIN, 0)] {
        let (svc, stats, mut client) = only_retry_info(seconds, nanos).await;

        let status = client.reserve(reserve("a")).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(svc.seen().len(), 1, "{seconds} s {nanos} ns: not retried");
        assert_eq!(stats.snapshot().refused.pushback, 1);
    }
}

/// An answer with both: the longer delay is the one the client waits, whichever says it.
#[tokio::test(start_paused = true)]
async fn with_both_the_longer_delay_wins() {
    let both = |header| {
        let details = status_with_retry_info(Code::Unavailable, 9, 0);
        Step::Details(Code::Unavailable, details, vec![header])
    };
    let svc = Scripted::new([both("200"), both("12000"), both("-1")], Step::Ok);
    let layer = RetryLayer::new(controller(idempotent_policy()));
    let stats = layer.stats();
    let mut client = setup(&svc, layer).await;

    let status = client.reserve(reserve("a")).await.unwrap_err();
    assert_eq!(
        status.code(),
        Code::Unavailable,
        "-1 wins over the RetryInfo"
    );
    let seen = svc.seen();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[1].at - seen[0].at, Duration::from_secs(9));
    assert_eq!(seen[2].at - seen[1].at, Duration::from_secs(12));
    assert_eq!(stats.snapshot().refused.pushback, 1);
}
