//! A method that is not keyed pays nothing for idempotency keys: a call through a layer
//! whose method table keys other methods allocates what a call through a layer without
//! keys does (one lookup in a map that has no entry for it). A keyed call pays for its key
//! (the header value, and the headers kept for a retry): counted too, so the cost is a
//! figure, not a guess. Counted with a counting global allocator (this test binary's
//! alone), on a single-threaded runtime, the layers' calls interleaved over one real tonic
//! server.

#![allow(clippy::unwrap_used)]

#[path = "support/alloc.rs"]
mod alloc_support;
#[path = "support/client.rs"]
mod client_support;

use alloc_support::allocations_of;
use client_support::*;
use stormguard_client::RetryLayer;
use stormguard_core::MethodScope;
use stormguard_core::MethodTable;
use stormguard_core::RetryController;

/// A layer retrying every method as `controller` does, keying `keyed_service`'s methods.
fn layer(keyed_service: Option<&str>) -> RetryLayer {
    let mut table = MethodTable::uniform(idempotent_policy());
    if let Some(service) = keyed_service {
        table.set_idempotency_key(MethodScope::Service(service), true);
    }
    RetryLayer::new(RetryController::new(table, budget(100, 0.1), None, 42).unwrap())
}

#[tokio::test(flavor = "current_thread")]
async fn an_unkeyed_call_allocates_no_more_than_one_through_a_layer_without_keys() {
    let svc = Scripted::always(Step::Ok);
    let addr = serve(svc.clone()).await;
    let mut plain = client(channel(addr).await, layer(None));
    // Keys for another service: Reserve is not keyed.
    let mut other = client(channel(addr).await, layer(Some("pkg.Payments")));
    let mut keyed = client(
        channel(addr).await,
        layer(Some("stormguard.demo.v1.Inventory")),
    );
    // Warm the connections up.
    allocations_of(&mut plain, 50).await;
    allocations_of(&mut other, 50).await;
    allocations_of(&mut keyed, 50).await;
    let (mut p, mut o, mut k) = (0, 0, 0);
    for _ in 0..5 {
        p += allocations_of(&mut plain, 100).await;
        o += allocations_of(&mut other, 100).await;
        k += allocations_of(&mut keyed, 100).await;
    }
    println!(
        "allocations per call: no keys {:.2}, unkeyed method {:.2}, keyed method {:.2}",
        p as f64 / 500.0,
        o as f64 / 500.0,
        k as f64 / 500.0
    );
    // Equal in measurement; the margin (one allocation per ten calls) absorbs a buffer of
    // the connection growing in one run and not the other.
    assert!(
        o <= p + 50,
        "unkeyed method {o} allocations against no keys {p} for 500 calls each"
    );
    // The keyed calls did carry keys (so the comparison above is of a layer that keys).
    assert!(k > p, "a keyed call pays for its key: {k} against {p}");
}
