//! A generated client's `with_interceptor` takes a channel wrapped in the `RetryLayer`
//! (tonic-build requires `T::ResponseBody: Default` there). The interceptor runs once per
//! logical call, above the layer, and what it sets (here the call's deadline) goes out on
//! every attempt, retries included.
#![allow(clippy::unwrap_used)]

use crate::client_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use client_support::*;
use stormguard_demo::InventoryClient;
use tonic::Code;
use tower::ServiceBuilder;

#[tokio::test]
async fn a_generated_client_with_an_interceptor_runs_over_the_layer() {
    let svc = Scripted::new([Step::Fail(Code::Unavailable)], Step::Ok);
    let addr = serve(svc.clone()).await;
    let layered = ServiceBuilder::new()
        .layer(stormguard_client::RetryLayer::new(controller(
            idempotent_policy(),
        )))
        .service(channel(addr).await);
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let mut client =
        InventoryClient::with_interceptor(layered, move |mut request: tonic::Request<()>| {
            counted.fetch_add(1, Ordering::Relaxed);
            request.set_timeout(Duration::from_secs(5));
            Ok(request)
        });
    client.reserve(reserve("intercepted")).await.unwrap();
    let seen = svc.seen();
    assert_eq!(
        seen.len(),
        2,
        "the first attempt failed, its retry succeeded"
    );
    assert_eq!(runs.load(Ordering::Relaxed), 1, "once per logical call");
    for attempt in &seen {
        let left = attempt
            .timeout()
            .expect("the interceptor's deadline is sent");
        assert!(left > Duration::from_secs(4) && left <= Duration::from_secs(5));
    }
}
