//! Configuration: typed, validated, with errors that name the field.
//!
//! Two document shapes are read into one [`ClientConfig`]:
//!
//! * the **standard gRPC service config** (what gRPC clients in every language already
//!   read): `methodConfig[].name` / `retryPolicy` / `hedgingPolicy` / `timeout` and
//!   `retryThrottling`, with proto3 JSON durations (`"0.1s"`) and status codes by name
//!   (any case) or number. Its retry policies use the A6 backoff, its hedging policies
//!   become [`HedgingPolicy`]s (see [Hedging](#hedging)), and its `retryThrottling`
//!   becomes the A6 token bucket, which pays for hedges as for retries; without
//!   `retryThrottling` both are paid from stormguard's budget with default settings; a
//!   method's `timeout` becomes its default deadline
//!   ([`MethodTable::timeout`](crate::MethodTable::timeout)). Fields gRPC does
//!   not define, and fields stormguard does not act on (`waitForReady`,
//!   `maxRequestMessageBytes`, ...), are skipped as gRPC skips unknown fields, and listed
//!   in [`ClientConfig::not_applied`];
//! * **stormguard's own shape**, for users who want the budget and full jitter:
//!
//! ```json
//! { "retry": {
//!     "max_attempts": 3,
//!     "backoff": "full_jitter", "base": "50ms", "cap": "2s", "max_pushback": "30s",
//!     "per_attempt_timeout": "50ms",
//!     "retryable_codes": ["UNAVAILABLE"], "idempotent": false,
//!     "budget": { "ttl": "10s", "min_retries_per_second": 5, "retry_ratio": 0.1,
//!                 "fleet_size": 1 },
//!     "budget_exhausted": "fail_fast" },
//!   "methods": {
//!     "/stormguard.demo.v1.Inventory/Reserve": { "idempotent": true },
//!     "/stormguard.demo.v1.Reports/": { "max_attempts": 2 },
//!     "/stormguard.demo.v1.Inventory/Watch": null },
//!   "breaker": { "failure_rate": 0.5, "open_for": "5s" } }
//! ```
//!
//! `retry` applies to every method. An entry of `methods`, by full path
//! (`/package.Service/Method`) or whole service (`/package.Service/`), changes what it
//! names over `retry`'s settings, or hedges it instead (`hedging`, see
//! [Hedging](#hedging)); `null` means the method is neither retried nor hedged. The exact
//! method wins over its service, as in the service config. The budget (`retry.budget`,
//! `retry.budget_exhausted`) is the layer's, so a method entry cannot set it.
//!
//! # Idempotency: the one line that makes answers retried
//!
//! `idempotent` defaults to `false`, as in [`RetryPolicy`]: without it, only requests that
//! never reached the server are retried, because a server that answered `UNAVAILABLE` may
//! have done part of the work. A config that sets everything else and leaves that out
//! retries no answer; [`ClientConfig::notices`] says so. One entry marks the method that is
//! safe to repeat (or `idempotent: true` under `retry` marks every method):
//!
//! ```yaml
//! retry:
//!   budget:
//!     ttl: 10s
//!     min_retries_per_second: 5
//!     retry_ratio: 0.1
//!   backoff: full_jitter
//!   base: 100ms
//!   max_attempts: 3
//!   budget_exhausted: fail_fast
//! methods:
//!   /stormguard.demo.v1.Inventory/Reserve: { idempotent: true }
//! ```
//!
//! # Hedging
//!
//! A hedged method has copies of a call sent while the first is slow, and the first useful
//! answer wins (see [`hedge`](crate::hedge)). A method is retried or hedged, never both: the
//! most specific entry for it decides which, in either shape. Hedges are attempts: they are
//! paid from the same budget (or A6 throttle) as retries, and refused, not queued, when it
//! is empty.
//!
//! In the service config, A6's `hedgingPolicy` sits where a `retryPolicy` would, and an
//! entry holding both is an error naming the entry (`methodConfig[0]`). `maxAttempts` is
//! required (at least 2; above 5 counts as 5), `hedgingDelay` defaults to `"0s"` (every
//! copy at once) and `nonFatalStatusCodes` to none:
//!
//! ```
//! use std::time::Duration;
//! use stormguard_core::ClientConfig;
//! use stormguard_core::HedgeDelay;
//!
//! let config = ClientConfig::from_service_config_json(r#"{ "methodConfig": [{
//!     "name": [{ "service": "stormguard.demo.v1.Catalog" }],
//!     "hedgingPolicy": { "maxAttempts": 3, "hedgingDelay": "0.010s",
//!                        "nonFatalStatusCodes": ["UNAVAILABLE"] } }] }"#)?;
//! let hedging = config.methods.lookup_hedging("/stormguard.demo.v1.Catalog/Get").unwrap();
//! assert_eq!(hedging.delay, HedgeDelay::Fixed(Duration::from_millis(10)));
//! assert!(config.methods.lookup("/stormguard.demo.v1.Catalog/Get").is_none(), "not retried");
//! # Ok::<(), stormguard_core::ConfigError>(())
//! ```
//!
//! In stormguard's shape, an entry of `methods` holds `hedging` and nothing else (a retry
//! setting beside it is an error naming that setting). Every key is optional and defaults
//! as in [`HedgingPolicy::default`]: `max_attempts` (2), `delay` (`"10ms"`),
//! `non_fatal_codes` (none), `min_attempt_time` (`"5ms"`), `max_pushback` (`"30s"`);
//! nothing comes from `retry`. `delay` is a duration or `"learned"`, a percentile of the
//! method's recent latency ([`LearnedDelay`](crate::LearnedDelay)), whose settings
//! sit beside it, as `base` and `cap` sit beside `backoff`: `percentile` (0.95), `floor`
//! (`"1ms"`), `ceiling` (`"1s"`), `min_samples` (100), `window` (`"10s"`). They are refused
//! with a fixed delay.
//!
//! ```yaml
//! methods:
//!   /stormguard.demo.v1.Catalog/Get:
//!     hedging: { max_attempts: 3, delay: 10ms, non_fatal_codes: [UNAVAILABLE] }
//!   /stormguard.demo.v1.Search/:
//!     hedging: { delay: learned, percentile: 0.95, floor: 2ms, ceiling: 200ms }
//! ```
//!
//! There is no layer-wide `hedging`: hedging a method says that running it more than once
//! is harmless, a statement made method by method (or service by service), as
//! `idempotent` is. A top-level `hedging`, or one under `retry`, is an error that says so.
//!
//! ```
//! use stormguard_core::ClientConfig;
//! use stormguard_core::HedgeDelay;
//!
//! let config = ClientConfig::from_json(r#"{ "methods": {
//!     "/stormguard.demo.v1.Search/": { "hedging": { "delay": "learned", "ceiling": "200ms" } } } }"#)?;
//! let hedging = config.methods.lookup_hedging("/stormguard.demo.v1.Search/Query").unwrap();
//! assert!(matches!(hedging.delay, HedgeDelay::Learned(_)));
//! assert!(config.methods.lookup("/stormguard.demo.v1.Inventory/Reserve").is_some(), "`retry`");
//!
//! let both = ClientConfig::from_json(r#"{ "methods": {
//!     "/pkg.Svc/Get": { "hedging": {}, "max_attempts": 3 } } }"#);
//! assert!(both.unwrap_err().to_string().contains("methods./pkg.Svc/Get.max_attempts"));
//! # Ok::<(), stormguard_core::ConfigError>(())
//! ```
//!
//! # Adaptive throttle
//!
//! `adaptive_throttle` (stormguard's shape only; off when absent) has the layer refuse
//! calls locally while the dependency refuses most of them for overload (the SRE book's
//! client-side throttling; see [`adaptive_throttle`](crate::adaptive_throttle) for why).
//! Every key is optional and defaults as in
//! [`AdaptiveThrottleConfig::default`](crate::AdaptiveThrottleConfig):
//! `k` (2), `sheddable_k` (1.5), `critical_k` (3), `max_reject_probability` (0.9),
//! `window` (`"10s"`), `reject_codes` (`[RESOURCE_EXHAUSTED]`), `shed_codes`
//! (`[DEADLINE_EXCEEDED, UNAVAILABLE]`, counted only when the answer carries a pushback or
//! `stormguard-unprocessed`). An empty object turns it on with the defaults.
//!
//! ```
//! use stormguard_core::ClientConfig;
//!
//! let config = ClientConfig::from_json(r#"{ "adaptive_throttle": { "k": 1.5, "sheddable_k": 1.2,
//!     "window": "30s" } }"#)?;
//! assert_eq!(config.adaptive_throttle.unwrap().k, 1.5);
//! assert!(ClientConfig::from_json("{}")?.adaptive_throttle.is_none(), "off by default");
//!
//! let bad = ClientConfig::from_json(r#"{ "adaptive_throttle": { "max_reject_probability": 1 } }"#);
//! assert!(bad.unwrap_err().to_string().contains("adaptive_throttle.max_reject_probability"));
//! # Ok::<(), stormguard_core::ConfigError>(())
//! ```
//!
//! # Errors
//!
//! Every value is checked; an error names the field as a dotted path and says why
//! (``invalid `retry.budget.ttl`: must be between 1 s and 60 s, got 500ms``), so a bad
//! deploy fails loudly at start-up rather than quietly retrying everything. An error from
//! [`ClientConfig::from_path`] also names the file ([`ConfigError::File`]). Fields read
//! but not applied are not errors (gRPC accepts them): they are [`Notice`]s, which
//! [`ClientConfig::notices`] lists with the settings under which no answer is retried.
//!
//! # Why serde, and how to embed the config
//!
//! The config types implement [`serde::Deserialize`], so a team can hold stormguard's
//! section in its own config struct, in any serde format:
//!
//! ```
//! use serde::Deserialize;
//! use stormguard_core::ClientConfig;
//!
//! #[derive(Deserialize)]
//! struct App {
//!     listen: String,
//!     inventory: ClientConfig,
//! }
//!
//! let app: App = serde_json::from_str(r#"{ "listen": "[::1]:50051",
//!     "inventory": { "retry": { "max_attempts": 3 },
//!                    "methods": { "/stormguard.demo.v1.Inventory/Reserve": { "idempotent": true } } } }"#)
//!     .unwrap();
//! assert!(app.inventory.methods.lookup("/stormguard.demo.v1.Inventory/Reserve").unwrap().idempotent);
//!
//! // Deserializing validates: a bad value cannot get past it unnoticed.
//! let bad = serde_json::from_str::<App>(r#"{ "listen": "",
//!     "inventory": { "retry": { "budget": { "ttl": "0.5s" } } } }"#);
//! assert!(bad.err().unwrap().to_string().contains("retry.budget.ttl"));
//! ```
//!
//! Deserializing a [`ClientConfig`] (stormguard's shape) or an
//! [`AdmissionConfig`](crate::AdmissionConfig) (the fields of `admission`)
//! runs the same checks as [`ClientConfig::from_json`], so a config that deserialized is
//! valid: there is no `validate()` call to forget. A type error names its place in the
//! application's document as the application's format reports it (wrap the deserializer
//! in `serde_path_to_error` for a dotted path); a failed check names the field within
//! stormguard's section (`retry.budget.ttl`). Parts on their own
//! ([`BudgetConfig`], [`BreakerConfig`], [`A6BudgetConfig`],
//! [`AdaptiveThrottleConfig`],
//! [`AdaptiveLimitConfig`](crate::AdaptiveLimitConfig)) deserialize with their
//! defaults for missing fields and are checked by what is built from them. Durations in an
//! application's own fields can use the [`duration`] module (`"50ms"`, `"10s"`).
//!
//! # Formats
//!
//! JSON is always read. YAML and TOML are read with the `yaml` and `toml` features, both
//! on by default; a user who needs only JSON turns off the default features and compiles
//! neither parser. Reading a YAML or TOML document without its feature is
//! [`ConfigError::FormatDisabled`].

