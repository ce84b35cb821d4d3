//! Configuration: typed, validated, with errors that name the field.
//!
//! Two document shapes are read into one [`ClientConfig`]:
//!
//! * the **standard gRPC service config** (what gRPC clients in every language already
//!   read): `methodConfig[].name` / `retryPolicy` / `hedgingPolicy` / `timeout` and
//!   `retryThrottling`, with proto3 JSON durations (`"0.1s"`) and status codes by name
//!   (any case) or number. Its retry policies use the A6 backoff, its `retryThrottling`
//!   becomes the A6 token bucket (which pays for hedges as for retries), and a method's
//!   `timeout` caps its deadline. Fields stormguard does not act on (`waitForReady`,
//!   `maxRequestMessageBytes`, ...) are skipped as gRPC skips them, and listed in
//!   [`ClientConfig::notices`];
//! * **stormguard's own shape**, for the budget and full jitter: `retry` for every method
//!   (the layer's `budget` and `load_reports` with it), `methods` by full path or whole
//!   service (the exact method wins; `null`: neither retried nor hedged), `breaker` and
//!   `adaptive_throttle`.
//!
//! The admission, criticality, idempotency and replica documents have readers here too,
//! one per type, all built on one document reader ([`Format`]: JSON always, YAML and TOML
//! with the features of those names).
//!
//! Why typed and checked: every value is validated and an error names the field as a
//! dotted path and says why (``invalid `retry.budget.ttl`: must be between 1 s and 60 s,
//! got 500ms``), so a bad deploy fails loudly at start-up rather than quietly retrying
//! everything. An error from [`ClientConfig::from_path`] also names the file
//! ([`ConfigError::File`]). Fields read but not applied are [`Notice`]s, not errors.
//!
//! ```
//! use stormguard_core::ClientConfig;
//!
//! let config = ClientConfig::from_json(r#"{ "retry": { "max_attempts": 3 },
//!     "methods": { "/shop.Cart/Checkout": { "idempotent": true } } }"#)?;
//! assert!(ClientConfig::from_json(r#"{ "retry": { "max_attempts": 0 } }"#).is_err());
//! # let _ = config;
//! # Ok::<(), stormguard_core::ConfigError>(())
//! ```
//!
//! Every key of every document: the repository's `docs/config.md`.

use std::path::Path;

use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use document::Build;

use crate::budget::A6BudgetConfig;
use crate::budget::BudgetConfig;
use crate::error::ConfigError;
use crate::retry::BreakerConfig;
use crate::retry::HedgingPolicy;
use crate::retry::{AdaptiveThrottleConfig, SaturationConfig};
use crate::retry::{MethodScope, MethodTable, RetryPolicy};

mod admission;
mod client;
mod controller;
mod criticality;
pub(crate) mod document;
mod idempotency;
pub(crate) mod notice;
mod replica;
mod service;
mod value;

