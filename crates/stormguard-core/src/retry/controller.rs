//! The retry policy of one dependency, shared by every call to it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::backoff::Backoff;
use super::breaker::{BreakerConfig, CircuitBreaker};
use super::call::keying::{backoff_seed, breaker_seed, call_key, connect_seed};
use super::call::{CallRetry, HedgeState};
use super::connect::ConnectBackoff;
use super::decision::Refusal;
use super::delay::DelayEstimator;
use super::policy::{HedgeDelay, HedgingPolicy, MethodTable};
use super::saturation::Saturation;
use super::shared::Shared;
use crate::budget::{Budget, KeyedBudgets};
use crate::deadline::CallTimes;
use crate::deadline::resolve_deadline_at;
use crate::deadline::{CallDeadline, DeadlineSource};
use crate::error::ConfigError;

/// The retry policy of one dependency: its method table, one budget and one optional
/// breaker, shared by every clone.
///
/// The retry decision: may this failed attempt be tried again, and after how long?
///
/// This is the one place where the pieces of the policy meet, so that the client layer and
/// the fleet simulator make exactly the same decisions. A failed attempt is retried only
/// when **all** of these hold, checked in this order (the first that fails names the
/// [`Refusal`]):
///
/// 1. the caller's deadline has not passed (its own deadline running out is final, whatever
///    code the server used: tonic answers an expired `grpc-timeout` with `CANCELLED`);
/// 2. the method has a retry policy and the status is one of its retryable codes (an
///    attempt that timed out counts as retryable: the layer's timer fired, or the server
///    answered `DEADLINE_EXCEEDED`/`CANCELLED` to an attempt whose `grpc-timeout` was its
///    own per-attempt limit; see [`CallRetry::on_attempt_end_at`]);
/// 3. the server did not push back with "do not retry", nor ask for a wait longer than the
///    policy's `max_pushback`;
/// 4. the method is idempotent, or it carries an idempotency key (its server recognises a
///    repeated key and does not run the call twice; see [`CallRetry::idempotency_key`]),
///    or the request never reached the server;
/// 5. the request can be replayed (its body was buffered);
/// 6. attempts so far < `maxAttempts`;
/// 7. the deadline leaves room for the delay plus a useful attempt (a pushback longer than
///    the time left means no retry);
/// 8. the breaker is not open;
/// 9. the dependency's recent load reports (ORCA, when the layer reads them; see
///    [`LoadReport`](crate::LoadReport)) do not say that every endpoint is saturated;
/// 10. the request's retry allowance, when the call runs inside a
///     [`RequestScope`](crate::context::RequestScope) that has one (`x-retry-budget`), has
///     a retry left (it spends one);
/// 11. the budget grants a withdrawal (checked last, because it consumes).
///
/// The delay is the server's pushback when it sent one (exactly, and the backoff restarts),
/// else the next backoff step.
///
/// An attempt that never reached the server's application (a connection that could not be
/// made, a stream HTTP/2 refused with `REFUSED_STREAM` or above a `GOAWAY`'s last stream
/// id) is not a failure of the dependency: it is retried *transparently*, as gRPC A6 does,
/// for free (no budget, no attempt counted, no breaker outcome), at most
/// [`TRANSPARENT_RETRIES`](crate::TRANSPARENT_RETRIES) times per call: at once, or after a
/// refused connection when the connection backoff gives the call a slot
/// ([`CallRetry::on_connect_refused_at`]); see [`CallRetry::on_attempt_end_at`]. While that
/// backoff runs, a new call's first attempt is refused too, but for one probe per slot
/// ([`begin_call_at`](Self::begin_call_at)).
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use stormguard_core::{
///     Budget, BudgetConfig, RetryBudget, Code, MethodTable, RetryPolicy, AttemptEnd, CallTimes,
///     Decision, Failure, RetryController, Instant,
/// };
///
/// let budget: Arc<dyn Budget> = Arc::new(RetryBudget::new(BudgetConfig::default()).unwrap());
/// let policy = RetryPolicy { idempotent: true, ..RetryPolicy::default() };
/// let controller = RetryController::new(MethodTable::uniform(policy), budget, None, 1).unwrap();
/// let now = Instant::now();
/// let mut call = controller.begin_call_at("/pkg.Svc/Get", &CallTimes::default(), now).unwrap();
/// let failed = AttemptEnd::Failed(Failure::status(Code::Unavailable));
/// match call.on_attempt_end_at(failed, now).decision {
///     Decision::Retry { delay } => {
///         assert!(delay <= Duration::from_millis(50));
///         let plan = call.start_retry_at(now + delay).unwrap();
///         assert_eq!(plan.previous_attempts, 1);
///     }
///     other => panic!("no retry: {other:?}"),
/// }
/// ```
#[derive(Clone)]
pub struct RetryController {
    shared: Arc<Shared>,
}

/// One estimator per learned hedging policy of `methods`.
fn estimators(methods: &MethodTable) -> Vec<(Arc<HedgingPolicy>, Arc<DelayEstimator>)> {
    methods
        .hedging_policies()
        .filter_map(|p| match &p.delay {
            HedgeDelay::Learned(l) => {
                Some((Arc::clone(p), Arc::new(DelayEstimator::new(l.clone()))))
            }
            HedgeDelay::Fixed(_) => None,
        })
        .collect()
}

impl fmt::Debug for RetryController {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryController")
            .field("methods", &self.shared.methods)
            .field("budget", &self.shared.budget)
            .field("breaker", &self.shared.breaker.is_some())
            .finish()
    }
}

