//! A call the adaptive throttle lets through allocates exactly what a call through a layer
//! without a throttle does: asking the throttle and recording the answer take a lock and
//! an atomic increment, no allocation. Counted with a counting global allocator (this test
//! binary's alone), on a single-threaded runtime, the two layers' calls interleaved over
//! one real tonic server.

#![allow(clippy::unwrap_used)]

#[path = "support/alloc.rs"]
mod alloc_support;
#[path = "support/client.rs"]
mod client_support;

use alloc_support::allocations_of;
use client_support::*;
use stormguard_client::RetryLayer;
use stormguard_core::adaptive_throttle::{AdaptiveThrottle, AdaptiveThrottleConfig};

#[tokio::test(flavor = "current_thread")]
async fn a_call_the_throttle_lets_through_allocates_no_more_than_one_without_it() {
    let svc = Scripted::always(Step::Ok);
    let addr = serve(svc).await;
    let mut plain = client(
        channel(addr).await,
        RetryLayer::new(controller(idempotent_policy())),
    );
    let throttle = AdaptiveThrottle::new(AdaptiveThrottleConfig::default(), 1).unwrap();
    let layer =
        RetryLayer::new(controller(idempotent_policy())).with_adaptive_throttle(throttle.clone());
    let stats = layer.stats();
    let mut throttled = client(channel(addr).await, layer);
    // Warm both connections up.
    allocations_of(&mut plain, 50).await;
    allocations_of(&mut throttled, 50).await;
    let (mut p, mut t) = (0, 0);
    for _ in 0..5 {
        p += allocations_of(&mut plain, 100).await;
        t += allocations_of(&mut throttled, 100).await;
    }
    assert_eq!(stats.snapshot().throttled.total(), 0, "nothing was refused");
    let counts = throttle.counts_at(
        stormguard_core::criticality::Criticality::Default,
        stormguard_core::Instant::now(),
    );
    assert_eq!(counts.accepts, 550, "every answer was recorded");
    // Equal in measurement; the margin (one allocation per ten calls) absorbs a buffer of
    // the connection growing in one run and not the other.
    assert!(
        t <= p + 50,
        "throttled {t} allocations against plain {p} for 500 calls each"
    );
}
