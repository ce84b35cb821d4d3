#![allow(clippy::unwrap_used)]
use super::*;
use http_body_util::BodyExt;
use std::collections::VecDeque;

/// A body that yields the given chunks one frame at a time, with no length announced.
struct Chunks(VecDeque<Bytes>);

impl HttpBody for Chunks {
    type Data = Bytes;
    type Error = Status;
    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        Poll::Ready(self.get_mut().0.pop_front().map(|c| Ok(Frame::data(c))))
    }
    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

fn chunked(chunks: &[&'static [u8]]) -> Body {
    Body::new(Chunks(
        chunks.iter().map(|c| Bytes::from_static(c)).collect(),
    ))
}

async fn collect(body: ReplayBody) -> Bytes {
    body.collect().await.unwrap().to_bytes()
}

#[tokio::test]
async fn replays_the_whole_body_to_every_attempt() {
    let (replay, first) = Replay::new(chunked(&[b"ab", b"cd"]), 16).unwrap();
    assert_eq!(collect(first).await, Bytes::from_static(b"abcd"));
    assert!(replay.is_replayable());
    assert_eq!(collect(replay.body()).await, Bytes::from_static(b"abcd"));
    assert_eq!(collect(replay.body()).await, Bytes::from_static(b"abcd"));
}

#[tokio::test]
async fn a_retry_continues_a_body_the_first_attempt_left_half_read() {
    let (replay, mut first) = Replay::new(chunked(&[b"ab", b"cd", b"ef"]), 16).unwrap();
    let frame = first.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), Bytes::from_static(b"ab"));
    drop(first);
    assert_eq!(collect(replay.body()).await, Bytes::from_static(b"abcdef"));
}

#[tokio::test]
async fn a_body_over_the_limit_is_sent_once_and_the_buffer_is_freed() {
    let (replay, first) = Replay::new(chunked(&[b"abcd", b"efgh", b"ij"]), 6).unwrap();
    assert_eq!(collect(first).await, Bytes::from_static(b"abcdefghij"));
    assert!(!replay.is_replayable());
    assert_eq!(replay.buffered(), 0);
    let err = replay.body().collect().await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Internal);
}

/// Yields its frames, returning `Pending` once before each (waking itself).
struct Slow {
    frames: VecDeque<Result<Frame<Bytes>, Status>>,
    ready: bool,
}

impl HttpBody for Slow {
    type Data = Bytes;
    type Error = Status;
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if !std::mem::replace(&mut this.ready, false) {
            this.ready = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(this.frames.pop_front())
    }
}

/// Yields its frames, every one ready at once.
struct Listed(VecDeque<Result<Frame<Bytes>, Status>>);

impl HttpBody for Listed {
    type Data = Bytes;
    type Error = Status;
    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        Poll::Ready(self.get_mut().0.pop_front())
    }
}

async fn collect_body(body: Body) -> Result<Bytes, Status> {
    Ok(body.collect().await?.to_bytes())
}

#[tokio::test]
async fn a_body_ready_at_once_is_read_whole_before_the_first_attempt() {
    match buffer(chunked(&[b"ab"]), 16) {
        Buffered::Whole(data, _) => assert_eq!(data, Bytes::from_static(b"ab")),
        other => panic!("{other:?}"),
    }
    match buffer(chunked(&[b"ab", b"cd", b"ef"]), 16) {
        Buffered::Whole(data, _) => assert_eq!(data, Bytes::from_static(b"abcdef")),
        other => panic!("{other:?}"),
    }
    match buffer(Body::empty(), 16) {
        Buffered::Whole(data, _) => assert!(data.is_empty()),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_body_not_ready_at_once_is_buffered_as_it_goes_with_nothing_lost() {
    let slow = Slow {
        frames: [b"ab", b"cd"]
            .into_iter()
            .map(|c| Ok(Frame::data(Bytes::from_static(c))))
            .collect(),
        ready: true,
    };
    // The first frame is ready, the second is not.
    let Buffered::Stream(replay, first) = buffer(Body::new(slow), 16) else {
        panic!("not ready at once")
    };
    assert_eq!(collect(first).await, Bytes::from_static(b"abcd"));
    assert_eq!(collect(replay.body()).await, Bytes::from_static(b"abcd"));
}

#[tokio::test]
async fn a_body_that_outgrows_the_limit_while_read_is_sent_once_whole() {
    let Buffered::Stream(replay, first) = buffer(chunked(&[b"abcd", b"efgh", b"ij"]), 6) else {
        panic!("over the limit")
    };
    assert_eq!(collect(first).await, Bytes::from_static(b"abcdefghij"));
    assert!(!replay.is_replayable());
}

#[tokio::test]
async fn an_error_read_before_the_first_attempt_reaches_it() {
    let failing = Listed(
        [
            Ok(Frame::data(Bytes::from_static(b"ab"))),
            Err(Status::internal("encoding failed")),
        ]
        .into_iter()
        .collect(),
    );
    let Buffered::Stream(_, first) = buffer(Body::new(failing), 16) else {
        panic!("an error is not a whole body")
    };
    let err = collect_body(Body::new(first)).await.unwrap_err();
    assert_eq!(err.message(), "encoding failed");
}

#[tokio::test]
async fn once_the_call_commits_the_buffer_stops_filling() {
    let (replay, mut first) = Replay::new(chunked(&[b"ab", b"cd", b"ef"]), 64).unwrap();
    let frame = first.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), Bytes::from_static(b"ab"));
    assert_eq!(replay.buffered(), 2);
    replay.commit();
    // The rest still reaches the wire, unbuffered; the buffer is freed.
    assert_eq!(collect(first).await, Bytes::from_static(b"cdef"));
    assert_eq!(replay.buffered(), 0);
    assert!(!replay.is_replayable());
}

