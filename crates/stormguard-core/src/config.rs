//! Configuration: typed, validated, with errors that name the field.
//!
//! Two document shapes are read into one [`ClientConfig`]:
//!
//! * the **standard gRPC service config** (what gRPC clients in every language already
//!   read): `methodConfig[].name` / `retryPolicy` and `retryThrottling`, with proto3 JSON
//!   durations (`"0.1s"`) and status codes by name (any case) or number. Its retry policies
//!   use the A6 backoff and its `retryThrottling` becomes the A6 token bucket; without
//!   `retryThrottling` retries are paid from stormguard's budget with default settings; a
//!   method's `timeout` becomes its default deadline
//!   ([`MethodTable::timeout`](crate::policy::MethodTable::timeout)), and a
//!   `hedgingPolicy` is refused with an error (stormguard does not hedge);
//! * stormguard's own shape, for users who want the budget and full jitter:
//!
//! ```json
//! { "retry": {
//!     "max_attempts": 3,
//!     "backoff": "full_jitter", "base": "50ms", "cap": "2s", "max_pushback": "30s",
//!     "per_attempt_timeout": "50ms",
//!     "retryable_codes": ["UNAVAILABLE"], "idempotent": true,
//!     "budget": { "ttl": "10s", "min_retries_per_second": 5, "retry_ratio": 0.1,
//!                 "fleet_size": 1 },
//!     "budget_exhausted": "fail_fast" } }
//! ```
//!
//! `idempotent` defaults to `false`, as in [`RetryPolicy`]: without it, only requests that
//! never reached the server are retried.
//!
//! Every value is checked; an error names the field as a dotted path and says why, so a bad
//! deploy fails loudly at start-up rather than quietly retrying everything.

use std::path::Path;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::backoff::BackoffConfig;
use crate::breaker::BreakerConfig;
use crate::budget::BudgetConfig;
use crate::code::{Code, CodeSet};
pub use crate::error::ConfigError;
use crate::policy::{MethodTable, RetryPolicy};
use crate::throttle::ThrottleConfig;

/// Which budget pays for retries.
#[derive(Clone, Debug, PartialEq)]
pub enum BudgetChoice {
    /// stormguard's windowed budget: retries ≤ `retry_ratio` of successes, plus a floor.
    Stormguard(BudgetConfig),
    /// gRPC A6 `retryThrottling`.
    A6(ThrottleConfig),
}

impl Default for BudgetChoice {
    fn default() -> Self {
        BudgetChoice::Stormguard(BudgetConfig::default())
    }
}

/// Everything the client retry controller needs.
///
/// ```
/// use stormguard_core::config::{BudgetChoice, ClientConfig};
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
    /// Retry policies by method.
    pub methods: MethodTable,
    /// What pays for retries.
    pub budget: BudgetChoice,
    /// The circuit breaker, if any.
    pub breaker: Option<BreakerConfig>,
}

impl ClientConfig {
    /// stormguard's defaults for every method: retry `UNAVAILABLE`, 3 attempts, full jitter,
    /// the default budget, no breaker. No method is taken for idempotent, so only requests
    /// that never reached the server are retried; mark the methods that are safe to repeat
    /// with a policy of their own (see [`policy`](crate::policy)).
    pub fn standard() -> Self {
        ClientConfig {
            methods: MethodTable::uniform(RetryPolicy::default()),
            budget: BudgetChoice::default(),
            breaker: None,
        }
    }

    /// No retries at all (the layer still counts and stamps headers).
    pub fn no_retries() -> Self {
        ClientConfig {
            methods: MethodTable::none(),
            ..ClientConfig::default()
        }
    }

