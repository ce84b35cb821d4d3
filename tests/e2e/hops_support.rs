//! Shared by the tests across hops: a client layer whose budget never runs dry, so only
//! the rules under test limit retries, and a generated client through it.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use stormguard_client::{Retry, RetryLayer};
use stormguard_core::RetryController;
use stormguard_core::{Budget, BudgetConfig, RetryBudget};
use stormguard_core::{MethodTable, RetryPolicy};
use stormguard_demo::InventoryClient;
use tonic::transport::{Channel, Endpoint};
use tower::ServiceBuilder;

pub type Client = InventoryClient<Retry<Channel>>;

/// `max_attempts` attempts per call, a backoff of a few milliseconds, every method
/// idempotent, a budget floor of 1 000 retries a second.
pub fn retry_layer(max_attempts: u32) -> RetryLayer {
    let policy = RetryPolicy {
        backoff: stormguard_core::BackoffConfig::FullJitter {
            base: Duration::from_millis(1),
            cap: Duration::from_millis(4),
            multiplier: 2.0,
        },
        max_attempts,
        idempotent: true,
        ..RetryPolicy::default()
    };
    let budget: Arc<dyn Budget> = Arc::new(
        RetryBudget::new(BudgetConfig {
            min_retries_per_second: 1_000,
            // A roomy budget, lent whatever the answers: the hops are what is tested.
            floor: stormguard_core::Floor::Always,
            ..BudgetConfig::default()
        })
        .unwrap(),
    );
    RetryLayer::new(RetryController::new(MethodTable::uniform(policy), budget, None, 7).unwrap())
}

/// A client of the service at `addr` through `layer`.
pub async fn client(addr: SocketAddr, layer: RetryLayer) -> Client {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    InventoryClient::new(ServiceBuilder::new().layer(layer).service(channel))
}