use std::path::Path;

use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use document::Build;

use crate::A6BudgetConfig;
use crate::AdaptiveThrottleConfig;
use crate::BreakerConfig;
use crate::BudgetConfig;
use crate::ConfigError;
use crate::HedgingPolicy;
use crate::{MethodTable, RetryPolicy};

mod admission;
pub(crate) mod check;
mod client;
mod criticality;
pub(crate) mod document;
pub(crate) mod duration;
mod idempotency;
pub(crate) mod notice;
mod replica;
mod service;
mod value;

pub use admission::ShedSettings;
pub use document::Format;
pub use duration::parse_duration;
pub use notice::{IDEMPOTENT_SETTING, NotApplied, NotAppliedReason, Notice};
pub(crate) use value::{finite, whole};

/// Which budget pays for retries.
#[derive(Clone, Debug, PartialEq)]
pub enum BudgetChoice {
    /// stormguard's windowed budget: retries ≤ `retry_ratio` of successes, plus a floor.
    Stormguard(BudgetConfig),
    /// gRPC A6 `retryThrottling`.
    A6(A6BudgetConfig),
}

impl Default for BudgetChoice {
    fn default() -> Self {
        BudgetChoice::Stormguard(BudgetConfig::default())
    }
}

/// Everything the client retry controller needs.
///
/// ```
/// use stormguard_core::{BudgetChoice, ClientConfig};
///
/// let json = r#"{
///   "methodConfig": [{
///     "name": [{ "service": "stormguard.demo.v1.Inventory" }],
///     "retryPolicy": {
///       "maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
///       "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE", "resource_exhausted"]
///     }
///   }],
///   "retryThrottling": { "maxTokens": 10, "tokenRatio": 0.1 }
/// }"#;
/// let config = ClientConfig::from_service_config_json(json).unwrap();
/// let policy = config.methods.lookup("/stormguard.demo.v1.Inventory/Reserve").unwrap();
/// assert_eq!(policy.max_attempts, 4);
/// assert!(matches!(config.budget, BudgetChoice::A6(_)));
/// assert!(config.methods.lookup("/other.Svc/Get").is_none());
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClientConfig {
    /// Retry and hedging policies by method.
    pub methods: MethodTable,
    /// What pays for retries and hedges.
    pub budget: BudgetChoice,
    /// The circuit breaker, if any.
    pub breaker: Option<BreakerConfig>,
    /// Client-side adaptive throttling (stormguard's `adaptive_throttle`), if any: see
    /// [`adaptive_throttle`](crate::AdaptiveThrottle). Off by default.
    pub adaptive_throttle: Option<AdaptiveThrottleConfig>,
    /// Refuse retries and hedges to a dependency whose load reports (ORCA) say it is
    /// saturated (`retry.load_reports`; see [`crate::orca`](crate::LoadReport)). Default `None`: reports are
    /// not read for retries.
    pub load_reports: Option<crate::SaturationConfig>,
    /// The seed of every random draw of a client built from this config (backoff jitter,
    /// the breaker's open-duration jitter, the adaptive throttle, idempotency keys), so a
    /// run can be reproduced; `None` draws one. Not read from documents: set it in code,
    /// with [`ClientConfig::with_seed`].
    pub seed: Option<u64>,
    /// Fields of the document read but not applied.
    not_applied: Vec<NotApplied>,
}

