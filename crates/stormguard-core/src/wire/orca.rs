//! Load reports from the server (gRPC ORCA): the message, its checks, and what a client
//! makes of it.
//!
//! # Why
//!
//! A server knows it is about to shed before its clients do: its workers are all busy and
//! calls wait in its queue. gRPC's ORCA (gRFC A51) lets it say so on every answer, an
//! `xds.data.orca.v3.OrcaLoadReport` in the [`ENDPOINT_LOAD_METRICS_BIN`] trailer. grpc-go,
//! Java and Envoy use those reports only to weight load balancing. stormguard uses them
//! for that too (the endpoint-aware channel weights replicas with gRPC A58's formula, see
//! [`crate::replica`]) and, first of all, to **stop retries to a server that says it is
//! saturated before it starts shedding**: a retry sent there would only queue behind the
//! work that is already late, and a shed answer would come back at the cost of one more
//! call ([`Saturation`], [`Refusal::Saturated`](crate::retry::Refusal::Saturated)).
//!
//! # Trust
//!
//! A report comes from a peer. A malformed or absurd one (not base64, not the message,
//! larger than [`MAX_REPORT_BYTES`], a NaN, a negative value, a utilization above
//! [`MAX_UTILIZATION`]) is ignored and counted by the layer that read it, never an error of
//! the call. A valid report can only *lower* what a client sends to that server: it may
//! refuse a retry, or lower a replica's weight below its report-free weight, never raise
//! one, so a lying server cannot attract traffic with it.
//!
//! # The fields
//!
//! [`OrcaLoadReport`] mirrors the fields of the published proto
//! (`proto/xds/data/orca/v3/orca_load_report.proto`, vendored from cncf/xds) that
//! stormguard reads or writes, with the same numbers and types, so a report decodes with
//! the generated types of that proto and the other way round (the demo crate's test
//! checks it). A stormguard server (`ShedLayer::with_load_reports`) sends:
//!
//! | field | value |
//! |---|---|
//! | `application_utilization` | calls running / the current worker limit |
//! | `rps_fractional` | calls that arrived per second, over the last second or so |
//! | `eps` | calls shed per second, over the same window |
//! | `named_metrics["queue_depth"]` ([`QUEUE_DEPTH`]) | calls waiting for a worker |
//! | `named_metrics["time_queued_ms"]` ([`TIME_QUEUED_MS`]) | how long this call waited, ms |

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::time::Duration;

use crate::Instant;
use crate::error::ConfigError;

/// The trailer (or trailers-only header) that carries a load report:
/// `endpoint-load-metrics-bin`, binary metadata (base64 on the wire).
pub use crate::wire::ENDPOINT_LOAD_METRICS_BIN;

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
    pub fn decode(bytes: &[u8]) -> Result<Self, LoadReportError> {
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
    pub fn from_message(message: &OrcaLoadReport) -> Result<Self, LoadReportError> {
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

/// When a client reads a server as saturated, and for how long it remembers (config key
/// `retry.load_reports`, see `docs/config.md`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SaturationConfig {
    /// A report says "saturated" when its utilization is at least this. Above 0, at most
    /// [`MAX_UTILIZATION`]. Default 0.95.
    pub utilization: f64,
    /// ... and its queue depth is at least this (0: utilization alone decides; a report
    /// without a queue depth then counts by utilization alone too). Default 1.
    pub queue_depth: f64,
    /// Reports fade over this time: each one's weight halves every `window`, and a server
    /// that sent nothing for 4 windows is no longer read as saturated. Above zero.
    /// Default 1 s.
    pub window: Duration,
}

impl Default for SaturationConfig {
    /// Utilization 0.95 with at least 1 call queued, a 1 s window.
    fn default() -> Self {
        SaturationConfig {
            utilization: 0.95,
            queue_depth: 1.0,
            window: Duration::from_secs(1),
        }
    }
}

impl SaturationConfig {
    /// Checks the bounds of every field; the error names it (`retry.load_reports.<field>`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(self.utilization > 0.0 && self.utilization <= MAX_UTILIZATION) {
            return Err(ConfigError::invalid(
                "retry.load_reports.utilization",
                format!("must be above 0 and at most {MAX_UTILIZATION}"),
            ));
        }
        if !(self.queue_depth.is_finite() && self.queue_depth >= 0.0) {
            return Err(ConfigError::invalid(
                "retry.load_reports.queue_depth",
                "must be a finite number, at least 0",
            ));
        }
        if self.window.is_zero() {
            return Err(ConfigError::invalid(
                "retry.load_reports.window",
                "must be above zero",
            ));
        }
        Ok(())
    }

    /// Whether `report` alone says "saturated".
    pub fn is_saturated(&self, report: &LoadReport) -> bool {
        report.utilization >= self.utilization
            && (self.queue_depth == 0.0 || report.queue_depth.unwrap_or(0.0) >= self.queue_depth)
    }
}

