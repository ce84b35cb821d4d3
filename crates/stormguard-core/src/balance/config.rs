//! How a [`ReplicaSet`](crate::ReplicaSet) chooses and ejects replicas; read from a
//! config document by [`ReplicaConfig::from_text`].

use std::time::Duration;

use crate::error::ConfigError;
use crate::field::check::{share, within};

/// How a [`ReplicaSet`](crate::ReplicaSet) chooses and ejects replicas.
///
/// Build it with `..ReplicaConfig::default()` for the fields you do not set. Deserializes
/// from an object of these fields, each optional; unknown fields are refused.
#[derive(Debug, Clone, PartialEq, Default, serde::Deserialize)]
#[serde(
    default,
    deny_unknown_fields,
    expecting = "an object of replica settings"
)]
pub struct ReplicaConfig {
    /// When a replica is taken out of the choice.
    pub ejection: EjectionConfig,
    /// How a new or returning replica's share ramps up.
    pub slow_start: SlowStartConfig,
    /// How load and health are estimated.
    pub load: LoadConfig,
    /// How load reports (ORCA) weight replicas.
    pub reports: ReportWeightConfig,
    /// The seed of the choice and of the ejection jitter; `None` draws one.
    pub seed: Option<u64>,
    /// Client-side health checks (gRFC A17): each replica's `grpc.health.v1.Health/Watch`
    /// stream says whether it takes attempts. `None` (the default): off, no `Watch` is
    /// sent. In a document: `health_check: { service_name: "" }`. A client runs them with
    /// `stormguard-client`'s feature `health`, over a tonic `Channel` per replica
    /// (`Replicas::from_endpoints`, `balance_channel`, `from_dns`).
    pub health_check: Option<HealthCheckConfig>,
}

/// Client-side health checks per replica, as gRFC A17's `healthCheckConfig`: a replica
/// whose health service says `NOT_SERVING` (or `SERVICE_UNKNOWN`, or has not answered yet)
/// gets no new attempts until it says `SERVING` (see
/// [`ServingStatus`](crate::ServingStatus)).
///
/// ```
/// use stormguard_core::{Format, HealthCheckConfig, ReplicaConfig};
///
/// let json = r#"{ "replicas": { "health_check": { "service_name": "inventory.v1.Inventory" } } }"#;
/// let config = ReplicaConfig::from_text(json, Format::Json)?;
/// assert_eq!(config.health_check, Some(HealthCheckConfig::service("inventory.v1.Inventory")));
/// // Off unless asked for.
/// assert_eq!(ReplicaConfig::default().health_check, None);
/// # Ok::<(), stormguard_core::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(
    default,
    deny_unknown_fields,
    expecting = "an object of health-check settings"
)]
pub struct HealthCheckConfig {
    /// The service name each `Watch` asks about (A17's `serviceName`); `""`, the default,
    /// is the whole server's status.
    #[serde(alias = "serviceName")]
    pub service_name: String,
}

impl HealthCheckConfig {
    /// Health checks of the service `name` (`""`: the whole server).
    pub fn service(name: impl Into<String>) -> Self {
        HealthCheckConfig {
            service_name: name.into(),
        }
    }
}

/// When a replica is ejected, and for how long. See [the docs](crate::ReplicaSet).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(
    default,
    deny_unknown_fields,
    expecting = "an object of ejection settings"
)]
pub struct EjectionConfig {
    /// Failures in a row that eject a replica; 0 turns this rule off.
    #[serde(deserialize_with = "crate::field::whole")]
    pub consecutive_failures: u32,
    /// The share of failed answers over `window` that ejects a replica, in (0, 1]; with
    /// fewer than `min_requests` answers in the window the rule does not apply.
    #[serde(deserialize_with = "crate::field::finite")]
    pub failure_share: f64,
    /// Answers needed in the window before `failure_share` applies; 0 turns that rule off.
    #[serde(deserialize_with = "crate::field::whole")]
    pub min_requests: u32,
    /// The window of `failure_share`, and how long a returned replica must stay healthy
    /// before its next ejection starts again from `base_time`. 1 s to 10 min.
    #[serde(with = "crate::field::duration")]
    pub window: Duration,
    /// The first ejection's length; each ejection in a row doubles it. 10 ms to 1 h.
    #[serde(with = "crate::field::duration")]
    pub base_time: Duration,
    /// The longest ejection, at least `base_time`, at most 1 h.
    #[serde(with = "crate::field::duration")]
    pub max_time: Duration,
    /// Each ejection lasts up to this fraction longer, at random, so that clients that saw
    /// the same failures do not probe together. In [0, 1].
    #[serde(deserialize_with = "crate::field::finite")]
    pub jitter: f64,
    /// The most replicas out at once, as a share of the set, in [0, 1]; at least one when
    /// the set has two or more, and never the last one. 0 turns ejection off.
    #[serde(deserialize_with = "crate::field::finite")]
    pub max_ejected_share: f64,
}

impl Default for EjectionConfig {
    /// 5 failures in a row, or half of at least 20 answers in 10 s; ejected for 500 ms
    /// doubling to 60 s, up to 50 % longer at random; at most half the replicas out.
    fn default() -> Self {
        EjectionConfig {
            consecutive_failures: 5,
            failure_share: 0.5,
            min_requests: 20,
            window: Duration::from_secs(10),
            base_time: Duration::from_millis(500),
            max_time: Duration::from_secs(60),
            jitter: 0.5,
            max_ejected_share: 0.5,
        }
    }
}

/// How a new or returning replica's share ramps up.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(
    default,
    deny_unknown_fields,
    expecting = "an object of slow-start settings"
)]
pub struct SlowStartConfig {
    /// How long the ramp lasts; 0 turns slow start off. At most 10 min.
    #[serde(with = "crate::field::duration")]
    pub window: Duration,
    /// The share a replica starts from, as a fraction of a full one, in (0, 1].
    #[serde(deserialize_with = "crate::field::finite")]
    pub min_weight: f64,
}