impl RetryController {
    /// A controller over `methods`, paying for retries from `budget`, failing fast through
    /// `breaker`. `seed` seeds the backoff jitter of every call (call `i` uses a seed
    /// derived from `seed` and `i`), so a seeded run is reproducible. Fails, naming the
    /// field, when a policy of `methods` is out of range (a retry policy of fewer than 2
    /// attempts or no retryable code, a learned hedge delay whose floor is above its
    /// ceiling, ...), as [`from_config`](Self::from_config) does.
    pub fn new(
        methods: MethodTable,
        budget: Arc<dyn Budget>,
        breaker: Option<CircuitBreaker>,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        methods.validate()?;
        Ok(Self::over(methods, budget, breaker, seed))
    }

    /// [`new`](Self::new) for a table already checked.
    fn over(
        methods: MethodTable,
        budget: Arc<dyn Budget>,
        breaker: Option<CircuitBreaker>,
        seed: u64,
    ) -> Self {
        RetryController {
            shared: Arc::new(Shared {
                estimators: estimators(&methods),
                methods,
                budget,
                breaker,
                keyed: None,
                saturation: None,
                seed,
                calls: AtomicU64::new(0),
                connect: Arc::new(ConnectBackoff::new(connect_seed(seed))),
            }),
        }
    }

    /// The same controller, also charging each retry to the key its failed attempt went to
    /// (see [`KeyedBudgets`] and [`CallRetry::set_budget_key`]). Call it before cloning the
    /// controller: clones made earlier keep charging only the shared budget.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use stormguard_core::{Budget, BudgetConfig, KeyedBudgets, RetryBudget};
    /// use stormguard_core::{MethodTable, RetryPolicy};
    /// use stormguard_core::RetryController;
    ///
    /// let budget: Arc<dyn Budget> = Arc::new(RetryBudget::new(BudgetConfig::default())?);
    /// let keyed = KeyedBudgets::new(BudgetConfig::default(), 64)?;
    /// let controller = RetryController::new(MethodTable::uniform(RetryPolicy::default()), budget, None, 1)?
    ///     .with_key_budgets(keyed);
    /// # Ok::<(), stormguard_core::ConfigError>(())
    /// ```
    pub fn with_key_budgets(self, keyed: KeyedBudgets) -> Self {
        self.rebuilt(|shared| shared.keyed = Some(Arc::new(keyed)))
    }

    /// A controller sharing this one's state but for what `edit` changes (the builders
    /// below run once, before any call).
    fn rebuilt(self, edit: impl FnOnce(&mut Shared)) -> Self {
        let old = &*self.shared;
        let mut shared = Shared {
            methods: old.methods.clone(),
            budget: Arc::clone(&old.budget),
            breaker: old.breaker.clone(),
            keyed: old.keyed.clone(),
            saturation: old.saturation.clone(),
            estimators: old.estimators.clone(),
            seed: old.seed,
            calls: AtomicU64::new(old.calls.load(Ordering::Relaxed)),
            connect: Arc::clone(&old.connect),
        };
        edit(&mut shared);
        RetryController {
            shared: Arc::new(shared),
        }
    }

