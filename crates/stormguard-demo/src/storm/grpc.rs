//! The storm's client on the official `grpc` crate (`--client grpc`): the policy's
//! `ClientConfig` drives stormguard's `RetryInterceptor` on a `grpc` 0.9 channel instead of
//! a `RetryLayer` on a tonic channel; the server, the arrivals and the report are the
//! same.
//!
//! Attempts are counted below the interceptor, as [`Observe`](super::client::Observe)
//! counts them below the layer. A shed answer is counted when an attempt's first item is
//! trailers with `UNAVAILABLE` or `RESOURCE_EXHAUSTED`: `grpc` 0.9 drops the metadata of a
//! trailers-only answer, so the `ShedLayer`'s `grpc-retry-pushback-ms` cannot be seen (on
//! loopback nothing else answers those codes). Failures of the connection are not told
//! apart from answers either: `grpc` 0.9 reports both as `UNAVAILABLE` trailers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use grpc::StatusCodeError;
use grpc::client::interceptor::InvokeExt;
use grpc::client::{
    CallOptions, Channel, ChannelOptions, Invoke, RecvStream, ResponseStreamItem, SendOptions,
    SendStream,
};
use grpc::core::{RecvMessage, RequestHeaders, SendMessage};
use grpc::credentials::LocalChannelCredentials;
use stormguard_core::{ClientConfig, ConfigError};
use stormguard_grpc::{InterceptorStats, RetryInterceptor};
use tokio::time::Instant;
use tonic::Status;
use tower::util::BoxCloneSyncService;

use super::client::{Caller, INVENTORY_SERVICE, RESERVE_METHOD};
use super::report::Timeline;
use crate::{ReserveReply, ReserveRequest};

/// Which client library the storm's policies run on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ClientKind {
    /// tonic's `Channel`, under stormguard's `RetryLayer` (or the policy's own loop).
    #[default]
    Tonic,
    /// The official `grpc` crate's `Channel` (0.9), under stormguard's `RetryInterceptor`:
    /// only the policies whose client is stormguard's retry decision run on it.
    Grpc,
}

impl ClientKind {
    /// Its name on the command line and in the report.
    pub fn as_str(self) -> &'static str {
        match self {
            ClientKind::Tonic => "tonic",
            ClientKind::Grpc => "grpc",
        }
    }
}

/// Counts every attempt sent through it and the answers shed (see the module docs).
#[derive(Clone)]
struct Observed<I> {
    inner: I,
    timeline: Arc<Timeline>,
}

impl<I: Invoke> Invoke for Observed<I> {
    type SendStream = I::SendStream;
    type RecvStream = ObservedRecv<I::RecvStream>;

    async fn invoke(
        &self,
        headers: RequestHeaders,
        options: CallOptions,
    ) -> (Self::SendStream, Self::RecvStream) {
        self.timeline.attempt(Instant::now());
        let (send, recv) = self.inner.invoke(headers, options).await;
        let recv = ObservedRecv {
            inner: recv,
            timeline: Arc::clone(&self.timeline),
            first: true,
        };
        (send, recv)
    }
}

struct ObservedRecv<R> {
    inner: R,
    timeline: Arc<Timeline>,
    first: bool,
}

impl<R: RecvStream> RecvStream for ObservedRecv<R> {
    async fn recv(&mut self, msg: &mut dyn RecvMessage) -> ResponseStreamItem {
        let item = self.inner.recv(msg).await;
        if std::mem::take(&mut self.first)
            && let ResponseStreamItem::Trailers(trailers) = &item
            && let Err(e) = trailers.status()
            && matches!(
                e.code(),
                StatusCodeError::Unavailable | StatusCodeError::ResourceExhausted
            )
        {
            self.timeline.shed(Instant::now());
        }
        item
    }
}

/// A prost message as the `grpc` crate sends it.
struct Out<'a, M>(&'a M);

impl<M: prost::Message> SendMessage for Out<'_, M> {
    fn encode(&self) -> Result<Box<dyn Buf + Send + Sync>, String> {
        Ok(Box::new(Bytes::from(self.0.encode_to_vec())))
    }
}

/// A prost message as the `grpc` crate receives it.
struct In<M>(Option<M>);

impl<M: prost::Message + Default> RecvMessage for In<M> {
    fn decode(&mut self, data: &mut dyn Buf) -> Result<(), String> {
        self.0 = Some(M::decode(data).map_err(|e| e.to_string())?);
        Ok(())
    }
}

/// One `Reserve` call on `invoker` with `deadline` for all its attempts, its answer as a
/// tonic client's.
async fn reserve<I: Invoke>(invoker: &I, deadline: Duration) -> Result<ReserveReply, Status> {
    let mut options = CallOptions::new();
    options.set_deadline((Instant::now() + deadline).into_std());
    let headers =
        RequestHeaders::new().with_method_name(format!("/{INVENTORY_SERVICE}/{RESERVE_METHOD}"));
    let (mut send, mut recv) = invoker.invoke(headers, options).await;
    // A send that fails means the call already ended: its trailers say how.
    let final_msg = SendOptions::new().with_final_msg(true);
    let _ = send.send(&Out(&ReserveRequest::default()), final_msg).await;
    let mut reply = None;
    loop {
        let mut msg = In::<ReserveReply>(None);
        match recv.recv(&mut msg).await {
            ResponseStreamItem::Headers(_) => {}
            ResponseStreamItem::Message => reply = msg.0.or(reply),
            ResponseStreamItem::Trailers(trailers) => {
                return match trailers.status() {
                    Ok(()) => reply.ok_or_else(|| Status::internal("an OK without a reply")),
                    Err(e) => Err(Status::new(
                        tonic::Code::from_i32(e.code() as i32),
                        e.message(),
                    )),
                };
            }
            ResponseStreamItem::StreamClosed => {
                return Err(Status::internal("the stream closed before its trailers"));
            }
        }
    }
}

/// A caller on a `grpc` channel to `addr` under a `RetryInterceptor` for `config` seeded
/// with `seed`, each call given `deadline`; its attempts counted in `timeline`. Returns the
/// interceptor's counters too.
pub(crate) fn grpc_caller(
    addr: SocketAddr,
    config: &ClientConfig,
    seed: u64,
    timeline: Arc<Timeline>,
    deadline: Duration,
) -> Result<(Caller, InterceptorStats), ConfigError> {
    let channel = Channel::new(
        format!("dns:///{addr}"),
        Arc::new(LocalChannelCredentials::new()),
        ChannelOptions::default(),
    );
    let interceptor = RetryInterceptor::from_config(&config.clone().with_seed(seed))?;
    let stats = interceptor.stats();
    let invoker = Arc::new(
        Observed {
            inner: channel,
            timeline,
        }
        .with_interceptor(interceptor),
    );
    let caller = BoxCloneSyncService::new(tower::service_fn(move |()| {
        let invoker = Arc::clone(&invoker);
        async move { reserve(&*invoker, deadline).await }
    }));
    Ok((caller, stats))
}
