//! The retry decision: may this failed attempt be tried again, and after how long?
//!
//! This is the one place where the pieces of the policy meet, so that the client layer and
//! the fleet simulator make exactly the same decisions. A failed attempt is retried only
//! when **all** of these hold, checked in this order (the first that fails names the
//! [`Refusal`]):
//!
//! 1. the caller's deadline has not passed (its own deadline running out is final, whatever
//!    code the server used: tonic answers an expired `grpc-timeout` with `CANCELLED`);
//! 2. the method has a retry policy and the status is one of its retryable codes (an
//!    attempt that timed out counts as retryable: the layer's timer fired, or the server
//!    answered `DEADLINE_EXCEEDED`/`CANCELLED` to an attempt whose `grpc-timeout` was its
//!    own per-attempt limit; see [`CallRetry::on_attempt_end_at`]);
//! 3. the server did not push back with "do not retry", nor ask for a wait longer than the
//!    policy's `max_pushback`;
//! 4. the method is idempotent, or it carries an idempotency key (its server recognises a
//!    repeated key and does not run the call twice; see [`CallRetry::idempotency_key`]),
//!    or the request never reached the server;
//! 5. the request can be replayed (its body was buffered);
//! 6. attempts so far < `maxAttempts`;
//! 7. the deadline leaves room for the delay plus a useful attempt (a pushback longer than
//!    the time left means no retry);
//! 8. the breaker is not open;
//! 9. the dependency's recent load reports (ORCA, when the layer reads them; see
//!    [`crate::orca`]) do not say that every endpoint is saturated;
//! 10. the request's retry allowance, when the call runs inside a
//!     [`RequestScope`](crate::context::RequestScope) that has one (`x-retry-budget`), has
//!     a retry left (it spends one);
//! 11. the budget grants a withdrawal (checked last, because it consumes).
//!
//! The delay is the server's pushback when it sent one (exactly, and the backoff restarts),
//! else the next backoff step.
//!
//! An attempt that never reached the server's application (a connection that could not be
//! made, a stream HTTP/2 refused with `REFUSED_STREAM` or above a `GOAWAY`'s last stream
//! id) is not a failure of the dependency: it is retried *transparently*, as gRPC A6 does,
//! at once and for free (no budget, no attempt counted, no breaker outcome), at most
//! [`TRANSPARENT_RETRIES`] times per call; see [`CallRetry::on_attempt_end_at`].
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use stormguard_core::{
//!     budget::{Budget, BudgetConfig, RetryBudget},
//!     code::Code,
//!     policy::{MethodTable, RetryPolicy},
//!     retry::{AttemptEnd, Decision, Failure, RetryController},
//!     Instant,
//! };
//!
//! let budget: Arc<dyn Budget> = Arc::new(RetryBudget::new(BudgetConfig::default()).unwrap());
//! let policy = RetryPolicy { idempotent: true, ..RetryPolicy::default() };
//! let controller = RetryController::new(MethodTable::uniform(policy), budget, None, 1);
//! let now = Instant::now();
//! let mut call = controller.begin_at("/pkg.Svc/Get", None, now).unwrap();
//! let failed = AttemptEnd::Failed(Failure::status(Code::Unavailable));
//! match call.on_attempt_end_at(failed, now).decision {
//!     Decision::Retry { delay } => {
//!         assert!(delay <= Duration::from_millis(50));
//!         let plan = call.start_retry_at(now + delay).unwrap();
//!         assert_eq!(plan.previous_attempts, 1);
//!     }
//!     other => panic!("no retry: {other:?}"),
//! }
//! ```

pub mod backoff;
pub mod breaker;
pub mod hedge;
pub mod policy;
pub mod throttle;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::Instant;
use crate::backoff::Backoff;
use crate::breaker::{BreakerPermit, BreakerState, CircuitBreaker};
use crate::budget::{Budget, DEFAULT_MAX_KEYS, KeyedBudgets, RetryBudget};
use crate::code::Code;
use crate::config::{BudgetChoice, ClientConfig, ConfigError};
use crate::context;
use crate::deadline::{CallDeadline, CallTimes, DeadlineSource, resolve_deadline_at};
use crate::hedge::{DelayEstimator, HedgeDelay, HedgingPolicy};
use crate::orca::{LoadReport, Saturation};
use crate::policy::{MethodTable, RetryPolicy};
use crate::pushback::Pushback;
use crate::throttle::A6Throttle;
use crate::wire::{UuidKey, uuid_v4};

/// Why a failed attempt was not retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Refusal {
    /// The status is not retryable for this method, or the method has no retry policy.
    NotRetryable,
    /// The method is neither idempotent nor keyed (an idempotency key) and the request may
    /// have reached the server.
    NotIdempotent,
    /// The server's pushback said not to retry.
    Pushback,
    /// The attempt limit was reached.
    Attempts,
    /// Not enough time is left on the caller's deadline.
    Deadline,
    /// The circuit breaker is open.
    Breaker,
    /// The retry budget is spent.
    Budget,
    /// The key the failed attempt went to (its replica, or the request's shard) has spent
    /// its own account: see [`KeyedBudgets`].
    KeyBudget,
    /// The request body was too large to buffer for replay.
    ReplayLimit,
    /// The request-scoped retry allowance (`x-retry-budget`) is spent.
    Allowance,
    /// The dependency's recent load reports (ORCA) say it is saturated: every endpoint
    /// heard from is running at its limit with calls queued (see [`crate::orca`]).
    Saturated,
}

impl Refusal {
    /// Every refusal, in declaration order (the [module docs](self) give the order in which
    /// the checks run: a passed deadline first, the budget last).
    pub const ALL: [Refusal; 11] = [
        Refusal::NotRetryable,
        Refusal::NotIdempotent,
        Refusal::Pushback,
        Refusal::Attempts,
        Refusal::Deadline,
        Refusal::Breaker,
        Refusal::Budget,
        Refusal::KeyBudget,
        Refusal::ReplayLimit,
        Refusal::Allowance,
        Refusal::Saturated,
    ];