    /// Refuse retries and hedges while `saturation` says every endpoint of the dependency
    /// heard from recently is saturated ([`Refusal::Saturated`]); the layer feeds it the
    /// load reports of every attempt ([`CallRetry::record_load_report_at`]).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use stormguard_core::{
    ///     Budget, BudgetConfig, MethodTable, RetryBudget, RetryController, RetryPolicy, Saturation,
    ///     SaturationConfig,
    /// };
    ///
    /// let budget: Arc<dyn Budget> = Arc::new(RetryBudget::new(BudgetConfig::default())?);
    /// let sat = Arc::new(Saturation::new(SaturationConfig::default())?);
    /// let controller = RetryController::new(MethodTable::uniform(RetryPolicy::default()), budget, None, 1)?
    ///     .with_saturation(sat);
    /// # Ok::<(), stormguard_core::ConfigError>(())
    /// ```
    pub fn with_saturation(self, saturation: Arc<Saturation>) -> Self {
        self.rebuilt(|shared| shared.saturation = Some(saturation))
    }

    /// The load-report tracker, if retries are refused by load reports.
    pub fn saturation(&self) -> Option<&Arc<Saturation>> {
        self.shared.saturation.as_ref()
    }

    /// The accounts per key, if retries are charged per key.
    #[cfg(test)]
    pub(crate) fn key_budgets(&self) -> Option<&KeyedBudgets> {
        self.shared.keyed.as_deref()
    }

    /// A controller over `methods` paying from `budget`, with the breaker `breaker`
    /// describes, its open-duration jitter seeded from `seed` as every random draw of the
    /// controller is ([`from_config`](Self::from_config) builds it so). The table is
    /// already checked.
    pub(crate) fn seeded(
        methods: MethodTable,
        budget: Arc<dyn Budget>,
        breaker: Option<BreakerConfig>,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        let breaker = match breaker {
            Some(b) => Some(CircuitBreaker::new(b, breaker_seed(seed))?),
            None => None,
        };
        Ok(Self::over(methods, budget, breaker, seed))
    }

    /// The budget that pays for retries.
    pub fn budget(&self) -> &Arc<dyn Budget> {
        &self.shared.budget
    }

    /// The breaker, if one is configured.
    pub fn breaker(&self) -> Option<&CircuitBreaker> {
        self.shared.breaker.as_ref()
    }

    #[cfg(test)]
    /// Starts a logical call to `path` (`/pkg.Service/Method`) whose caller waits until
    /// `deadline` (already resolved: a caller's deadline). Fails when the breaker is open
    /// ([`Refusal::Breaker`]) or the dependency is in connection backoff and this is not the
    /// slot's probe ([`Refusal::ConnectBackoff`]): then the first attempt is rejected at
    /// once, without touching the network. A
    /// layer starts calls with [`begin_call_at`](Self::begin_call_at), which resolves the
    /// deadline from everything it knows.
    pub(crate) fn begin_at(
        &self,
        path: &str,
        deadline: Option<Instant>,
        now: Instant,
    ) -> Result<CallRetry, Refusal> {
        let deadline = deadline.map(|at| CallDeadline {
            at,
            source: DeadlineSource::Inbound,
        });
        self.begin_resolved_at(path, deadline, None, now)
    }