    /// Checks every part.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for policy in self.methods.policies() {
            policy.validate("retry")?;
        }
        match &self.budget {
            BudgetChoice::Stormguard(b) => b.validate()?,
            BudgetChoice::A6(t) => t.validate()?,
        }
        if let Some(b) = &self.breaker {
            b.validate()?;
        }
        Ok(())
    }

    /// Reads a config file, JSON, YAML or TOML by its extension (`.json`, `.yaml` / `.yml`,
    /// `.toml`), in either shape: a standard gRPC service config when its root has
    /// `methodConfig` or `retryThrottling`, stormguard's own shape otherwise.
    ///
    /// ```no_run
    /// use stormguard_core::config::ClientConfig;
    ///
    /// let config = ClientConfig::from_path("retry.yaml")?;
    /// # Ok::<(), stormguard_core::config::ConfigError>(())
    /// ```
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        Self::from_document(read_document(path.as_ref())?)
    }

    /// [`ClientConfig::from_path`] for a document already in memory.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard_core::config::{BudgetChoice, ClientConfig, Format};
    ///
    /// let yaml = "
    /// retry:
    ///   budget:
    ///     ttl: 10s
    ///     min_retries_per_second: 5
    ///     retry_ratio: 0.1
    ///   backoff: full_jitter
    ///   base: 100ms
    ///   max_attempts: 3
    ///   budget_exhausted: fail_fast
    /// ";
    /// let config = ClientConfig::from_text(yaml, Format::Yaml).unwrap();
    /// let BudgetChoice::Stormguard(budget) = &config.budget else { panic!() };
    /// assert_eq!(budget.ttl, Duration::from_secs(10));
    ///
    /// let toml = "[retry]\nmax_attempts = 3\nbase = \"100ms\"\n[retry.budget]\nttl = \"10s\"\n";
    /// assert_eq!(ClientConfig::from_text(toml, Format::Toml).unwrap(), config);
    /// ```
    pub fn from_text(text: &str, format: Format) -> Result<Self, ConfigError> {
        Self::from_document(parse_document(text, format)?)
    }

    fn from_document(root: Map<String, Value>) -> Result<Self, ConfigError> {
        let service_config = ["methodConfig", "retryThrottling"]
            .iter()
            .any(|key| root.contains_key(*key));
        if service_config {
            Self::from_service_config(&root)
        } else {
            Self::from_stormguard(&root)
        }
    }

    /// Reads a standard gRPC service config (JSON).
    pub fn from_service_config_json(json: &str) -> Result<Self, ConfigError> {
        Self::from_service_config(&parse_object(json)?)
    }

    fn from_service_config(root: &Map<String, Value>) -> Result<Self, ConfigError> {
        let mut methods = MethodTable::none();
        if let Some(list) = root.get("methodConfig") {
            let list = list
                .as_array()
                .ok_or_else(|| ConfigError::invalid("methodConfig", "must be an array"))?;
            for (i, entry) in list.iter().enumerate() {
                let field = format!("methodConfig[{i}]");
                let entry = as_object(entry, &field)?;
                if entry.contains_key("hedgingPolicy") {
                    return Err(ConfigError::invalid(
                        format!("{field}.hedgingPolicy"),
                        "hedging is not supported; use `retryPolicy` (a hedging policy is \
                         refused rather than dropped, so that calls are never sent other \
                         than as configured)",
                    ));
                }
                let policy = match entry.get("retryPolicy") {
                    Some(p) => Some(a6_retry_policy(p, &format!("{field}.retryPolicy"))?),
                    None => None,
                };
                // The method's default deadline: what a call gets when its caller set none.
                let timeout = match entry.get("timeout") {
                    Some(t) => {
                        let tf = format!("{field}.timeout");
                        let t = proto_duration(t, &tf)?;
                        if t.is_zero() {
                            return Err(ConfigError::invalid(tf, "must be greater than 0"));
                        }
                        Some(t)
                    }
                    None => None,
                };
                let names = entry.get("name").and_then(Value::as_array).ok_or_else(|| {
                    ConfigError::invalid(format!("{field}.name"), "must be an array of names")
                })?;
                for (j, name) in names.iter().enumerate() {
                    let nf = format!("{field}.name[{j}]");
                    let name = as_object(name, &nf)?;
                    let service = opt_str(name, "service", &nf)?.unwrap_or("");
                    let method = opt_str(name, "method", &nf)?.unwrap_or("");
                    match (service, method) {
                        ("", "") => {
                            methods.set_default(policy.clone());
                            methods.set_default_timeout(timeout);
                        }
                        ("", _) => {
                            return Err(ConfigError::invalid(
                                format!("{nf}.service"),
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
        }
        let budget = match root.get("retryThrottling") {
            Some(t) => {
                let t = as_object(t, "retryThrottling")?;
                let config = ThrottleConfig {
                    max_tokens: req_f64(t, "maxTokens", "retryThrottling")?,
                    token_ratio: req_f64(t, "tokenRatio", "retryThrottling")?,
                };
                config.validate()?;
                BudgetChoice::A6(config)
            }
            None => BudgetChoice::default(),
        };
        Ok(ClientConfig {
            methods,
            budget,
            breaker: None,
        })
    }

    /// Reads stormguard's own shape (see the [module docs](self)). Every field is optional
    /// and defaults as in [`ClientConfig::standard`]; unknown fields are errors (a typo must
    /// not silently fall back to a default).
    pub fn from_json(json: &str) -> Result<Self, ConfigError> {
        Self::from_stormguard(&parse_object(json)?)
    }

    fn from_stormguard(root: &Map<String, Value>) -> Result<Self, ConfigError> {
        check_keys(root, "", &["retry", "breaker"])?;
        let mut policy = RetryPolicy::default();
        let mut budget = BudgetConfig::default();
        if let Some(retry) = root.get("retry") {
            let r = as_object(retry, "retry")?;
            check_keys(
                r,
                "retry",
                &[
                    "max_attempts",
                    "backoff",
                    "base",
                    "cap",
                    "multiplier",
                    "retryable_codes",
                    "idempotent",
                    "min_attempt_time",
                    "max_pushback",
                    "per_attempt_timeout",
                    "budget",
                    "budget_exhausted",
                ],
            )?;
            if let Some(v) = r.get("max_attempts") {
                policy.max_attempts = as_u32(v, "retry.max_attempts")?;
                if policy.max_attempts < 2 {
                    return Err(ConfigError::invalid(
                        "retry.max_attempts",
                        "must be at least 2 (one retry); leave `retry` out to disable retries",
                    ));
                }
            }
            let (mut base, mut cap, mut multiplier) =
                (Duration::from_millis(50), Duration::from_secs(2), 2.0);
            if let Some(v) = r.get("base") {
                base = as_duration(v, "retry.base")?;
            }
            if let Some(v) = r.get("cap") {
                cap = as_duration(v, "retry.cap")?;
            }
            if let Some(v) = r.get("multiplier") {
                multiplier = as_f64(v, "retry.multiplier")?;
            }
            policy.backoff = match r
                .get("backoff")
                .map(|v| as_str(v, "retry.backoff"))
                .transpose()?
            {
                None | Some("full_jitter") => BackoffConfig::FullJitter {
                    base,
                    cap,
                    multiplier,
                },
                Some("a6") | Some("exponential") => BackoffConfig::A6 {
                    initial: base,
                    max: cap,
                    multiplier,
                },
                Some(other) => {
                    return Err(ConfigError::invalid(
                        "retry.backoff",
                        format!("expected \"full_jitter\" or \"a6\", got {other:?}"),
                    ));
                }
            };
            if let Some(v) = r.get("retryable_codes") {
                policy.retryable_codes = codes(v, "retry.retryable_codes")?;
            }
            if let Some(v) = r.get("idempotent") {
                policy.idempotent = v.as_bool().ok_or_else(|| {
                    ConfigError::invalid("retry.idempotent", "must be true or false")
                })?;
            }
            if let Some(v) = r.get("min_attempt_time") {
                policy.min_attempt_time = as_duration(v, "retry.min_attempt_time")?;
            }
            if let Some(v) = r.get("max_pushback") {
                policy.max_pushback = as_duration(v, "retry.max_pushback")?;
            }
            if let Some(v) = r.get("per_attempt_timeout") {
                policy.per_attempt_timeout = Some(as_duration(v, "retry.per_attempt_timeout")?);
            }
            if let Some(v) = r.get("budget_exhausted") {
                match as_str(v, "retry.budget_exhausted")? {
                    "fail_fast" => {}
                    other => {
                        return Err(ConfigError::invalid(
                            "retry.budget_exhausted",
                            format!(
                                "only \"fail_fast\" is supported (a retry the budget refuses returns the last status at once), got {other:?}"
                            ),
                        ));
                    }
                }
            }
            if let Some(b) = r.get("budget") {
                let b = as_object(b, "retry.budget")?;
                check_keys(
                    b,
                    "retry.budget",
                    &["ttl", "min_retries_per_second", "retry_ratio", "fleet_size"],
                )?;
                if let Some(v) = b.get("ttl") {
                    budget.ttl = as_duration(v, "retry.budget.ttl")?;
                }
                if let Some(v) = b.get("min_retries_per_second") {
                    budget.min_retries_per_second =
                        as_u32(v, "retry.budget.min_retries_per_second")?;
                }
                if let Some(v) = b.get("retry_ratio") {
                    budget.retry_ratio = as_f64(v, "retry.budget.retry_ratio")?;
                }
                if let Some(v) = b.get("fleet_size") {
                    budget.fleet_size = as_u32(v, "retry.budget.fleet_size")?;
                }
            }
        }
        let breaker = match root.get("breaker") {
            None | Some(Value::Null) => None,
            Some(v) => Some(breaker_config(v)?),
        };
        // `RetryPolicy::validate` names fields as the struct (and A6) spell them; this
        // document spells them `retry.base`, `retry.retryable_codes`, ...
        policy.validate("retry").map_err(|e| {
            e.renamed(&[
                ("retry.maxAttempts", "retry.max_attempts"),
                ("retry.retryableStatusCodes", "retry.retryable_codes"),
                ("retry.perAttemptRecvTimeout", "retry.per_attempt_timeout"),
                ("retry.backoff.base", "retry.base"),
                ("retry.backoff.cap", "retry.cap"),
                ("retry.backoff.initialBackoff", "retry.base"),
                ("retry.backoff.maxBackoff", "retry.cap"),
                ("retry.backoff.multiplier", "retry.multiplier"),
            ])
        })?;
        let config = ClientConfig {
            methods: MethodTable::uniform(policy),
            budget: BudgetChoice::Stormguard(budget),
            breaker,
        };
        config.validate()?;
        Ok(config)
    }
}

fn breaker_config(v: &Value) -> Result<BreakerConfig, ConfigError> {
    let b = as_object(v, "breaker")?;
    check_keys(
        b,
        "breaker",
        &[
            "failure_rate",
            "window",
            "min_requests",
            "open_for",
            "open_jitter",
            "half_open_probes",
        ],
    )?;
    let mut c = BreakerConfig::default();
    if let Some(v) = b.get("failure_rate") {
        c.failure_rate = as_f64(v, "breaker.failure_rate")?;
    }
    if let Some(v) = b.get("window") {
        c.window = as_duration(v, "breaker.window")?;
    }
    if let Some(v) = b.get("min_requests") {
        c.min_requests = as_u32(v, "breaker.min_requests")?;
    }
    if let Some(v) = b.get("open_for") {
        c.open_for = as_duration(v, "breaker.open_for")?;
    }
    if let Some(v) = b.get("open_jitter") {
        c.open_jitter = as_f64(v, "breaker.open_jitter")?;
    }
    if let Some(v) = b.get("half_open_probes") {
        c.half_open_probes = as_u32(v, "breaker.half_open_probes")?;
    }
    Ok(c)
}

/// A6 `retryPolicy`: every field required.
fn a6_retry_policy(v: &Value, field: &str) -> Result<RetryPolicy, ConfigError> {
    let p = as_object(v, field)?;
    let max_attempts = as_u32(
        req(p, "maxAttempts", field)?,
        &format!("{field}.maxAttempts"),
    )?;
    let initial = proto_duration(
        req(p, "initialBackoff", field)?,
        &format!("{field}.initialBackoff"),
    )?;
    let max = proto_duration(req(p, "maxBackoff", field)?, &format!("{field}.maxBackoff"))?;
    let multiplier = req_f64(p, "backoffMultiplier", field)?;
    let retryable_codes = codes(
        req(p, "retryableStatusCodes", field)?,
        &format!("{field}.retryableStatusCodes"),
    )?;
    // Optional, as in gRPC's service config.
    let per_attempt_timeout = p
        .get("perAttemptRecvTimeout")
        .map(|v| proto_duration(v, &format!("{field}.perAttemptRecvTimeout")))
        .transpose()?;
    let policy = RetryPolicy {
        max_attempts,
        retryable_codes,
        per_attempt_timeout,
        // gRPC retries every method its service config gives a retry policy: naming the
        // method there is the user's statement that repeating it is harmless.
        idempotent: true,
        backoff: BackoffConfig::A6 {
            initial,
            max,
            multiplier,
        },
        ..RetryPolicy::default()
    };
    // The backoff fields sit directly in `retryPolicy`, not in a `backoff` object.
    policy.validate(field).map_err(|e| {
        e.renamed(&[
            (
                &format!("{field}.backoff.initialBackoff"),
                &format!("{field}.initialBackoff"),
            ),
            (
                &format!("{field}.backoff.maxBackoff"),
                &format!("{field}.maxBackoff"),
            ),
            (
                &format!("{field}.backoff.multiplier"),
                &format!("{field}.backoffMultiplier"),
            ),
        ])
    })?;
    Ok(policy)
}

pub(crate) fn parse_object(json: &str) -> Result<Map<String, Value>, ConfigError> {
    match serde_json::from_str::<Value>(json) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ConfigError::Malformed(
            "the document must be a JSON object".into(),
        )),
        Err(e) => Err(ConfigError::Malformed(e.to_string())),
    }
}

pub(crate) fn check_keys(
    map: &Map<String, Value>,
    field: &str,
    known: &[&str],
) -> Result<(), ConfigError> {
    for key in map.keys() {
        if !known.contains(&key.as_str()) {
            let path = if field.is_empty() {
                key.clone()
            } else {
                format!("{field}.{key}")
            };
            return Err(ConfigError::invalid(
                path,
                format!("unknown field; expected one of {}", known.join(", ")),
            ));
        }
    }
    Ok(())
}

/// The format of a config document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// JSON (`.json`).
    Json,
    /// YAML (`.yaml`, `.yml`).
    Yaml,
    /// TOML (`.toml`).
    Toml,
}

impl Format {
    /// The format a file's extension names.
    ///
    /// ```
    /// use std::path::Path;
    /// use stormguard_core::config::Format;
    ///
    /// assert_eq!(Format::from_path(Path::new("retry.yml")).unwrap(), Format::Yaml);
    /// assert!(Format::from_path(Path::new("retry.ini")).is_err());
    /// ```
    pub fn from_path(path: &Path) -> Result<Format, ConfigError> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("json") => Ok(Format::Json),
            Some("yaml" | "yml") => Ok(Format::Yaml),
            Some("toml") => Ok(Format::Toml),
            _ => Err(ConfigError::Read {
                path: path.display().to_string(),
                reason: "the name must end in .json, .yaml, .yml or .toml".to_owned(),
            }),
        }
    }
}

