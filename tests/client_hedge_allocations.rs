//! A hedged call that is answered before its delay allocates exactly what a retried call
//! does: the hedges' storage is created only when a hedge is sent. Counted with a counting
//! global allocator (this test binary's alone), on a single-threaded runtime, the two
//! layers' calls interleaved over one real tonic server.

#![allow(clippy::unwrap_used)]

#[path = "support/alloc.rs"]
mod alloc_support;
#[path = "support/client.rs"]
mod client_support;

use std::time::Duration;

use alloc_support::allocations_of;
use client_support::*;
use stormguard_client::RetryLayer;
use stormguard_core::MethodScope;
use stormguard_core::MethodTable;
use stormguard_core::RetryController;
use stormguard_core::{HedgeDelay, HedgingPolicy};

#[tokio::test(flavor = "current_thread")]
async fn a_hedged_call_answered_before_its_delay_allocates_no_more_than_a_retried_one() {
    let svc = Scripted::always(Step::Ok);
    let addr = serve(svc).await;
    let mut retried = client(
        channel(addr).await,
        RetryLayer::new(controller(idempotent_policy())),
    );
    let mut table = MethodTable::none();
    table.set_hedging(
        MethodScope::Default,
        Some(HedgingPolicy {
            delay: HedgeDelay::Fixed(Duration::from_secs(5)),
            ..HedgingPolicy::default()
        }),
    );
    let hedging = RetryController::new(table, budget(100, 0.1), None, 1).unwrap();
    let layer = RetryLayer::new(hedging);
    let stats = layer.stats();
    let mut hedged = client(channel(addr).await, layer);
    // Warm both connections up.
    allocations_of(&mut retried, 50).await;
    allocations_of(&mut hedged, 50).await;
    let (mut r, mut h) = (0, 0);
    for _ in 0..5 {
        r += allocations_of(&mut retried, 100).await;
        h += allocations_of(&mut hedged, 100).await;
    }
    assert_eq!(stats.snapshot().hedges, 0, "no hedge was due");
    // Equal in measurement; the margin (one allocation per ten calls) absorbs a buffer of
    // the connection growing in one run and not the other.
    assert!(
        h <= r + 50,
        "hedged {h} allocations against retried {r} for 500 calls each"
    );
}