    /// Starts a logical call to `path` at `now` with the time limits the layer knows
    /// (`times`). The call's deadline is resolved here, in one place
    /// ([`resolve_deadline_at`], with the method's default from the method table), and so
    /// is each attempt's timeout: the method policy's
    /// [`per_attempt_timeout`](crate::RetryPolicy::per_attempt_timeout), else the layer's.
    ///
    /// Fails when the breaker is open ([`Refusal::Breaker`]), and while the dependency is in
    /// connection backoff ([`Refusal::ConnectBackoff`], gRPC's `TRANSIENT_FAILURE`): after a
    /// refused connection ([`CallRetry::on_connect_refused_at`]) a first attempt would only
    /// dial a dependency that refuses, so it is refused at once, except one probe per slot
    /// of the backoff (1 s after the first refusal, ×1.6 per refusal in a row, at most
    /// 10 s), let through to find the dependency back; the first answer ends the backoff.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use stormguard_core::{Budget, BudgetConfig, CallTimes, Instant, MethodTable};
    /// use stormguard_core::{Refusal, RetryBudget, RetryController, RetryPolicy};
    ///
    /// let budget: Arc<dyn Budget> = Arc::new(RetryBudget::new(BudgetConfig::default())?);
    /// let controller = RetryController::new(MethodTable::uniform(RetryPolicy::default()), budget, None, 1)?;
    /// let now = Instant::now();
    /// let mut call = controller.begin_call_at("/pkg.Svc/Get", &CallTimes::default(), now).unwrap();
    /// call.on_connect_refused_at(now);
    /// // In backoff: the next call is not sent...
    /// let next = controller.begin_call_at("/pkg.Svc/Get", &CallTimes::default(), now);
    /// assert_eq!(next.err(), Some(Refusal::ConnectBackoff));
    /// // ...until the slot, 1 s ± 20 % later, lets one probe through.
    /// let slot = now + Duration::from_millis(1_200);
    /// assert!(controller.begin_call_at("/pkg.Svc/Get", &CallTimes::default(), slot).is_ok());
    /// # Ok::<(), stormguard_core::ConfigError>(())
    /// ```
    pub fn begin_call_at(
        &self,
        path: &str,
        times: &CallTimes,
        now: Instant,
    ) -> Result<CallRetry, Refusal> {
        let deadline = resolve_deadline_at(times, self.shared.methods.timeout(path), now);
        self.begin_resolved_at(path, deadline, times.per_attempt, now)
    }

    fn begin_resolved_at(
        &self,
        path: &str,
        deadline: Option<CallDeadline>,
        layer_attempt_timeout: Option<Duration>,
        now: Instant,
    ) -> Result<CallRetry, Refusal> {
        let permit = match &self.shared.breaker {
            Some(b) => Some(b.acquire_at(now).map_err(|_| Refusal::Breaker)?),
            None => None,
        };
        // After the breaker: a call it refuses takes no probe slot (a half-open permit
        // taken here goes back unused when the call is refused).
        if !self.shared.connect.admits_first_at(now) {
            return Err(Refusal::ConnectBackoff);
        }
        let policy = self.shared.methods.lookup(path).cloned();
        let hedge = match &policy {
            Some(_) => None,
            None => self
                .shared
                .methods
                .lookup_hedging(path)
                .map(|p| HedgeState {
                    estimator: self
                        .shared
                        .estimators
                        .iter()
                        .find(|(q, _)| Arc::ptr_eq(p, q))
                        .map(|(_, e)| Arc::clone(e)),
                    policy: Arc::clone(p),
                    sent: 0,
                    next_at: None,
                    stopped: None,
                }),
        };
        let keyed = self.shared.methods.idempotency_key(path);
        // One call number per call that draws from the seeded RNG (a retried or a keyed
        // call): the jitter and the key of call `n` both come from `seed` and `n`.
        let n =
            (policy.is_some() || keyed).then(|| self.shared.calls.fetch_add(1, Ordering::Relaxed));
        let backoff = policy
            .as_ref()
            .zip(n)
            .map(|(p, n)| Backoff::new(p.backoff, backoff_seed(self.shared.seed, n)));
        let idempotency_key = n.filter(|_| keyed).map(|n| call_key(self.shared.seed, n));
        // A hedged call's copies each have what is left of the call's deadline: a slow copy
        // is answered by the next copy, not by a timer.
        let attempt_timeout = match hedge {
            Some(_) => None,
            None => policy
                .as_ref()
                .and_then(|p| p.per_attempt_timeout)
                .or(layer_attempt_timeout),
        };
        Ok(CallRetry {
            shared: Arc::clone(&self.shared),
            policy,
            backoff,
            previous_attempts: 0,
            deadline: deadline.map(|d| d.at),
            caller_header: deadline.is_some_and(|d| d.source == DeadlineSource::Caller),
            attempt_timeout,
            attempt_deadline: None,
            permit,
            granted: None,
            key: None,
            granted_key: None,
            spent_allowance: false,
            pending_transparent: false,
            transparent_retries: 0,
            hedge,
            endpoints: 1,
            idempotency_key,
            connect_at: None,
        })
    }
}