impl Default for SlowStartConfig {
    /// A 5 s linear ramp from a tenth of a full share.
    fn default() -> Self {
        SlowStartConfig {
            window: Duration::from_secs(5),
            min_weight: 0.1,
        }
    }
}

/// How a replica's load and health are estimated.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(default, deny_unknown_fields, expecting = "an object of load settings")]
pub struct LoadConfig {
    /// How fast the peak-EWMA latency forgets a slow answer. 10 ms to 1 min.
    #[serde(with = "crate::field::duration")]
    pub decay: Duration,
    /// The latency a replica is assumed to have before its first answer, and the one its
    /// estimate returns to while it gets none. Keep it at or below the service's real
    /// latency: an optimistic guess makes the choice try a replica it knows nothing about,
    /// a pessimistic one starves it. 1 µs to 1 min.
    #[serde(with = "crate::field::duration")]
    pub default_rtt: Duration,
    /// How fast the memory of failures fades while a replica gets no answers (so a replica
    /// avoided for its failures is tried again). 10 ms to 10 min.
    #[serde(with = "crate::field::duration")]
    pub failure_decay: Duration,
}

impl Default for LoadConfig {
    /// Latency decays over 1 s towards an assumed 1 ms; failures fade over 5 s.
    fn default() -> Self {
        LoadConfig {
            decay: Duration::from_secs(1),
            default_rtt: Duration::from_millis(1),
            failure_decay: Duration::from_secs(5),
        }
    }
}

/// How load reports (ORCA) weight replicas, after gRPC A58 (see the
/// [docs](crate::ReplicaSet#load-reports-orca-may-only-lower-a-replicas-share)).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(
    default,
    deny_unknown_fields,
    expecting = "an object of load report settings"
)]
pub struct ReportWeightConfig {
    /// Whether reports weight replicas at all. Default `true` (a replica that sends none is
    /// unaffected).
    pub enabled: bool,
    /// How long after a replica's first report (or its first after expiry) its reports
    /// start to count. A58's default, 10 s. At most 10 min.
    #[serde(with = "crate::field::duration")]
    pub blackout_period: Duration,
    /// A replica's reports stop counting when none came for this long. A58's default,
    /// 3 min. 1 s to 1 h.
    #[serde(with = "crate::field::duration")]
    pub expiration_period: Duration,
    /// A58's `error_utilization_penalty`: how much errors per request add to the
    /// utilization. Default 1.0, at least 0, at most 100.
    #[serde(deserialize_with = "crate::field::finite")]
    pub error_utilization_penalty: f64,
    /// The least a report multiplies a replica's share by, in (0, 1]. Default 0.05.
    #[serde(deserialize_with = "crate::field::finite")]
    pub min_factor: f64,
}

impl Default for ReportWeightConfig {
    /// Enabled, A58's 10 s blackout and 3 min expiry, penalty 1.0, factor at least 0.05.
    fn default() -> Self {
        ReportWeightConfig {
            enabled: true,
            blackout_period: Duration::from_secs(10),
            expiration_period: Duration::from_secs(180),
            error_utilization_penalty: 1.0,
            min_factor: 0.05,
        }
    }
}

impl ReplicaConfig {
    /// Checks every field; the error names the first field out of range.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        self.ejection.validate()?;
        self.slow_start.validate()?;
        self.load.validate()?;
        self.reports.validate()
    }
}

const HOUR: Duration = Duration::from_secs(3600);
const TEN_MIN: Duration = Duration::from_secs(600);

impl EjectionConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let e = self;
        share("replicas.ejection.failure_share", e.failure_share, false)?;
        within(
            "replicas.ejection.window",
            e.window,
            Duration::from_secs(1),
            TEN_MIN,
        )?;
        let base = e.base_time;
        within(
            "replicas.ejection.base_time",
            base,
            Duration::from_millis(10),
            HOUR,
        )?;
        within("replicas.ejection.max_time", e.max_time, e.base_time, HOUR)?;
        share("replicas.ejection.jitter", e.jitter, true)?;
        share(
            "replicas.ejection.max_ejected_share",
            e.max_ejected_share,
            true,
        )
    }
}

impl SlowStartConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        within(
            "replicas.slow_start.window",
            self.window,
            Duration::ZERO,
            TEN_MIN,
        )?;
        share("replicas.slow_start.min_weight", self.min_weight, false)
    }
}

impl LoadConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let (ms10, min) = (Duration::from_millis(10), Duration::from_secs(60));
        within("replicas.load.decay", self.decay, ms10, min)?;
        let rtt = self.default_rtt;
        within(
            "replicas.load.default_rtt",
            rtt,
            Duration::from_micros(1),
            min,
        )?;
        within(
            "replicas.load.failure_decay",
            self.failure_decay,
            ms10,
            TEN_MIN,
        )
    }
}

impl ReportWeightConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let r = self;
        within(
            "replicas.reports.blackout_period",
            r.blackout_period,
            Duration::ZERO,
            TEN_MIN,
        )?;
        let expiration = r.expiration_period;
        within(
            "replicas.reports.expiration_period",
            expiration,
            Duration::from_secs(1),
            HOUR,
        )?;
        if !(r.error_utilization_penalty.is_finite()
            && (0.0..=100.0).contains(&r.error_utilization_penalty))
        {
            return Err(ConfigError::invalid(
                "replicas.reports.error_utilization_penalty",
                format!("must be in [0, 100], got {}", r.error_utilization_penalty),
            ));
        }
        share("replicas.reports.min_factor", r.min_factor, false)
    }
}