/// At most this many endpoints are remembered; the one heard from longest ago makes room.
pub const MAX_ENDPOINTS: usize = 1024;

#[derive(Clone, Copy, Debug)]
struct Heard {
    /// Decayed weight of the saturated reports, and of all reports, at `at`.
    saturated: f64,
    all: f64,
    at: Instant,
}

/// What a client's recent load reports say about each endpoint it calls: saturated or
/// not, decayed over [`SaturationConfig::window`]. An endpoint is a key the client
/// chooses (the replica over an endpoint-aware channel, one key for a plain channel).
///
/// An endpoint is *saturated* at `now` when it was heard from within 4 windows and at
/// least half the decayed weight of its reports said "saturated". A retry is refused
/// ([`Refusal::Saturated`](crate::retry::Refusal::Saturated)) when every endpoint heard
/// from is saturated: over several replicas, a retry can still go to one that is not.
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::Instant;
/// use stormguard_core::orca::{LoadReport, Saturation, SaturationConfig};
///
/// let sat = Saturation::new(SaturationConfig::default()).unwrap();
/// let busy = LoadReport { utilization: 1.0, rps: 50.0, eps: 0.0, queue_depth: Some(4.0) };
/// let idle = LoadReport { utilization: 0.2, rps: 50.0, eps: 0.0, queue_depth: Some(0.0) };
/// let now = Instant::now();
/// sat.record_at(1, &busy, now);
/// assert!(sat.refuses_retry_at(now));
/// assert!(!sat.refuses_retry_among_at(2, now), "a second replica, not heard from yet");
/// sat.record_at(2, &idle, now);
/// assert!(!sat.refuses_retry_at(now), "replica 2 can take the retry");
/// assert!(sat.is_saturated_at(1, now));
/// assert!(!sat.refuses_retry_at(now + Duration::from_secs(5)), "old reports expire");
/// ```
#[derive(Debug)]
pub struct Saturation {
    config: SaturationConfig,
    endpoints: std::sync::Mutex<HashMap<u64, Heard>>,
}

