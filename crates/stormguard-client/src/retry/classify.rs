//! How an attempt ended, read from what the inner service returned.
//!
//! gRPC A6 draws the line: a call is *committed* once response headers without a status
//! arrive. Before that, an attempt ends in a trailers-only answer (`OK` or a failure), a
//! proxy's HTTP error, or a transport error; the wire facts are read by
//! [`status`](crate::status), and sorted here into what the retry decision needs.

use stormguard_core::Code;
use stormguard_core::{AttemptEnd, Failure};
use tonic::Status;

use stormguard_core::wire::http::grpc_status;

use crate::status::{
    BoxError, classify_error, code_from_http_status, pushback, status_from_error, unprocessed,
};

/// What an attempt ended in.
pub(super) enum Outcome<B> {
    /// A trailers-only `OK`.
    Ok(http::Response<B>),
    /// Response headers without a status: the call is committed, its outcome comes with the
    /// trailers.
    Committed(http::Response<B>),
    /// A failure before commit: the retry state decides (`end`); `last` is what the caller
    /// gets if nothing follows; `connect` says the connection could not be made.
    Failed {
        end: AttemptEnd,
        last: Last<B>,
        connect: bool,
    },
}

/// What the caller gets from a failed attempt if it is not retried: the response as it
/// came, or the error as a status.
pub(super) enum Last<B> {
    Response(http::Response<B>),
    Error(Status),
}

impl<B> Last<B> {
    /// The code the caller will see.
    pub(super) fn code(&self) -> Code {
        match self {
            Last::Response(r) => {
                grpc_status(r.headers()).unwrap_or_else(|| code_from_http_status(r.status()))
            }
            Last::Error(status) => crate::status::code_from_tonic(status.code()),
        }
    }
}

/// Sorts an attempt's result into "pass it to the caller" and "a failure before commit"
/// (`status`: the answer's `grpc-status`, as [`load::read`](super::load::read) found it;
/// `replayable`: whether the request can be sent again).
pub(super) fn classify<B, E: Into<BoxError>>(
    result: Result<http::Response<B>, E>,
    status: Option<Code>,
    replayable: bool,
) -> Outcome<B> {
    let answered = |code, response: http::Response<B>| Outcome::Failed {
        end: AttemptEnd::Failed(Failure {
            code,
            pushback: pushback(response.headers()),
            replayable,
            unsent: false,
            unprocessed: unprocessed(response.headers()),
        }),
        last: Last::Response(response),
        connect: false,
    };
    match result {
        Ok(response) => match status {
            // Not a gRPC answer: a proxy or load balancer in front of the server said
            // 502/503/504 (or worse) before any gRPC response began. Nothing was committed;
            // classify it as tonic will report it to the caller.
            None if response.status() != http::StatusCode::OK => {
                answered(code_from_http_status(response.status()), response)
            }
            None => Outcome::Committed(response),
            Some(Code::Ok) => Outcome::Ok(response),
            Some(code) => answered(code, response),
        },
        Err(err) => {
            let err = crate::replicas::unwrap_error(err.into());
            let transport = classify_error(&*err);
            if transport.timed_out {
                // A timer below the layer (the channel's `grpc-timeout`, `Endpoint::timeout`,
                // a `tower::timeout`) ended the attempt.
                return Outcome::Failed {
                    end: AttemptEnd::TimedOut {
                        replayable,
                        unsent: transport.unsent,
                    },
                    last: Last::Error(Status::deadline_exceeded(err.to_string())),
                    connect: false,
                };
            }
            Outcome::Failed {
                end: AttemptEnd::Failed(Failure {
                    code: transport.code,
                    pushback: None,
                    replayable,
                    unsent: transport.unsent,
                    unprocessed: false,
                }),
                last: Last::Error(status_from_error(err, transport.code)),
                connect: transport.connect,
            }
        }
    }
}