impl ClientConfig {
    /// The same config with its random draws seeded by `seed` (see [`ClientConfig::seed`]).
    ///
    /// ```
    /// use stormguard_core::ClientConfig;
    ///
    /// assert_eq!(ClientConfig::standard().with_seed(7).seed, Some(7));
    /// ```
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }
    /// stormguard's defaults for every method: retry `UNAVAILABLE`, 3 attempts, full jitter,
    /// the default budget, no breaker. No method is taken for idempotent, so only requests
    /// that never reached the server are retried; mark the methods that are safe to repeat
    /// with a policy of their own (see [`policy`](crate::RetryPolicy)).
    pub fn standard() -> Self {
        ClientConfig {
            methods: MethodTable::uniform(RetryPolicy::default()),
            ..ClientConfig::default()
        }
    }

    /// No retries at all (the layer still counts and stamps headers).
    pub fn no_retries() -> Self {
        ClientConfig::default()
    }

    /// Checks every part.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for policy in self.methods.policies() {
            policy.validate("retry")?;
        }
        for policy in self.methods.hedging_policies() {
            policy.validate("hedging")?;
        }
        match &self.budget {
            BudgetChoice::Stormguard(b) => b.validate()?,
            BudgetChoice::A6(t) => t.validate()?,
        }
        if let Some(b) = &self.breaker {
            b.validate()?;
        }
        if let Some(t) = &self.adaptive_throttle {
            t.validate()?;
        }
        if let Some(l) = &self.load_reports {
            l.validate()?;
        }
        Ok(())
    }

    /// The fields of the service config this was read from that are not applied: fields
    /// stormguard does not act on (`waitForReady`, `maxRequestMessageBytes`,
    /// `maxResponseMessageBytes`, load balancing) and fields gRPC does not define (a
    /// misspelled `retryPolicyy`), each with its path. Empty for stormguard's own shape,
    /// which refuses unknown fields, and for a config built in code.
    ///
    /// ```
    /// use stormguard_core::{ClientConfig, NotAppliedReason};
    ///
    /// let config = ClientConfig::from_service_config_json(r#"{ "methodConfig": [{
    ///     "name": [{ "service": "pkg.Svc" }], "waitForReady": true,
    ///     "retryPolicyy": { "maxAttempts": 3 } }] }"#).unwrap();
    /// let reason = |path: &str| config.not_applied().iter().find(|n| n.path == path).map(|n| n.reason);
    /// assert_eq!(config.not_applied().len(), 2);
    /// assert_eq!(reason("methodConfig[0].waitForReady"), Some(NotAppliedReason::WaitForReady));
    /// assert_eq!(reason("methodConfig[0].retryPolicyy"), Some(NotAppliedReason::Unknown));
    /// ```
    pub fn not_applied(&self) -> &[NotApplied] {
        &self.not_applied
    }

    /// What this config says that will not happen, for the layer to report when it is
    /// built: each field [not applied](Self::not_applied), then
    /// [`Notice::NoAnswerRetried`] when methods have retry policies but none is
    /// idempotent, so that no answer is ever retried. Computed from the config as it is
    /// now, so a method marked idempotent in code after loading counts.
    ///
    /// ```
    /// use stormguard_core::{ClientConfig, Notice};
    ///
    /// let config = ClientConfig::from_json(r#"{ "retry": { "max_attempts": 3 } }"#).unwrap();
    /// assert!(matches!(config.notices()[..], [Notice::NoAnswerRetried { max_attempts: 3, .. }]));
    ///
    /// let config = ClientConfig::from_json(r#"{ "retry": { "max_attempts": 3 },
    ///     "methods": { "/pkg.Svc/Get": { "idempotent": true } } }"#).unwrap();
    /// assert!(config.notices().is_empty());
    /// ```
    pub fn notices(&self) -> Vec<Notice> {
        notice::notices(self)
    }

    /// Reads a config file, JSON, YAML or TOML by its extension (`.json`, `.yaml` / `.yml`,
    /// `.toml`), in either shape: a standard gRPC service config when its root has
    /// `methodConfig` or `retryThrottling`, stormguard's own shape otherwise. An error in
    /// the file's content is a [`ConfigError::File`] naming the file.
    ///
    /// ```no_run
    /// use stormguard_core::ClientConfig;
    ///
    /// let config = ClientConfig::from_path("retry.yaml")?;
    /// # Ok::<(), stormguard_core::ConfigError>(())
    /// ```
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        document::read_file(path.as_ref(), Self::from_document)
    }

    /// [`ClientConfig::from_path`] for a document already in memory.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard_core::{BudgetChoice, ClientConfig, Format};
    ///
    /// let toml = "[retry]\nmax_attempts = 3\nbase = \"100ms\"\n[retry.budget]\nttl = \"10s\"\n";
    /// # #[cfg(feature = "toml")] {
    /// let config = ClientConfig::from_text(toml, Format::Toml).unwrap();
    /// let BudgetChoice::Stormguard(budget) = &config.budget else { panic!() };
    /// assert_eq!(budget.ttl, Duration::from_secs(10));
    /// # }
    /// ```
    pub fn from_text(text: &str, format: Format) -> Result<Self, ConfigError> {
        Self::from_document(document::parse(text, format)?)
    }

    fn from_document(root: Map<String, Value>) -> Result<Self, ConfigError> {
        let service_config = ["methodConfig", "retryThrottling"]
            .iter()
            .any(|key| root.contains_key(*key));
        if service_config {
            service::read(root)
        } else {
            document::strict::<client::ClientDoc>(root)?.build()
        }
    }

    /// Reads a standard gRPC service config (JSON): retry and hedging policies, timeouts
    /// and throttling (see `docs/config.md`).
    pub fn from_service_config_json(json: &str) -> Result<Self, ConfigError> {
        service::read(document::parse(json, Format::Json)?)
    }

    /// Reads stormguard's own shape (see `docs/config.md`). Every field is optional
    /// and defaults as in [`ClientConfig::standard`]; unknown fields are errors (a typo must
    /// not silently fall back to a default).
    pub fn from_json(json: &str) -> Result<Self, ConfigError> {
        document::strict::<client::ClientDoc>(document::parse(json, Format::Json)?)?.build()
    }
}