    /// A short stable name, used as a metric label and a JSON key.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::NotRetryable => "not_retryable",
            Refusal::NotIdempotent => "not_idempotent",
            Refusal::Pushback => "pushback",
            Refusal::Attempts => "attempts",
            Refusal::Deadline => "deadline",
            Refusal::Breaker => "breaker",
            Refusal::Budget => "budget",
            Refusal::KeyBudget => "key_budget",
            Refusal::ReplayLimit => "replay_limit",
            Refusal::Allowance => "allowance",
            Refusal::Saturated => "saturated",
        }
    }

    /// Whether the failure was retryable and stormguard chose not to retry it (budget,
    /// breaker, attempts, deadline, request allowance). Such a failure should not be retried
    /// by any layer above either: the client layer answers it with
    /// `grpc-retry-pushback-ms: -1`.
    pub fn is_retryable_but_refused(self) -> bool {
        matches!(
            self,
            Refusal::Attempts
                | Refusal::Deadline
                | Refusal::Breaker
                | Refusal::Budget
                | Refusal::KeyBudget
                | Refusal::Allowance
                | Refusal::Saturated
        )
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What is known about a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The status code of the attempt (`UNAVAILABLE` for a transport failure).
    pub code: Code,
    /// The server's `grpc-retry-pushback-ms`, if it sent one.
    pub pushback: Option<Pushback>,
    /// Whether the request can be sent again (its body was buffered).
    pub replayable: bool,
    /// Whether the request provably never reached the server's application: the connection
    /// could not be made, HTTP/2 refused the stream (`REFUSED_STREAM`, or a stream above a
    /// `GOAWAY`'s last stream id), or the request was never handed to a connection. Even a
    /// non-idempotent method may then be retried, and the retry is
    /// [transparent](CallRetry::on_attempt_end_at) while the call has transparent retries
    /// left.
    pub unsent: bool,
    /// Whether the server said its application never ran the request (a stormguard
    /// server's own answer: shed, shutting down, expired while queued; the
    /// `stormguard-unprocessed` header), so that a non-idempotent method may be retried
    /// too. Unlike `unsent`, such a retry is paid and counted as any other.
    pub unprocessed: bool,
}

impl Failure {
    /// A replayable failure with `code`, no pushback, that may have reached the server.
    pub fn status(code: Code) -> Self {
        Failure {
            code,
            pushback: None,
            replayable: true,
            unsent: false,
            unprocessed: false,
        }
    }

    /// The same failure with a pushback.
    pub fn with_pushback(self, pushback: Option<Pushback>) -> Self {
        Failure { pushback, ..self }
    }
}

/// The verdict on a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Wait `delay`, call [`CallRetry::start_retry_at`], then send the next attempt.
    Retry {
        /// How long to wait first.
        delay: Duration,
    },
    /// Return the last status to the caller.
    GiveUp(Refusal),
    /// The caller's deadline has passed: the call ends with `DEADLINE_EXCEEDED`, never
    /// retried, whatever the attempt's answer was (only [`CallRetry::on_attempt_end_at`]
    /// decides this).
    Expired,
}

/// How an attempt ended before the call committed, as the layer (or the simulator) saw it:
/// the one input of [`CallRetry::on_attempt_end_at`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptEnd {
    /// An answer that is not `OK`: a trailers-only status, a proxy's HTTP error, or a
    /// transport error read as a status.
    Failed(Failure),
    /// A timer ended the attempt without an answer: the layer's own timer, or one below it
    /// (the channel's `grpc-timeout` timer, `Endpoint::timeout`, a `tower::timeout`).
    TimedOut {
        /// Whether the request can be sent again.
        replayable: bool,
        /// Whether the request provably never reached the server (a connection that timed
        /// out), as in [`Failure::unsent`].
        unsent: bool,
    },
}

/// The verdict on an ended attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// What follows.
    pub decision: Decision,
    /// Whether the attempt ran out of its per-attempt timeout (then it was recorded as a
    /// failure of the dependency, and a give-up answers `DEADLINE_EXCEEDED`).
    pub attempt_timed_out: bool,
    /// Whether the retry granted is transparent: the attempt never reached the server's
    /// application ([`Failure::unsent`]), so its retry is free. It is not paid from the
    /// budget, not counted against `maxAttempts` nor in `grpc-previous-rpc-attempts` (the
    /// plan [`start_retry_at`](CallRetry::start_retry_at) makes carries the same number as the
    /// attempt it replaces), not a failure for the breaker, and sent without a delay. Only
    /// with [`Decision::Retry`].
    pub transparent: bool,
}

/// What the attempt about to be sent carries and when it must end: from
/// [`CallRetry::first_attempt_at`] and [`CallRetry::start_retry_at`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttemptPlan {
    /// Attempts before this one: the value of `grpc-previous-rpc-attempts` (0 on the first).
    pub previous_attempts: u32,
    /// The `grpc-timeout` to write on the attempt; `None` when the request must keep what it
    /// has (no deadline, or the caller's own header, which is already this attempt's limit).
    pub grpc_timeout: Option<Duration>,
    /// When the layer's timer fires: the earlier of the call's deadline and the attempt's own.
    pub fire_at: Option<Instant>,
    /// The per-attempt timeout, when it is what limits this attempt (its own deadline comes
    /// before the call's): `grpc_timeout` is then exactly this, the same for every such
    /// attempt of the method, so a layer may encode it once.
    pub attempt_limit: Option<Duration>,
    /// Whether this attempt is a transparent retry (see [`Verdict::transparent`]): it
    /// replaces an attempt that never reached the server's application, and carries the same
    /// `previous_attempts`. A layer counts it apart from the retries it paid for.
    pub transparent: bool,
}

/// The retry policy of one dependency: its method table, one budget and one optional
/// breaker, shared by every clone.
#[derive(Clone)]
pub struct RetryController {
    shared: Arc<Shared>,
}