/// A document's root object, in any [`Format`]. An empty YAML document is an empty object.
pub(crate) fn parse_document(
    text: &str,
    format: Format,
) -> Result<Map<String, Value>, ConfigError> {
    let root: Value = match format {
        Format::Json => return parse_object(text),
        Format::Yaml => serde_norway::from_str(text)
            .map_err(|e| ConfigError::Malformed(format!("YAML: {e}")))?,
        Format::Toml => {
            toml::from_str(text).map_err(|e| ConfigError::Malformed(format!("TOML: {e}")))?
        }
    };
    match root {
        Value::Object(map) => Ok(map),
        Value::Null => Ok(Map::new()),
        _ => Err(ConfigError::Malformed(
            "the document's root must be a mapping of fields".to_owned(),
        )),
    }
}

/// A config file's root object; the format comes from the file's extension.
pub(crate) fn read_document(path: &Path) -> Result<Map<String, Value>, ConfigError> {
    let format = Format::from_path(path)?;
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    parse_document(&text, format).map_err(|e| match e {
        ConfigError::Malformed(m) => ConfigError::Malformed(format!("{}: {m}", path.display())),
        other => other,
    })
}

pub(crate) fn as_object<'a>(
    v: &'a Value,
    field: &str,
) -> Result<&'a Map<String, Value>, ConfigError> {
    v.as_object()
        .ok_or_else(|| ConfigError::invalid(field, "must be an object"))
}

