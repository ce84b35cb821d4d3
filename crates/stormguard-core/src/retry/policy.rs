//! Which failures of which methods may be retried.
//!
//! See [`RetryPolicy`](crate::RetryPolicy) for what it does and why.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::backoff::BackoffConfig;
use crate::error::ConfigError;
use crate::wire::code::{Code, CodeSet};

/// The largest number of attempts A6 allows; larger configured values are treated as this.
pub const MAX_ATTEMPTS_CAP: u32 = 5;

/// How one method's failures are retried.
///
/// ```
/// use stormguard_core::{Code, RetryPolicy};
///
/// let policy = RetryPolicy::default();
/// assert_eq!(policy.max_attempts, 3);
/// assert!(!policy.idempotent, "answers are retried only for methods marked idempotent");
/// assert!(policy.retryable_codes.contains(Code::Unavailable));
/// assert!(!policy.retryable_codes.contains(Code::Internal));
/// ```
///
/// A retry is only safe when repeating the call cannot do harm. A method with no policy is
/// never retried. A method with a policy is retried when the status says the server did
/// not do the work (by default only `UNAVAILABLE`, as in gRPC A6) and either the request
/// provably never reached the server (the connection failed), or the method is marked
/// [`idempotent`](RetryPolicy::idempotent). The default policy is **not** idempotent: a
/// server that answers `UNAVAILABLE` may have done part of the work before it did, and
/// sending a payment or a reservation twice is worse than failing it once. Retrying
/// answers is something a user opts into per method, by saying the method is safe to
/// repeat:
///
/// ```
/// use stormguard_core::{MethodScope, MethodTable, RetryPolicy};
///
/// // Every method: retry only requests that never reached the server.
/// let mut table = MethodTable::uniform(RetryPolicy::default());
/// // Reserve carries a request id that makes it idempotent: retry its failures too.
/// table.set_retry(
///     MethodScope::Method("stormguard.demo.v1.Inventory", "Reserve"),
///     Some(RetryPolicy { idempotent: true, ..RetryPolicy::default() }),
/// );
/// assert!(!table.lookup("/stormguard.demo.v1.Inventory/Cancel").unwrap().idempotent);
/// assert!(table.lookup("/stormguard.demo.v1.Inventory/Reserve").unwrap().idempotent);
/// ```
///
/// A standard gRPC service config is read the way gRPC reads it: a method it gives a
/// `retryPolicy` is retried (naming the method there is the opt-in).
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Attempts of one logical call, the first included (A6: at least 2; above 5 counts as 5).
    pub max_attempts: u32,
    /// Codes that mean "the server did not do the work; trying again may succeed".
    pub retryable_codes: CodeSet,
    /// Delays between attempts.
    pub backoff: BackoffConfig,
    /// Whether repeating the method is harmless. A non-idempotent method is retried only
    /// when the request never reached the server (a failed connection). Default: `false`.
    pub idempotent: bool,
    /// A retry needs at least this much time left after its delay to be worth sending.
    pub min_attempt_time: Duration,
    /// The longest server pushback honoured. A longer one (a peer asking this call to wait
    /// for minutes) means no retry: a peer may make the client more careful, never park
    /// its calls. Matters for calls without a deadline; with one, a pushback longer than the
    /// time left already means no retry.
    pub max_pushback: Duration,
    /// How long one attempt may take before it is abandoned (gRPC's
    /// `perAttemptRecvTimeout`); `None`: an attempt may use all that is left of the call's
    /// deadline. Each attempt tells the server the smaller of the two as `grpc-timeout`, so
    /// the server can drop work its caller no longer waits for. An attempt that times out
    /// is a failure of the dependency (it counts for the breaker and the budget) and is
    /// retried like a retryable status, whatever [`retryable_codes`](Self::retryable_codes)
    /// says; when the call's own deadline runs out first, the call ends as usual.
    pub per_attempt_timeout: Option<Duration>,
}

