//! Load reports from the server (gRPC ORCA): the message, its checks, and what a client
//! makes of it.
//!
//! See [`LoadReport`](crate::LoadReport) for what it does and why.

use std::collections::BTreeMap;

/// The named metric with the server's queue depth when it answered.
pub const QUEUE_DEPTH: &str = "queue_depth";
/// The named metric with how long the call waited for a worker, in milliseconds.
pub const TIME_QUEUED_MS: &str = "time_queued_ms";

/// The largest report read, in bytes of the decoded message; a larger one is ignored.
pub const MAX_REPORT_BYTES: usize = 1024;
/// The largest utilization taken at face value (ORCA allows values above 1 when a
/// server is past its soft limits; 100 times its capacity is no measurement).
pub const MAX_UTILIZATION: f64 = 100.0;
/// The largest rate (`rps_fractional`, `eps`) taken at face value, per second.
pub const MAX_RATE: f64 = 1e9;

/// The ORCA load report message, `xds.data.orca.v3.OrcaLoadReport`: the fields stormguard
/// uses, with the published proto's numbers and types (the deprecated integer `rps`,
/// field 3, is left out: a decoder skips it).
#[derive(Clone, PartialEq, prost::Message)]
pub struct OrcaLoadReport {
    /// CPU utilization, a fraction of the available CPU (may exceed 1).
    #[prost(double, tag = "1")]
    pub cpu_utilization: f64,
    /// Memory utilization, a fraction of the available memory (0 to 1).
    #[prost(double, tag = "2")]
    pub mem_utilization: f64,
    /// Application-specific costs of the request.
    #[prost(btree_map = "string, double", tag = "4")]
    pub request_cost: BTreeMap<String, f64>,
    /// Utilization of named resources, each a fraction (0 to 1).
    #[prost(btree_map = "string, double", tag = "5")]
    pub utilization: BTreeMap<String, f64>,
    /// Requests per second served by the endpoint.
    #[prost(double, tag = "6")]
    pub rps_fractional: f64,
    /// Errors per second served by the endpoint.
    #[prost(double, tag = "7")]
    pub eps: f64,
    /// Application-specific opaque metrics.
    #[prost(btree_map = "string, double", tag = "8")]
    pub named_metrics: BTreeMap<String, f64>,
    /// Application-specific utilization (may exceed 1); preferred over
    /// `cpu_utilization` by gRPC A58.
    #[prost(double, tag = "9")]
    pub application_utilization: f64,
}

/// Why a load report was ignored.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LoadReportError {
    /// The header appeared more than once.
    #[error("endpoint-load-metrics-bin is repeated")]
    Repeated,
    /// The value, or the message it decodes to, is larger than [`MAX_REPORT_BYTES`].
    #[error("load report larger than {MAX_REPORT_BYTES} bytes")]
    Oversize,
    /// The value is not base64.
    #[error("load report is not base64")]
    Base64,
    /// The bytes are not an `OrcaLoadReport`.
    #[error("load report does not decode: {0}")]
    Decode(String),
    /// A field holds NaN, an infinity, a negative value, or more than its bound.
    #[error("load report field `{0}` is out of range")]
    OutOfRange(&'static str),
}

