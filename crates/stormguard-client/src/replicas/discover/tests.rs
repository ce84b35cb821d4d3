#![allow(clippy::unwrap_used)]
use std::convert::Infallible;
use std::task::Context;
use std::time::Duration;

use tokio::sync::oneshot;
use tower::discover::Change;

use super::*;

/// A discovery stream that never yields; `_held` is dropped with it.
struct Silent {
    _held: oneshot::Sender<()>,
}

type Answer = tower::util::ServiceFn<
    fn(http::Request<()>) -> std::future::Ready<Result<http::Response<()>, Infallible>>,
>;

impl futures_core::Stream for Silent {
    type Item = Result<Change<u32, Answer>, Infallible>;

    fn poll_next(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Poll::Pending
    }
}

#[tokio::test(start_paused = true)]
async fn the_discovery_task_ends_when_the_channel_is_dropped_while_its_stream_waits() {
    let (held, dropped) = oneshot::channel();
    let replicas = Replicas::discover(ReplicaConfig::default(), Silent { _held: held }).unwrap();
    let copy = replicas.clone();
    tokio::task::yield_now().await;
    drop(replicas);
    tokio::task::yield_now().await;
    let mut dropped = pin!(dropped);
    assert!(
        poll_fn(|cx| Poll::Ready(dropped.as_mut().poll(cx).is_pending())).await,
        "a clone is left: the task goes on"
    );
    drop(copy);
    // The task drops its stream as it ends (within a second of paused time, or never).
    let ended = tokio::time::timeout(Duration::from_secs(1), dropped).await;
    assert!(matches!(ended, Ok(Err(_))), "the task ended: {ended:?}");
}