struct Shared {
    methods: MethodTable,
    budget: Arc<dyn Budget>,
    breaker: Option<CircuitBreaker>,
    /// Accounts per key (replica or shard), when the budget is stormguard's.
    keyed: Option<Arc<KeyedBudgets>>,
    /// What the dependency's load reports say, when the layer reads them.
    saturation: Option<Arc<Saturation>>,
    /// The learned hedge delays, one per hedging policy of the table that learns its delay
    /// (found by the policy's address: a lookup allocates nothing).
    estimators: Vec<(Arc<HedgingPolicy>, Arc<DelayEstimator>)>,
    seed: u64,
    calls: AtomicU64,
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
    /// derived from `seed` and `i`), so a seeded run is reproducible.
    pub fn new(
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
            }),
        }
    }

    /// The same controller, also charging each retry to the key its failed attempt went to
    /// (see [`KeyedBudgets`] and [`CallRetry::set_budget_key`]). Call it before cloning the
    /// controller: clones made earlier keep charging only the shared budget.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use stormguard_core::budget::{Budget, BudgetConfig, KeyedBudgets, RetryBudget};
    /// use stormguard_core::policy::{MethodTable, RetryPolicy};
    /// use stormguard_core::retry::RetryController;
    ///
    /// let budget: Arc<dyn Budget> = Arc::new(RetryBudget::new(BudgetConfig::default())?);
    /// let keyed = KeyedBudgets::new(BudgetConfig::default(), 64)?;
    /// let controller = RetryController::new(MethodTable::uniform(RetryPolicy::default()), budget, None, 1)
    ///     .with_key_budgets(keyed);
    /// assert!(controller.key_budgets().is_some());
    /// # Ok::<(), stormguard_core::config::ConfigError>(())
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
    /// use stormguard_core::{budget::*, orca::*, policy::*, retry::RetryController};
    ///
    /// let budget: Arc<dyn Budget> = Arc::new(RetryBudget::new(BudgetConfig::default())?);
    /// let sat = Arc::new(Saturation::new(SaturationConfig::default())?);
    /// let controller = RetryController::new(MethodTable::uniform(RetryPolicy::default()), budget, None, 1)
    ///     .with_saturation(sat);
    /// assert!(controller.saturation().is_some());
    /// # Ok::<(), stormguard_core::config::ConfigError>(())
    /// ```
    pub fn with_saturation(self, saturation: Arc<Saturation>) -> Self {
        self.rebuilt(|shared| shared.saturation = Some(saturation))
    }

    /// The load-report tracker, if retries are refused by load reports.
    pub fn saturation(&self) -> Option<&Arc<Saturation>> {
        self.shared.saturation.as_ref()
    }

    /// The accounts per key, if retries are charged per key.
    pub fn key_budgets(&self) -> Option<&KeyedBudgets> {
        self.shared.keyed.as_deref()
    }

    /// A controller for `config` (validated first): its method table, the budget or A6
    /// throttle it names, and its breaker. `seed` seeds the backoff jitter and the breaker's
    /// open-duration jitter, so a seeded run can be reproduced.
    ///
    /// ```
    /// use stormguard_core::{config::ClientConfig, retry::RetryController};
    ///
    /// let controller = RetryController::from_config(&ClientConfig::standard(), 7).unwrap();
    /// assert!(controller.methods().lookup("/pkg.Svc/Get").is_some());
    /// ```
    pub fn from_config(config: &ClientConfig, seed: u64) -> Result<Self, ConfigError> {
        config.validate()?;
        let budget: Arc<dyn Budget> = match &config.budget {
            BudgetChoice::Stormguard(b) => Arc::new(RetryBudget::new(b.clone())?),
            BudgetChoice::A6(t) => Arc::new(A6Throttle::new(t.clone())?),
        };
        let breaker = match &config.breaker {
            Some(b) => Some(CircuitBreaker::new(
                b.clone(),
                splitmix64(seed ^ 0x0B2E_A4E2),
            )?),
            None => None,
        };
        let mut controller = RetryController::new(config.methods.clone(), budget, breaker, seed);
        if let Some(load_reports) = config.load_reports {
            controller = controller.with_saturation(Arc::new(Saturation::new(load_reports)?));
        }
        Ok(match &config.budget {
            // One account per replica (or shard) beside the shared budget; an A6 throttle
            // is one token bucket, as A6 defines it.
            BudgetChoice::Stormguard(b) => {
                controller.with_key_budgets(KeyedBudgets::new(b.clone(), DEFAULT_MAX_KEYS)?)
            }
            BudgetChoice::A6(_) => controller,
        })
    }

    /// The budget that pays for retries.
    pub fn budget(&self) -> &Arc<dyn Budget> {
        &self.shared.budget
    }

    /// The breaker, if one is configured.
    pub fn breaker(&self) -> Option<&CircuitBreaker> {
        self.shared.breaker.as_ref()
    }

    /// The method table.
    pub fn methods(&self) -> &MethodTable {
        &self.shared.methods
    }

    /// Starts a logical call to `path` (`/pkg.Service/Method`) whose caller waits until
    /// `deadline` (already resolved: a caller's deadline). Fails only when the breaker is
    /// open: then the first attempt is rejected at once, without touching the network. A
    /// layer starts calls with [`begin_call_at`](Self::begin_call_at), which resolves the
    /// deadline from everything it knows.
    pub fn begin_at(
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
    /// [`per_attempt_timeout`](RetryPolicy::per_attempt_timeout), else the layer's. Fails
    /// only when the breaker is open.
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
            .map(|(p, n)| Backoff::new(p.backoff, splitmix64(self.shared.seed ^ splitmix64(n))));
        let idempotency_key = n.filter(|_| keyed).map(|n| {
            let mut rng =
                fastrand::Rng::with_seed(splitmix64(self.shared.seed ^ KEY_SALT ^ splitmix64(n)));
            uuid_v4(rng.u128(..))
        });
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
        })
    }

    /// [`begin_at`](Self::begin_at) now.
    pub fn begin(&self, path: &str, deadline: Option<Instant>) -> Result<CallRetry, Refusal> {
        self.begin_at(path, deadline, Instant::now())
    }
}

/// The retry state of one logical call.
pub struct CallRetry {
    shared: Arc<Shared>,
    policy: Option<Arc<RetryPolicy>>,
    backoff: Option<Backoff>,
    previous_attempts: u32,
    deadline: Option<Instant>,
    /// Whether the deadline is the caller's own `grpc-timeout` (the first attempt then sends
    /// the header as the caller wrote it).
    caller_header: bool,
    /// How long each attempt may take, if limited.
    attempt_timeout: Option<Duration>,
    /// When the attempt in flight times out, if before the call's deadline.
    attempt_deadline: Option<Instant>,
    permit: Option<BreakerPermit>,
    /// When the budget granted the retry that has not started yet.
    granted: Option<Instant>,
    /// The budget key of the attempt that ended last ([`CallRetry::set_budget_key`]).
    key: Option<u64>,
    /// The key that paid for the retry granted and not started yet.
    granted_key: Option<u64>,
    /// Whether that retry spent one of the request's allowance (given back with it).
    spent_allowance: bool,
    /// Whether the retry granted and not started yet is transparent (free).
    pending_transparent: bool,
    /// Transparent retries this call has made (see [`TRANSPARENT_RETRIES`]).
    transparent_retries: u32,
    /// The call's hedging, when its method is hedged.
    hedge: Option<HedgeState>,
    /// How many endpoints a retry could go to ([`CallRetry::set_endpoints`]).
    endpoints: usize,
    /// The call's idempotency key, when its method is keyed.
    idempotency_key: Option<UuidKey>,
}

/// The hedges of one call.
struct HedgeState {
    policy: Arc<HedgingPolicy>,
    estimator: Option<Arc<DelayEstimator>>,
    /// Copies sent so far, the first included.
    sent: u32,
    /// When the next copy is due, if one may follow.
    next_at: Option<Instant>,
    /// Why no copy may follow any more, once that is known.
    stopped: Option<Refusal>,
}

