//! A raw HTTP/2 peer (the `h2` crate, below tonic) sends header values no gRPC library would:
//! huge, repeated, non-ASCII, empty, absurd numbers, on every header stormguard reads. The
//! server (the demo Inventory behind a `ShedLayer`, as the example server runs it) must
//! answer each of them or refuse the stream, never go down, never leave work behind, and
//! keep answering well-formed calls from another connection in between and all along.
#![allow(clippy::unwrap_used)]

use crate::server_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request};
use server_support::*;
use stormguard_demo::InventoryClient;
use stormguard_demo::server::DemoConfig;
use stormguard_server::AdmissionConfig;
use stormguard_server::WorkerLimit;
use tokio::net::TcpStream;

const RESERVE: &str = "/stormguard.demo.v1.Inventory/Reserve";
/// Every wait in this test has this bound; none is expected to come near it.
const BOUND: Duration = Duration::from_secs(20);

/// Headers stormguard (and tonic below it) reads from a request.
const HEADERS: &[&str] = &[
    "grpc-timeout",
    "grpc-previous-rpc-attempts",
    "x-retry-attempt",
    "grpc-retry-pushback-ms",
    "x-retry-budget",
    "stormguard-criticality",
];

/// Hostile values for one header, each a list of values sent together (repeats).
fn hostile_values() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    let digits = |n: usize| vec![b'9'; n];
    vec![
        ("empty", vec![b"".to_vec()]),
        ("non-ASCII (Latin-1)", vec![vec![0xff, 0xfe, 0x80, b'1']]),
        ("non-ASCII (UTF-8)", vec!["é١٢".as_bytes().to_vec()]),
        ("2^64", vec![b"18446744073709551616".to_vec()]),
        ("2^31", vec![b"2147483648".to_vec()]),
        ("99999999H", vec![b"99999999H".to_vec()]),
        ("999999999H", vec![b"999999999H".to_vec()]),
        ("negative", vec![b"-1".to_vec()]),
        ("padded", vec![b" 1\t".to_vec()]),
        ("4 KiB of digits", vec![digits(4 << 10)]),
        ("12 KiB of digits", vec![digits(12 << 10)]),
        ("repeated 200 times", vec![b"1".to_vec(); 200]),
        (
            "repeated, disagreeing",
            vec![b"0".to_vec(), b"5".to_vec(), b"5m".to_vec()],
        ),
        // Above the server's 16 KiB header list limit: refused, one way or another.
        ("64 KiB of digits", vec![digits(64 << 10)]),
    ]
}

/// What became of one raw request.
#[derive(Debug)]
enum Answer {
    /// An HTTP response, with the gRPC status from its headers or trailers.
    Http {
        status: u16,
        grpc_status: Option<String>,
    },
    /// The stream or the connection was refused or reset.
    Refused(String),
}

/// A raw HTTP/2 connection to the server.
async fn connect(addr: std::net::SocketAddr) -> h2::client::SendRequest<Bytes> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        // Ends when the server closes the connection; that is an outcome, not a failure.
        let _ = connection.await;
    });
    send
}