fn req<'a>(map: &'a Map<String, Value>, key: &str, field: &str) -> Result<&'a Value, ConfigError> {
    map.get(key)
        .ok_or_else(|| ConfigError::invalid(format!("{field}.{key}"), "is required"))
}

fn req_f64(map: &Map<String, Value>, key: &str, field: &str) -> Result<f64, ConfigError> {
    as_f64(req(map, key, field)?, &format!("{field}.{key}"))
}

fn opt_str<'a>(
    map: &'a Map<String, Value>,
    key: &str,
    field: &str,
) -> Result<Option<&'a str>, ConfigError> {
    map.get(key)
        .map(|v| as_str(v, &format!("{field}.{key}")))
        .transpose()
}

pub(crate) fn as_str<'a>(v: &'a Value, field: &str) -> Result<&'a str, ConfigError> {
    v.as_str()
        .ok_or_else(|| ConfigError::invalid(field, "must be a string"))
}

fn as_f64(v: &Value, field: &str) -> Result<f64, ConfigError> {
    let n = match v {
        Value::Number(n) => n.as_f64(),
        // proto3 JSON allows numbers as strings.
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    };
    n.filter(|n| n.is_finite())
        .ok_or_else(|| ConfigError::invalid(field, format!("must be a finite number, got {v}")))
}

