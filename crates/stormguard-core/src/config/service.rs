//! The standard gRPC service config: `methodConfig[]` and `retryThrottling`, read the way
//! gRPC reads them. Fields gRPC does not define are skipped, as gRPC skips them, and
//! fields stormguard does not act on are skipped too; both are listed in
//! [`ClientConfig::notices`] rather than dropped without a word.
//!
//! An entry of `methodConfig` gives the methods it names a `retryPolicy` or a
//! `hedgingPolicy` (A6: never both), or neither: then they are neither retried nor hedged.
//! As in gRPC, the most specific entry for a method decides.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::document;
use super::notice::NotApplied;
use super::{BudgetChoice, ClientConfig, MethodPolicy};
use crate::budget::A6BudgetConfig;
use crate::error::ConfigError;
use crate::field::duration::Proto;
use crate::field::{Finite, Int};
use crate::retry::BackoffConfig;
use crate::retry::{HedgeDelay, HedgingPolicy};
use crate::retry::{MethodScope, MethodTable, RetryPolicy};
use crate::wire::code::CodeSet;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", expecting = "a gRPC service config object")]
struct ServiceConfigDoc {
    #[serde(default)]
    method_config: Vec<MethodConfigDoc>,
    retry_throttling: Option<A6BudgetConfig>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", expecting = "a `methodConfig` entry")]
struct MethodConfigDoc {
    name: Vec<NameDoc>,
    retry_policy: Option<A6PolicyDoc>,
    hedging_policy: Option<A6HedgingDoc>,
    /// The method's default deadline: what a call gets when its caller set none.
    timeout: Option<Proto>,
}

#[derive(Deserialize)]
#[serde(expecting = "a method name (`service`, `method`)")]
struct NameDoc {
    service: Option<String>,
    method: Option<String>,
}

/// A6 `retryPolicy`: every field required but `perAttemptRecvTimeout`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", expecting = "a `retryPolicy` object")]
struct A6PolicyDoc {
    max_attempts: Int<u32>,
    initial_backoff: Proto,
    max_backoff: Proto,
    backoff_multiplier: Finite,
    retryable_status_codes: CodeSet,
    per_attempt_recv_timeout: Option<Proto>,
}

/// A6 `hedgingPolicy`: `maxAttempts` required, `hedgingDelay` 0 s (every copy at once)
/// and `nonFatalStatusCodes` none when left out.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", expecting = "a `hedgingPolicy` object")]
struct A6HedgingDoc {
    max_attempts: Int<u32>,
    hedging_delay: Option<Proto>,
    #[serde(default)]
    non_fatal_status_codes: CodeSet,
}

/// The backoff fields sit directly in `retryPolicy`, not in a `backoff` object.
const SPELLING: &[(&str, &str)] = &[
    ("backoff.initialBackoff", "initialBackoff"),
    ("backoff.maxBackoff", "maxBackoff"),
    ("backoff.multiplier", "backoffMultiplier"),
];

/// Reads a service config's root object.
pub(super) fn read(root: Map<String, Value>) -> Result<ClientConfig, ConfigError> {
    let mut not_applied = Vec::new();
    let doc: ServiceConfigDoc =
        document::lenient(root, |path| not_applied.push(NotApplied::skipped(path)))?;
    let mut methods = MethodTable::none();
    for (i, entry) in doc.method_config.iter().enumerate() {
        let field = format!("methodConfig[{i}]");
        let choice = match (&entry.retry_policy, &entry.hedging_policy) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::invalid(
                    field,
                    "has both `retryPolicy` and `hedgingPolicy`; a method is retried or \
                     hedged, not both (gRPC A6): keep one",
                ));
            }
            (Some(p), None) => MethodPolicy::Retry(p.policy(&format!("{field}.retryPolicy"))?),
            (None, Some(h)) => MethodPolicy::Hedge(h.policy(&format!("{field}.hedgingPolicy"))?),
            (None, None) => MethodPolicy::Neither,
        };
        let timeout = entry.timeout.map(|t| t.0);
        if timeout.is_some_and(|t| t.is_zero()) {
            return Err(ConfigError::invalid(
                format!("{field}.timeout"),
                "must be greater than 0",
            ));
        }
        for (j, name) in entry.name.iter().enumerate() {
            let service = name.service.as_deref().unwrap_or("");
            let method = name.method.as_deref().unwrap_or("");
            let scope = match (service, method) {
                ("", "") => MethodScope::Default,
                ("", _) => {
                    return Err(ConfigError::invalid(
                        format!("{field}.name[{j}].service"),
                        "a method name needs its service",
                    ));
                }
                (s, "") => MethodScope::Service(s),
                (s, m) => MethodScope::Method(s, m),
            };
            choice.set(&mut methods, scope);
            methods.set_timeout(scope, timeout);
        }
    }
    let budget = match doc.retry_throttling {
        Some(throttle) => {
            throttle.validate()?;
            BudgetChoice::A6(throttle)
        }
        None => BudgetChoice::default(),
    };
    Ok(ClientConfig {
        methods,
        budget,
        breaker: None,
        adaptive_throttle: None,
        load_reports: None,
        seed: None,
        not_applied,
    })
}

impl A6PolicyDoc {
    fn policy(&self, field: &str) -> Result<RetryPolicy, ConfigError> {
        let policy = RetryPolicy {
            max_attempts: self.max_attempts.0,
            retryable_codes: self.retryable_status_codes,
            per_attempt_timeout: self.per_attempt_recv_timeout.map(|t| t.0),
            // gRPC retries every method its service config gives a retry policy: naming the
            // method there is the user's statement that repeating it is harmless.
            idempotent: true,
            backoff: BackoffConfig::A6 {
                initial: self.initial_backoff.0,
                max: self.max_backoff.0,
                multiplier: self.backoff_multiplier.0,
            },
            ..RetryPolicy::default()
        };
        policy
            .validate(field)
            .map_err(|e| e.renamed(field, SPELLING))?;
        Ok(policy)
    }
}

impl A6HedgingDoc {
    fn policy(&self, field: &str) -> Result<HedgingPolicy, ConfigError> {
        let policy = HedgingPolicy {
            max_attempts: self.max_attempts.0,
            delay: HedgeDelay::Fixed(self.hedging_delay.map_or(Duration::ZERO, |d| d.0)),
            non_fatal_codes: self.non_fatal_status_codes,
            // Not in A6's hedgingPolicy: stormguard's defaults, as for a retry policy.
            ..HedgingPolicy::default()
        };
        // `validate` names the fields as A6 spells them (`maxAttempts`,
        // `nonFatalStatusCodes`).
        policy.validate(field)?;
        Ok(policy)
    }
}
