//! Parity: the same scripted answers, on paused time, drive stormguard's tonic
//! `RetryLayer` and the `grpc` interceptor, each over its own engine built from one config
//! and one seed. Every decision the engine makes shows in what follows it: when each
//! attempt goes out (the backoff's and the pushback's delays), what it carries
//! (`grpc-previous-rpc-attempts`, `grpc-timeout`), how the call ends (its code, a "do not
//! retry" mark) and the budget's balance after it. The two traces must be equal, call by
//! call: the interceptor adds no decision of its own and drops none.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use grpc::client::interceptor::InvokeExt;
use grpc::client::{CallOptions, Invoke, RecvStream, ResponseStreamItem, SendOptions, SendStream};
use grpc::core::{RecvMessage, RequestHeaders, SendMessage, Trailers};
use grpc::metadata::{AsciiMetadataValue, BinaryMetadataValue};
use stormguard_client::RetryLayer;
use stormguard_core::wire;
use stormguard_core::{BreakerConfig, BudgetChoice, BudgetConfig, Code, RetryController};
use stormguard_grpc::{ClientConfig, MethodScope, RetryInterceptor, RetryPolicy};
use tokio::time::Instant;
use tower::{Service, ServiceExt};

const RESERVE: &str = "/stormguard.demo.v1.Inventory/Reserve";
/// A method with the default policy: not idempotent (retried only when the server says it
/// did not run it).
const OTHER: &str = "/stormguard.demo.v1.Inventory/WatchStock";

/// One attempt's scripted answer.
#[derive(Clone, Debug)]
enum Answer {
    Ok,
    Fail {
        code: Code,
        pushback: Option<&'static str>,
        retry_info: Option<Duration>,
        unprocessed: bool,
    },
    Hang,
}

fn fail(code: Code) -> Answer {
    Answer::Fail {
        code,
        pushback: None,
        retry_info: None,
        unprocessed: false,
    }
}

const U: Code = Code::Unavailable;

fn pushback(ms: &'static str) -> Answer {
    Answer::Fail {
        code: U,
        pushback: Some(ms),
        retry_info: None,
        unprocessed: false,
    }
}

/// What one attempt carried and when it went out (from its call's start).
#[derive(Clone, Debug, PartialEq)]
struct Attempt {
    at: Duration,
    previous: u32,
    timeout: Option<Duration>,
}

/// What one call did.
#[derive(Clone, Debug, PartialEq)]
struct CallTrace {
    attempts: Vec<Attempt>,
    code: Code,
    pushback: Option<String>,
    balance_after: f64,
}

/// The calls of the run: a method and its attempts' answers each (past the script, `OK`).
fn script() -> Vec<(&'static str, Vec<Answer>)> {
    let mut calls = vec![
        (RESERVE, vec![fail(U), Answer::Ok]),
        (RESERVE, vec![pushback("200"), Answer::Ok]),
        (RESERVE, vec![pushback("-1")]),
        (
            RESERVE,
            vec![
                Answer::Fail {
                    code: U,
                    pushback: None,
                    retry_info: Some(Duration::from_millis(300)),
                    unprocessed: false,
                },
                Answer::Ok,
            ],
        ),
        (RESERVE, vec![fail(U), fail(U), fail(U)]),
        (RESERVE, vec![fail(Code::NotFound)]),
        (OTHER, vec![fail(U)]),
        (
            OTHER,
            vec![
                Answer::Fail {
                    code: U,
                    pushback: None,
                    retry_info: None,
                    unprocessed: true,
                },
                Answer::Ok,
            ],
        ),
        (RESERVE, vec![fail(U), Answer::Hang]),
        (RESERVE, vec![Answer::Hang]),
    ];
    // A dependency that fails everything: the budget runs dry, then the breaker opens.
    for _ in 0..30 {
        calls.push((RESERVE, vec![fail(U), fail(U), fail(U)]));
    }
    calls
}