impl Default for RetryPolicy {
    /// Retry `UNAVAILABLE`, 3 attempts, full jitter, not idempotent (only requests that
    /// never reached the server are retried), 5 ms minimum attempt, pushback honoured up to
    /// 30 s, no per-attempt timeout.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            retryable_codes: CodeSet::single(Code::Unavailable),
            backoff: BackoffConfig::default(),
            idempotent: false,
            min_attempt_time: Duration::from_millis(5),
            max_pushback: Duration::from_secs(30),
            per_attempt_timeout: None,
        }
    }
}

impl RetryPolicy {
    /// Attempts actually allowed: `max_attempts` capped at [`MAX_ATTEMPTS_CAP`].
    pub(crate) fn effective_max_attempts(&self) -> u32 {
        self.max_attempts.min(MAX_ATTEMPTS_CAP)
    }

    /// Checks the ranges; `field` prefixes the names in errors.
    pub(crate) fn validate(&self, field: &str) -> Result<(), ConfigError> {
        check_max_attempts(field, self.max_attempts, "retry")?;
        if self.retryable_codes.is_empty() {
            return Err(ConfigError::invalid(
                format!("{field}.retryableStatusCodes"),
                "must name at least one status code",
            ));
        }
        if self.retryable_codes.contains(Code::Ok) {
            return Err(ConfigError::invalid(
                format!("{field}.retryableStatusCodes"),
                "OK is not a failure and cannot be retried",
            ));
        }
        if self.per_attempt_timeout.is_some_and(|t| t.is_zero()) {
            return Err(ConfigError::invalid(
                format!("{field}.perAttemptRecvTimeout"),
                "must be greater than zero; leave it out for no per-attempt timeout",
            ));
        }
        self.backoff.validate(&format!("{field}.backoff"))
    }
}

/// A retry or hedging policy's `maxAttempts` (`what`: `retry` or `hedge`) must allow one
/// attempt more than the first.
pub(crate) fn check_max_attempts(
    field: &str,
    max_attempts: u32,
    what: &str,
) -> Result<(), ConfigError> {
    if max_attempts < 2 {
        return Err(ConfigError::invalid(
            format!("{field}.maxAttempts"),
            format!(
                "must be at least 2 (one {what}), got {max_attempts}; configure no {what} policy \
                 to disable {what}s"
            ),
        ));
    }
    Ok(())
}

/// Retry policies by method, matched like the gRPC service config's `methodConfig[].name`:
/// an exact `service/method` entry wins over a whole-`service` entry, which wins over the
/// default.
///
/// ```
/// use std::sync::Arc;
/// use stormguard_core::{MethodScope, MethodTable, RetryPolicy};
///
/// let mut table = MethodTable::none();
/// let inventory = "stormguard.demo.v1.Inventory";
/// table.set_retry(MethodScope::Service(inventory), Some(RetryPolicy::default()));
/// table.set_retry(MethodScope::Method(inventory, "Cancel"), None);
/// assert!(table.lookup("/stormguard.demo.v1.Inventory/Reserve").is_some());
/// assert!(table.lookup("/stormguard.demo.v1.Inventory/Cancel").is_none());
/// assert!(table.lookup("/other.Service/Reserve").is_none());
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MethodTable {
    /// `None` for a method: not retried.
    policies: MethodMap<Option<Arc<RetryPolicy>>>,
    /// `None` for a method: not hedged. Every entry set in one map is set in the other
    /// (to `None` there), so the most specific entry decides both: a method has a retry
    /// policy or a hedging policy, never both.
    hedges: MethodMap<Option<Arc<HedgingPolicy>>>,
    /// Default deadlines, looked up like the policies.
    timeouts: MethodMap<Option<Duration>>,
    /// Whether a method's calls carry an idempotency key (`idempotency-key`), looked up
    /// like the policies but set apart from them: a method retried or hedged may be keyed.
    keys: MethodMap<bool>,
}

