//! Tracing: what the layers log, and at which level. A healthy service logs nothing at
//! INFO; a refused retry, a shed call and an expiry are INFO events with their details;
//! each attempt's span carries `retry.attempt`, `retry.delay_ms` and `retry.reason`.
//!
//! One test in this binary, so that no other test registers the callsites first without
//! the recording subscriber.
#![allow(clippy::unwrap_used)]

mod client_support;
mod server_support;
mod tracing_support;

use std::time::Duration;

use client_support::{Scripted, Step};
use stormguard_client::RetryLayer;
use stormguard_demo::InventoryClient;
use stormguard_demo::server::DemoConfig;
use tonic::Code;
use tracing::Level;
use tracing_support::Recorder;

#[tokio::test]
async fn info_is_quiet_when_healthy_and_tells_what_was_refused_or_shed() {
    let recorder = Recorder::default();
    let _guard = tracing::subscriber::set_default(recorder.clone());
    tracing::callsite::rebuild_interest_cache();

    // Client, healthy: a failure retried once, an application error, successes.
    let svc = Scripted::new(
        [
            Step::Fail(Code::Unavailable),
            Step::Ok,
            Step::Fail(Code::NotFound),
        ],
        Step::Ok,
    );
    let layer = RetryLayer::new(client_support::controller(client_support::quick_policy()));
    let mut client = client_support::setup(&svc, layer).await;
    client.reserve(client_support::reserve("a")).await.unwrap();
    let not_found = client
        .reserve(client_support::reserve("b"))
        .await
        .unwrap_err();
    assert_eq!(not_found.code(), Code::NotFound);
    for i in 0..5 {
        client
            .reserve(client_support::reserve(&format!("c{i}")))
            .await
            .unwrap();
    }
    assert_eq!(
        recorder.take_info().len(),
        0,
        "a healthy client is quiet at INFO"
    );
    let retry_span = recorder
        .spans
        .lock()
        .unwrap()
        .iter()
        .find(|(name, f)| {
            name == "stormguard.attempt" && f.iter().any(|(k, v)| k == "retry.attempt" && v == "1")
        })
        .cloned()
        .unwrap();
    let field = |k: &str| {
        retry_span
            .1
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(field("retry.reason").as_deref(), Some("UNAVAILABLE"));
    let delay: u64 = field("retry.delay_ms").unwrap().parse().unwrap();
    assert!(
        delay <= 5,
        "the retry's backoff delay, at most the cap: {delay}"
    );

    // Client, failing: the attempt limit refuses the last retry, at INFO.
    svc.push([
        Step::Fail(Code::Unavailable),
        Step::Fail(Code::Unavailable),
        Step::Fail(Code::Unavailable),
    ]);
    let mut request = tonic::Request::new(client_support::reserve("d"));
    request.set_timeout(Duration::from_secs(30));
    client.reserve(request).await.unwrap_err();
    let info = recorder.take_info();
    assert_eq!(info.len(), 1, "{info:?}");
    let refused = &info[0];
    assert_eq!(refused.level, Level::INFO);
    assert_eq!(refused.get("message"), Some("stormguard: retry refused"));
    assert_eq!(refused.get("retry.refused"), Some("attempts"));
    assert_eq!(refused.get("retry.attempt"), Some("2"));
    let left: u64 = refused.get("deadline.left_ms").unwrap().parse().unwrap();
    assert!(left > 0 && left <= 30_000, "{left}");

    // Server, healthy: nothing at INFO. Then one worker held and no queue: the next call
    // is shed, at INFO, with its class, reason, depth and pushback.
    let server = server_support::start(
        server_support::one_worker_no_queue(),
        DemoConfig::default(),
        true,
    )
    .await;
    let plain = InventoryClient::new(server_support::channel(server.addr).await);
    server.control.open_gate();
    plain
        .clone()
        .reserve(server_support::reserve("ok", None))
        .await
        .unwrap();
    assert_eq!(
        recorder.take_info().len(),
        0,
        "a healthy server is quiet at INFO"
    );
    server.control.close_gate();
    let held = server_support::hold_worker(&plain, &server.control).await;
    let shed = plain
        .clone()
        .reserve(server_support::reserve("shed", Some("1")))
        .await
        .unwrap_err();
    assert_eq!(shed.code(), Code::Unavailable);
    server_support::release(&server.control, held).await;
    let info = recorder.take_info();
    assert_eq!(info.len(), 1, "{info:?}");
    let event = &info[0];
    assert_eq!(event.get("message"), Some("stormguard: call shed"));
    assert_eq!(event.get("shed.class"), Some("retry"));
    assert_eq!(event.get("shed.reason"), Some("queue_full"));
    assert_eq!(event.get("queue.depth"), Some("0"));
    let pushback: i64 = event.get("pushback_ms").unwrap().parse().unwrap();
    assert!(pushback >= 1 || pushback == -1, "{pushback}");
}