impl Saturation {
    /// A tracker for a valid `config`.
    pub fn new(config: SaturationConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Saturation {
            config,
            endpoints: std::sync::Mutex::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SaturationConfig {
        &self.config
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Heard>> {
        self.endpoints
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn decay(&self, from: Instant, to: Instant) -> f64 {
        let dt = to.saturating_duration_since(from).as_secs_f64();
        0.5f64.powf(dt / self.config.window.as_secs_f64())
    }

    fn fresh(&self, heard: &Heard, now: Instant) -> bool {
        now.saturating_duration_since(heard.at) < self.config.window.saturating_mul(4)
    }

    fn saturated(&self, heard: &Heard, now: Instant) -> bool {
        // Both weights decay alike: their ratio is what the recent reports say.
        self.fresh(heard, now) && heard.all > 0.0 && heard.saturated * 2.0 >= heard.all
    }

    /// `endpoint` answered with `report` at `now`.
    pub fn record_at(&self, endpoint: u64, report: &LoadReport, now: Instant) {
        let saturated = if self.config.is_saturated(report) {
            1.0
        } else {
            0.0
        };
        let mut endpoints = self.lock();
        if !endpoints.contains_key(&endpoint) && endpoints.len() >= MAX_ENDPOINTS {
            let oldest = endpoints.iter().min_by_key(|(_, h)| h.at).map(|(k, _)| *k);
            if let Some(oldest) = oldest {
                endpoints.remove(&oldest);
            }
        }
        let heard = endpoints.entry(endpoint).or_insert(Heard {
            saturated: 0.0,
            all: 0.0,
            at: now,
        });
        let w = self.decay(heard.at, now);
        heard.saturated = heard.saturated * w + saturated;
        heard.all = heard.all * w + 1.0;
        heard.at = heard.at.max(now);
    }

    /// Whether `endpoint`'s recent reports say it is saturated at `now`.
    pub fn is_saturated_at(&self, endpoint: u64, now: Instant) -> bool {
        self.lock()
            .get(&endpoint)
            .is_some_and(|h| self.saturated(h, now))
    }

    /// Whether a retry must be refused at `now`: at least one endpoint was heard from
    /// recently, and every endpoint heard from recently is saturated.
    pub fn refuses_retry_at(&self, now: Instant) -> bool {
        self.refuses_retry_among_at(1, now)
    }

    /// Whether a retry must be refused at `now` when the dependency has `endpoints`
    /// endpoints (the replicas of an endpoint-aware channel): at least `endpoints` of them
    /// were heard from recently and said "saturated", and none heard from recently said
    /// otherwise. An endpoint not heard from may take the retry.
    pub fn refuses_retry_among_at(&self, endpoints: usize, now: Instant) -> bool {
        let heard = self.lock();
        let mut saturated = 0;
        for h in heard.values().filter(|h| self.fresh(h, now)) {
            if !self.saturated(h, now) {
                return false;
            }
            saturated += 1;
        }
        saturated >= endpoints.max(1)
    }
}

/// Calls per second over a sliding window of about one second (the current second and
/// a share of the previous one), for a server's `rps_fractional` and `eps`.
#[derive(Clone, Copy, Debug)]
pub struct RateMeter {
    start: Instant,
    current: u64,
    previous: u64,
}

impl RateMeter {
    /// A meter whose first second starts at `now`.
    pub fn new_at(now: Instant) -> Self {
        RateMeter {
            start: now,
            current: 0,
            previous: 0,
        }
    }

    fn roll_at(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.start);
        if elapsed >= Duration::from_secs(2) {
            self.previous = 0;
            self.current = 0;
            self.start = now;
        } else if elapsed >= Duration::from_secs(1) {
            self.previous = self.current;
            self.current = 0;
            self.start += Duration::from_secs(1);
        }
    }

    /// One event at `now`.
    pub fn record_at(&mut self, now: Instant) {
        self.roll_at(now);
        self.current = self.current.saturating_add(1);
    }

    /// Events per second at `now`: this second's so far plus the previous second's share
    /// of the last second.
    pub fn rate_at(&mut self, now: Instant) -> f64 {
        self.roll_at(now);
        let into = now
            .saturating_duration_since(self.start)
            .as_secs_f64()
            .min(1.0);
        self.current as f64 + self.previous as f64 * (1.0 - into)
    }
}

/// gRPC A58's weight of an endpoint from its report:
/// `qps / (utilization + eps / qps * error_utilization_penalty)`; `None` when the report
/// cannot weight (no requests, or no utilization), as A58 ignores such reports.
pub fn a58_weight(report: &LoadReport, error_utilization_penalty: f64) -> Option<f64> {
    if report.rps <= 0.0 {
        return None;
    }
    let penalty = report.eps / report.rps * error_utilization_penalty;
    let denominator = report.utilization + penalty;
    (denominator > 0.0).then(|| report.rps / denominator)
}

#[cfg(test)]
mod tests;