/// The methods a setting of a [`MethodTable`] or a [`MethodMap`] covers, as the service
/// config's `methodConfig[].name` names them. A method's own setting wins over its
/// service's, which wins over the default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MethodScope<'a> {
    /// Every method no more specific setting names.
    Default,
    /// Every method of a service, fully qualified (`pkg.Service`).
    Service(&'a str),
    /// One method: its service (`pkg.Service`) and its name.
    Method(&'a str, &'a str),
}

/// A value per gRPC method, matched like the service config's `methodConfig[].name`: an
/// exact `service/method` entry wins over a whole-`service` entry, which wins over the
/// default. A lookup allocates nothing.
///
/// ```
/// use stormguard_core::{MethodMap, MethodScope};
///
/// let mut map = MethodMap::new();
/// map.insert(MethodScope::Default, "default");
/// map.insert(MethodScope::Service("pkg.Svc"), "service");
/// map.insert(MethodScope::Method("pkg.Svc", "Get"), "method");
/// assert_eq!(map.get("/pkg.Svc/Get"), Some(&"method"));
/// assert_eq!(map.get("/pkg.Svc/Put"), Some(&"service"));
/// assert_eq!(map.get("/other.Svc/Get"), Some(&"default"));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct MethodMap<T> {
    default: Option<T>,
    /// By `pkg.Service`.
    services: HashMap<String, T>,
    /// By `pkg.Service/Method`.
    methods: HashMap<String, T>,
}

impl<T> Default for MethodMap<T> {
    fn default() -> Self {
        MethodMap {
            default: None,
            services: HashMap::new(),
            methods: HashMap::new(),
        }
    }
}

impl<T> MethodMap<T> {
    /// An empty map: every lookup gives `None`.
    pub fn new() -> Self {
        MethodMap::default()
    }

    /// Sets the value of the methods `scope` names, replacing the one set there before.
    pub fn insert(&mut self, scope: MethodScope<'_>, value: T) {
        match scope {
            MethodScope::Default => self.default = Some(value),
            MethodScope::Service(service) => {
                self.services.insert(service.to_owned(), value);
            }
            MethodScope::Method(service, method) => {
                self.methods.insert(format!("{service}/{method}"), value);
            }
        }
    }

    /// The most specific value for a request path (`/pkg.Service/Method`): the method's,
    /// else its service's, else the default.
    pub fn get(&self, path: &str) -> Option<&T> {
        // Every call looks its method up (policy, deadline, key; the server's exempt
        // calls): a map with a default alone, the usual one, answers without reading the path.
        if self.methods.is_empty() && self.services.is_empty() {
            return self.default.as_ref();
        }
        let key = path.strip_prefix('/').unwrap_or(path);
        self.methods
            .get(key)
            .or_else(|| {
                key.split_once('/')
                    .and_then(|(service, _)| self.services.get(service))
            })
            .or(self.default.as_ref())
    }

    /// Every value: the default, then the services', then the methods'.
    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.default
            .iter()
            .chain(self.services.values())
            .chain(self.methods.values())
    }
}

impl MethodTable {
    /// A table that retries nothing.
    pub fn none() -> Self {
        MethodTable::default()
    }

    /// A table that applies `policy` to every method.
    pub fn uniform(policy: RetryPolicy) -> Self {
        let mut table = MethodTable::default();
        table
            .policies
            .insert(MethodScope::Default, Some(Arc::new(policy)));
        table
    }

    /// Sets the retry policy of the methods `scope` names; `None` disables retries for
    /// them. A hedging policy set for the same scope is replaced: a method is retried or
    /// hedged, not both.
    pub fn set_retry(&mut self, scope: MethodScope<'_>, policy: Option<RetryPolicy>) {
        self.policies.insert(scope, policy.map(Arc::new));
        self.hedges.insert(scope, None);
    }

