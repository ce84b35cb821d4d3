//! The readiness contract of `ShedService`: ready exactly when the inner service is,
//! never waiting for a worker (admission happens in `call`, where a full queue is
//! answered at once).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use stormguard_server::{AdmissionConfig, RetryThreshold, ShedLayer};

use stormguard_server::WorkerLimit;
use tower::{Layer, Service};

/// A handler whose readiness the test switches; its calls never finish.
#[derive(Clone)]
struct Switch {
    ready: Arc<AtomicBool>,
}

impl Service<http::Request<String>> for Switch {
    type Response = http::Response<String>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<http::Response<String>, Infallible>> + Send>,
    >;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        if self.ready.load(Ordering::SeqCst) {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    fn call(&mut self, _: http::Request<String>) -> Self::Future {
        Box::pin(std::future::pending())
    }
}

fn poll_ready_once<S: Service<http::Request<String>>>(service: &mut S) -> bool {
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    service.poll_ready(&mut cx).is_ready()
}

fn request() -> http::Request<String> {
    http::Request::new(String::new())
}

#[test]
fn ready_exactly_when_the_inner_service_is_even_with_the_queue_full() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _guard = runtime.enter();
    let layer = ShedLayer::from_config(&AdmissionConfig {
        workers: WorkerLimit::Fixed(1),
        queue_capacity: 1,
        retry_threshold: RetryThreshold {
            depth: None,
            queue_delay: None,
        },
        ..AdmissionConfig::default()
    })
    .expect("config");
    let stats = layer.stats();
    let switch = Arc::new(AtomicBool::new(true));
    let mut service = layer.layer(Switch {
        ready: Arc::clone(&switch),
    });

    // Fill the worker and the queue.
    assert!(poll_ready_once(&mut service));
    let _running = service.call(request());
    assert!(poll_ready_once(&mut service));
    let _queued = service.call(request());
    let s = stats.snapshot();
    assert_eq!((s.in_flight, s.queue_depth), (1, 1));

    // Still ready: the next call is admitted or shed in `call`, not held in poll_ready.
    assert!(poll_ready_once(&mut service));
    let shed = runtime
        .block_on(service.call(request()))
        .expect("infallible");
    assert_eq!(shed.headers()["grpc-status"], "14");

    // Not ready when the inner service is not, whatever the queue.
    switch.store(false, Ordering::SeqCst);
    assert!(!poll_ready_once(&mut service));
    switch.store(true, Ordering::SeqCst);
    assert!(poll_ready_once(&mut service));
}