/// stormguard's own shape (see `docs/config.md`),
/// validated: what deserializes is what [`ClientConfig::from_json`] accepts.
impl<'de> Deserialize<'de> for ClientConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        document::built::<client::ClientDoc, D>(d)
    }
}

/// What one entry of a document (a `methodConfig` entry, an entry of `methods`) gives the
/// methods it names: a method is retried or hedged, never both, or neither.
enum MethodPolicy {
    Retry(RetryPolicy),
    Hedge(HedgingPolicy),
    Neither,
}

/// The methods an entry names.
#[derive(Clone, Copy)]
enum Scope<'a> {
    /// Every method no other entry names.
    Default,
    /// Every method of a service (`pkg.Service`).
    Service(&'a str),
    /// One method.
    Method(&'a str, &'a str),
}

impl MethodPolicy {
    /// Sets it in `table` for `scope`, replacing what was set there before (of either kind).
    fn set(&self, table: &mut MethodTable, scope: Scope<'_>) {
        let (retry, hedge) = match self {
            MethodPolicy::Retry(p) => (Some(p.clone()), None),
            MethodPolicy::Hedge(h) => (None, Some(h.clone())),
            MethodPolicy::Neither => (None, None),
        };
        match (scope, hedge) {
            (Scope::Default, Some(h)) => table.set_default_hedging(Some(h)),
            (Scope::Default, None) => table.set_default(retry),
            (Scope::Service(s), Some(h)) => table.insert_service_hedging(s, Some(h)),
            (Scope::Service(s), None) => table.insert_service(s, retry),
            (Scope::Method(s, m), Some(h)) => table.insert_method_hedging(s, m, Some(h)),
            (Scope::Method(s, m), None) => table.insert_method(s, m, retry),
        }
    }
}

#[cfg(test)]
mod tests;