impl HedgeState {
    /// The delay before the next copy, at `now`; `None` while a learned delay has too few
    /// samples (then no hedge is sent).
    fn delay_at(&self, now: Instant) -> Option<Duration> {
        match (&self.policy.delay, &self.estimator) {
            (HedgeDelay::Fixed(d), _) => Some(*d),
            (HedgeDelay::Learned(_), Some(e)) => e.delay_at(now),
            (HedgeDelay::Learned(_), None) => None,
        }
    }

    /// Schedules the copy after one sent (or answered non-fatally) at `now`, `after` from
    /// now, if another may follow.
    fn schedule(&mut self, now: Instant, after: Option<Duration>) {
        self.next_at = match self.stopped {
            Some(_) => None,
            None if self.sent >= self.policy.effective_max_attempts() => None,
            None => after.map(|d| crate::deadline::Deadline::after_at(now, d).instant()),
        };
    }
}

/// What follows a hedged copy that ended without winning: from
/// [`CallRetry::on_hedge_end_at`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HedgeDecision {
    /// Other copies are in flight or another is due ([`CallRetry::next_hedge_at`]): wait for
    /// them.
    Wait,
    /// The call ends with this copy's answer: a fatal status
    /// ([`Refusal::NotRetryable`]: every other copy is cancelled), or the last copy failed
    /// and no other may follow (why).
    GiveUp(Refusal),
    /// The caller's deadline has passed: the call ends with `DEADLINE_EXCEEDED`.
    Expired,
}

impl Drop for CallRetry {
    /// A retry the budget granted but that never started goes back to the budget.
    fn drop(&mut self) {
        if let Some(at) = self.granted.take() {
            self.refund_budget(at);
            self.refund_allowance();
        }
    }
}

impl fmt::Debug for CallRetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallRetry")
            .field("policy", &self.policy)
            .field("previous_attempts", &self.previous_attempts)
            .field("deadline", &self.deadline)
            .finish()
    }
}

impl CallRetry {
    /// Attempts made before the one in flight: the value of `grpc-previous-rpc-attempts`
    /// (0 on the first attempt).
    pub fn previous_attempts(&self) -> u32 {
        self.previous_attempts
    }

    /// The caller's deadline.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Time left at `now` on the caller's deadline.
    pub fn remaining_at(&self, now: Instant) -> Option<Duration> {
        self.deadline.map(|d| d.saturating_duration_since(now))
    }

    /// Whether the method may be sent more than once at all (retried or hedged); when it
    /// may not, there is no need to buffer its request body.
    pub fn is_retryable_method(&self) -> bool {
        self.policy.is_some() || self.hedge.is_some()
    }

    /// The idempotency key drawn for this call when its method is keyed
    /// ([`MethodTable::idempotency_key`]): a UUID v4 from the controller's seeded RNG, which
    /// every attempt and hedge carries as `idempotency-key` (the layer keeps a key the caller
    /// set instead). A keyed call is retried after it may have run, as an idempotent one is:
    /// the server that recognises the key answers a repeat with what the first run answered.
    /// `None`: the method is not keyed.
    pub fn idempotency_key(&self) -> Option<&UuidKey> {
        self.idempotency_key.as_ref()
    }

    /// Whether the method is keyed (see [`idempotency_key`](Self::idempotency_key)).
    pub fn is_keyed(&self) -> bool {
        self.idempotency_key.is_some()
    }

    /// Whether the method is hedged: its copies are sent by
    /// [`start_hedge_at`](Self::start_hedge_at) and their failures go to
    /// [`on_hedge_end_at`](Self::on_hedge_end_at), never retried.
    pub fn is_hedged(&self) -> bool {
        self.hedge.is_some()
    }

    /// When the next hedge is due, if one may follow (set by the first attempt, each hedge
    /// and each non-fatal answer).
    pub fn next_hedge_at(&self) -> Option<Instant> {
        self.hedge.as_ref().and_then(|h| h.next_at)
    }

    /// Why the call's hedges stopped, once no hedge may follow for a reason other than
    /// its answers (budget, breaker, allowance, deadline, pushback).
    pub fn hedges_stopped(&self) -> Option<Refusal> {
        self.hedge.as_ref().and_then(|h| h.stopped)
    }

    /// No copy of the call may follow (`why`): its request cannot be sent twice at once (a
    /// streaming body, which only one copy at a time can read), or the channel cannot take
    /// another. Copies in flight go on.
    pub fn stop_hedges(&mut self, why: Refusal) {
        if let Some(hedge) = self.hedge.as_mut() {
            hedge.stopped.get_or_insert(why);
            hedge.next_at = None;
        }
    }

    /// Copies of the call sent so far (the first included); 0 when it is not hedged.
    pub fn hedges_sent(&self) -> u32 {
        self.hedge.as_ref().map_or(0, |h| h.sent)
    }

    /// The next copy of a hedged call is about to be sent at `now`: what it carries. Every
    /// hedge is an attempt, checked in this order, and refused (not queued: the refusal
    /// stops the call's hedges) when one fails:
    ///
    /// 1. enough time is left on the call's deadline for a useful attempt
    ///    ([`Refusal::Deadline`]);
    /// 2. copies so far < `maxAttempts` ([`Refusal::Attempts`]);
    /// 3. no pushback stopped the hedges ([`Refusal::Pushback`]);
    /// 4. the breaker is closed: neither open nor probing ([`Refusal::Breaker`]);
    /// 5. the load reports do not say the dependency is saturated
    ///    ([`Refusal::Saturated`], with [`RetryController::with_saturation`]);
    /// 6. the request's retry allowance has one left (it spends one;
    ///    [`Refusal::Allowance`]);
    /// 7. the budget grants a withdrawal, from the same budget that pays for retries but
    ///    only from its upper half ([`Budget::withdraw_hedge_at`]): a stormguard budget
    ///    while half of what its window minted is left after it, an A6 throttle while it
    ///    holds more than half its tokens ([`Refusal::Budget`]).
    ///
    /// A hedge granted is spent: it carries `grpc-previous-rpc-attempts` (the copies sent
    /// before it), and the next copy is scheduled a delay later.
    pub fn start_hedge_at(&mut self, now: Instant) -> Result<AttemptPlan, Refusal> {
        let refusal = self.hedge_refusal_at(now);
        let Some(hedge) = self.hedge.as_mut() else {
            return Err(Refusal::NotRetryable);
        };
        if let Some(refusal) = refusal {
            hedge.stopped = Some(refusal);
            hedge.next_at = None;
            return Err(refusal);
        }
        self.previous_attempts = hedge.sent;
        hedge.sent += 1;
        let delay = hedge.delay_at(now);
        hedge.schedule(now, delay);
        Ok(self.plan_at(now, false))
    }

