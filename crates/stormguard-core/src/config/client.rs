//! stormguard's own shape of a client config: `retry`, `breaker` and `methods` (see the
//! [module docs](super)).

use std::collections::BTreeMap;

use serde::Deserialize;

use super::document::Build;
use super::duration::Human;
use super::value::{Finite, Int};
use super::{BudgetChoice, ClientConfig};
use crate::backoff::BackoffConfig;
use crate::breaker::BreakerConfig;
use crate::budget::BudgetConfig;
use crate::code::CodeSet;
use crate::error::ConfigError;
use crate::policy::{MethodTable, RetryPolicy};

/// The document: every key optional, unknown keys refused (a typo must not quietly fall
/// back to a default).
#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "stormguard's client config (`retry`, `breaker`, `methods`)"
)]
pub(super) struct ClientDoc {
    #[serde(default)]
    retry: PolicyDoc,
    breaker: Option<BreakerConfig>,
    /// By `/package.Service/Method` or `/package.Service/`; `null`: not retried.
    #[serde(default)]
    methods: BTreeMap<String, Option<PolicyDoc>>,
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
    min_attempt_time: Option<Human>,
    max_pushback: Option<Human>,
    per_attempt_timeout: Option<Human>,
    // The layer's, under `retry` only.
    budget: Option<BudgetConfig>,
    budget_exhausted: Option<BudgetExhausted>,
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

impl Build for ClientDoc {
    type Config = ClientConfig;

    fn build(self) -> Result<ClientConfig, ConfigError> {
        let default = self.retry.policy(&RetryPolicy::default(), "retry")?;
        let mut methods = MethodTable::uniform(default.clone());
        for (path, entry) in &self.methods {
            let field = format!("methods.{path}");
            let (service, method) = method_path(path).ok_or_else(|| {
                ConfigError::invalid(
                    &field,
                    "a method is \"/package.Service/Method\", a service \"/package.Service/\"",
                )
            })?;
            let policy = match entry {
                Some(entry) => Some(entry.method_policy(&default, &field)?),
                None => None,
            };
            match method {
                Some(method) => methods.insert_method(service, method, policy),
                None => methods.insert_service(service, policy),
            }
        }
        let config = ClientConfig {
            methods,
            budget: BudgetChoice::Stormguard(self.retry.budget.unwrap_or_default()),
            breaker: self.breaker,
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

    /// [`PolicyDoc::policy`] for an entry of `methods`, which cannot set what belongs to
    /// the whole layer.
    fn method_policy(
        &self,
        inherit: &RetryPolicy,
        field: &str,
    ) -> Result<RetryPolicy, ConfigError> {
        let layer_wide = [
            ("budget", self.budget.is_some()),
            ("budget_exhausted", self.budget_exhausted.is_some()),
        ];
        if let Some((key, _)) = layer_wide.iter().find(|(_, set)| *set) {
            return Err(ConfigError::invalid(
                format!("{field}.{key}"),
                format!("every method of a layer shares one budget: set it as `retry.{key}`"),
            ));
        }
        self.policy(inherit, field)
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