    /// Hedges the methods `scope` names with `policy` (see
    /// [`HedgingPolicy`]); a retry policy set for the same scope is replaced: a method is
    /// retried or hedged, not both. `None`: neither.
    ///
    /// ```
    /// use stormguard_core::HedgingPolicy;
    /// use stormguard_core::{MethodScope, MethodTable, RetryPolicy};
    ///
    /// let mut table = MethodTable::uniform(RetryPolicy::default());
    /// table.set_hedging(MethodScope::Method("pkg.Svc", "Get"), Some(HedgingPolicy::default()));
    /// assert!(table.lookup_hedging("/pkg.Svc/Get").is_some());
    /// assert!(table.lookup("/pkg.Svc/Get").is_none(), "hedged, so not retried");
    /// assert!(table.lookup("/pkg.Svc/Put").is_some());
    /// ```
    pub fn set_hedging(&mut self, scope: MethodScope<'_>, policy: Option<HedgingPolicy>) {
        self.hedges.insert(scope, policy.map(Arc::new));
        self.policies.insert(scope, None);
    }

    /// The hedging policy for a request path, or `None` when the method is not hedged.
    /// Allocates nothing.
    pub fn lookup_hedging(&self, path: &str) -> Option<&Arc<HedgingPolicy>> {
        self.hedges.get(path).and_then(Option::as_ref)
    }

    /// Every hedging policy in the table, each shared entry once per entry.
    pub(crate) fn hedging_policies(&self) -> impl Iterator<Item = &Arc<HedgingPolicy>> {
        self.hedges.values().flatten()
    }

    /// The policy for a request path (`/pkg.Service/Method`), or `None` when the method is
    /// not retried. Allocates nothing.
    pub fn lookup(&self, path: &str) -> Option<&Arc<RetryPolicy>> {
        self.policies.get(path).and_then(Option::as_ref)
    }

    /// Sets the deadline limit of calls to the methods `scope` names (a service config's
    /// `timeout`); `None`: no limit. Looked up like [`lookup`](Self::lookup): a call's
    /// deadline is the earlier of it and the caller's own (see
    /// [`resolve_deadline_at`](crate::resolve_deadline_at)).
    pub fn set_timeout(&mut self, scope: MethodScope<'_>, timeout: Option<Duration>) {
        self.timeouts.insert(scope, timeout);
    }

    /// The longest a call to `path` may take (a service config's `timeout` for the
    /// method), looked up like [`lookup`](Self::lookup): a call's deadline is the earlier
    /// of it and the caller's own (see
    /// [`resolve_deadline_at`](crate::deadline::resolve_deadline_at)).
    pub(crate) fn timeout(&self, path: &str) -> Option<Duration> {
        self.timeouts.get(path).copied().flatten()
    }

    /// Sets whether calls to the methods `scope` names carry an idempotency key.
    pub fn set_idempotency_key(&mut self, scope: MethodScope<'_>, keyed: bool) {
        self.keys.insert(scope, keyed);
    }

    /// Whether calls to `path` carry an idempotency key (the `idempotency-key` header, see
    /// [`wire::IDEMPOTENCY_KEY`](crate::wire::IDEMPOTENCY_KEY)), looked up like
    /// [`lookup`](Self::lookup); `false` unless set. A keyed method is one whose server
    /// recognises a repeated key and does not run the call twice, so the retry decision
    /// treats it as safe to retry after it may have run, as it does an
    /// [`idempotent`](RetryPolicy::idempotent) one. Allocates nothing.
    ///
    /// ```
    /// use stormguard_core::{MethodScope, MethodTable, RetryPolicy};
    ///
    /// let mut table = MethodTable::uniform(RetryPolicy::default());
    /// table.set_idempotency_key(MethodScope::Service("pkg.Payments"), true);
    /// table.set_idempotency_key(MethodScope::Method("pkg.Payments", "Lookup"), false);
    /// assert!(table.idempotency_key("/pkg.Payments/Charge"));
    /// assert!(!table.idempotency_key("/pkg.Payments/Lookup"));
    /// assert!(!table.idempotency_key("/pkg.Other/Charge"));
    /// ```
    pub fn idempotency_key(&self, path: &str) -> bool {
        self.keys.get(path).copied().unwrap_or(false)
    }