    fn hedge_refusal_at(&mut self, now: Instant) -> Option<Refusal> {
        let hedge = self.hedge.as_ref()?;
        if let Some(stopped) = hedge.stopped {
            return Some(stopped);
        }
        if self
            .deadline
            .is_some_and(|d| hedge.policy.min_attempt_time >= d.saturating_duration_since(now))
        {
            return Some(Refusal::Deadline);
        }
        if hedge.sent >= hedge.policy.effective_max_attempts() {
            return Some(Refusal::Attempts);
        }
        if let Some(breaker) = &self.shared.breaker
            && !matches!(breaker.state_at(now), BreakerState::Closed)
        {
            return Some(Refusal::Breaker);
        }
        if self.saturated_at(now) {
            return Some(Refusal::Saturated);
        }
        if !context::spend_retry() {
            return Some(Refusal::Allowance);
        }
        if !self.shared.budget.withdraw_hedge_at(now) {
            context::refund_retry();
            return Some(Refusal::Budget);
        }
        None
    }

    /// A copy of a hedged call ended at `now` without winning (`end`: a status, a transport
    /// failure, a timer below the layer) while `in_flight` other copies still run. A6's
    /// rules, in this order:
    ///
    /// 1. at or after the caller's deadline the call has expired ([`HedgeDecision::Expired`]);
    /// 2. a status that is not one of the policy's non-fatal codes ends the call with this
    ///    answer: the layer cancels every other copy. A copy that never reached the
    ///    server's application is non-fatal whatever its code: one that was never sent
    ///    ([`Failure::unsent`]), or one a stormguard server shed, or refused while shutting
    ///    down, without running it ([`Failure::unprocessed`]): a server that sheds a hedge
    ///    (as it sheds hedges before first attempts) must not fail the copy still running;
    /// 3. a non-fatal failure costs an A6 throttle a token; its pushback `-1` (or one longer
    ///    than `max_pushback`) stops further hedges, `N` ms puts the next one `N` from now,
    ///    and without one the next copy is due at once;
    /// 4. when no copy is in flight and none may follow, the call ends with this answer.
    pub fn on_hedge_end_at(
        &mut self,
        end: AttemptEnd,
        in_flight: usize,
        now: Instant,
    ) -> HedgeDecision {
        let failure = match end {
            AttemptEnd::Failed(f) => f,
            AttemptEnd::TimedOut { replayable, unsent } => Failure {
                code: Code::DeadlineExceeded,
                pushback: None,
                replayable,
                unsent,
                unprocessed: false,
            },
        };
        if self.deadline.is_some_and(|d| now >= d) {
            self.on_deadline_passed_at(Some(&failure), now);
            return HedgeDecision::Expired;
        }
        let Some(hedge) = self.hedge.as_mut() else {
            return HedgeDecision::GiveUp(Refusal::NotRetryable);
        };
        // A copy the server never ran (a stormguard server shed it, or it never reached
        // the server) says nothing about the call: the others may still answer.
        let non_fatal = failure.unsent
            || failure.unprocessed
            || hedge.policy.non_fatal_codes.contains(failure.code);
        if !non_fatal {
            self.record_outcome_at(failure.code, failure.pushback, now);
            return HedgeDecision::GiveUp(Refusal::NotRetryable);
        }
        if !failure.unsent {
            self.shared.budget.record_failure_at(now);
        }
        let after = match failure.pushback {
            Some(Pushback::DoNotRetry) => None,
            Some(Pushback::RetryAfter(d)) if d > hedge.policy.max_pushback => None,
            Some(Pushback::RetryAfter(d)) => Some(d),
            None => Some(Duration::ZERO),
        };
        if after.is_none() {
            hedge.stopped = Some(Refusal::Pushback);
        }
        hedge.schedule(now, after);
        if in_flight == 0 && hedge.next_at.is_none() {
            let why = hedge.stopped.unwrap_or(Refusal::Attempts);
            // The call's last copy failed: the breaker hears how.
            self.record_breaker_outcome_at(failure.code, failure.pushback, now);
            return HedgeDecision::GiveUp(why);
        }
        HedgeDecision::Wait
    }

    /// A copy of the call ran for `elapsed` and ended at `now`, whichever way (won, lost
    /// and cancelled, failed, cut off by the deadline): the method's learned hedge delay
    /// counts it. Nothing when the delay is fixed.
    pub fn record_hedge_latency_at(&self, elapsed: Duration, now: Instant) {
        if let Some(e) = self.hedge.as_ref().and_then(|h| h.estimator.as_ref()) {
            e.record_at(elapsed, now);
        }
    }

    /// Settles the breaker permit for a final non-fatal answer of a hedged call: a failure,
    /// unless it is an overload answer (never health, never a failure).
    fn record_breaker_outcome_at(&mut self, code: Code, pushback: Option<Pushback>, now: Instant) {
        if let Some(permit) = self.permit.take()
            && !is_overload(code, pushback)
        {
            permit.failure_at(now);
        }
    }

    /// The attempt answered `OK`: deposits into the budget and reports a success to the
    /// breaker. Only `OK` mints retries (as in gRPC A6 and its C-core and Java clients).
    pub fn on_success_at(&mut self, now: Instant) {
        self.shared.budget.deposit_at(now);
        if let (Some(keyed), Some(key)) = (&self.shared.keyed, self.key) {
            keyed.deposit_at(key, now);
        }
        if let Some(permit) = self.permit.take() {
            permit.success_at(now);
        }
    }

    /// The attempt failed before the call was committed. Records the failure (breaker,
    /// throttle) and decides whether to retry.
    ///
    /// A keyed call answered `ABORTED` by a server that did not run it
    /// ([`Failure::unprocessed`]) met a first run of the same key still in progress: that is
    /// no failure of the dependency (recorded nowhere) and, whatever the method's retryable
    /// codes, it is retried under every other rule, after the server's pushback, so that
    /// the retry finds the first run's recorded answer.
    pub(crate) fn on_failure_at(&mut self, failure: &Failure, now: Instant) -> Decision {
        let in_progress = self.is_keyed() && failure.unprocessed && failure.code == Code::Aborted;
        let retryable_code = if in_progress {
            drop(self.permit.take());
            true
        } else {
            self.record_outcome_at(failure.code, failure.pushback, now)
        };
        let deadline_passed = self.deadline.is_some_and(|d| now >= d);
        match self.decide(failure, retryable_code, deadline_passed, now) {
            Ok(delay) => Decision::Retry { delay },
            Err(refusal) => Decision::GiveUp(refusal),
        }
    }