fn config() -> ClientConfig {
    let mut config = ClientConfig::default();
    config.methods.set_retry(
        MethodScope::Method("stormguard.demo.v1.Inventory", "Reserve"),
        Some(RetryPolicy {
            idempotent: true,
            ..RetryPolicy::default()
        }),
    );
    config.budget = BudgetChoice::Stormguard(BudgetConfig {
        min_retries_per_second: 1,
        ..BudgetConfig::default()
    });
    config.breaker = Some(BreakerConfig::default());
    config.seed = Some(42);
    config
}

const TIMEOUT: Duration = Duration::from_secs(1);

/// The engine, built when a run starts (so that both runs' budgets start at the same
/// moment of their own run).
fn controller() -> RetryController {
    RetryController::from_config(&config()).unwrap()
}

/// When an attempt arrived, its `grpc-previous-rpc-attempts` and its `grpc-timeout`.
type Arrival = (Instant, u32, Option<Duration>);

/// The attempts recorded by a scripted peer, and its answers to come.
#[derive(Clone, Default)]
struct Peer {
    answers: Arc<Mutex<VecDeque<Answer>>>,
    attempts: Arc<Mutex<Vec<Arrival>>>,
}

impl Peer {
    fn record(&self, previous: Option<&[u8]>, timeout: Option<&[u8]>) -> Answer {
        let previous = previous
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
            .unwrap_or(0);
        let timeout = timeout.and_then(|v| wire::decode_grpc_timeout(v).ok());
        self.attempts
            .lock()
            .unwrap()
            .push((Instant::now(), previous, timeout));
        self.answers
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Answer::Ok)
    }

    fn begin(&self, answers: &[Answer]) -> Instant {
        *self.answers.lock().unwrap() = answers.iter().cloned().collect();
        self.attempts.lock().unwrap().clear();
        Instant::now()
    }

    fn attempts(&self, start: Instant) -> Vec<Attempt> {
        self.attempts
            .lock()
            .unwrap()
            .iter()
            .map(|(at, previous, timeout)| Attempt {
                at: *at - start,
                previous: *previous,
                timeout: *timeout,
            })
            .collect()
    }
}

// The tonic side: trailers-only HTTP answers under the RetryLayer.

fn http_answer(answer: &Answer) -> http::Response<tonic::body::Body> {
    let mut response = http::Response::builder()
        .status(200)
        .header("content-type", "application/grpc");
    match answer {
        Answer::Ok | Answer::Hang => response = response.header(wire::GRPC_STATUS, "0"),
        Answer::Fail {
            code,
            pushback,
            retry_info,
            unprocessed,
        } => {
            response = response.header(wire::GRPC_STATUS, code.as_i32().to_string());
            if let Some(p) = pushback {
                response = response.header(wire::GRPC_RETRY_PUSHBACK_MS, *p);
            }
            if let Some(delay) = retry_info {
                response = response.header(
                    wire::GRPC_STATUS_DETAILS_BIN,
                    wire::encode_retry_info(*code, "busy", *delay),
                );
            }
            if *unprocessed {
                response = response.header(wire::STORMGUARD_UNPROCESSED, "1");
            }
        }
    }
    response.body(tonic::body::Body::empty()).unwrap()
}