/// A whole number from 0 to `u64::MAX`, as a JSON number or a string of digits.
pub(crate) fn as_u64(v: &Value, field: &str) -> Result<u64, ConfigError> {
    let n = match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse::<u64>().ok(),
        _ => None,
    };
    n.ok_or_else(|| {
        ConfigError::invalid(
            field,
            format!("must be a whole number from 0 to {}, got {v}", u64::MAX),
        )
    })
}

pub(crate) fn as_u32(v: &Value, field: &str) -> Result<u32, ConfigError> {
    let n = match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse::<u64>().ok(),
        _ => None,
    };
    n.and_then(|n| u32::try_from(n).ok()).ok_or_else(|| {
        ConfigError::invalid(
            field,
            format!("must be a whole number from 0 to {}, got {v}", u32::MAX),
        )
    })
}

fn codes(v: &Value, field: &str) -> Result<CodeSet, ConfigError> {
    let list = v
        .as_array()
        .ok_or_else(|| ConfigError::invalid(field, "must be an array of status codes"))?;
    let mut set = CodeSet::EMPTY;
    for (i, c) in list.iter().enumerate() {
        set.insert(code(c, &format!("{field}[{i}]"))?);
    }
    Ok(set)
}

/// One status code: a name (any case) or a number.
pub(crate) fn code(v: &Value, field: &str) -> Result<Code, ConfigError> {
    let code = match v {
        Value::String(s) => s.parse::<Code>().ok(),
        Value::Number(n) => n
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .and_then(Code::from_i32),
        _ => None,
    };
    code.ok_or_else(|| {
        ConfigError::invalid(
            field,
            format!(
                "{v} is not a gRPC status code (a name such as UNAVAILABLE or a number 0 to 16)"
            ),
        )
    })
}

/// A proto3 JSON duration: decimal seconds with an `s` suffix, up to 9 fractional digits
/// (`"1s"`, `"0.100s"`).
fn proto_duration(v: &Value, field: &str) -> Result<Duration, ConfigError> {
    let s = as_str(v, field)?;
    let secs = s.strip_suffix('s').ok_or_else(|| {
        ConfigError::invalid(
            field,
            format!("a duration is decimal seconds ending in \"s\" (\"0.1s\"), got {s:?}"),
        )
    })?;
    decimal(secs, 1_000_000_000).ok_or_else(|| {
        ConfigError::invalid(
            field,
            format!("a duration is decimal seconds ending in \"s\" (\"0.1s\"), got {s:?}"),
        )
    })
}

/// A duration in stormguard's shape: a number with a unit (`"50ms"`, `"10s"`, `"1.5s"`,
/// `"2m"`, `"250us"`), or a proto3 duration.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (number, nanos_per_unit) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1_000_000)
    } else if let Some(n) = s.strip_suffix("us").or_else(|| s.strip_suffix("µs")) {
        (n, 1_000)
    } else if let Some(n) = s.strip_suffix("ns") {
        (n, 1)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1_000_000_000)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000_000_000)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3_600_000_000_000)
    } else {
        return None;
    };
    decimal(number, nanos_per_unit)
}

