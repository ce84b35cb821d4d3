//! `--otel-stdout` and `--metrics-addr`: an example's metrics, exported to stdout by
//! OpenTelemetry's stdout exporter every `interval` and once more when the example ends,
//! and served to Prometheus by OpenTelemetry's Prometheus exporter at
//! `http://ADDR/metrics` (names as its mapping writes them: dots to underscores, the unit
//! and `_total` as suffixes). Needs the `otel-examples` feature (`cargo run --features
//! otel-examples --example ...`); without it either flag is refused with a message saying
//! so.
//!
//! The scrape is served by a small HTTP/1.1 responder on the example's runtime (one
//! request per connection, `Connection: close`): a scrape reads the layers' counters when
//! it comes, so a call does no work for it.

use std::net::SocketAddr;
use std::time::Duration;

/// Where an example's metrics go: `stdout` every that often, a Prometheus endpoint on
/// `metrics_addr`, or both.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Sinks {
    pub(crate) stdout: Option<Duration>,
    pub(crate) metrics_addr: Option<SocketAddr>,
}

/// An example's metrics, exported.
pub(crate) struct Export {
    #[cfg(feature = "otel-examples")]
    provider: opentelemetry_sdk::metrics::SdkMeterProvider,
    #[cfg(feature = "otel-examples")]
    scrape: Option<tokio::task::JoinHandle<()>>,
}

impl Export {
    /// A meter provider of its own (nothing global) exporting to `sinks`; `None` when there
    /// is nowhere to export. With `metrics_addr`, writes `metrics on http://ADDR/metrics`
    /// (the real port when given `:0`) to stderr once the endpoint is listening.
    #[cfg(feature = "otel-examples")]
    pub(crate) async fn start(sinks: Sinks) -> Result<Option<Self>, String> {
        use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
        if sinks.stdout.is_none() && sinks.metrics_addr.is_none() {
            return Ok(None);
        }
        let mut provider = SdkMeterProvider::builder();
        if let Some(interval) = sinks.stdout {
            let reader = PeriodicReader::builder(opentelemetry_stdout::MetricExporter::default())
                .with_interval(interval)
                .build();
            provider = provider.with_reader(reader);
        }
        let mut scrape = None;
        if let Some(addr) = sinks.metrics_addr {
            let registry = prometheus::Registry::new();
            let exporter = opentelemetry_prometheus::exporter()
                .with_registry(registry.clone())
                .build()
                .map_err(|e| format!("--metrics-addr: the Prometheus exporter: {e}"))?;
            provider = provider.with_reader(exporter);
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("--metrics-addr: cannot listen on {addr}: {e}"))?;
            let bound = listener
                .local_addr()
                .map_err(|e| format!("--metrics-addr: {e}"))?;
            eprintln!("metrics on http://{bound}/metrics");
            scrape = Some(tokio::spawn(scrape::serve(listener, registry)));
        }
        Ok(Some(Export {
            provider: provider.build(),
            scrape,
        }))
    }

    /// Without the feature there is nothing to export with.
    #[cfg(not(feature = "otel-examples"))]
    pub(crate) async fn start(sinks: Sinks) -> Result<Option<Self>, String> {
        if sinks.stdout.is_none() && sinks.metrics_addr.is_none() {
            return Ok(None);
        }
        Err(
            "--otel-stdout and --metrics-addr need the otel-examples feature: \
             cargo run --features otel-examples --example ..."
                .to_owned(),
        )
    }

    /// The meter the example's layers record into.
    #[cfg(feature = "otel-examples")]
    pub(crate) fn meter(&self) -> opentelemetry::metrics::Meter {
        use opentelemetry::metrics::MeterProvider as _;
        self.provider.meter("stormguard-example")
    }

    /// Exports what is left to stdout, stops serving scrapes, and stops.
    pub(crate) fn finish(self) {
        #[cfg(feature = "otel-examples")]
        {
            if let Some(scrape) = self.scrape {
                scrape.abort();
            }
            if let Err(e) = self.provider.force_flush() {
                eprintln!("otel: flush: {e}");
            }
            if let Err(e) = self.provider.shutdown() {
                eprintln!("otel: shutdown: {e}");
            }
        }
    }
}

/// The scrape endpoint: `GET /metrics` answers the registry in Prometheus's text format.
#[cfg(feature = "otel-examples")]
mod scrape {
    use prometheus::Encoder as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::{TcpListener, TcpStream};

    /// The most of a request read: a scrape's request line and headers fit many times.
    const MAX_REQUEST: usize = 8 * 1024;

    /// Accepts connections until aborted, each answered on a task of its own.
    pub(super) async fn serve(listener: TcpListener, registry: prometheus::Registry) {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    tokio::spawn(answer(stream, registry.clone()));
                }
                Err(e) => eprintln!("metrics: accept: {e}"),
            }
        }
    }

    /// Reads one request's head and answers it; the connection closes after the answer.
    async fn answer(mut stream: TcpStream, registry: prometheus::Registry) {
        let mut head = Vec::with_capacity(1024);
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) if head.len() + n > MAX_REQUEST => {
                    let _ = respond(&mut stream, "431 Request Header Fields Too Large", &[]).await;
                    return;
                }
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
        let mut parts = line.split(|&b| b == b' ');
        let (method, target) = (parts.next(), parts.next());
        let path = target.map(|t| t.split(|&b| b == b'?').next().unwrap_or_default());
        let answered = match (method, path) {
            (Some(b"GET"), Some(b"/metrics")) => {
                let mut body = Vec::new();
                match prometheus::TextEncoder::new().encode(&registry.gather(), &mut body) {
                    Ok(()) => respond(&mut stream, "200 OK", &body).await,
                    Err(e) => {
                        let message = format!("encoding the metrics: {e}\n");
                        respond(&mut stream, "500 Internal Server Error", message.as_bytes()).await
                    }
                }
            }
            (Some(b"GET"), _) => respond(&mut stream, "404 Not Found", b"try /metrics\n").await,
            _ => respond(&mut stream, "405 Method Not Allowed", &[]).await,
        };
        if let Err(e) = answered {
            eprintln!("metrics: answering a scrape: {e}");
        }
    }

    async fn respond(stream: &mut TcpStream, status: &str, body: &[u8]) -> std::io::Result<()> {
        let head = format!(
            "HTTP/1.1 {status}\r\ncontent-type: {}\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n",
            prometheus::TEXT_FORMAT,
            body.len()
        );
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body).await?;
        stream.shutdown().await
    }
}
