use super::*;
use std::task::{Context, Poll, Waker};

/// Runs one `Reserve` with the given metadata; the gate is open and the service
/// time zero, so the handler finishes on its first poll.
fn reserve_with(demo: &DemoInventory, headers: &[(&'static str, &'static str)]) {
    let mut request = Request::new(ReserveRequest::default());
    for (name, value) in headers {
        request
            .metadata_mut()
            .insert(*name, value.parse().expect("valid ASCII metadata"));
    }
    let mut call = demo.reserve(request);
    let mut cx = Context::from_waker(Waker::noop());
    assert!(matches!(call.as_mut().poll(&mut cx), Poll::Ready(Ok(_))));
}

#[test]
fn attempt_class_counted_as_the_shed_layer_reads_it() {
    let demo = DemoInventory::new(DemoConfig {
        service_time: Duration::ZERO,
        ..DemoConfig::default()
    });
    reserve_with(&demo, &[]);
    reserve_with(&demo, &[("grpc-previous-rpc-attempts", "0")]);
    // A malformed value is a retry to the layer (a peer cannot buy priority with
    // garbage), and `x-retry-attempt` marks a retry when the standard header is absent.
    reserve_with(&demo, &[("grpc-previous-rpc-attempts", "two")]);
    reserve_with(&demo, &[("x-retry-attempt", "1")]);
    reserve_with(&demo, &[("grpc-previous-rpc-attempts", "2")]);
    let counts = demo.control().counts();
    assert_eq!(counts.entered, 5);
    assert_eq!((counts.entered_first, counts.entered_retry), (2, 3));
}
