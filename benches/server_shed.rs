//! The cost of a shed answer, against the work it replaces, same run.
//!
//! - `shed/stormguard`: one call through `ShedService` on a full queue, answered at once
//!   (attempt-class and `grpc-timeout` parsing, the decision under the queue's lock, the
//!   jittered pushback, and the trailers-only response built from static headers).
//! - `shed/tonic_status_into_http`: the same answer built the usual way, a
//!   `tonic::Status` with pushback metadata turned into an `http::Response`.
//! - `admitted/stormguard` and `admitted/bare`: a call that runs (the handler answers at
//!   once), through the layer and without it: the layer's overhead on the normal path.
//!
//! Run: `cargo bench --bench server_shed`.

use std::convert::Infallible;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use stormguard_server::WorkerLimit;
use stormguard_server::{AdmissionConfig, RetryThreshold, ShedLayer};
use tower::{Layer, Service, ServiceExt};

fn request() -> http::Request<String> {
    http::Request::builder()
        .uri("/stormguard.demo.v1.Inventory/Reserve")
        .header("grpc-previous-rpc-attempts", "1")
        .header("grpc-timeout", "250m")
        .body(String::new())
        .expect("request")
}

fn handler() -> impl Service<
    http::Request<String>,
    Response = http::Response<String>,
    Error = Infallible,
    Future = std::future::Ready<Result<http::Response<String>, Infallible>>,
> + Clone {
    tower::service_fn(|_req: http::Request<String>| {
        std::future::ready(Ok(http::Response::new(String::new())))
    })
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _guard = runtime.enter();

    // Zero workers are not allowed; one worker held for the whole run and no queue
    // makes every call a shed.
    let full = ShedLayer::from_config(&AdmissionConfig {
        workers: WorkerLimit::Fixed(1),
        queue_capacity: 0,
        retry_threshold: RetryThreshold {
            depth: None,
            queue_delay: None,
        },
        ..AdmissionConfig::default()
    })
    .expect("config");
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let held = {
        let gate = std::sync::Arc::clone(&gate);
        full.layer(tower::service_fn(move |_req: http::Request<String>| {
            let gate = std::sync::Arc::clone(&gate);
            async move {
                let _permit = gate.acquire().await;
                Ok::<_, Infallible>(http::Response::new(String::new()))
            }
        }))
    };
    let blocker = runtime.spawn(held.clone().oneshot(request()));
    runtime.block_on(async {
        while full.stats().snapshot().in_flight == 0 {
            tokio::task::yield_now().await;
        }
    });

    let mut group = c.benchmark_group("shed");
    let mut shed = held.clone();
    group.bench_function("stormguard", |b| {
        b.iter(|| {
            let future = shed.call(black_box(request()));
            black_box(runtime.block_on(future).expect("infallible"))
        })
    });
    group.bench_function("tonic_status_into_http", |b| {
        b.iter(|| {
            let _ = black_box(request());
            let mut status = tonic::Status::unavailable("stormguard: overloaded, queue full");
            status
                .metadata_mut()
                .insert("grpc-retry-pushback-ms", black_box(37u64).into());
            black_box(status.into_http::<()>())
        })
    });
    group.finish();

    let free = ShedLayer::from_config(&AdmissionConfig::default()).expect("config");
    let mut admitted = free.layer(handler());
    let mut bare = handler();
    let mut group = c.benchmark_group("admitted");
    group.bench_function("stormguard", |b| {
        b.iter(|| {
            let future = admitted.call(black_box(request()));
            black_box(runtime.block_on(future).expect("infallible"))
        })
    });
    group.bench_function("bare", |b| {
        b.iter(|| {
            let future = bare.call(black_box(request()));
            black_box(runtime.block_on(future).expect("infallible"))
        })
    });
    group.finish();

    gate.add_permits(1);
    let _ = runtime.block_on(blocker);
}

criterion_group!(benches, bench);
criterion_main!(benches);