    /// How long each attempt may take: the method policy's
    /// [`per_attempt_timeout`](RetryPolicy::per_attempt_timeout), else the layer's (see
    /// [`RetryController::begin_call_at`]), if any.
    pub fn per_attempt_timeout(&self) -> Option<Duration> {
        self.attempt_timeout
    }

    /// The first attempt is about to be sent at `now`: what it carries and when it must end.
    pub fn first_attempt_at(&mut self, now: Instant) -> AttemptPlan {
        if let Some(hedge) = self.hedge.as_mut() {
            hedge.sent = 1;
            let delay = hedge.delay_at(now);
            hedge.schedule(now, delay);
        }
        self.plan_at(now, false)
    }

    /// The limits of an attempt sent at `now` (`transparent`: a transparent retry); records
    /// its own deadline.
    fn plan_at(&mut self, now: Instant, transparent: bool) -> AttemptPlan {
        // Saturates: an absurd timeout means "no practical limit", not a panic.
        let own = self
            .attempt_timeout
            .map(|t| crate::deadline::Deadline::after_at(now, t).instant());
        self.attempt_deadline = match (self.deadline, own) {
            (Some(call), Some(attempt)) if attempt < call => Some(attempt),
            (Some(_), _) => None,
            (None, attempt) => attempt,
        };
        let fire_at = self.attempt_deadline.or(self.deadline);
        // The first attempt of a call whose deadline is the caller's own header keeps that
        // header (it was encoded a moment ago): no second encoding. Every other attempt
        // with a limit says what is left of it, a transparent retry of the first attempt
        // too (its request is rebuilt without the header).
        let first = self.previous_attempts == 0 && !transparent;
        let keep = first && self.caller_header && self.attempt_deadline.is_none();
        AttemptPlan {
            previous_attempts: self.previous_attempts,
            grpc_timeout: fire_at
                .filter(|_| !keep)
                .map(|at| at.saturating_duration_since(now)),
            fire_at,
            attempt_limit: self.attempt_deadline.and(self.attempt_timeout),
            transparent,
        }
    }

    /// The one entry point for an attempt that ended before the call committed (an `OK`
    /// goes to [`on_success_at`](Self::on_success_at), a commit to
    /// [`on_commit_at`](Self::on_commit_at)). In this order:
    ///
    /// 1. at or after the caller's deadline the call has expired, whatever the answer (the
    ///    channel's timer or a server's late `CANCELLED` may beat the layer's timer to it):
    ///    [`Decision::Expired`]. The caller's deadline says nothing about the dependency (a
    ///    batch job with 5 ms deadlines on a 10 ms method must not open the breaker every
    ///    other caller shares), so only an answer that is not itself an expiry is recorded;
    /// 2. a timer that ended the attempt before that is the attempt timing out; so is an
    ///    expiry answer (`DEADLINE_EXCEEDED`, or `CANCELLED`, tonic's answer to an expired
    ///    `grpc-timeout`) to an attempt whose `grpc-timeout` was its own per-attempt limit
    ///    (the plan's [`attempt_limit`](AttemptPlan::attempt_limit): its own deadline came
    ///    before the call's), whenever it arrives. A server that answers early because the
    ///    attempt cannot finish within that limit (a `ShedLayer` answers a queued call at
    ///    once when its wait would outlast it) has only said sooner what the layer's timer
    ///    would have said later. The attempt timing out is a failure of the dependency (the
    ///    breaker counts it, an A6 throttle takes a token), retried whatever the method's
    ///    retryable codes, under every other rule. An expiry answer to an attempt that
    ///    carried what was left of the call's own deadline (or no limit at all) is about the
    ///    call, not the attempt, and stays a plain answer (final unless the method retries
    ///    its code);
    /// 3. a failure that never reached the server's application ([`Failure::unsent`]: a
    ///    connection that could not be made, a stream HTTP/2 refused) is retried
    ///    *transparently*, as gRPC A6 retries such attempts, while the call has made fewer
    ///    than [`TRANSPARENT_RETRIES`] of them: at once (no backoff), not paid from the
    ///    budget or the request's allowance, not counted against `maxAttempts` nor in
    ///    `grpc-previous-rpc-attempts`, for a non-idempotent method too, and recorded nowhere
    ///    (the breaker permit is released without an outcome). It still needs a replayable
    ///    request, room on the call's deadline for a useful attempt, no pushback saying
    ///    otherwise, and a breaker that is not open ([`Verdict::transparent`] says so);
    /// 4. any other answer (an unsent failure past the bound included) is a failure:
    ///    recorded, then retried only if every rule of the [module docs](self) holds.
    pub fn on_attempt_end_at(&mut self, end: AttemptEnd, now: Instant) -> Verdict {
        if self.deadline.is_some_and(|d| now >= d) {
            let answer = match &end {
                AttemptEnd::Failed(f) => Some(f),
                AttemptEnd::TimedOut { .. } => None,
            };
            self.on_deadline_passed_at(answer, now);
            return Verdict {
                decision: Decision::Expired,
                attempt_timed_out: false,
                transparent: false,
            };
        }
        if let AttemptEnd::Failed(f) = &end
            && let Some(decision) = self.transparent_retry_at(f, now)
        {
            return Verdict {
                decision,
                attempt_timed_out: false,
                transparent: matches!(decision, Decision::Retry { .. }),
            };
        }
        let (failure, timed_out) = match end {
            AttemptEnd::TimedOut { replayable, unsent } => (
                Failure {
                    code: Code::DeadlineExceeded,
                    pushback: None,
                    replayable,
                    unsent,
                    unprocessed: false,
                },
                true,
            ),
            AttemptEnd::Failed(f) => {
                // Set exactly when the attempt's own limit, not the call's deadline, was what
                // its `grpc-timeout` carried (see `plan_at`).
                let own_limit = self.attempt_deadline.is_some();
                let expiry = matches!(f.code, Code::DeadlineExceeded | Code::Cancelled);
                (f, own_limit && expiry)
            }
        };
        let decision = if timed_out {
            self.on_attempt_timeout_at(&failure, now)
        } else {
            self.on_failure_at(&failure, now)
        };
        Verdict {
            decision,
            attempt_timed_out: timed_out,
            transparent: false,
        }
    }

