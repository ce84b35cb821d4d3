//! The demo `stormguard.demo.v1.Inventory` service, generated from
//! `proto/stormguard/demo/v1/inventory.proto` without a system `protoc`.
//!
//! It lives in its own unpublished crate so that examples, tests and benches share one
//! generated copy and library users never compile it.

#![allow(missing_docs, unreachable_pub, clippy::unwrap_used)]

pub mod dns;
#[cfg(doctest)]
mod docs;
pub mod pool;
pub mod server;
pub mod steady;
pub mod storm;
pub mod turmoil_net;

/// Generated messages, client and server for `stormguard.demo.v1`.
pub mod v1 {
    tonic::include_proto!("stormguard.demo.v1");
}

/// The ORCA load report generated from the vendored published proto
/// (`proto/xds/data/orca/v3/orca_load_report.proto`), for the tests that check
/// `stormguard_core::OrcaLoadReport` against it.
pub mod orca {
    tonic::include_proto!("xds.data.orca.v3");
}

pub use v1::{
    ReserveBatchReply, ReserveReply, ReserveRequest, StockLevel, WatchStockRequest,
    inventory_batch_client::InventoryBatchClient,
    inventory_batch_server::{InventoryBatch, InventoryBatchServer},
    inventory_client::InventoryClient,
    inventory_server::{Inventory, InventoryServer},
};

/// stormguard's standard client policy ([`ClientConfig::default`]) with the demo's
/// `Reserve` marked idempotent, as the proto documents it (a reservation is keyed by its
/// `request_id`): the policy the examples use when no config file is given.
///
/// [`ClientConfig::default`]: stormguard_core::ClientConfig::default
pub fn client_config() -> stormguard_core::ClientConfig {
    let mut config = stormguard_core::ClientConfig::default();
    config.methods.set_retry(
        stormguard_core::MethodScope::Method("stormguard.demo.v1.Inventory", "Reserve"),
        Some(stormguard_core::RetryPolicy {
            idempotent: true,
            ..stormguard_core::RetryPolicy::default()
        }),
    );
    config
}