    /// Whether any method of the table carries an idempotency key.
    pub(crate) fn any_idempotency_key(&self) -> bool {
        self.keys.values().any(|keyed| *keyed)
    }

    /// Checks every retry and hedging policy of the table; the error names the first bad
    /// field (`retry.<field>` or `hedging.<field>`).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        for policy in self.policies() {
            policy.validate("retry")?;
        }
        for policy in self.hedging_policies() {
            policy.validate("hedging")?;
        }
        Ok(())
    }

    /// Every policy in the table (for validation and reporting).
    pub(crate) fn policies(&self) -> impl Iterator<Item = &RetryPolicy> {
        self.policies.values().flatten().map(|p| p.as_ref())
    }
}

/// How one method is hedged (gRPC A6's `hedgingPolicy`).
///
/// A method has either a [`RetryPolicy`](crate::RetryPolicy) or a hedging policy:
/// no retries follow the hedges. Giving a method a hedging policy is the statement that
/// running it more than once is harmless.
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use stormguard_core::{HedgeDelay, HedgingPolicy, MethodScope, MethodTable, RetryController, Unlimited};
///
/// let policy = HedgingPolicy {
///     max_attempts: 2,
///     delay: HedgeDelay::Fixed(Duration::from_millis(10)),
///     ..HedgingPolicy::default()
/// };
/// let mut methods = MethodTable::none();
/// methods.set_hedging(MethodScope::Method("shop.Catalog", "Get"), Some(policy));
/// // The controller checks every policy of its table.
/// let controller = RetryController::new(methods, Arc::new(Unlimited), None, 1)?;
/// # let _ = controller;
/// # Ok::<(), stormguard_core::ConfigError>(())
/// ```
///
/// A retry answers a failure; a hedge answers slowness. The first attempt goes at once, and
/// while no answer has come the n-th copy follows `n × delay` later (gRPC A6's
/// `hedgingPolicy`); the first answer that is not a *non-fatal* failure wins and every other
/// copy is cancelled. A non-fatal status sends the next copy at once.
///
/// # Why hedges can start a storm, and what stops them
///
/// A hedge is extra load sent exactly when the server is slow, which is when it can least
/// afford it. stormguard treats every hedge as an attempt (see
/// [`CallRetry::start_hedge_at`](crate::CallRetry::start_hedge_at)): it is paid from
/// the same budget as retries (an A6 throttle lets hedges go only while it holds more than
/// half its tokens) and refused when that is empty, never queued; it needs a closed breaker
/// and a retry left in the request's allowance; it carries `grpc-previous-rpc-attempts`, so
/// a stormguard server sheds it before any first attempt; a server's pushback `-1` stops the
/// call's hedges and `N` ms puts the next one off by `N`.
///
/// # A delay that does not feed a slowdown
///
/// A fixed delay must be chosen by someone who knows the latency. The alternative, a
/// percentile of recent latency ([`HedgeDelay::Learned`]), has a trap: if only the answers
/// that *won* are measured (as tower's `hedge` middleware does), then during a slowdown the
/// hedges win, each measured as `delay + a fast answer`; the estimate falls, the layer
/// hedges sooner, more hedges win, and the estimate falls further: the hedge rate climbs
/// exactly while the server is slow. The learned delay counts **every** attempt, the ones
/// that lost or were cut off included, at least for the time they ran, so a slowdown raises
/// the estimate instead. A floor keeps hedges from firing on noise, a ceiling keeps the tail
/// bounded, and no hedge is sent before the estimator has enough samples to know the
/// latency.
#[derive(Clone, Debug, PartialEq)]
pub struct HedgingPolicy {
    /// Copies of one logical call, the first included (A6: at least 2; above 5 counts as 5).
    pub max_attempts: u32,
    /// When the copies after the first are sent.
    pub delay: HedgeDelay,
    /// Statuses that do not end the call: the next copy is sent at once. Any other status
    /// (`OK` included) wins. A6 default: none.
    pub non_fatal_codes: CodeSet,
    /// A hedge needs at least this much time left on the call's deadline to be worth sending.
    pub min_attempt_time: Duration,
    /// The longest server pushback honoured (a longer one stops the call's hedges).
    pub max_pushback: Duration,
}

