//! The demo's simulated network (`turmoil_net`) under the real layers.

use std::time::Duration;

use stormguard_client::RetryLayer;
use stormguard_core::AdmissionConfig;
use stormguard_demo::server::{DemoConfig, DemoInventory};
use stormguard_demo::turmoil_net::{connect_lazy_with, endpoint, incoming};
use stormguard_demo::{InventoryClient, InventoryServer, ReserveRequest};
use stormguard_server::ShedLayer;
use tonic::transport::Server;
use tower::ServiceBuilder;

/// A real tonic server behind the `ShedLayer` and a real client behind the
/// `RetryLayer` talk over turmoil; a partition fails a call within its deadline and a
/// repaired network serves the next one.
#[test]
fn real_layers_over_the_simulated_network() {
    let mut sim = turmoil::Builder::new()
        .simulation_duration(Duration::from_secs(20))
        .rng_seed(7)
        .build();
    sim.host("server", || async {
        let service = DemoInventory::new(DemoConfig::default());
        let shed = ShedLayer::from_config(&AdmissionConfig::default())?;
        Server::builder()
            .layer(shed)
            .add_service(InventoryServer::new(service))
            .serve_with_incoming(incoming(50051).await?)
            .await?;
        Ok(())
    });
    sim.client("client", async {
        // turmoil's TCP does not retransmit what a partition dropped, so a partition
        // breaks a connection for good, as a black hole does; HTTP/2 keepalive finds it.
        let endpoint = endpoint("server", 50051)?
            .http2_keep_alive_interval(Duration::from_millis(300))
            .keep_alive_timeout(Duration::from_millis(300))
            .keep_alive_while_idle(true);
        let channel = connect_lazy_with(endpoint);
        let layer = RetryLayer::from_config(&stormguard_demo::client_config().with_seed(3))?;
        let mut client = InventoryClient::new(ServiceBuilder::new().layer(layer).service(channel));
        let call = |id: &str| {
            let mut request = tonic::Request::new(ReserveRequest {
                sku: "sku".into(),
                quantity: 1,
                request_id: id.into(),
                payload: Vec::new(),
            });
            request.set_timeout(Duration::from_millis(500));
            request
        };
        client
            .reserve(call("a"))
            .await
            .map_err(|s| format!("a: {s:?}"))?;
        turmoil::partition("client", "server");
        let started = tokio::time::Instant::now();
        let status = client.reserve(call("b")).await.expect_err("partitioned");
        let took = started.elapsed();
        assert!(
            took <= Duration::from_millis(510),
            "ended {took:?} after it began, {status:?}"
        );
        turmoil::repair("client", "server");
        tokio::time::sleep(Duration::from_secs(1)).await;
        client
            .reserve(call("c"))
            .await
            .map_err(|s| format!("c: {s:?}"))?;
        Ok(())
    });
    sim.run().expect("simulation");
}