async fn tonic_run() -> Vec<CallTrace> {
    let peer = Peer::default();
    let inner = {
        let peer = peer.clone();
        tower::service_fn(move |request: http::Request<tonic::body::Body>| {
            let h = request.headers();
            let answer = peer.record(
                h.get(wire::GRPC_PREVIOUS_RPC_ATTEMPTS)
                    .map(|v| v.as_bytes()),
                h.get(wire::GRPC_TIMEOUT).map(|v| v.as_bytes()),
            );
            async move {
                if matches!(answer, Answer::Hang) {
                    std::future::pending::<()>().await;
                }
                Ok::<_, Infallible>(http_answer(&answer))
            }
        })
    };
    let controller = controller();
    let layer = RetryLayer::new(controller.clone()).with_default_timeout(TIMEOUT);
    let mut svc = tower::ServiceBuilder::new().layer(layer).service(inner);
    let mut traces = Vec::new();
    for (method, answers) in script() {
        let start = peer.begin(&answers);
        let request = http::Request::builder()
            .method("POST")
            .uri(format!("http://peer{method}"))
            .header("content-type", "application/grpc")
            .body(tonic::body::Body::new(http_body_util::Full::new(
                bytes::Bytes::from_static(b"\0\0\0\0\0"),
            )))
            .unwrap();
        let (code, pushback) = match svc.ready().await.unwrap().call(request).await {
            Ok(response) => {
                let h = response.headers();
                let code = h
                    .get(wire::GRPC_STATUS)
                    .map(|v| wire::parse_grpc_status(v.as_bytes()))
                    .unwrap();
                let p = h
                    .get(wire::GRPC_RETRY_PUSHBACK_MS)
                    .map(|v| v.to_str().unwrap().to_owned());
                (code, p)
            }
            Err(e) => {
                let status = e.downcast::<tonic::Status>().unwrap();
                let p = status
                    .metadata()
                    .get(wire::GRPC_RETRY_PUSHBACK_MS)
                    .map(|v| v.to_str().unwrap().to_owned());
                (stormguard_client::code_from_tonic(status.code()), p)
            }
        };
        traces.push(CallTrace {
            attempts: peer.attempts(start),
            code,
            pushback,
            balance_after: controller.budget().balance_at(Instant::now()),
        });
    }
    traces
}

// The grpc side: the same answers as the `grpc` crate's trailers, under the interceptor.

#[derive(Clone, Default)]
struct ScriptedInvoke {
    peer: Peer,
}

struct Sink;

impl SendStream for Sink {
    async fn send(&mut self, _msg: &dyn SendMessage, _options: SendOptions) -> Result<(), ()> {
        Ok(())
    }
}

struct Reply(Option<Answer>);

impl RecvStream for Reply {
    async fn recv(&mut self, _msg: &mut dyn RecvMessage) -> ResponseStreamItem {
        let Some(answer) = self.0.take() else {
            return ResponseStreamItem::StreamClosed;
        };
        let trailers = match answer {
            Answer::Hang => std::future::pending().await,
            Answer::Ok => Trailers::new(Ok(())),
            Answer::Fail {
                code,
                pushback,
                retry_info,
                unprocessed,
            } => {
                let status =
                    grpc::StatusError::new(grpc::StatusCodeError::from(code.as_i32()), "scripted");
                let mut t = Trailers::new(Err(status));
                let md = t.metadata_mut();
                if let Some(p) = pushback {
                    md.insert(
                        wire::GRPC_RETRY_PUSHBACK_MS,
                        AsciiMetadataValue::from_static(p),
                    );
                }
                if let Some(delay) = retry_info {
                    let encoded = wire::encode_retry_info(code, "busy", delay);
                    let raw = base64::engine::general_purpose::STANDARD_NO_PAD
                        .decode(encoded.trim_end_matches('='))
                        .unwrap();
                    md.insert_bin(
                        wire::GRPC_STATUS_DETAILS_BIN,
                        BinaryMetadataValue::from_bytes(&raw),
                    );
                }
                if unprocessed {
                    md.insert(
                        wire::STORMGUARD_UNPROCESSED,
                        AsciiMetadataValue::from_static("1"),
                    );
                }
                t
            }
        };
        ResponseStreamItem::Trailers(trailers)
    }
}

impl Invoke for ScriptedInvoke {
    type SendStream = Sink;
    type RecvStream = Reply;