#[tokio::test]
async fn a_body_exactly_at_the_limit_stays_replayable() {
    let (replay, first) = Replay::new(chunked(&[b"abc", b"def"]), 6).unwrap();
    assert_eq!(collect(first).await, Bytes::from_static(b"abcdef"));
    assert!(replay.is_replayable());
    assert_eq!(replay.buffered(), 6);
}

#[tokio::test]
async fn an_announced_length_over_the_limit_is_not_wrapped() {
    let body = Body::new(http_body_util::Full::new(Bytes::from(vec![0u8; 100])));
    assert!(Replay::new(body, 99).is_err());
}

#[tokio::test]
async fn an_empty_body_replays_as_empty() {
    let (replay, first) = Replay::new(Body::empty(), 16).unwrap();
    assert!(first.is_end_stream());
    assert!(replay.body().is_end_stream());
    assert_eq!(collect(replay.body()).await, Bytes::new());
}

#[tokio::test]
async fn replay_waits_until_the_previous_attempt_hands_the_body_back() {
    let (replay, mut first) = Replay::new(chunked(&[b"ab", b"cd"]), 16).unwrap();
    let _ = first.frame().await.unwrap().unwrap();
    let mut second = replay.body();
    // Replays "ab", then must wait: the first attempt still holds the original body.
    assert_eq!(
        second.frame().await.unwrap().unwrap().into_data().unwrap(),
        Bytes::from_static(b"ab")
    );
    let pending = futures_poll_once(&mut second);
    assert!(pending.is_none(), "must wait for the original body");
    drop(first);
    assert_eq!(
        second.frame().await.unwrap().unwrap().into_data().unwrap(),
        Bytes::from_static(b"cd")
    );
}

/// A waker that records whether it was woken.
struct Flag(std::sync::atomic::AtomicBool);

impl std::task::Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

fn poll_with(body: &mut ReplayBody, flag: &Arc<Flag>) -> Poll<()> {
    let waker = Waker::from(flag.clone());
    let mut cx = Context::from_waker(&waker);
    Pin::new(body).poll_frame(&mut cx).map(|_| ())
}

#[tokio::test]
async fn every_attempt_waiting_for_the_body_is_woken_when_it_comes_back() {
    let (replay, mut first) = Replay::new(chunked(&[b"ab", b"cd"]), 16).unwrap();
    let _ = first.frame().await.unwrap().unwrap();
    // Two later attempts (a retry whose own retry is already under way) both replay
    // "ab" and then wait for the original body, which the first attempt still holds.
    let (mut second, mut third) = (replay.body(), replay.body());
    let (w2, w3) = (Arc::new(Flag(false.into())), Arc::new(Flag(false.into())));
    for (body, flag) in [(&mut second, &w2), (&mut third, &w3)] {
        assert!(
            poll_with(body, flag).is_ready(),
            "replays the buffered chunk"
        );
        assert!(poll_with(body, flag).is_pending());
    }
    // The second attempt's transport polls it again while it waits.
    assert!(poll_with(&mut second, &w2).is_pending());
    drop(first);
    let woken = |f: &Arc<Flag>| f.0.load(std::sync::atomic::Ordering::SeqCst);
    assert!(woken(&w2) && woken(&w3), "no waiting attempt is forgotten");
    drop(second);
    assert_eq!(
        third.frame().await.unwrap().unwrap().into_data().unwrap(),
        Bytes::from_static(b"cd")
    );
}

fn futures_poll_once(body: &mut ReplayBody) -> Option<()> {
    let waker = Waker::noop();
    let mut cx = Context::from_waker(waker);
    match Pin::new(body).poll_frame(&mut cx) {
        Poll::Pending => None,
        Poll::Ready(_) => Some(()),
    }
}
