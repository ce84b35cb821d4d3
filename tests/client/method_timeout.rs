//! A service config's `timeout` caps the deadline of its method's calls, as gRPC specifies
//! ("the actual deadline used will be the minimum of the value specified here and the value
//! set by the application"): a call whose caller set none gets it (sent as `grpc-timeout`,
//! bounding its retries), a longer deadline of the caller's own is cut to it, a shorter one
//! is kept, and it wins over the layer-wide default.
#![allow(clippy::unwrap_used)]

use crate::client_support;

use std::time::Duration;

use client_support::*;
use stormguard_client::RetryLayer;
use stormguard_core::config::ClientConfig;
use tonic::Request;

const CONFIG: &str = r#"{ "methodConfig": [
  { "name": [{ "service": "stormguard.demo.v1.Inventory" }], "timeout": "0.25s",
    "retryPolicy": { "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
                     "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"] } },
  { "name": [{ "service": "stormguard.demo.v1.Inventory", "method": "WatchStock" }] } ] }"#;

fn layer() -> RetryLayer {
    RetryLayer::from_config_seeded(&ClientConfig::from_service_config_json(CONFIG).unwrap(), 1)
        .unwrap()
        .with_default_timeout(Duration::from_secs(30))
}

#[tokio::test]
async fn a_method_timeout_caps_the_deadline_of_its_calls() {
    let svc = Scripted::always(Step::Ok);
    let mut client = setup(&svc, layer()).await;

    client.reserve(reserve("no-deadline")).await.unwrap();
    let mut own = Request::new(reserve("own-deadline"));
    own.set_timeout(Duration::from_secs(5));
    client.reserve(own).await.unwrap();
    let mut short = Request::new(reserve("short-deadline"));
    short.set_timeout(Duration::from_millis(100));
    client.reserve(short).await.unwrap();

    let seen = svc.seen();
    let sent = seen[0]
        .timeout()
        .expect("the method's timeout is sent as grpc-timeout");
    assert!(
        sent <= Duration::from_millis(250) && sent > Duration::from_millis(200),
        "{sent:?}"
    );
    // A caller's own deadline longer than the method's limit is cut to it ...
    let own = seen[1].timeout().unwrap();
    assert!(
        own <= Duration::from_millis(250) && own > Duration::from_millis(200),
        "{own:?}"
    );
    // ... and a shorter one is kept as the caller wrote it.
    let short = seen[2].timeout().unwrap();
    assert!(short <= Duration::from_millis(100), "{short:?}");
}
