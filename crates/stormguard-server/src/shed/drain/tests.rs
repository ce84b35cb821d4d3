#![allow(clippy::unwrap_used)]
use super::*;
use bytes::Bytes;
use http_body::Frame;

/// `frames` frames of `size` bytes, all ready at once, then the end.
struct Ready {
    frames: usize,
    size: usize,
}

impl Body for Ready {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.frames == 0 {
            return Poll::Ready(None);
        }
        self.frames -= 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![0; self.size])))))
    }
}

/// A body whose caller never sends anything.
struct Stalled;

impl Body for Stalled {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Pending
    }
}

#[test]
fn a_body_already_there_is_read_in_place_and_a_large_one_is_cut() {
    let drains = Arc::new(Drains::default());
    discard(
        Ready {
            frames: 3,
            size: 20,
        },
        &drains,
    );
    // 65 frames of 1 KiB: one more than MAX_BYTES allows.
    discard(
        Ready {
            frames: 65,
            size: 1024,
        },
        &drains,
    );
    let counts = drains.counts();
    assert_eq!((counts.ended, counts.cut, counts.active), (1, 1, 0));
    // Exactly MAX_BYTES is read to the end.
    discard(
        Ready {
            frames: 64,
            size: 1024,
        },
        &drains,
    );
    assert_eq!(drains.counts().ended, 2);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_stalled_body_is_read_for_at_most_max_time_and_max_drains_at_once() {
    let drains = Arc::new(Drains::default());
    for _ in 0..MAX_DRAINS + 5 {
        discard(Stalled, &drains);
    }
    let counts = drains.counts();
    assert_eq!((counts.active, counts.skipped), (MAX_DRAINS, 5));
    tokio::time::sleep(MAX_TIME - Duration::from_millis(1)).await;
    assert_eq!(drains.counts().active, MAX_DRAINS);
    tokio::time::sleep(Duration::from_millis(2)).await;
    let counts = drains.counts();
    assert_eq!(
        (counts.active, counts.cut, counts.ended),
        (0, MAX_DRAINS as u64, 0)
    );
}

#[test]
fn without_a_runtime_a_pending_body_is_dropped_and_counted() {
    let drains = Arc::new(Drains::default());
    discard(Stalled, &drains);
    assert_eq!(drains.counts().skipped, 1);
}