impl Default for HedgingPolicy {
    /// Two copies, the second after 10 ms, no non-fatal codes, 5 ms minimum attempt,
    /// pushback honoured up to 30 s.
    fn default() -> Self {
        HedgingPolicy {
            max_attempts: 2,
            delay: HedgeDelay::Fixed(Duration::from_millis(10)),
            non_fatal_codes: CodeSet::EMPTY,
            min_attempt_time: Duration::from_millis(5),
            max_pushback: Duration::from_secs(30),
        }
    }
}

impl HedgingPolicy {
    /// Copies actually allowed: `max_attempts` capped at [`MAX_ATTEMPTS_CAP`].
    pub(crate) fn effective_max_attempts(&self) -> u32 {
        self.max_attempts.min(MAX_ATTEMPTS_CAP)
    }

    /// Checks the ranges; `field` prefixes the names in errors.
    pub(crate) fn validate(&self, field: &str) -> Result<(), ConfigError> {
        crate::retry::policy::check_max_attempts(field, self.max_attempts, "hedge")?;
        if self.non_fatal_codes.contains(Code::Ok) {
            return Err(ConfigError::invalid(
                format!("{field}.nonFatalStatusCodes"),
                "OK is not a failure",
            ));
        }
        match &self.delay {
            HedgeDelay::Fixed(_) => Ok(()),
            HedgeDelay::Learned(l) => l.validate(field),
        }
    }
}

/// When a call's hedges are sent.
#[derive(Clone, Debug, PartialEq)]
pub enum HedgeDelay {
    /// The n-th copy after `n × delay` (all at once when it is zero): A6's `hedgingDelay`.
    Fixed(Duration),
    /// A high percentile of the method's recent attempt latency (see the
    /// [docs](RetryPolicy)).
    Learned(LearnedDelay),
}

/// How a learned hedge delay is estimated.
#[derive(Clone, Debug, PartialEq)]
pub struct LearnedDelay {
    /// The percentile of attempt latency the delay is set to, in `(0, 1)`: `0.97` (the
    /// default) hedges about the slowest 3 % of calls. Hedges may spend the upper half of
    /// the retry budget, 5 % of the calls that succeed by default: hedging 3 % leaves room
    /// for bursts, so at a normal load every slow call gets its hedge.
    pub percentile: f64,
    /// The shortest delay: below it a hedge would fire on noise.
    pub floor: Duration,
    /// The longest delay: the tail it still cuts.
    pub ceiling: Duration,
    /// Samples needed before the first hedge (no hedge until the latency is known).
    pub min_samples: u32,
    /// How far back samples count: the estimate covers between one and two windows.
    pub window: Duration,
}

impl Default for LearnedDelay {
    /// p97 of the last 10 to 20 s, between 1 ms and 1 s, after 100 samples.
    fn default() -> Self {
        LearnedDelay {
            percentile: 0.97,
            floor: Duration::from_millis(1),
            ceiling: Duration::from_secs(1),
            min_samples: 100,
            window: Duration::from_secs(10),
        }
    }
}

impl LearnedDelay {
    fn validate(&self, field: &str) -> Result<(), ConfigError> {
        if !(self.percentile > 0.0 && self.percentile < 1.0) {
            return Err(ConfigError::invalid(
                format!("{field}.percentile"),
                format!(
                    "must be between 0 and 1 (exclusive), got {}",
                    self.percentile
                ),
            ));
        }
        if self.floor > self.ceiling {
            return Err(ConfigError::invalid(
                format!("{field}.floor"),
                format!(
                    "must not exceed the ceiling ({:?} > {:?})",
                    self.floor, self.ceiling
                ),
            ));
        }
        if self.window.is_zero() {
            return Err(ConfigError::invalid(
                format!("{field}.window"),
                "must be greater than zero",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