/// Sends `Reserve` (an empty message) with `name` set to each of `values`.
async fn send_raw(
    send: &mut h2::client::SendRequest<Bytes>,
    name: &str,
    values: &[Vec<u8>],
) -> Answer {
    let mut request = Request::post(format!("http://stormguard.test{RESERVE}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
    for value in values {
        request
            .headers_mut()
            .append(name.clone(), HeaderValue::from_bytes(value).unwrap());
    }
    let ready = match send.clone().ready().await {
        Ok(ready) => ready,
        Err(e) => return Answer::Refused(format!("connection: {e}")),
    };
    *send = ready;
    let (response, mut body) = match send.send_request(request, false) {
        Ok(pair) => pair,
        Err(e) => return Answer::Refused(format!("send: {e}")),
    };
    // One gRPC frame: uncompressed, length 0 (the empty ReserveRequest).
    if let Err(e) = body.send_data(Bytes::from_static(&[0, 0, 0, 0, 0]), true) {
        return Answer::Refused(format!("body: {e}"));
    }
    let response = match response.await {
        Ok(response) => response,
        Err(e) => return Answer::Refused(format!("response: {e}")),
    };
    let status = response.status().as_u16();
    let mut grpc_status = response
        .headers()
        .get("grpc-status")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        match chunk {
            Ok(chunk) => {
                let _ = body.flow_control().release_capacity(chunk.len());
            }
            Err(e) => return Answer::Refused(format!("body: {e}")),
        }
    }
    if grpc_status.is_none() {
        match body.trailers().await {
            Ok(trailers) => {
                grpc_status = trailers.and_then(|t| {
                    t.get("grpc-status")
                        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                })
            }
            Err(e) => return Answer::Refused(format!("trailers: {e}")),
        }
    }
    Answer::Http {
        status,
        grpc_status,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_header_values_leave_the_server_answering() {
    let admission = AdmissionConfig {
        workers: WorkerLimit::Fixed(2),
        queue_capacity: 64,
        ..AdmissionConfig::default()
    };
    let demo = DemoConfig {
        service_time: Duration::from_millis(1),
        ..DemoConfig::default()
    };
    let server = start(admission, demo, false).await;
    let client = InventoryClient::new(channel(server.addr).await);

    // Well-formed calls on their own connection, all along.
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let steady = {
        let (mut client, stop, served) = (client.clone(), stop.clone(), served.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let reply = client.reserve(reserve("steady", None)).await;
                reply.expect("a well-formed call is answered while a peer misbehaves");
                served.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    let mut raw = connect(server.addr).await;
    let mut refused = Vec::new();
    let mut answered = 0;
    for header in HEADERS {
        for (what, values) in hostile_values() {
            let answer = tokio::time::timeout(BOUND, send_raw(&mut raw, header, &values))
                .await
                .unwrap_or_else(|_| panic!("{header} {what}: no answer within {BOUND:?}"));
            let size: usize = values.iter().map(Vec::len).sum();
            match &answer {
                Answer::Http {
                    status: 200,
                    grpc_status: Some(_),
                } => answered += 1,
                // Only a header list above the server's limit may be turned away.
                Answer::Http { status, .. } if size > 16 << 10 => {
                    refused.push(format!("{header} {what}: HTTP {status}"));
                    raw = connect(server.addr).await;
                }
                Answer::Refused(reason) if size > 16 << 10 => {
                    refused.push(format!("{header} {what}: {reason}"));
                    raw = connect(server.addr).await;
                }
                other => panic!("{header} {what}: {other:?}"),
            }
            // In between, a well-formed call from another connection is answered at once.
            let mut c = client.clone();
            let reply = tokio::time::timeout(BOUND, c.reserve(reserve("between", None)))
                .await
                .expect("bounded");
            assert!(reply.is_ok(), "{header} {what}: then {reply:?}");
        }
    }
    // The same values again, all at once on one connection.
    let mut burst = tokio::task::JoinSet::new();
    let shared = connect(server.addr).await;
    for header in HEADERS {
        for (_, values) in hostile_values() {
            let mut send = shared.clone();
            burst.spawn(async move {
                tokio::time::timeout(BOUND, send_raw(&mut send, header, &values)).await
            });
        }
    }
    while let Some(done) = burst.join_next().await {
        done.unwrap()
            .expect("every hostile stream ends within the bound");
    }

    stop.store(true, Ordering::Relaxed);
    tokio::time::timeout(BOUND, steady)
        .await
        .expect("bounded")
        .unwrap();
    assert!(!server.task.is_finished(), "the server stopped");
    assert!(served.load(Ordering::Relaxed) > 0);
    // Every header but the oversized ones was answered as a gRPC call.
    let sent = HEADERS.len() * hostile_values().len();
    assert_eq!(answered + refused.len(), sent, "{refused:#?}");
    assert!(refused.len() <= HEADERS.len(), "{refused:#?}");
    println!(
        "{answered} hostile requests answered, {} turned away: {refused:#?}; {} well-formed \
         calls served meanwhile",
        refused.len(),
        served.load(Ordering::Relaxed)
    );
    // Nothing left behind: no queued call, no busy worker.
    eventually("the queue and the workers are idle", || {
        let s = server.stats.snapshot();
        s.queue_depth == 0 && s.in_flight == 0
    })
    .await;
}
