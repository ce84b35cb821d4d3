//! stormguard's own shape of a client config: `retry`, `breaker` and `methods` (see the
//! [docs](super)).

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Unexpected, Visitor};

use super::document::Build;
use super::value::present;
use super::{BudgetChoice, ClientConfig, MethodPolicy};
use crate::budget::BudgetConfig;
use crate::error::ConfigError;
use crate::field::duration::{Human, parse_duration};
use crate::field::{Finite, Int};
use crate::retry::AdaptiveThrottleConfig;
use crate::retry::BackoffConfig;
use crate::retry::BreakerConfig;
use crate::retry::SaturationConfig;
use crate::retry::{HedgeDelay, HedgingPolicy, LearnedDelay};
use crate::retry::{MethodScope, MethodTable, RetryPolicy};
use crate::wire::code::CodeSet;

/// The document: every key optional, unknown keys refused (a typo must not quietly fall
/// back to a default).
#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "stormguard's client config (`retry`, `breaker`, `adaptive_throttle`, `methods`)"
)]
pub(super) struct ClientDoc {
    #[serde(default)]
    retry: PolicyDoc,
    breaker: Option<BreakerConfig>,
    /// The layer's client-side adaptive throttle, off when absent.
    adaptive_throttle: Option<AdaptiveThrottleConfig>,
    /// By `/package.Service/Method` or `/package.Service/`; `null`: neither retried nor
    /// hedged.
    #[serde(default)]
    methods: BTreeMap<String, Option<PolicyDoc>>,
    /// Refused with a pointer to `methods`: hedging is chosen per method or service.
    #[serde(default, deserialize_with = "present")]
    hedging: bool,
}

/// `retry`, or one entry of `methods`: what it sets, over what it inherits.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "an object of retry settings")]
struct PolicyDoc {
    max_attempts: Option<Int<u32>>,
    backoff: Option<BackoffKind>,
    base: Option<Human>,
    cap: Option<Human>,
    multiplier: Option<Finite>,
    retryable_codes: Option<CodeSet>,
    idempotent: Option<bool>,
    /// Whether calls carry an idempotency key; beside `hedging` too (it is not a retry
    /// setting: a hedged method may be keyed).
    idempotency_key: Option<bool>,
    min_attempt_time: Option<Human>,
    max_pushback: Option<Human>,
    per_attempt_timeout: Option<Human>,
    // The layer's, under `retry` only.
    budget: Option<BudgetConfig>,
    budget_exhausted: Option<BudgetExhausted>,
    load_reports: Option<LoadReportsDoc>,
    // An entry of `methods` only, and then alone: the method is hedged, not retried.
    hedging: Option<HedgingDoc>,
}

/// `retry.load_reports`: refuse retries to a dependency whose load reports (ORCA) say it
/// is saturated. Every key optional, defaults as [`SaturationConfig::default`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "an object of load report settings")]
struct LoadReportsDoc {
    utilization: Option<Finite>,
    queue_depth: Option<Finite>,
    window: Option<Human>,
}

impl LoadReportsDoc {
    fn build(&self) -> Result<SaturationConfig, ConfigError> {
        let mut c = SaturationConfig::default();
        if let Some(Finite(u)) = self.utilization {
            c.utilization = u;
        }
        if let Some(Finite(q)) = self.queue_depth {
            c.queue_depth = q;
        }
        if let Some(Human(w)) = self.window {
            c.window = w;
        }
        c.validate()?;
        Ok(c)
    }
}

/// `hedging` in an entry of `methods`: every key optional, defaults as
/// [`HedgingPolicy::default`] (and [`LearnedDelay::default`] with `delay: learned`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "an object of hedging settings")]
struct HedgingDoc {
    max_attempts: Option<Int<u32>>,
    delay: Option<DelayDoc>,
    non_fatal_codes: Option<CodeSet>,
    min_attempt_time: Option<Human>,
    max_pushback: Option<Human>,
    // With `delay: learned` only.
    percentile: Option<Finite>,
    floor: Option<Human>,
    ceiling: Option<Human>,
    min_samples: Option<Int<u32>>,
    window: Option<Human>,
}

