//! A counting global allocator for the test binaries that count a call's allocations (each
//! binary that declares this module gets its own), and the count of a run of calls.

#![allow(dead_code, clippy::unwrap_used)]

use std::time::Duration;

use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

use crate::client_support::{Client, reserve};

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

/// Allocations made while `client` makes `calls` unary calls, one after another.
pub(crate) async fn allocations_of(client: &mut Client, calls: usize) -> usize {
    let before = GLOBAL.stats().allocations;
    for i in 0..calls {
        let mut request = tonic::Request::new(reserve(&format!("{i:08}")));
        request.set_timeout(Duration::from_secs(10));
        client.reserve(request).await.unwrap();
    }
    GLOBAL.stats().allocations - before
}
