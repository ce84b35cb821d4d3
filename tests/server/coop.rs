//! A caller's plain loop over calls the `ShedLayer` sheds without I/O yields to the
//! runtime: on a current-thread runtime, a task beside the loop runs only when the loop's
//! task yields, and it counts its turns while the loop gets `CALLS` shed answers.
#![allow(clippy::unwrap_used)]

use crate::turns_support::TurnCounter;

use stormguard::server::ShedLayer;
use tonic::body::Body;
use tower::{Layer, Service, ServiceExt};

use crate::server_support::one_worker_no_queue;

const CALLS: u64 = 4_096;

#[tokio::test(flavor = "current_thread")]
async fn a_loop_of_shed_calls_yields() {
    // A handler that never answers: the first call holds the one worker, every other call
    // is shed on arrival.
    let handler = tower::service_fn(|_: http::Request<Body>| {
        std::future::pending::<Result<http::Response<Body>, std::convert::Infallible>>()
    });
    let mut svc = ShedLayer::from_config(&one_worker_no_queue())
        .unwrap()
        .layer(handler);
    let request = || {
        http::Request::post("/stormguard.demo.v1.Inventory/Reserve")
            .header("content-type", "application/grpc")
            .body(Body::empty())
            .unwrap()
    };
    let _held = svc.ready().await.unwrap().call(request());
    let counter = TurnCounter::spawn();
    for _ in 0..CALLS {
        let response = svc.ready().await.unwrap().call(request()).await.unwrap();
        let status = response.headers().get("grpc-status").unwrap();
        assert_ne!(status, "0", "shed");
    }
    let got = counter.turns();
    drop(counter);
    assert!(
        got >= CALLS / 256,
        "the task beside the loop ran {got} times in {CALLS} shed calls"
    );
}