/// `hedging.delay`: a duration (`"10ms"`) or `"learned"`.
#[derive(Clone, Copy)]
enum DelayDoc {
    Fixed(std::time::Duration),
    Learned,
}

impl<'de> Deserialize<'de> for DelayDoc {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = DelayDoc;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#"a duration with a unit such as "10ms", or "learned""#)
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<DelayDoc, E> {
                if s.trim() == "learned" {
                    return Ok(DelayDoc::Learned);
                }
                parse_duration(s)
                    .map(DelayDoc::Fixed)
                    .ok_or_else(|| E::invalid_value(Unexpected::Str(s), &self))
            }
        }
        d.deserialize_str(V)
    }
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum BackoffKind {
    FullJitter,
    #[serde(alias = "exponential")]
    A6,
}

/// What happens to a retry the budget refuses. Only one answer: the call returns its last
/// status at once (a retry that waited for budget would be the queue the budget prevents).
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum BudgetExhausted {
    FailFast,
}

/// `RetryPolicy::validate` names fields as the struct (and A6) spell them; this document
/// spells them as below.
const SPELLING: &[(&str, &str)] = &[
    ("maxAttempts", "max_attempts"),
    ("retryableStatusCodes", "retryable_codes"),
    ("perAttemptRecvTimeout", "per_attempt_timeout"),
    ("backoff.base", "base"),
    ("backoff.cap", "cap"),
    ("backoff.initialBackoff", "base"),
    ("backoff.maxBackoff", "cap"),
    ("backoff.multiplier", "multiplier"),
];

/// The same for `HedgingPolicy::validate` (the learned delay's names are this document's).
const HEDGING_SPELLING: &[(&str, &str)] = &[
    ("maxAttempts", "max_attempts"),
    ("nonFatalStatusCodes", "non_fatal_codes"),
];

impl Build for ClientDoc {
    type Config = ClientConfig;

    fn build(self) -> Result<ClientConfig, ConfigError> {
        if self.hedging {
            return Err(ConfigError::invalid(
                "hedging",
                "hedging is chosen per method or service, under `methods` \
                 (`methods: { \"/package.Service/Method\": { hedging: { ... } } }`): \
                 hedging a method says that running it more than once is harmless",
            ));
        }
        if self.retry.hedging.is_some() {
            return Err(ConfigError::invalid(
                "retry.hedging",
                "hedging is chosen per method or service, under `methods`; `retry` \
                 holds the retry policy of every other method",
            ));
        }
        let default = self.retry.policy(&RetryPolicy::default(), "retry")?;
        let mut methods = MethodTable::uniform(default.clone());
        if let Some(keyed) = self.retry.idempotency_key {
            methods.set_idempotency_key(MethodScope::Default, keyed);
        }
        for (path, entry) in &self.methods {
            let field = format!("methods.{path}");
            let (service, method) = method_path(path).ok_or_else(|| {
                ConfigError::invalid(
                    &field,
                    "a method is \"/package.Service/Method\", a service \"/package.Service/\"",
                )
            })?;
            let choice = match entry {
                Some(entry) => entry.method_choice(&default, &field)?,
                None => MethodPolicy::Neither,
            };
            let keyed = entry.as_ref().and_then(|e| e.idempotency_key);
            match (keyed, method) {
                (Some(keyed), Some(method)) => {
                    methods.set_idempotency_key(MethodScope::Method(service, method), keyed);
                }
                (Some(keyed), None) => {
                    methods.set_idempotency_key(MethodScope::Service(service), keyed)
                }
                (None, _) => {}
            }
            let scope = match method {
                Some(method) => MethodScope::Method(service, method),
                None => MethodScope::Service(service),
            };
            choice.set(&mut methods, scope);
        }
        let config = ClientConfig {
            methods,
            budget: BudgetChoice::Stormguard(self.retry.budget.unwrap_or_default()),
            breaker: self.breaker,
            adaptive_throttle: self.adaptive_throttle,
            load_reports: self
                .retry
                .load_reports
                .as_ref()
                .map(LoadReportsDoc::build)
                .transpose()?,
            seed: None,
            not_applied: Vec::new(),
        };
        config.validate()?;
        Ok(config)
    }
}

