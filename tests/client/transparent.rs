//! End-to-end: an attempt HTTP/2 refused (`RST_STREAM REFUSED_STREAM`: the server did not
//! process it) is retried transparently by the `RetryLayer` over a real tonic channel:
//! for a non-idempotent method, without a retry budget, without counting an attempt.
//!
//! The server is raw h2 on loopback (bound before the client connects): it refuses the
//! first stream and answers every other one with a trailers-only `OK`.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use http::{HeaderMap, Request, Response};
use stormguard_client::RetryLayer;
use stormguard_core::RetryController;
use stormguard_core::{Budget, BudgetConfig, RetryBudget};
use stormguard_core::{MethodTable, RetryPolicy};
use tokio::net::TcpListener;
use tonic::body::Body;
use tonic::transport::Endpoint;
use tower::Layer;
use tower::{Service, ServiceExt};

/// Serves one connection: refuses the first `refuse` streams, answers the rest `OK`;
/// records the headers of every stream.
async fn raw_h2_server(refuse: usize) -> (std::net::SocketAddr, Arc<Mutex<Vec<HeaderMap>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut connection = h2::server::handshake(tcp).await.unwrap();
        let mut n = 0;
        while let Some(Ok((request, mut respond))) = connection.accept().await {
            log.lock().unwrap().push(request.headers().clone());
            n += 1;
            if n <= refuse {
                respond.send_reset(h2::Reason::REFUSED_STREAM);
                continue;
            }
            let response = Response::builder()
                .status(200)
                .header("content-type", "application/grpc")
                .header("grpc-status", "0")
                .body(())
                .unwrap();
            let _ = respond.send_response(response, true);
        }
    });
    (addr, seen)
}

/// A layer whose budget grants nothing: any retry it paid for would be refused.
fn layer(idempotent: bool) -> (RetryLayer, Arc<dyn Budget>) {
    let budget: Arc<dyn Budget> = Arc::new(
        RetryBudget::new(BudgetConfig {
            min_retries_per_second: 0,
            retry_ratio: 0.001,
            ..BudgetConfig::default()
        })
        .unwrap(),
    );
    let policy = RetryPolicy {
        idempotent,
        ..RetryPolicy::default()
    };
    let controller =
        RetryController::new(MethodTable::uniform(policy), Arc::clone(&budget), None, 3).unwrap();
    (RetryLayer::new(controller), budget)
}

fn request() -> Request<Body> {
    Request::builder()
        .method("POST")
        .uri("http://refusing/pkg.Orders/Create")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Body::empty())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_stream_is_retried_transparently_for_a_non_idempotent_method() {
    let (addr, seen) = raw_h2_server(1).await;
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (layer, budget) = layer(false);
    let stats = layer.stats();
    let mut svc = layer.layer(channel);

    let response = svc.ready().await.unwrap().call(request()).await.unwrap();
    assert_eq!(
        response.headers()["grpc-status"],
        "0",
        "served on the second stream"
    );

    let s = stats.snapshot();
    assert_eq!(
        (s.attempts, s.transparent_retries, s.retries, s.ok),
        (2, 1, 0, 1),
        "{s:?}"
    );
    assert_eq!(s.refused.not_idempotent + s.refused.budget, 0);
    // The success's deposit (retry_ratio), and nothing withdrawn.
    let balance = budget.balance_at(stormguard_core::Instant::now());
    assert!((balance - 0.001).abs() < 1e-9, "{balance}");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert!(
        seen.iter()
            .all(|h| h.get("grpc-previous-rpc-attempts").is_none()),
        "a transparent retry is not a retry on the wire"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_streams_are_free_only_a_bounded_number_of_times() {
    // Every stream refused: three transparent retries, then the failure is an ordinary
    // one, paid from a budget that has nothing: refused, and the call fails.
    let (addr, seen) = raw_h2_server(usize::MAX).await;
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (layer, _budget) = layer(true);
    let stats = layer.stats();
    let mut svc = layer.layer(channel);

    let err = svc
        .ready()
        .await
        .unwrap()
        .call(request())
        .await
        .unwrap_err();
    let status = err.downcast::<tonic::Status>().unwrap();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let s = stats.snapshot();
    let free = u64::from(stormguard_core::TRANSPARENT_RETRIES);
    assert_eq!(
        (
            s.attempts,
            s.transparent_retries,
            s.retries,
            s.refused.budget
        ),
        (1 + free, free, 0, 1),
        "{s:?}"
    );
    assert_eq!(seen.lock().unwrap().len() as u64, 1 + free);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_a_dependency_refuses_connections_a_new_call_fails_at_once_without_dialing() {
    // A port that refuses connections: bound, then closed.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let (layer, _) = layer(true);
    let stats = layer.stats();
    let mut svc = layer.layer(channel);
    let call = || {
        let mut request = request();
        let timeout = http::HeaderValue::from_static("300m");
        request.headers_mut().insert("grpc-timeout", timeout);
        request
    };
    // The first call dials and is refused; its transparent retry's slot in the connection
    // backoff (1 s ± 20 %) is past its deadline, so it is not made.
    let first = svc.ready().await.unwrap().call(call()).await.unwrap_err();
    let first = tonic::Status::from_error(first);
    assert_eq!(first.code(), tonic::Code::Unavailable, "{first:?}");
    // The dependency is in backoff: the next call is answered at once, without dialing.
    let second = svc.ready().await.unwrap().call(call()).await.unwrap_err();
    let second = tonic::Status::from_error(second);
    assert_eq!(second.code(), tonic::Code::Unavailable, "{second:?}");
    assert!(
        second.message().contains("connection is in backoff"),
        "{second:?}"
    );
    assert_eq!(
        second.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "-1",
        "callers above are told not to retry it"
    );
    let s = stats.snapshot();
    assert_eq!((s.logical, s.attempts), (2, 1), "{s:?}");
    assert_eq!(s.refused.connect_backoff, 1, "{s:?}");
}
