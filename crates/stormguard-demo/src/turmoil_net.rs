//! Real tonic clients and servers over turmoil's simulated network.
//!
//! turmoil runs every host of a distributed test in one thread on virtual time, over a
//! network that can partition, hold and release messages, add latency, and crash or restart
//! a host, all from a seed. The fault tests and the fleet runs use it to put the *real*
//! layers (`RetryLayer`, `Replicas`, `ShedLayer`) on such a network: only the socket is
//! simulated; tonic, hyper, h2 and both layers run unchanged.
//!
//! Two functions do the plumbing: [`incoming`] turns a turmoil listener into what
//! `Server::serve_with_incoming` takes, and [`endpoint`] / [`connect`] / [`connect_lazy`]
//! give a tonic `Channel` whose connector dials through turmoil.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;
use tonic::transport::{Channel, Endpoint};

/// A turmoil TCP stream a tonic server can serve.
#[derive(Debug)]
pub struct SimConn(pub turmoil::net::TcpStream);

/// What a handler sees of the peer (`Request::extensions().get::<SimConnInfo>()`).
#[derive(Debug, Clone, Copy)]
pub struct SimConnInfo {
    /// The peer's simulated address, when turmoil knows it.
    pub peer: Option<std::net::SocketAddr>,
}

impl Connected for SimConn {
    type ConnectInfo = SimConnInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        SimConnInfo {
            peer: self.0.peer_addr().ok(),
        }
    }
}

impl AsyncRead for SimConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for SimConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Binds `port` on the current turmoil host and yields its connections, for
/// `Server::builder()...serve_with_incoming(incoming(port).await?)`.
///
/// Bind first, then start the clients: a host's clients may connect as soon as this returns.
pub async fn incoming(
    port: u16,
) -> io::Result<impl futures_core::Stream<Item = io::Result<SimConn>> + Send + 'static> {
    let listener = turmoil::net::TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, port)).await?;
    Ok(futures_util::stream::unfold(
        listener,
        |listener| async move {
            let next = listener.accept().await.map(|(stream, _)| SimConn(stream));
            Some((next, listener))
        },
    ))
}

/// An endpoint for `http://{host}:{port}` on the simulated network. Set its timeouts as a
/// user would, then [`connect_with`] or [`connect_lazy_with`] it.
pub fn endpoint(host: &str, port: u16) -> Result<Endpoint, tonic::transport::Error> {
    Endpoint::from_shared(format!("http://{host}:{port}"))
}

/// Connects `endpoint` through turmoil now.
pub async fn connect_with(endpoint: Endpoint) -> Result<Channel, tonic::transport::Error> {
    endpoint.connect_with_connector(Dialer::default()).await
}

/// A channel that connects through turmoil on its first call, and again after the
/// connection breaks (as `Endpoint::connect_lazy` does over TCP).
pub fn connect_lazy_with(endpoint: Endpoint) -> Channel {
    endpoint.connect_with_connector_lazy(Dialer::default())
}

/// The instants of a channel's connection attempts ([`connect_lazy_counting`]).
pub type Dials = Arc<Mutex<Vec<tokio::time::Instant>>>;

/// [`connect_lazy_with`], recording the instant of every connection attempt in `dials`.
pub fn connect_lazy_counting(endpoint: Endpoint, dials: Dials) -> Channel {
    endpoint.connect_with_connector_lazy(Dialer { dials: Some(dials) })
}

/// [`connect_with`] on `http://{host}:{port}` with tonic's defaults.
pub async fn connect(host: &str, port: u16) -> Result<Channel, tonic::transport::Error> {
    connect_with(endpoint(host, port)?).await
}

/// [`connect_lazy_with`] on `http://{host}:{port}` with tonic's defaults.
pub fn connect_lazy(host: &str, port: u16) -> Result<Channel, tonic::transport::Error> {
    Ok(connect_lazy_with(endpoint(host, port)?))
}

/// tonic's connector: dials the URI's host (a turmoil host name) and port, recording
/// each attempt in `dials` when given.
#[derive(Debug, Clone, Default)]
struct Dialer {
    dials: Option<Dials>,
}

impl tower_service::Service<Uri> for Dialer {
    type Response = TokioIo<turmoil::net::TcpStream>;
    type Error = io::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = io::Result<Self::Response>> + Send + 'static>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        if let Some(dials) = &self.dials {
            dials
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(tokio::time::Instant::now());
        }
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no host in the URI"))?
                .to_owned();
            let port = uri.port_u16().unwrap_or(80);
            let stream = turmoil::net::TcpStream::connect((host.as_str(), port)).await?;
            Ok(TokioIo::new(stream))
        })
    }
}