impl PolicyDoc {
    /// `inherit` with what this entry sets, validated; `field` is the entry's place in the
    /// document (`retry`, `methods./pkg.Svc/Get`).
    fn policy(&self, inherit: &RetryPolicy, field: &str) -> Result<RetryPolicy, ConfigError> {
        let mut policy = inherit.clone();
        if let Some(Int(n)) = self.max_attempts {
            if n < 2 {
                return Err(ConfigError::invalid(
                    format!("{field}.max_attempts"),
                    "must be at least 2 (one retry); a method that must not be retried is \
                     given `null` under `methods`",
                ));
            }
            policy.max_attempts = n;
        }
        let (kind, base, cap, multiplier) = match inherit.backoff {
            BackoffConfig::FullJitter {
                base,
                cap,
                multiplier,
            } => (BackoffKind::FullJitter, base, cap, multiplier),
            BackoffConfig::A6 {
                initial,
                max,
                multiplier,
            } => (BackoffKind::A6, initial, max, multiplier),
        };
        let base = self.base.map_or(base, |d| d.0);
        let cap = self.cap.map_or(cap, |d| d.0);
        let multiplier = self.multiplier.map_or(multiplier, |m| m.0);
        policy.backoff = match self.backoff.unwrap_or(kind) {
            BackoffKind::FullJitter => BackoffConfig::FullJitter {
                base,
                cap,
                multiplier,
            },
            BackoffKind::A6 => BackoffConfig::A6 {
                initial: base,
                max: cap,
                multiplier,
            },
        };
        if let Some(codes) = self.retryable_codes {
            policy.retryable_codes = codes;
        }
        if let Some(idempotent) = self.idempotent {
            policy.idempotent = idempotent;
        }
        if let Some(d) = self.min_attempt_time {
            policy.min_attempt_time = d.0;
        }
        if let Some(d) = self.max_pushback {
            policy.max_pushback = d.0;
        }
        if let Some(d) = self.per_attempt_timeout {
            policy.per_attempt_timeout = Some(d.0);
        }
        policy
            .validate(field)
            .map_err(|e| e.renamed(field, SPELLING))?;
        Ok(policy)
    }

    /// What an entry of `methods` gives what it names: a hedging policy when it has
    /// `hedging` (and then nothing else), else [`PolicyDoc::policy`]; it cannot set what
    /// belongs to the whole layer.
    fn method_choice(
        &self,
        inherit: &RetryPolicy,
        field: &str,
    ) -> Result<MethodPolicy, ConfigError> {
        let layer_wide = [
            ("budget", self.budget.is_some()),
            ("budget_exhausted", self.budget_exhausted.is_some()),
            ("load_reports", self.load_reports.is_some()),
        ];
        if let Some((key, _)) = layer_wide.iter().find(|(_, set)| *set) {
            return Err(ConfigError::invalid(
                format!("{field}.{key}"),
                format!("every method of a layer shares one budget: set it as `retry.{key}`"),
            ));
        }
        let Some(hedging) = &self.hedging else {
            return self.policy(inherit, field).map(MethodPolicy::Retry);
        };
        if let Some(key) = self.retry_settings().first() {
            let instead = match *key {
                "max_attempts" | "min_attempt_time" | "max_pushback" => {
                    format!(": set `hedging.{key}` instead")
                }
                "idempotent" => {
                    ": a hedged method is taken for idempotent (hedging sends it more than once)"
                        .to_owned()
                }
                _ => String::new(),
            };
            return Err(ConfigError::invalid(
                format!("{field}.{key}"),
                format!(
                    "a method is retried or hedged, not both, and this entry has `hedging`, \
                     so it takes no retry settings{instead}"
                ),
            ));
        }
        hedging
            .policy(&format!("{field}.hedging"))
            .map(MethodPolicy::Hedge)
    }