    /// The transparent retry of `failure`, when it is one (see
    /// [`on_attempt_end_at`](Self::on_attempt_end_at), step 3): `None` when the failure may
    /// have reached the application or the call has used its transparent retries, and it
    /// goes the ordinary way.
    fn transparent_retry_at(&mut self, failure: &Failure, now: Instant) -> Option<Decision> {
        if !failure.unsent || self.transparent_retries >= TRANSPARENT_RETRIES {
            return None;
        }
        let policy = self.policy.as_ref()?;
        // Recorded nowhere: the dependency's application never saw the attempt.
        drop(self.permit.take());
        let refusal = if matches!(failure.pushback, Some(Pushback::DoNotRetry)) {
            Some(Refusal::Pushback)
        } else if !failure.replayable {
            Some(Refusal::ReplayLimit)
        } else if self
            .deadline
            .is_some_and(|d| policy.min_attempt_time >= d.saturating_duration_since(now))
        {
            Some(Refusal::Deadline)
        } else if self
            .shared
            .breaker
            .as_ref()
            .is_some_and(|b| matches!(b.state_at(now), BreakerState::Open { .. }))
        {
            Some(Refusal::Breaker)
        } else {
            None
        };
        Some(match refusal {
            Some(refusal) => Decision::GiveUp(refusal),
            None => {
                self.pending_transparent = true;
                Decision::Retry {
                    delay: Duration::ZERO,
                }
            }
        })
    }

    /// The attempt ran out of its per-attempt timeout before the call's deadline: a
    /// failure of the dependency (the breaker counts it, an A6 throttle takes a token) that
    /// is retried like a retryable status whatever the method's retryable codes, under every
    /// other rule (pushback, idempotency, attempts, deadline, breaker, budget). `failure`
    /// says whether the request can be replayed; its code is read as `DEADLINE_EXCEEDED`.
    pub(crate) fn on_attempt_timeout_at(&mut self, failure: &Failure, now: Instant) -> Decision {
        let failure = Failure {
            code: Code::DeadlineExceeded,
            ..*failure
        };
        if let Some(permit) = self.permit.take() {
            permit.failure_at(now);
        }
        self.shared.budget.record_failure_at(now);
        let deadline_passed = self.deadline.is_some_and(|d| now >= d);
        match self.decide(&failure, true, deadline_passed, now) {
            Ok(delay) => Decision::Retry { delay },
            Err(refusal) => Decision::GiveUp(refusal),
        }
    }

    /// The call committed at `now` (response headers without a status arrived; it will not
    /// be retried). A half-open probe is settled as a success here: the dependency
    /// answered, and a long stream must not hold a probe slot (and so keep the breaker
    /// half-open) for as long as it lasts. Any other permit is settled when the call ends.
    pub fn on_commit_at(&mut self, now: Instant) {
        if self.permit.as_ref().is_some_and(BreakerPermit::is_probe)
            && let Some(permit) = self.permit.take()
        {
            permit.success_at(now);
        }
    }

    /// The caller's own deadline ran out at `now`; the call ends without a retry. `answer`
    /// is the failure that arrived at that moment, if one did. The caller's deadline says
    /// nothing about the dependency (a batch job with 5 ms deadlines on a 10 ms method must
    /// not open the breaker every other caller shares), so an expiry is recorded nowhere:
    /// the breaker permit is released without an outcome. An answer that is itself an
    /// expiry (`DEADLINE_EXCEEDED`, or `CANCELLED`, tonic's answer to an expired
    /// `grpc-timeout`) is the same; any other answer is recorded as it came. A dependency
    /// that hangs is seen by the breaker through the per-attempt timeout
    /// ([`on_attempt_end_at`](Self::on_attempt_end_at)).
    pub(crate) fn on_deadline_passed_at(&mut self, answer: Option<&Failure>, now: Instant) {
        match answer {
            Some(f) if !matches!(f.code, Code::DeadlineExceeded | Code::Cancelled) => {
                self.record_outcome_at(f.code, f.pushback, now);
            }
            _ => drop(self.permit.take()),
        }
    }

    /// A committed call (its response headers had arrived, so it is never retried) ended
    /// with `code`, e.g. a stream whose trailers carried a status. Records the outcome in
    /// the budget and the breaker as [`on_success_at`](Self::on_success_at) and
    /// [`on_attempt_end_at`](Self::on_attempt_end_at) would, and decides nothing.
    pub fn on_committed_at(&mut self, code: Code, now: Instant) {
        if code == Code::Ok {
            self.on_success_at(now);
        } else {
            self.record_outcome_at(code, None, now);
        }
    }

    /// Records an outcome; returns whether `code` is retryable for this method.
    ///
    /// For the budget and an A6 throttle only `OK` is a success and only a retryable code
    /// is a failure; any other code is neither (it mints nothing and costs nothing). For
    /// the breaker a retryable code is a failure, `OK` and application answers
    /// (`NOT_FOUND`, `INVALID_ARGUMENT`, ...) are signs of life, and an overload or expiry
    /// answer (`UNAVAILABLE`, `RESOURCE_EXHAUSTED`, `DEADLINE_EXCEEDED`, `CANCELLED`, or
    /// any answer carrying a pushback) is never health: it releases the permit without an
    /// outcome.
    fn record_outcome_at(&mut self, code: Code, pushback: Option<Pushback>, now: Instant) -> bool {
        if code == Code::Ok {
            self.on_success_at(now);
            return false;
        }
        let retryable_code = match (&self.policy, &self.hedge) {
            (Some(p), _) => p.retryable_codes.contains(code),
            (None, Some(h)) => h.policy.non_fatal_codes.contains(code),
            (None, None) => code == Code::Unavailable,
        };
        let permit = self.permit.take();
        if retryable_code {
            if let Some(permit) = permit {
                permit.failure_at(now);
            }
            self.shared.budget.record_failure_at(now);
        } else if !is_overload(code, pushback)
            && let Some(permit) = permit
        {
            permit.success_at(now);
        }
        retryable_code
    }