pub(crate) fn as_duration(v: &Value, field: &str) -> Result<Duration, ConfigError> {
    let s = as_str(v, field)?;
    parse_duration(s).ok_or_else(|| {
        ConfigError::invalid(
            field,
            format!("expected a duration with a unit such as \"50ms\" or \"10s\", got {s:?}"),
        )
    })
}

/// Non-negative decimal `number` (digits, optional fraction) times `unit_nanos`, exactly.
fn decimal(number: &str, unit_nanos: u128) -> Option<Duration> {
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if int.len() > 12 || frac.len() > 9 {
        return None;
    }
    let int: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let frac_value: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    let scale = 10u128.pow(frac.len() as u32);
    let nanos = int * unit_nanos + frac_value * unit_nanos / scale;
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    Some(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn field_of(e: ConfigError) -> String {
        match e {
            ConfigError::Invalid { field, .. } => field,
            ConfigError::Malformed(m) => format!("malformed: {m}"),
            read @ ConfigError::Read { .. } => read.to_string(),
        }
    }

    const INVENTORY: &str = "stormguard.demo.v1.Inventory";

    #[test]
    fn service_config_matches_names_like_grpc() {
        let json = r#"{"methodConfig": [
            {"name": [{}], "retryPolicy": {"maxAttempts": 2, "initialBackoff": "1s", "maxBackoff": "2s",
              "backoffMultiplier": 1.5, "retryableStatusCodes": [14]}},
            {"name": [{"service": "stormguard.demo.v1.Inventory"}], "retryPolicy": {"maxAttempts": 3,
              "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
              "retryableStatusCodes": ["unavailable", "Resource_Exhausted"]}},
            {"name": [{"service": "stormguard.demo.v1.Inventory", "method": "WatchStock"}]}
        ]}"#;
        let c = ClientConfig::from_service_config_json(json).unwrap();
        let p = c.methods.lookup(&format!("/{INVENTORY}/Reserve")).unwrap();
        assert_eq!(p.max_attempts, 3);
        assert!(p.retryable_codes.contains(Code::ResourceExhausted));
        assert_eq!(
            p.backoff,
            BackoffConfig::A6 {
                initial: Duration::from_millis(100),
                max: Duration::from_secs(1),
                multiplier: 2.0
            }
        );
        assert!(
            c.methods
                .lookup(&format!("/{INVENTORY}/WatchStock"))
                .is_none()
        );
        assert_eq!(c.methods.lookup("/x.Y/Z").unwrap().max_attempts, 2);
        assert_eq!(c.budget, BudgetChoice::Stormguard(BudgetConfig::default()));
    }

    #[test]
    fn service_config_throttling_becomes_a6() {
        let json = r#"{"retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}"#;
        let c = ClientConfig::from_service_config_json(json).unwrap();
        assert_eq!(
            c.budget,
            BudgetChoice::A6(ThrottleConfig {
                max_tokens: 10.0,
                token_ratio: 0.1
            })
        );
        assert!(c.methods.lookup("/a.B/C").is_none());
    }

    #[test]
    fn service_config_errors_name_the_field() {
        let cases = [
            (r#"{"methodConfig": {}}"#, "methodConfig"),
            (
                r#"{"methodConfig": [{"name": [{"service": "s"}], "retryPolicy": {"maxAttempts": 1,
                    "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
                "methodConfig[0].retryPolicy.maxAttempts",
            ),
            (
                r#"{"methodConfig": [{"name": [{"service": "s"}], "retryPolicy": {"maxAttempts": 3,
                    "initialBackoff": "100ms", "maxBackoff": "1s", "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
                "methodConfig[0].retryPolicy.initialBackoff",
            ),
            (
                r#"{"methodConfig": [{"name": [{"service": "s"}], "retryPolicy": {"maxAttempts": 3,
                    "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE", "NOPE"]}}]}"#,
                "methodConfig[0].retryPolicy.retryableStatusCodes[1]",
            ),
            (
                r#"{"methodConfig": [{"name": [{"service": "s"}], "retryPolicy": {"maxAttempts": 3,
                    "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 2}}]}"#,
                "methodConfig[0].retryPolicy.retryableStatusCodes",
            ),
            (
                r#"{"methodConfig": [{"name": [{"service": "s"}], "retryPolicy": {"maxAttempts": 3,
                    "initialBackoff": "0s", "maxBackoff": "1s", "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
                "methodConfig[0].retryPolicy.initialBackoff",
            ),
            (
                r#"{"methodConfig": [{"name": [{"service": "s"}], "retryPolicy": {"maxAttempts": 3,
                    "initialBackoff": "2s", "maxBackoff": "1s", "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
                "methodConfig[0].retryPolicy.maxBackoff",
            ),
            (
                r#"{"methodConfig": [{"name": [{"service": "s"}], "retryPolicy": {"maxAttempts": 3,
                    "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 0,
                    "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
                "methodConfig[0].retryPolicy.backoffMultiplier",
            ),
            (
                r#"{"methodConfig": [{"name": [{"method": "M"}]}]}"#,
                "methodConfig[0].name[0].service",
            ),
            (
                r#"{"retryThrottling": {"maxTokens": 0, "tokenRatio": 0.1}}"#,
                "retryThrottling.maxTokens",
            ),
            (
                r#"{"retryThrottling": {"maxTokens": 10}}"#,
                "retryThrottling.tokenRatio",
            ),
        ];
        for (json, field) in cases {
            let e = ClientConfig::from_service_config_json(json).unwrap_err();
            assert_eq!(field_of(e), field, "{json}");
        }
        assert!(matches!(
            ClientConfig::from_service_config_json("[1]"),
            Err(ConfigError::Malformed(_))
        ));
        assert!(matches!(
            ClientConfig::from_service_config_json("{"),
            Err(ConfigError::Malformed(_))
        ));
    }

    #[test]
    fn only_methods_marked_idempotent_have_their_answers_retried() {
        // stormguard's shape applies to every method: not idempotent unless it says so.
        let c = ClientConfig::from_json("{}").unwrap();
        assert!(!c.methods.lookup("/a.B/C").unwrap().idempotent);
        assert_eq!(c, ClientConfig::standard());
        let c = ClientConfig::from_json(r#"{"retry": {"idempotent": true}}"#).unwrap();
        assert!(c.methods.lookup("/a.B/C").unwrap().idempotent);
        // The gRPC service config names the methods it retries: gRPC retries them.
        let json = r#"{"methodConfig": [{"name": [{"service": "a.B"}], "retryPolicy": {"maxAttempts": 3,
            "initialBackoff": "0.01s", "maxBackoff": "1s", "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#;
        let c = ClientConfig::from_service_config_json(json).unwrap();
        assert!(c.methods.lookup("/a.B/C").unwrap().idempotent);
        assert!(c.methods.lookup("/x.Y/Z").is_none());
    }

    #[test]
    fn per_attempt_timeout_is_read_from_both_shapes() {
        let json = r#"{"methodConfig": [{"name": [{}], "retryPolicy": {"maxAttempts": 3,
            "initialBackoff": "0.01s", "maxBackoff": "1s", "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"], "perAttemptRecvTimeout": "0.05s"}}]}"#;
        let c = ClientConfig::from_service_config_json(json).unwrap();
        assert_eq!(
            c.methods.lookup("/a.B/C").unwrap().per_attempt_timeout,
            Some(Duration::from_millis(50))
        );
        let c = ClientConfig::from_json(r#"{"retry": {"per_attempt_timeout": "50ms"}}"#).unwrap();
        assert_eq!(
            c.methods.lookup("/a.B/C").unwrap().per_attempt_timeout,
            Some(Duration::from_millis(50))
        );
        // Absent: no per-attempt timeout.
        assert_eq!(
            ClientConfig::from_json("{}")
                .unwrap()
                .methods
                .lookup("/a.B/C")
                .unwrap()
                .per_attempt_timeout,
            None
        );
        let zero = r#"{"methodConfig": [{"name": [{}], "retryPolicy": {"maxAttempts": 3,
            "initialBackoff": "0.01s", "maxBackoff": "1s", "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"], "perAttemptRecvTimeout": "0s"}}]}"#;
        assert_eq!(
            field_of(ClientConfig::from_service_config_json(zero).unwrap_err()),
            "methodConfig[0].retryPolicy.perAttemptRecvTimeout"
        );
        let bad = r#"{"methodConfig": [{"name": [{}], "retryPolicy": {"maxAttempts": 3,
            "initialBackoff": "0.01s", "maxBackoff": "1s", "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"], "perAttemptRecvTimeout": "50ms"}}]}"#;
        assert_eq!(
            field_of(ClientConfig::from_service_config_json(bad).unwrap_err()),
            "methodConfig[0].retryPolicy.perAttemptRecvTimeout"
        );
        for (json, field) in [
            (
                r#"{"retry": {"per_attempt_timeout": "0ms"}}"#,
                "retry.per_attempt_timeout",
            ),
            (
                r#"{"retry": {"per_attempt_timeout": 50}}"#,
                "retry.per_attempt_timeout",
            ),
        ] {
            assert_eq!(
                field_of(ClientConfig::from_json(json).unwrap_err()),
                field,
                "{json}"
            );
        }
    }

    #[test]
    fn max_attempts_above_five_count_as_five() {
        let json = r#"{"methodConfig": [{"name": [{}], "retryPolicy": {"maxAttempts": 8,
            "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#;
        let c = ClientConfig::from_service_config_json(json).unwrap();
        assert_eq!(
            c.methods.lookup("/a.B/C").unwrap().effective_max_attempts(),
            5
        );
    }

    #[test]
    fn stormguard_shape_reads_every_field() {
        let json = r#"{"retry": {"max_attempts": 4, "backoff": "full_jitter", "base": "20ms", "cap": "1s", "max_pushback": "5s",
            "retryable_codes": ["UNAVAILABLE", 8], "budget": {"ttl": "5s", "min_retries_per_second": 2,
            "retry_ratio": 0.2, "fleet_size": 40}, "budget_exhausted": "fail_fast"},
            "breaker": {"failure_rate": 0.6, "min_requests": 10, "open_for": "2s"}}"#;
        let c = ClientConfig::from_json(json).unwrap();
        let p = c.methods.lookup("/any.Svc/Any").unwrap();
        assert_eq!(p.max_attempts, 4);
        assert_eq!(
            p.backoff,
            BackoffConfig::FullJitter {
                base: Duration::from_millis(20),
                cap: Duration::from_secs(1),
                multiplier: 2.0
            }
        );
        assert!(p.retryable_codes.contains(Code::ResourceExhausted));
        assert_eq!(p.max_pushback, Duration::from_secs(5));
        assert_eq!(
            c.budget,
            BudgetChoice::Stormguard(BudgetConfig {
                ttl: Duration::from_secs(5),
                min_retries_per_second: 2,
                retry_ratio: 0.2,
                fleet_size: 40,
            })
        );
        let b = c.breaker.unwrap();
        assert_eq!(b.failure_rate, 0.6);
        assert_eq!(b.min_requests, 10);
        assert_eq!(b.open_for, Duration::from_secs(2));
    }

    #[test]
    fn stormguard_shape_defaults_and_errors() {
        let c = ClientConfig::from_json("{}").unwrap();
        assert_eq!(c, ClientConfig::standard());
        let cases = [
            (r#"{"retry": {"max_atempts": 3}}"#, "retry.max_atempts"),
            (
                r#"{"retry": {"budget": {"ttl": "0.5s"}}}"#,
                "retry.budget.ttl",
            ),
            (
                r#"{"retry": {"budget": {"ttl": "ten seconds"}}}"#,
                "retry.budget.ttl",
            ),
            (
                r#"{"retry": {"budget": {"retry_ratio": -1}}}"#,
                "retry.budget.retry_ratio",
            ),
            (
                r#"{"retry": {"budget_exhausted": "queue"}}"#,
                "retry.budget_exhausted",
            ),
            (r#"{"retry": {"backoff": "linear"}}"#, "retry.backoff"),
            (r#"{"retry": {"max_attempts": -2}}"#, "retry.max_attempts"),
            (r#"{"retry": {"max_attempts": 1}}"#, "retry.max_attempts"),
            // Errors found by validation name the field as this document spells it.
            (r#"{"retry": {"base": "0ms"}}"#, "retry.base"),
            (r#"{"retry": {"base": "2s", "cap": "1s"}}"#, "retry.cap"),
            (r#"{"retry": {"multiplier": 0.5}}"#, "retry.multiplier"),
            (
                r#"{"retry": {"retryable_codes": []}}"#,
                "retry.retryable_codes",
            ),
            (
                r#"{"retry": {"retryable_codes": ["OK"]}}"#,
                "retry.retryable_codes",
            ),
            (
                r#"{"breaker": {"failure_rate": 2}}"#,
                "breaker.failure_rate",
            ),
        ];
        for (json, field) in cases {
            let e = ClientConfig::from_json(json).unwrap_err();
            assert_eq!(field_of(e), field, "{json}");
        }
    }

    #[test]
    fn durations_parse_exactly() {
        assert_eq!(parse_duration("50ms"), Some(Duration::from_millis(50)));
        assert_eq!(parse_duration("0.1s"), Some(Duration::from_millis(100)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250us"), Some(Duration::from_micros(250)));
        assert_eq!(parse_duration("7ns"), Some(Duration::from_nanos(7)));
        assert_eq!(parse_duration(".5s"), Some(Duration::from_millis(500)));
        for bad in [
            "",
            "s",
            "10",
            "-1s",
            "1e3s",
            "1.2.3s",
            "ms",
            "1,5s",
            "1.0000000001s",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
        assert!(
            proto_duration(&Value::String("0.000000001s".into()), "f").unwrap()
                == Duration::from_nanos(1)
        );
    }

    proptest! {
        #[test]
        fn duration_parser_never_panics(s in ".{0,24}") {
            let _ = parse_duration(&s);
        }

        #[test]
        fn milliseconds_round_trip(ms in 0u64..1_000_000_000) {
            prop_assert_eq!(parse_duration(&format!("{ms}ms")), Some(Duration::from_millis(ms)));
            let secs = format!("{}.{:03}s", ms / 1000, ms % 1000);
            prop_assert_eq!(parse_duration(&secs), Some(Duration::from_millis(ms)));
        }

        #[test]
        fn service_config_parser_never_panics(json in r#"\{"(methodConfig|retryThrottling)": .{0,40}\}"#) {
            let _ = ClientConfig::from_service_config_json(&json);
        }
    }
}