    /// The retry settings this entry sets, in the order they are written above.
    fn retry_settings(&self) -> Vec<&'static str> {
        [
            ("max_attempts", self.max_attempts.is_some()),
            ("backoff", self.backoff.is_some()),
            ("base", self.base.is_some()),
            ("cap", self.cap.is_some()),
            ("multiplier", self.multiplier.is_some()),
            ("retryable_codes", self.retryable_codes.is_some()),
            ("idempotent", self.idempotent.is_some()),
            ("min_attempt_time", self.min_attempt_time.is_some()),
            ("max_pushback", self.max_pushback.is_some()),
            ("per_attempt_timeout", self.per_attempt_timeout.is_some()),
        ]
        .into_iter()
        .filter_map(|(key, set)| set.then_some(key))
        .collect()
    }
}

impl HedgingDoc {
    /// The policy it describes, validated; `field` is its place (`methods./pkg.Svc/Get.hedging`).
    fn policy(&self, field: &str) -> Result<HedgingPolicy, ConfigError> {
        let default = HedgingPolicy::default();
        let delay = match self.delay {
            Some(DelayDoc::Learned) => {
                let d = LearnedDelay::default();
                HedgeDelay::Learned(LearnedDelay {
                    percentile: self.percentile.map_or(d.percentile, |p| p.0),
                    floor: self.floor.map_or(d.floor, |h| h.0),
                    ceiling: self.ceiling.map_or(d.ceiling, |h| h.0),
                    min_samples: self.min_samples.map_or(d.min_samples, |n| n.0),
                    window: self.window.map_or(d.window, |h| h.0),
                })
            }
            Some(DelayDoc::Fixed(d)) => self.fixed(field, HedgeDelay::Fixed(d))?,
            None => self.fixed(field, default.delay)?,
        };
        let policy = HedgingPolicy {
            max_attempts: self.max_attempts.map_or(default.max_attempts, |n| n.0),
            delay,
            non_fatal_codes: self.non_fatal_codes.unwrap_or(default.non_fatal_codes),
            min_attempt_time: self
                .min_attempt_time
                .map_or(default.min_attempt_time, |h| h.0),
            max_pushback: self.max_pushback.map_or(default.max_pushback, |h| h.0),
        };
        policy
            .validate(field)
            .map_err(|e| e.renamed(field, HEDGING_SPELLING))?;
        Ok(policy)
    }

    /// `delay`, a fixed one, when no setting of a learned delay is written beside it.
    fn fixed(&self, field: &str, delay: HedgeDelay) -> Result<HedgeDelay, ConfigError> {
        let learned = [
            ("percentile", self.percentile.is_some()),
            ("floor", self.floor.is_some()),
            ("ceiling", self.ceiling.is_some()),
            ("min_samples", self.min_samples.is_some()),
            ("window", self.window.is_some()),
        ];
        match learned.iter().find(|(_, set)| *set) {
            Some((key, _)) => Err(ConfigError::invalid(
                format!("{field}.{key}"),
                "is a setting of a learned delay: write `delay: learned` beside it, or leave \
                 it out for a fixed delay",
            )),
            None => Ok(delay),
        }
    }
}

/// `("pkg.Svc", Some("Get"))` for `"/pkg.Svc/Get"`, `("pkg.Svc", None)` for `"/pkg.Svc/"`.
fn method_path(path: &str) -> Option<(&str, Option<&str>)> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    if service.is_empty() || method.contains('/') {
        return None;
    }
    Some((service, Some(method).filter(|m| !m.is_empty())))
}