    fn decide(
        &mut self,
        failure: &Failure,
        retryable_code: bool,
        deadline_passed: bool,
        now: Instant,
    ) -> Result<Duration, Refusal> {
        if deadline_passed {
            return Err(Refusal::Deadline);
        }
        let (Some(policy), Some(backoff)) = (&self.policy, &mut self.backoff) else {
            return Err(Refusal::NotRetryable);
        };
        if !retryable_code {
            return Err(Refusal::NotRetryable);
        }
        let pushback = match failure.pushback {
            Some(Pushback::DoNotRetry) => return Err(Refusal::Pushback),
            Some(Pushback::RetryAfter(d)) if d > policy.max_pushback => {
                return Err(Refusal::Pushback);
            }
            Some(Pushback::RetryAfter(d)) => Some(d),
            None => None,
        };
        let keyed = self.idempotency_key.is_some();
        if !policy.idempotent && !keyed && !failure.unsent && !failure.unprocessed {
            return Err(Refusal::NotIdempotent);
        }
        if !failure.replayable {
            return Err(Refusal::ReplayLimit);
        }
        if self.previous_attempts.saturating_add(1) >= policy.effective_max_attempts() {
            return Err(Refusal::Attempts);
        }
        let delay = match pushback {
            Some(d) => {
                backoff.reset();
                d
            }
            None => backoff.next_delay(),
        };
        if let Some(deadline) = self.deadline {
            let left = deadline.saturating_duration_since(now);
            if delay.saturating_add(policy.min_attempt_time) >= left {
                return Err(Refusal::Deadline);
            }
        }
        if let Some(breaker) = &self.shared.breaker
            && matches!(breaker.state_at(now), BreakerState::Open { .. })
        {
            return Err(Refusal::Breaker);
        }
        if self.saturated_at(now) {
            return Err(Refusal::Saturated);
        }
        if !context::spend_retry() {
            return Err(Refusal::Allowance);
        }
        self.spent_allowance = true;
        let keyed = self.shared.keyed.as_ref().zip(self.key);
        if let Some((keyed, key)) = keyed
            && !keyed.withdraw_at(key, now)
        {
            self.refund_allowance();
            return Err(Refusal::KeyBudget);
        }
        if !self.shared.budget.withdraw_at(now) {
            if let Some((keyed, key)) = keyed {
                keyed.refund_at(key, now);
            }
            self.refund_allowance();
            return Err(Refusal::Budget);
        }
        self.granted = Some(now);
        self.granted_key = keyed.map(|(_, key)| key);
        Ok(delay)
    }

    /// Gives back to the budget (and to the key that paid, if any) a retry granted at
    /// `at` that never started.
    fn refund_budget(&mut self, at: Instant) {
        self.shared.budget.refund_at(at);
        if let (Some(keyed), Some(key)) = (&self.shared.keyed, self.granted_key.take()) {
            keyed.refund_at(key, at);
        }
    }

    /// The attempt that just ended went to `key` (the replica the channel chose, or the
    /// request's shard): its success deposits into `key`'s account as well as the shared
    /// budget, and a retry after its failure is charged to `key`'s account too (see
    /// [`KeyedBudgets`]). `None`: the shared budget only. Set it after each attempt ends,
    /// before reporting how it ended.
    pub fn set_budget_key(&mut self, key: Option<u64>) {
        self.key = key;
    }

    /// The retry's delay has passed and it is about to be sent: takes a breaker permit for
    /// the next attempt and counts it. Fails when the breaker opened meanwhile or the
    /// deadline passed; the budget then gets the retry back, as it does when the call is
    /// dropped before the retry starts.
    pub fn start_retry_at(&mut self, now: Instant) -> Result<AttemptPlan, Refusal> {
        let transparent = std::mem::take(&mut self.pending_transparent);
        let started = self
            .try_start_retry_at(now, transparent)
            .map(|()| self.plan_at(now, transparent));
        if let Some(at) = self.granted.take()
            && started.is_err()
        {
            self.refund_budget(at);
            self.refund_allowance();
        }
        self.granted_key = None;
        self.spent_allowance = false;
        started
    }

    /// Gives back the allowance the pending retry spent, if it spent one.
    fn refund_allowance(&mut self) {
        if std::mem::take(&mut self.spent_allowance) {
            context::refund_retry();
        }
    }

    fn try_start_retry_at(&mut self, now: Instant, transparent: bool) -> Result<(), Refusal> {
        if self.deadline.is_some_and(|d| now >= d) {
            return Err(Refusal::Deadline);
        }
        if let Some(breaker) = &self.shared.breaker {
            self.permit = Some(breaker.acquire_at(now).map_err(|_| Refusal::Breaker)?);
        }
        if transparent {
            // The attempt it replaces never reached the application: same number.
            self.transparent_retries = self.transparent_retries.saturating_add(1);
        } else {
            self.previous_attempts = self.previous_attempts.saturating_add(1);
        }
        Ok(())
    }

    /// An attempt of this call was answered by `endpoint` (the replica, or one key for
    /// a plain channel) with the load report `report` at `now`: fed to the controller's
    /// [`Saturation`], if it has one (else nothing happens).
    pub fn record_load_report_at(&self, endpoint: u64, report: &LoadReport, now: Instant) {
        if let Some(saturation) = &self.shared.saturation {
            saturation.record_at(endpoint, report, now);
        }
    }

    /// The dependency has `n` endpoints a retry could go to (the replicas of an
    /// endpoint-aware channel; 1, the default, for a plain channel): a retry is refused as
    /// [`Refusal::Saturated`] only once that many were heard from saturated (see
    /// [`Saturation::refuses_retry_among_at`]).
    pub fn set_endpoints(&mut self, n: usize) {
        self.endpoints = n.max(1);
    }

    /// Whether the load reports say every endpoint is saturated.
    fn saturated_at(&self, now: Instant) -> bool {
        self.shared
            .saturation
            .as_ref()
            .is_some_and(|s| s.refuses_retry_among_at(self.endpoints, now))
    }

    /// Transparent retries this call has made (each replaced an attempt that never reached
    /// the server's application; see [`on_attempt_end_at`](Self::on_attempt_end_at)).
    pub fn transparent_retries(&self) -> u32 {
        self.transparent_retries
    }
}

/// How many transparent retries one logical call may make (see
/// [`CallRetry::on_attempt_end_at`], step 3); past them an unsent failure is an ordinary
/// failure: recorded, paid from the budget, counted against `maxAttempts`.
///
/// Why a bound, and why 3: gRPC A6 retries an attempt that never left the client without
/// limit, but against a single server whose process is gone every connection attempt
/// fails at once, and an unbounded free retry would be a hot loop until the deadline. A
/// rolling restart or a graceful `GOAWAY` refuses a call once or twice (the connection that
/// closed, then perhaps a replica that is also draining); three free retries cover that,
/// and against a dead server a call costs at most three extra immediate attempts before the
/// budget, the backoff and the attempt limit take over, as for any failure. A failure that
/// is not unsent does not use them up.
pub const TRANSPARENT_RETRIES: u32 = 3;

/// An answer that says the server is overloaded or out of time: never a sign of health.
fn is_overload(code: Code, pushback: Option<Pushback>) -> bool {
    pushback.is_some()
        || matches!(
            code,
            Code::Unavailable | Code::ResourceExhausted | Code::DeadlineExceeded | Code::Cancelled
        )
}

/// Mixed into the seed of a call's idempotency key, so the key and the call's backoff
/// jitter (seeded from the same call number) are unrelated draws.
const KEY_SALT: u64 = 0x1DE4_907E_4C1E_5EED;

/// A 64-bit mixer, so that consecutive call numbers give unrelated seeds.
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests;
