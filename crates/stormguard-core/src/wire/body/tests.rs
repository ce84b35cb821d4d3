#![allow(clippy::unwrap_used)]
use super::*;
use bytes::Bytes;
use std::time::Duration;

/// Yields its frames, each ready at once, then waits forever.
struct Listed(VecDeque<Frame<Bytes>>, bool);

impl Body for Listed {
    type Data = Bytes;
    type Error = &'static str;
    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, &'static str>>> {
        let this = self.get_mut();
        match this.0.pop_front() {
            Some(f) => Poll::Ready(Some(Ok(f))),
            None if this.1 => Poll::Pending,
            None => Poll::Ready(None),
        }
    }
}

fn data(s: &'static str) -> Frame<Bytes> {
    Frame::data(Bytes::from_static(s.as_bytes()))
}

async fn next<B: Body>(body: &mut Pin<Box<DeadlineCut<B>>>) -> Polled<B::Data, B::Error> {
    std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await
}

#[tokio::test(start_paused = true)]
async fn a_waiting_body_is_cut_at_its_deadline_once() {
    let at = Instant::now() + Duration::from_secs(1);
    let mut body = Box::pin(DeadlineCut::new(Listed([data("a")].into(), true), Some(at)));
    assert!(matches!(next(&mut body).await, Polled::Frame(Some(Ok(_)))));
    assert!(matches!(next(&mut body).await, Polled::Cut));
    assert_eq!(Instant::now(), at);
    assert!(body.get_ref().is_none() && body.is_end_stream());
    assert!(matches!(next(&mut body).await, Polled::Frame(None)));
}

#[tokio::test(start_paused = true)]
async fn a_ready_data_frame_past_the_deadline_is_cut() {
    let at = Instant::now() + Duration::from_secs(1);
    let mut body = Box::pin(DeadlineCut::new(
        Listed([data("a")].into(), false),
        Some(at),
    ));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(matches!(next(&mut body).await, Polled::Cut));
}

#[tokio::test(start_paused = true)]
async fn an_ended_body_is_not_cut() {
    let at = Instant::now() + Duration::from_secs(1);
    let mut body = Box::pin(DeadlineCut::new(
        Listed([data("a")].into(), false),
        Some(at),
    ));
    assert!(matches!(next(&mut body).await, Polled::Frame(Some(Ok(_)))));
    assert!(matches!(next(&mut body).await, Polled::Frame(None)));
    assert_eq!(body.cut_at(), None);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(matches!(next(&mut body).await, Polled::Frame(None)));
}

/// Every frame of `body` until its end, or its first error.
async fn frames<B: Body + Unpin>(mut body: B) -> Vec<Result<Frame<B::Data>, B::Error>> {
    let mut frames = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        frames.push(frame);
    }
    frames
}

#[tokio::test]
async fn held_frames_come_first_then_the_rest() {
    let rest = Listed([data("cd")].into(), false);
    let body = HeldFrames::new([Ok(data("ab"))], Some(rest));
    assert_eq!(body.size_hint().lower(), 2);
    assert!(!body.is_end_stream());
    let read: Vec<_> = frames(body)
        .await
        .into_iter()
        .map(|f| f.unwrap().into_data().unwrap())
        .collect();
    assert_eq!(read, ["ab", "cd"]);
    let held: HeldFrames<Listed> = HeldFrames::new([Ok(data("ab")), Err("failed")], None);
    let read = frames(held).await;
    assert_eq!(read.len(), 2);
    assert!(matches!(read[1], Err("failed")));
}