pub use crate::field::duration::parse_duration;
pub use admission::ShedSettings;
pub use document::Format;
pub use notice::{IDEMPOTENT_SETTING, NotApplied, NotAppliedReason, Notice};

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
///
/// [`ClientConfig::default`] is what stormguard recommends, as is an empty document (`{}`);
/// [`ClientConfig::no_retries`] retries nothing.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientConfig {
    /// Retry and hedging policies by method.
    pub methods: MethodTable,
    /// What pays for retries and hedges.
    pub budget: BudgetChoice,
    /// The circuit breaker, if any.
    pub breaker: Option<BreakerConfig>,
    /// Client-side adaptive throttling (stormguard's `adaptive_throttle`), if any: see
    /// [`AdaptiveThrottle`](crate::AdaptiveThrottle). Off by default.
    pub adaptive_throttle: Option<AdaptiveThrottleConfig>,
    /// Refuse retries and hedges to a dependency whose load reports (ORCA) say it is
    /// saturated (`retry.load_reports`; see [`LoadReport`](crate::LoadReport)). Default
    /// `None`: reports are not read for retries.
    pub load_reports: Option<SaturationConfig>,
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
    /// assert_eq!(ClientConfig::default().with_seed(7).seed, Some(7));
    /// ```
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }
    /// No retries at all (the layer still counts and stamps headers).
    ///
    /// ```
    /// use stormguard_core::ClientConfig;
    ///
    /// assert!(ClientConfig::no_retries().methods.lookup("/pkg.Svc/Get").is_none());
    /// ```
    pub fn no_retries() -> Self {
        ClientConfig {
            methods: MethodTable::default(),
            ..ClientConfig::default()
        }
    }

    /// Checks every part.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        self.methods.validate()?;
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

    /// The fields of the service config this was read from that are not applied (each is
    /// also a [`Notice::NotApplied`] of [`notices`](Self::notices)).
    #[cfg(test)]
    pub(crate) fn not_applied(&self) -> &[NotApplied] {
        &self.not_applied
    }

    /// What this config says that will not happen, for the layer to report when it is
    /// built: each field of the service config it was read from that is not applied
    /// ([`Notice::NotApplied`]: fields stormguard does not act on, such as `waitForReady`,
    /// `maxRequestMessageBytes`, `maxResponseMessageBytes` and load balancing, and fields
    /// gRPC does not define, such as a misspelled `retryPolicyy`, each with its path; none
    /// for stormguard's own shape, which refuses unknown fields, nor for a config built in
    /// code), then [`Notice::NoAnswerRetried`] when methods have retry policies but none is
    /// idempotent, so that no answer is ever retried. Computed from the config as it is
    /// now, so a method marked idempotent in code after loading counts.
    ///
    /// ```
    /// use stormguard_core::{ClientConfig, NotAppliedReason, Notice};
    ///
    /// let config = ClientConfig::from_service_config_json(r#"{ "methodConfig": [{
    ///     "name": [{ "service": "pkg.Svc" }], "waitForReady": true,
    ///     "retryPolicyy": { "maxAttempts": 3 } }] }"#).unwrap();
    /// let reason = |path: &str| config.notices().into_iter().find_map(|n| match n {
    ///     Notice::NotApplied(n) if n.path == path => Some(n.reason),
    ///     _ => None,
    /// });
    /// assert_eq!(reason("methodConfig[0].waitForReady"), Some(NotAppliedReason::WaitForReady));
    /// assert_eq!(reason("methodConfig[0].retryPolicyy"), Some(NotAppliedReason::Unknown));
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
    /// and defaults as in [`ClientConfig::default`]; unknown fields are errors (a typo must
    /// not silently fall back to a default).
    pub fn from_json(json: &str) -> Result<Self, ConfigError> {
        document::strict::<client::ClientDoc>(document::parse(json, Format::Json)?)?.build()
    }
}

/// stormguard's own shape (see `docs/config.md`),
/// validated: what deserializes is what [`ClientConfig::from_json`] accepts.
impl Default for ClientConfig {
    /// What stormguard recommends for every method: retry `UNAVAILABLE`, 3 attempts, full
    /// jitter, the default budget, no breaker. No method is taken for idempotent, so only
    /// requests that never reached the server are retried; mark the methods that are safe to
    /// repeat with a policy of their own (see [`RetryPolicy`](crate::RetryPolicy)). The same
    /// config as an empty document.
    ///
    /// ```
    /// use stormguard_core::ClientConfig;
    ///
    /// let config = ClientConfig::default();
    /// assert_eq!(config.methods.lookup("/pkg.Svc/Get").map(|p| p.max_attempts), Some(3));
    /// assert_eq!(ClientConfig::from_json("{}")?, config);
    /// # Ok::<(), stormguard_core::ConfigError>(())
    /// ```
    fn default() -> Self {
        ClientConfig {
            methods: MethodTable::uniform(RetryPolicy::default()),
            budget: BudgetChoice::default(),
            breaker: None,
            adaptive_throttle: None,
            load_reports: None,
            seed: None,
            not_applied: Vec::new(),
        }
    }
}

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

impl MethodPolicy {
    /// Sets it in `table` for `scope`, replacing what was set there before (of either kind).
    fn set(&self, table: &mut MethodTable, scope: MethodScope<'_>) {
        match self {
            MethodPolicy::Retry(p) => table.set_retry(scope, Some(p.clone())),
            MethodPolicy::Hedge(h) => table.set_hedging(scope, Some(h.clone())),
            MethodPolicy::Neither => table.set_retry(scope, None),
        }
    }
}

#[cfg(test)]
mod tests;