/// A load report that passed every check: what a client acts on.
///
/// # Why
///
/// A server knows it is about to shed before its clients do: its workers are all busy and
/// calls wait in its queue. gRPC's ORCA (gRFC A51) lets it say so on every answer, an
/// `xds.data.orca.v3.OrcaLoadReport` in the `ENDPOINT_LOAD_METRICS_BIN` trailer. grpc-go,
/// Java and Envoy use those reports only to weight load balancing. stormguard uses them
/// for that too (the endpoint-aware channel weights replicas with gRPC A58's formula, see
/// [`ReplicaSet`](crate::ReplicaSet)) and, first of all, to **stop retries to a server that
/// says it is saturated before it starts shedding**: a retry sent there would only queue
/// behind the work that is already late, and a shed answer would come back at the cost of
/// one more call ([`Saturation`](crate::Saturation),
/// [`Refusal::Saturated`](crate::Refusal::Saturated)).
///
/// # Trust
///
/// A report comes from a peer. A malformed or absurd one (not base64, not the message,
/// larger than [`MAX_REPORT_BYTES`], a NaN, a negative value, a utilization above
/// [`MAX_UTILIZATION`]) is ignored and counted by the layer that read it, never an error of
/// the call. A valid report can only *lower* what a client sends to that server: it may
/// refuse a retry, or lower a replica's weight below its report-free weight, never raise
/// one, so a lying server cannot attract traffic with it.
///
/// # The fields
///
/// [`OrcaLoadReport`] mirrors the fields of the published proto
/// (`proto/xds/data/orca/v3/orca_load_report.proto`, vendored from cncf/xds) that
/// stormguard reads or writes, with the same numbers and types, so a report decodes with
/// the generated types of that proto and the other way round (the demo crate's test
/// checks it). A stormguard server (`ShedLayer::with_load_reports`) sends:
///
/// | field | value |
/// |---|---|
/// | `application_utilization` | calls running / the current worker limit |
/// | `rps_fractional` | calls that arrived per second, over the last second or so |
/// | `eps` | calls shed per second, over the same window |
/// | `named_metrics["queue_depth"]` ([`QUEUE_DEPTH`]) | calls waiting for a worker |
/// | `named_metrics["time_queued_ms"]` ([`TIME_QUEUED_MS`]) | how long this call waited, ms |
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadReport {
    /// `application_utilization` when set, else `cpu_utilization` (gRPC A58's order).
    pub utilization: f64,
    /// `rps_fractional`.
    pub rps: f64,
    /// `eps`.
    pub eps: f64,
    /// `named_metrics["queue_depth"]`, if sent.
    pub queue_depth: Option<f64>,
}

fn checked(field: &'static str, value: f64, max: f64) -> Result<f64, LoadReportError> {
    if value.is_finite() && (0.0..=max).contains(&value) {
        Ok(value)
    } else {
        Err(LoadReportError::OutOfRange(field))
    }
}

impl LoadReport {
    /// Decodes and checks the bytes of an `OrcaLoadReport` (after base64): at most
    /// [`MAX_REPORT_BYTES`], the message, then [`from_message`](Self::from_message).
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, LoadReportError> {
        use prost::Message as _;
        if bytes.len() > MAX_REPORT_BYTES {
            return Err(LoadReportError::Oversize);
        }
        let message =
            OrcaLoadReport::decode(bytes).map_err(|e| LoadReportError::Decode(e.to_string()))?;
        Self::from_message(&message)
    }

    /// Checks `message`: every number finite and non-negative, utilizations at most
    /// [`MAX_UTILIZATION`] (`mem_utilization` and the `utilization` map at most 1, as the
    /// proto says), rates at most [`MAX_RATE`], named metrics and request costs finite.
    pub(crate) fn from_message(message: &OrcaLoadReport) -> Result<Self, LoadReportError> {
        let cpu = checked("cpu_utilization", message.cpu_utilization, MAX_UTILIZATION)?;
        checked("mem_utilization", message.mem_utilization, 1.0)?;
        let app = checked(
            "application_utilization",
            message.application_utilization,
            MAX_UTILIZATION,
        )?;
        let rps = checked("rps_fractional", message.rps_fractional, MAX_RATE)?;
        let eps = checked("eps", message.eps, MAX_RATE)?;
        for v in message.utilization.values() {
            checked("utilization", *v, 1.0)?;
        }
        for v in message.request_cost.values() {
            if !v.is_finite() {
                return Err(LoadReportError::OutOfRange("request_cost"));
            }
        }
        for v in message.named_metrics.values() {
            if !v.is_finite() {
                return Err(LoadReportError::OutOfRange("named_metrics"));
            }
        }
        let queue_depth = match message.named_metrics.get(QUEUE_DEPTH) {
            Some(&q) => Some(checked("named_metrics.queue_depth", q, MAX_RATE)?),
            None => None,
        };
        Ok(LoadReport {
            utilization: if app > 0.0 { app } else { cpu },
            rps,
            eps,
            queue_depth,
        })
    }
}

#[cfg(test)]
mod tests;