    async fn invoke(&self, headers: RequestHeaders, _options: CallOptions) -> (Sink, Reply) {
        let md = headers.metadata();
        let answer = self.peer.record(
            md.get(wire::GRPC_PREVIOUS_RPC_ATTEMPTS)
                .map(|v| v.as_bytes()),
            md.get(wire::GRPC_TIMEOUT).map(|v| v.as_bytes()),
        );
        (Sink, Reply(Some(answer)))
    }
}

struct Empty;

impl SendMessage for Empty {
    fn encode(&self) -> Result<Box<dyn bytes::Buf + Send + Sync>, String> {
        Ok(Box::new(bytes::Bytes::new()))
    }
}

struct Ignore;

impl RecvMessage for Ignore {
    fn decode(&mut self, _data: &mut dyn bytes::Buf) -> Result<(), String> {
        Ok(())
    }
}

async fn grpc_run() -> Vec<CallTrace> {
    let invoker = ScriptedInvoke::default();
    let peer = invoker.peer.clone();
    let controller = controller();
    let interceptor = RetryInterceptor::new(controller.clone()).with_default_timeout(TIMEOUT);
    let chan = invoker.with_interceptor(interceptor);
    let mut traces = Vec::new();
    for (method, answers) in script() {
        let start = peer.begin(&answers);
        let headers = RequestHeaders::new().with_method_name(method);
        let (mut tx, mut rx) = chan.invoke(headers, CallOptions::new()).await;
        let _ = tx
            .send(&Empty, SendOptions::new().with_final_msg(true))
            .await;
        let trailers = loop {
            if let ResponseStreamItem::Trailers(t) = rx.recv(&mut Ignore).await {
                break t;
            }
        };
        let code = match trailers.status() {
            Ok(()) => Code::Ok,
            Err(e) => Code::from_i32(e.code() as i32).unwrap(),
        };
        let pushback = trailers
            .metadata()
            .get(wire::GRPC_RETRY_PUSHBACK_MS)
            .map(|v| v.to_str().to_owned());
        traces.push(CallTrace {
            attempts: peer.attempts(start),
            code,
            pushback,
            balance_after: controller.budget().balance_at(Instant::now()),
        });
    }
    traces
}

#[tokio::test(start_paused = true)]
async fn the_interceptor_decides_as_the_tonic_layer_does() {
    let tonic = tonic_run().await;
    let grpc = grpc_run().await;
    assert_eq!(tonic.len(), grpc.len());
    for (i, (t, g)) in tonic.iter().zip(&grpc).enumerate() {
        assert_eq!(t, g, "call {i} ({:?})", script()[i]);
    }
    // The run covers what it claims to: a retry after a jittered delay, a pushback waited
    // exactly, a RetryInfo, a deadline across attempts, the budget and the breaker refusing.
    let at = |i: usize, n: usize| tonic[i].attempts[n].at;
    assert!(at(0, 1) > Duration::ZERO && at(0, 1) <= Duration::from_millis(50));
    assert_eq!(at(1, 1), Duration::from_millis(200));
    assert_eq!(
        (tonic[2].attempts.len(), tonic[2].pushback.as_deref()),
        (1, Some("-1"))
    );
    assert_eq!(at(3, 1), Duration::from_millis(300));
    assert_eq!(tonic[4].pushback.as_deref(), Some("-1"), "attempts spent");
    assert_eq!(tonic[6].attempts.len(), 1, "not idempotent: not retried");
    assert_eq!(tonic[7].attempts.len(), 2, "unprocessed: retried");
    assert_eq!(tonic[8].code, Code::DeadlineExceeded);
    assert!(tonic[8].attempts[1].timeout < tonic[8].attempts[0].timeout);
    assert!(
        tonic
            .iter()
            .any(|c| c.attempts.len() == 1 && c.pushback.as_deref() == Some("-1") && c.code == U),
        "the budget refused a retry"
    );
    assert!(
        tonic.iter().any(|c| c.attempts.is_empty()),
        "the breaker refused a call"
    );
}
