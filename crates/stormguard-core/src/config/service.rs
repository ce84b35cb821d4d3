//! The standard gRPC service config: `methodConfig[]` and `retryThrottling`, read the way
//! gRPC reads them. Fields gRPC does not define are skipped, as gRPC skips them, and
//! fields stormguard does not act on are skipped too; both are listed in
//! [`ClientConfig::not_applied`] rather than dropped without a word.

use serde::Deserialize;
use serde_json::{Map, Value};

use super::document;
use super::duration::Proto;
use super::notice::NotApplied;
use super::value::{Finite, Int, present};
use super::{BudgetChoice, ClientConfig};
use crate::backoff::BackoffConfig;
use crate::code::CodeSet;
use crate::error::ConfigError;
use crate::policy::{MethodTable, RetryPolicy};
use crate::throttle::ThrottleConfig;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", expecting = "a gRPC service config object")]
struct ServiceConfigDoc {
    #[serde(default)]
    method_config: Vec<MethodConfigDoc>,
    retry_throttling: Option<ThrottleConfig>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", expecting = "a `methodConfig` entry")]
struct MethodConfigDoc {
    name: Vec<NameDoc>,
    retry_policy: Option<A6PolicyDoc>,
    #[serde(default, deserialize_with = "present")]
    hedging_policy: bool,
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
        if entry.hedging_policy {
            return Err(ConfigError::invalid(
                format!("{field}.hedgingPolicy"),
                "hedging is not supported; use `retryPolicy` (a hedging policy is refused \
                 rather than dropped, so that calls are never sent other than as configured)",
            ));
        }
        let policy = match &entry.retry_policy {
            Some(p) => Some(p.policy(&format!("{field}.retryPolicy"))?),
            None => None,
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
            match (service, method) {
                ("", "") => {
                    methods.set_default(policy.clone());
                    methods.set_default_timeout(timeout);
                }
                ("", _) => {
                    return Err(ConfigError::invalid(
                        format!("{field}.name[{j}].service"),
                        "a method name needs its service",
                    ));
                }
                (s, "") => {
                    methods.insert_service(s, policy.clone());
                    methods.insert_service_timeout(s, timeout);
                }
                (s, m) => {
                    methods.insert_method(s, m, policy.clone());
                    methods.insert_method_timeout(s, m, timeout);
                }
            }
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
