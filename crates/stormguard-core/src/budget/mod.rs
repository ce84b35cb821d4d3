//! Retry budgets: "can this process afford one more retry right now?"
//!
//! See [`RetryBudget`](crate::RetryBudget) for what it does and why.

mod a6;
mod keyed;
pub(crate) mod ring;
#[cfg(all(test, feature = "tower"))]
pub(crate) mod tower_harness;

pub use a6::{A6Budget, A6BudgetConfig};
pub(crate) use keyed::DEFAULT_MAX_KEYS;
pub use keyed::KeyedBudgets;

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::ConfigError;
use crate::field::check;
use ring::{Ring, unpack};

/// A retry budget: decides whether the process can afford one more retry now.
///
/// Implemented by [`RetryBudget`] and [`crate::A6Budget`]; callers hold it as
/// `Arc<dyn Budget>`. Every method has an `_at(now)` form that takes the time from its
/// argument (so a simulator can drive it on a virtual clock) and a convenience form that
/// reads [`Instant::now`].
pub trait Budget: Send + Sync + fmt::Debug {
    /// A logical call succeeded.
    fn deposit_at(&self, now: Instant);

    /// An attempt failed with a status its method's policy retries (or ran out of its
    /// per-attempt timeout); A6 counts these. Default: no-op.
    fn record_failure_at(&self, now: Instant) {
        let _ = now;
    }

    /// A failed attempt came with a pushback (a delay to wait, not "do not retry"), after
    /// [`record_failure_at`](Budget::record_failure_at): the dependency is up and paces its
    /// callers, so a floor lent "while the dependency answers" stays lent. Default: no-op.
    fn record_pushback_at(&self, now: Instant) {
        let _ = now;
    }

    /// May one more retry go out now? `true` consumes the retry where the implementation
    /// consumes.
    fn withdraw_at(&self, now: Instant) -> bool;

    /// Retries currently affordable (observability), may be fractional; never negative.
    fn balance_at(&self, now: Instant) -> f64;

    /// May one more *hedge* go out now? `true` consumes it as [`Budget::withdraw_at`] does.
    ///
    /// A hedge is optional work sent while the server is slow, a retry is the only cure of
    /// a failure: a hedge may spend only the upper half of the budget, so hedges can never
    /// starve the retries, and under overload they cost at most half of what a retry may.
    /// [`RetryBudget`] grants a hedge only while, after it, at least half of what the window
    /// minted (reserve and successes) is left; an [`A6Budget`](crate::A6Budget)
    /// grants it while it holds more than half its tokens, as gRPC A6 says (its
    /// [`Budget::withdraw_at`] already is that rule). Default: [`Budget::withdraw_at`].
    fn withdraw_hedge_at(&self, now: Instant) -> bool {
        self.withdraw_at(now)
    }

    /// Gives back a retry that [`withdraw_at`](Budget::withdraw_at)`(granted_at)` granted
    /// but that was never sent (the breaker opened or the deadline ran out during its
    /// delay, the caller went away). Default: no-op, for budgets whose withdrawals consume
    /// nothing.
    fn refund_at(&self, granted_at: Instant) {
        let _ = granted_at;
    }

    /// [`Budget::deposit_at`] at [`Instant::now`].
    fn deposit(&self) {
        self.deposit_at(Instant::now());
    }

    /// [`Budget::record_failure_at`] at [`Instant::now`].
    fn record_failure(&self) {
        self.record_failure_at(Instant::now());
    }

    /// [`Budget::withdraw_at`] at [`Instant::now`].
    fn withdraw(&self) -> bool {
        self.withdraw_at(Instant::now())
    }

    /// [`Budget::balance_at`] at [`Instant::now`].
    fn balance(&self) -> f64 {
        self.balance_at(Instant::now())
    }
}

/// Configuration of a [`RetryBudget`].
///
/// Build it with `..BudgetConfig::default()` for the fields you do not set, so that fields
/// added later do not break your code.
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::{BudgetConfig, RetryBudget};
///
/// let config = BudgetConfig { retry_ratio: 0.2, ..BudgetConfig::default() };
/// assert_eq!(config.ttl, Duration::from_secs(10));
/// // The budget's constructor checks every field.
/// assert!(RetryBudget::new(config.clone()).is_ok());
/// assert!(RetryBudget::new(BudgetConfig { retry_ratio: 0.0, ..config }).is_err());
/// ```
///
/// Deserializes from an object of these fields (stormguard's `retry.budget`), each
/// optional (its default when absent), durations with their unit (`"10s"`); unknown
/// fields are refused. [`RetryBudget::new`] validates it.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(
    default,
    deny_unknown_fields,
    expecting = "an object of budget settings"
)]
pub struct BudgetConfig {
    /// How long a deposit (a success) and a withdrawal (a retry) count. 1 s to 60 s.
    #[serde(with = "crate::field::duration")]
    pub ttl: Duration,
    /// The standing reserve: `min_retries_per_second × ttl` retries per window, whatever
    /// the success traffic. Below 2³¹.
    #[serde(deserialize_with = "crate::field::whole")]
    pub min_retries_per_second: u32,
    /// Retries minted per success: 0.1 allows one retry per ten successes. In (0, 1000],
    /// resolved to millionths (truncated), and at least 0.000001.
    #[serde(deserialize_with = "crate::field::finite")]
    pub retry_ratio: f64,
    /// How many processes share the dependency: the standing reserve is divided by it, so
    /// the *fleet* gets `min_retries_per_second`, not each process (see
    /// [the docs](RetryBudget#a-floor-for-the-fleet-not-for-each-process)). 1 (the
    /// default) to [`MAX_FLEET_SIZE`].
    #[serde(deserialize_with = "crate::field::whole")]
    pub fleet_size: u32,
    /// When the standing reserve may be spent (see
    /// [the docs](RetryBudget#a-floor-that-lends-only-while-the-dependency-answers)):
    /// [`Floor::WhileAnswering`] (the default), or [`Floor::Always`].
    pub floor: Floor,
}

/// When a [`RetryBudget`]'s standing reserve (its floor) may be spent.
///
/// ```
/// use stormguard_core::{BudgetConfig, Floor};
///
/// assert_eq!(BudgetConfig::default().floor, Floor::WhileAnswering);
/// let config: BudgetConfig = serde_json::from_str(r#"{ "floor": "always" }"#).unwrap();
/// assert_eq!(config.floor, Floor::Always);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Floor {
    /// While the dependency answers: the reserve is withheld once the window holds
    /// [`FLOOR_WITHHELD_AFTER`] retryable failures and no answer (a success, or a failure
    /// that came with a pushback: a server that says when to come back is up), and lent
    /// again at the next answer. Against a dependency that is down, only successes pay for retries
    /// (none arrive), so a fleet sends its offered load and no more, whatever its size.
    #[default]
    WhileAnswering,
    /// Always, as Finagle's and tower's budgets do: against a dependency that is down each
    /// process spends its reserve every window.
    Always,
}

/// Retryable failures in a window without a success after which a [`Floor::WhileAnswering`]
/// reserve is withheld. Three lets a process that has just started retry its first calls
/// (a failure, a retry that fails, a third attempt) before it has seen a success.
pub const FLOOR_WITHHELD_AFTER: u64 = 3;

impl Default for BudgetConfig {
    /// ttl 10 s, 5 retries per second floor lent while the dependency answers, ratio 0.1,
    /// a fleet of one.
    fn default() -> Self {
        BudgetConfig {
            ttl: Duration::from_secs(10),
            min_retries_per_second: 5,
            retry_ratio: 0.1,
            fleet_size: 1,
            floor: Floor::WhileAnswering,
        }
    }
}

impl BudgetConfig {
    /// Checks every field; the error names the first field out of range.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        check::window_secs("retry.budget.ttl", self.ttl, 1, 60)?;
        if self.min_retries_per_second > i32::MAX as u32 {
            return Err(ConfigError::invalid(
                "retry.budget.min_retries_per_second",
                format!(
                    "must be below 2^31 (as in Finagle and tower), got {}",
                    self.min_retries_per_second
                ),
            ));
        }
        if self.fleet_size == 0 || self.fleet_size > MAX_FLEET_SIZE {
            return Err(ConfigError::invalid(
                "retry.budget.fleet_size",
                format!(
                    "must be between 1 and {MAX_FLEET_SIZE}, got {}",
                    self.fleet_size
                ),
            ));
        }
        let ratio = self.retry_ratio;
        if !ratio.is_finite() || ratio <= 0.0 || ratio > 1000.0 {
            return Err(ConfigError::invalid(
                "retry.budget.retry_ratio",
                format!("must be finite, greater than 0 and at most 1000, got {ratio}"),
            ));
        }
        if truncate_decimal(ratio, MICROS_PER_RETRY as f64) == 0 {
            return Err(ConfigError::invalid(
                "retry.budget.retry_ratio",
                format!("must be at least 0.000001 (the accounting resolution), got {ratio}"),
            ));
        }
        Ok(())
    }
}

/// The largest integer `m` with `m / scale <= x`, for finite `0 <= x`.
///
/// This truncates `x` to the decimal resolution `1 / scale` without the off-by-one that
/// `(x * scale).floor()` gives for values such as 0.29 (`0.29 * 1000.0 < 290.0`): a
/// decimal written with at most that many places maps to exactly its digits.
pub(crate) fn truncate_decimal(x: f64, scale: f64) -> u64 {
    let mut m = (x * scale).floor();
    if m > 0.0 && m / scale > x {
        m -= 1.0;
    } else if (m + 1.0) / scale <= x {
        m += 1.0;
    }
    // `as` saturates; the callers validated `x` to a small finite range.
    m as u64
}

/// Slots per window. A deposit (or a withdrawal) counts from its instant until exactly
/// `ttl` after the start of its slot: for more than `ttl` less the slot's width
/// (`ttl / SLOTS`, rounded to a whole nanosecond) and at most `ttl`.
const SLOTS: usize = 16;

/// The largest fleet size a [`RetryBudget`] accepts.
pub const MAX_FLEET_SIZE: u32 = 1_000_000;

/// Accounting unit: one retry is a million micro-retries.
const MICROS_PER_RETRY: i128 = 1_000_000;

/// How many epochs a slot may be ahead of a caller's `now` and still be taken as newer
/// (the caller is late) rather than as left over from a previous lap of the 32-bit epoch.
const STALE_LIMIT: u32 = 1 << 20;

/// A Finagle-style retry budget (see the [docs](RetryBudget)): successes mint
/// `retry_ratio` retries each, valid for `ttl`, on top of a standing reserve of
/// `min_retries_per_second × ttl` retries; retries spent also count for `ttl`.
///
/// Lock-free: a deposit is one compare-and-swap; a withdrawal sums the two rings and,
/// when it may succeed, counts itself with one compare-and-swap. Clones share one budget, so one budget can be shared by
/// every channel to a service.
///
/// Calls may come with instants out of order (threads read the clock at slightly
/// different times; a simulator may replay). A deposit counts in the slot of its own
/// instant (dropped if that is more than a window before the latest instant seen). A
/// withdrawal is charged at the latest instant seen so far, so a late caller never spends
/// from a window that has already moved on. `balance_at` with an earlier instant sums the
/// window as it was then.
///
/// ```
/// use stormguard_core::Instant;
/// use stormguard_core::{Budget, BudgetConfig, RetryBudget};
///
/// let budget = RetryBudget::new(BudgetConfig::default())?; // reserve: 5/s × 10 s
/// let clone = budget.clone();
/// let now = Instant::now();
/// assert_eq!(budget.balance_at(now), 50.0);
/// assert!(clone.withdraw_at(now));
/// assert_eq!(budget.balance_at(now), 49.0); // the clone spent from the same budget
/// # Ok::<(), stormguard_core::ConfigError>(())
/// ```
///
/// # How
///
/// Why a budget rather than an attempt cap is in the [crate docs](crate). A retry budget
/// bounds retries by the *success* traffic: every success mints a fraction
/// (`retry_ratio`, 10 % by default) of a retry that stays valid for a window (`ttl`), and
/// every retry spends one. When nothing succeeds nothing is minted, so once the small
/// standing reserve is spent the client sends only its offered load, however many
/// attempts a single request would be allowed.
///
/// The reserve (`min_retries_per_second × ttl` retries per window) lets a client that has
/// just started, or that makes few calls, retry at all.
///
/// # A floor for the fleet, not for each process
///
/// The reserve is per process. Against a dead dependency a fleet therefore sends
/// `processes × min_retries_per_second` retries per second however little it calls: the
/// fleet simulator's table 2 (`docs/simulator.md`) measures it for many low-traffic
/// processes with the default floor, arriving as a pulse every `ttl` because the reserves
/// that were spent together
/// refill together. [`RetryBudget::with_fleet_size`] divides the reserve by the number of
/// processes that share the dependency, so the *fleet* gets the floor: at most
/// `min_retries_per_second` retries per second between them. A process whose share is
/// below one retry per window retries only on what its own successes mint (with 10 % of
/// 10 calls/s that is still a retry per second). [`RetryBudget::set_fleet_estimate`]
/// updates the divisor at run time (from service discovery, say); an estimate can only
/// make the floor smaller than the configured one, never larger.
///
/// # A floor that lends only while the dependency answers
///
/// Even divided by a fleet size, a floor spent against a dependency that is down is load
/// on a dependency that is down, and the fleet size is a number nobody has at hand. By
/// default ([`Floor::WhileAnswering`]) the reserve is lent only while the dependency
/// answers: once the window holds [`FLOOR_WITHHELD_AFTER`] retryable failures
/// ([`Budget::record_failure_at`]) and not one success, it is withheld, and the first
/// success lends it again. A process that has just started may still retry its first
/// failures; a process that sees a healthy dependency blip keeps its whole reserve (the
/// window holds the successes from before the blip); a dependency that stays down gets
/// each process's offered load and only what successes mint (nothing), so a fleet of any
/// size sends about one attempt per call without being told its size. [`Floor::Always`]
/// keeps the reserve lent whatever the answers, as Finagle and tower do.
///
/// # Two implementations, one trait
///
/// [`Budget`] is the interface the retry controller and the fleet simulator use (through
/// `Arc<dyn Budget>`). [`RetryBudget`] is the Finagle-style budget described above;
/// [`crate::A6Budget`] is gRPC's A6 `retryThrottling` token bucket.
///
/// # Adopting only the budget, with tower
///
/// A tower or linkerd-style stack that already has its retry policy (its own reading of
/// responses, its own replay of request bodies, `tower::retry::Retry`) may want none of
/// stormguard's layers, only a budget that does what its configuration says. tower's
/// `TpsBudget` does not, in each of the ways listed below, and each shows exactly when a
/// budget matters: under load, with many threads and steady traffic. With this crate's
/// `tower` feature (or the `stormguard` crate's `tower-budget`), [`RetryBudget`] and
/// [`crate::A6Budget`] implement `tower::retry::budget::Budget`, so either
/// takes `TpsBudget`'s place in a `tower::retry::Policy` with the same two calls. The
/// implementation's docs on [`RetryBudget`] show a policy over `Arc<RetryBudget>`; those on
/// [`crate::A6Budget`] say how A6's three events map onto tower's two calls.
/// The feature adds tower's `retry` module and nothing of tonic, http or hyper.
///
/// # How [`RetryBudget`] differs from tower's `TpsBudget`
///
/// It follows the same semantics (Finagle's: a reserve of `min_retries_per_second × ttl`,
/// `retry_ratio` of a retry per deposit, withdrawals that count for `ttl`), with these
/// fixes, each read from tower 0.5's `retry/budget/tps_budget.rs`:
///
/// - **No lock, and no over-allocation.** `TpsBudget` takes a `Mutex` on every deposit
///   and every withdrawal (to expire old slots), then checks the balance and subtracts
///   after releasing it, so two threads can both take the last retry. Here the window is
///   two rings of slots (deposits and withdrawals), each slot one `AtomicU64` holding a
///   32-bit slot epoch and a 32-bit count, updated by compare-and-swap. A withdrawal that
///   finds less than one retry is refused without writing anything; otherwise it is
///   counted first, the window is summed again, and it is undone and refused if the
///   balance went below zero, so concurrent callers can never take more retries than the
///   window holds (a race can only refuse too many).
/// - **An exact window.** A slot's epoch is derived from the call's own instant, so a
///   deposit counts until exactly `ttl` after the start of its slot, to the nanosecond:
///   for `ttl` less at most one slot width (`ttl / 16`), never more, whatever the timing
///   of the calls. `TpsBudget`'s 10 slots advance from the instant of the last expiry,
///   and an expiry that finds more than one slot width gone clears one more slot for each
///   further width or part of one, so when calls do not line up with its slot width the
///   window expires about twice as fast: steady calls every 7 ms against a 1 s `ttl`
///   keep about 0.6 s of deposits.
/// - **Exact ratios.** `TpsBudget` turns a ratio below 1 into a whole number of deposits
///   per retry, `(1.0 / retry_percent) as isize`: 0.6 becomes 1, so 10 successes allow
///   10 retries (tower issue #857), and 0.3 becomes 3 (one retry per 3 successes).
///   Accounting here is in integer micro-retries: 0.6 gives exactly 6 retries per 10
///   successes, and there is no floating-point drift.
///
/// Time comes only from the `now` argument of the `*_at` methods (the convenience forms
/// read [`Instant::now`], which follows tokio's paused clock in tests).
///
/// # Example
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use stormguard_core::Instant;
/// use stormguard_core::{Budget, BudgetConfig, RetryBudget};
///
/// let config = BudgetConfig { min_retries_per_second: 0, ..BudgetConfig::default() };
/// let budget: Arc<dyn Budget> = Arc::new(RetryBudget::new(config)?);
///
/// let t0 = Instant::now();
/// for _ in 0..10 {
///     budget.deposit_at(t0); // ten successes at a 10 % ratio mint one retry
/// }
/// assert_eq!(budget.balance_at(t0), 1.0);
/// assert!(budget.withdraw_at(t0));
/// assert!(!budget.withdraw_at(t0)); // spent
///
/// // Eleven seconds later the successes are outside the 10 s window.
/// let later = t0 + Duration::from_secs(11);
/// for _ in 0..9 {
///     budget.deposit_at(later);
/// }
/// assert!(!budget.withdraw_at(later)); // 0.9 of a retry is not a retry
/// # Ok::<(), stormguard_core::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct RetryBudget {
    shared: Arc<Shared>,
}

struct Shared {
    config: BudgetConfig,
    /// Slot epochs count from one window before the first instant the budget sees, so a
    /// virtual clock that starts before or after construction works alike, and an instant
    /// up to a window older than the first one seen (another thread read the clock a
    /// little earlier) still lands in its own slot.
    origin: OnceLock<Instant>,
    /// The window in nanoseconds (1 s to 60 s, so below 2³⁶).
    ttl_nanos: u64,
    /// `⌊2⁶⁴ · SLOTS / ttl_nanos⌋` (below 2³⁹): the epoch is a multiply, a shift and one
    /// correcting compare, not a division.
    slot_reciprocal: u64,
    /// The standing reserve of a fleet of one, in micro-retries; divided by `fleet`.
    reserve_micros: i128,
    /// The configured fleet size: the smallest divisor of the reserve.
    configured_fleet: u32,
    /// The fleet size in effect: `max(configured_fleet, latest estimate)`.
    fleet: AtomicU32,
    /// Micro-retries minted per deposit.
    mint_micros: i128,
    deposits: Ring,
    withdrawals: Ring,
    /// Retryable failures, counted only for [`Floor::WhileAnswering`].
    failures: Ring,
    /// Failures that came with a pushback ([`Budget::record_pushback_at`]), counted only
    /// for [`Floor::WhileAnswering`]: the dependency answered.
    paced: Ring,
    head: Head,
}

/// What a withdrawal must leave in the budget.
#[derive(Clone, Copy)]
enum Keep {
    /// A retry may spend the budget to zero.
    Nothing,
    /// A hedge must leave half of what the window minted.
    HalfMinted,
}

/// The latest epoch seen by a withdrawal or a balance read.
///
/// Withdrawals are always counted in the head slot (a late caller is charged at the latest
/// time seen, which is conservative), and a withdrawal is only granted if the head has not
/// moved while it ran.
///
/// There is deliberately no cached sum of the closed slots' withdrawals: a withdrawal that
/// is undone after such a sum was taken would stay counted in it, and the budget would
/// lose a retry for the rest of the window.
#[repr(align(64))]
struct Head {
    /// The head epoch (64-bit: never wraps).
    epoch: AtomicU64,
}

impl RetryBudget {
    /// A budget with `config`, or the validation error.
    pub fn new(config: BudgetConfig) -> Result<Self, ConfigError> {
        let fleet_size = config.fleet_size;
        Self::with_fleet_size(config, fleet_size)
    }

    /// A budget with `config` whose standing reserve is shared by a fleet of
    /// `fleet_size` processes (see [the docs](RetryBudget#a-floor-for-the-fleet-not-for-each-process)):
    /// each process gets `min_retries_per_second × ttl / fleet_size` retries per window,
    /// so the fleet together gets the configured floor. `fleet_size` is 1 to
    /// [`MAX_FLEET_SIZE`] and replaces `config.fleet_size`.
    ///
    /// ```
    /// use stormguard_core::Instant;
    /// use stormguard_core::{Budget, BudgetConfig, RetryBudget};
    ///
    /// // 5 retries/s × 10 s shared by 10 processes: 5 per process per window.
    /// let budget = RetryBudget::with_fleet_size(BudgetConfig::default(), 10)?;
    /// assert_eq!(budget.balance_at(Instant::now()), 5.0);
    /// assert!(RetryBudget::with_fleet_size(BudgetConfig::default(), 0).is_err());
    /// # Ok::<(), stormguard_core::ConfigError>(())
    /// ```
    pub fn with_fleet_size(mut config: BudgetConfig, fleet_size: u32) -> Result<Self, ConfigError> {
        config.fleet_size = fleet_size;
        config.validate()?;
        let ttl_nanos = u64::try_from(config.ttl.as_nanos()).unwrap_or(u64::MAX);
        let ttl_micros = i128::try_from(config.ttl.as_micros()).unwrap_or(i128::MAX);
        // min/s × ttl µs = micro-retries exactly, also for a fractional ttl.
        let reserve_micros = i128::from(config.min_retries_per_second) * ttl_micros;
        let mint_micros = i128::from(truncate_decimal(
            config.retry_ratio,
            MICROS_PER_RETRY as f64,
        ));
        Ok(RetryBudget {
            shared: Arc::new(Shared {
                origin: OnceLock::new(),
                ttl_nanos,
                slot_reciprocal: (((SLOTS as u128) << 64) / u128::from(ttl_nanos)) as u64,
                reserve_micros,
                configured_fleet: fleet_size,
                fleet: AtomicU32::new(fleet_size),
                mint_micros,
                deposits: Ring::new(),
                withdrawals: Ring::new(),
                failures: Ring::new(),
                paced: Ring::new(),
                head: Head {
                    epoch: AtomicU64::new(0),
                },
                config,
            }),
        })
    }

    #[cfg(test)]
    /// The configuration this budget was built with.
    pub(crate) fn config(&self) -> &BudgetConfig {
        &self.shared.config
    }

    /// The fleet size dividing the standing reserve now.
    pub(crate) fn fleet_size(&self) -> u32 {
        self.shared.fleet.load(Ordering::Relaxed)
    }

    /// Updates the estimated number of processes sharing the dependency (0 forgets the
    /// estimate). The reserve is divided by `max(configured fleet size, estimate)`, capped
    /// at [`MAX_FLEET_SIZE`]: an estimate can lower the floor below the configured one,
    /// never raise it above. Retries already granted are not taken back.
    ///
    /// ```
    /// use stormguard_core::Instant;
    /// use stormguard_core::{Budget, BudgetConfig, RetryBudget};
    ///
    /// let budget = RetryBudget::with_fleet_size(BudgetConfig::default(), 10)?;
    /// budget.set_fleet_estimate(50);
    /// assert_eq!(budget.balance_at(Instant::now()), 1.0);
    /// budget.set_fleet_estimate(2); // below the configured 10: the floor stays at 5
    /// assert_eq!(budget.balance_at(Instant::now()), 5.0);
    /// # Ok::<(), stormguard_core::ConfigError>(())
    /// ```
    pub fn set_fleet_estimate(&self, estimate: u32) {
        let shared = &*self.shared;
        let fleet = estimate.clamp(shared.configured_fleet, MAX_FLEET_SIZE);
        shared.fleet.store(fleet, Ordering::Relaxed);
    }
}

/// Events of `ring` in the window at `epoch` (its slot and the 15 before it).
fn window_count(ring: &Ring, epoch: u32) -> u64 {
    // In the window iff `epoch - e < SLOTS` (mod 2³²), i.e. `e - oldest < SLOTS`: done on
    // the packed word (subtracting only epoch bits cannot borrow from the count).
    let oldest = u64::from(epoch.wrapping_sub(SLOTS as u32 - 1)) << 32;
    let mut count = 0u64;
    for slot in &ring.slots {
        let word = slot.load(Ordering::SeqCst);
        let in_window = word.wrapping_sub(oldest) < (SLOTS as u64) << 32;
        count += (word & u64::from(u32::MAX)) * u64::from(in_window);
    }
    count
}

impl Shared {
    /// The slot epoch of `now`: `⌊SLOTS · n / ttl⌋` for `n` ns since the origin, exactly.
    /// Slot words keep its low 32 bits.
    ///
    /// Slot `e` therefore begins at `⌈e · ttl / SLOTS⌉` ns, and slot `e + SLOTS` exactly
    /// `ttl` later: a deposit counts until `ttl` after the start of its own slot (see
    /// [`SLOTS`]), to the nanosecond, whether or not `ttl` is a multiple of `SLOTS` ns.
    fn epoch(&self, now: Instant) -> u64 {
        let window = self.config.ttl;
        let origin = *self
            .origin
            .get_or_init(|| now.checked_sub(window).unwrap_or(now));
        let since = now.saturating_duration_since(origin);
        let nanos = since
            .as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(since.subsec_nanos()));
        // The reciprocal is at most 1 below `2⁶⁴ · SLOTS / ttl`, so the product is below the
        // exact quotient by less than `nanos / 2⁶⁴ < 1`: `q` is the quotient or one less,
        // and one compare settles which. `q < 2³⁹` and `ttl < 2³⁶`: nothing overflows.
        let q = ((u128::from(nanos) * u128::from(self.slot_reciprocal)) >> 64) as u64;
        let scaled = u128::from(nanos) * SLOTS as u128;
        q + u64::from(u128::from(q + 1) * u128::from(self.ttl_nanos) <= scaled)
    }

    /// Moves the head to `epoch` if it is behind; returns the head afterwards.
    fn advance_head(&self, epoch: u64) -> u64 {
        let head = self.head.epoch.load(Ordering::SeqCst);
        if epoch <= head {
            return head;
        }
        self.head
            .epoch
            .fetch_max(epoch, Ordering::SeqCst)
            .max(epoch)
    }

    /// Deposits in the window at `epoch` (its slot and the 15 before it).
    fn window_deposits(&self, epoch: u32) -> u64 {
        window_count(&self.deposits, epoch)
    }

    /// The standing reserve at `epoch` in micro-retries, given the window's `deposits`:
    /// the configured reserve divided by the fleet, or nothing while a
    /// [`Floor::WhileAnswering`] floor is withheld.
    fn reserve_at(&self, epoch: u32, deposits: u64) -> i128 {
        if self.config.floor == Floor::WhileAnswering
            && deposits == 0
            && window_count(&self.paced, epoch) == 0
            && window_count(&self.failures, epoch) >= FLOOR_WITHHELD_AFTER
        {
            return 0;
        }
        let fleet = i128::from(self.fleet.load(Ordering::Relaxed).max(1));
        self.reserve_micros / fleet
    }

    /// The balance at the head epoch `head` in micro-retries (may be negative).
    fn head_balance_micros(&self, head: u64) -> i128 {
        self.full_balance_micros(head as u32)
    }

    /// The balance at `epoch` of the window's `deposits` and `withdrawals`.
    fn micros(&self, epoch: u32, deposits: u64, withdrawals: u64) -> i128 {
        self.reserve_at(epoch, deposits) + self.mint_micros * i128::from(deposits)
            - MICROS_PER_RETRY * i128::from(withdrawals)
    }

    /// The balance at any `epoch` in micro-retries (may be negative), summing every slot.
    fn full_balance_micros(&self, epoch: u32) -> i128 {
        let mut withdrawals: u64 = 0;
        for slot in &self.withdrawals.slots {
            let (e, n) = unpack(slot.load(Ordering::SeqCst));
            let age = epoch.wrapping_sub(e);
            // Withdrawals charged to a later epoch than ours count too: they were spent.
            let counts = age < SLOTS as u32 || age > u32::MAX - STALE_LIMIT;
            withdrawals += u64::from(n) * u64::from(counts);
        }
        self.micros(epoch, self.window_deposits(epoch), withdrawals)
    }

    /// Refuses without writing if less than one retry above `keep` is left at the head;
    /// otherwise counts the withdrawal in the head slot, re-reads, and undoes it if the
    /// head moved or concurrent withdrawals took the balance below `keep`.
    ///
    /// `keep` is what the withdrawal must leave: nothing for a retry, half of what the
    /// window minted for a hedge ([`Budget::withdraw_hedge_at`]).
    fn try_withdraw(&self, epoch: u64, keep: Keep) -> bool {
        let head = self.advance_head(epoch);
        let keep = match keep {
            Keep::Nothing => 0,
            Keep::HalfMinted => {
                let epoch = head as u32;
                self.micros(epoch, self.window_deposits(epoch), 0) / 2
            }
        };
        // Read-only refusal: during a storm most withdrawals are refused, and this keeps
        // them from writing to (and contending on) the shared slots.
        if self.head_balance_micros(head) < MICROS_PER_RETRY + keep {
            return false;
        }
        if !self.withdrawals.add(head as u32) {
            return false;
        }
        if self.confirm(head, keep) {
            true
        } else {
            self.withdrawals.remove(head as u32);
            false
        }
    }

    /// After counting a withdrawal in the `head` slot: may it stand? Only if the head has
    /// not moved (a caller at a later head may have read the ring without it) and the balance,
    /// with every withdrawal counted so far, is not below `keep`.
    fn confirm(&self, head: u64, keep: i128) -> bool {
        self.head.epoch.load(Ordering::SeqCst) == head && self.head_balance_micros(head) >= keep
    }

    fn balance_micros(&self, epoch: u64) -> i128 {
        let head = self.advance_head(epoch);
        if epoch == head {
            self.head_balance_micros(head)
        } else {
            // A late read: sum the window as it was at `epoch`.
            self.full_balance_micros(epoch as u32)
        }
    }
}

impl Budget for RetryBudget {
    fn deposit_at(&self, now: Instant) {
        let shared = &*self.shared;
        // A deposit older than a window (a very late caller), or beyond 2³² per slot, is
        // dropped: it could only make the budget more generous.
        let _ = shared.deposits.add(shared.epoch(now) as u32);
    }

    /// Counted for a [`Floor::WhileAnswering`] floor only (nothing else reads it).
    fn record_failure_at(&self, now: Instant) {
        let shared = &*self.shared;
        if shared.config.floor == Floor::WhileAnswering {
            let _ = shared.failures.add(shared.epoch(now) as u32);
        }
    }

    /// Counted for a [`Floor::WhileAnswering`] floor only: a pushback is an answer.
    fn record_pushback_at(&self, now: Instant) {
        let shared = &*self.shared;
        if shared.config.floor == Floor::WhileAnswering {
            let _ = shared.paced.add(shared.epoch(now) as u32);
        }
    }

    fn withdraw_at(&self, now: Instant) -> bool {
        let shared = &*self.shared;
        shared.try_withdraw(shared.epoch(now), Keep::Nothing)
    }

    /// Granted only while, after it, at least half of what the window minted (the reserve
    /// and `retry_ratio` of each success) is left for retries.
    fn withdraw_hedge_at(&self, now: Instant) -> bool {
        let shared = &*self.shared;
        shared.try_withdraw(shared.epoch(now), Keep::HalfMinted)
    }

    fn balance_at(&self, now: Instant) -> f64 {
        let shared = &*self.shared;
        let micros = shared.balance_micros(shared.epoch(now)).max(0);
        micros as f64 / MICROS_PER_RETRY as f64
    }

    /// Undoes one withdrawal. It was counted in the head slot of its time, somewhere from
    /// the slot of `granted_at` to today's head; the oldest of those slots that still holds
    /// a withdrawal gives one back, so a refund never outlives the retry it returns.
    fn refund_at(&self, granted_at: Instant) {
        let shared = &*self.shared;
        let head = shared.head.epoch.load(Ordering::SeqCst);
        let from = shared.epoch(granted_at);
        if from.saturating_add(SLOTS as u64 - 1) < head {
            // Granted more than a window ago: it has expired, or was charged to a slot
            // that cannot be told apart from others' withdrawals. Keep it spent.
            return;
        }
        for epoch in from..=head {
            if shared.withdrawals.remove(epoch as u32) {
                return;
            }
        }
    }
}

/// With the `tower` feature: the budget as a tower retry budget, for a
/// [`tower::retry::Policy`] (see [the docs](RetryBudget#adopting-only-the-budget-with-tower)).
///
/// The two calls mean what they mean in [`Budget`], at [`Instant::now`] (tokio's clock,
/// paused in tests, as `TpsBudget` reads it):
///
/// - `deposit()`: a logical call succeeded; it mints `retry_ratio` of a retry for `ttl`.
/// - `withdraw()`: may one retry go out? `true` spends it. Ask last, after the policy's
///   own reasons to stop (attempts, status, deadline): a granted retry is spent even if
///   the policy then does not send it.
///
/// Both traits name these methods `deposit` and `withdraw`. With only one in scope
/// `budget.withdraw()` is that one's; with both, name the trait:
/// `tower::retry::budget::Budget::withdraw(&*budget)`.
///
/// A [`tower::retry::Policy`] that retries a failed call at most twice, while the budget
/// allows, through [`tower::retry::Retry`]:
///
/// ```
/// use std::future;
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicUsize, Ordering};
///
/// use stormguard_core::{BudgetConfig, RetryBudget};
/// use tower::retry::budget::Budget;
/// use tower::retry::{Policy, Retry};
/// use tower::{ServiceExt, service_fn};
///
/// #[derive(Clone, Debug)]
/// struct Attempts {
///     budget: Arc<RetryBudget>,
///     retries_left: u32,
/// }
///
/// impl<Req: Clone, Res, E> Policy<Req, Res, E> for Attempts {
///     type Future = future::Ready<()>;
///
///     fn retry(&mut self, _req: &mut Req, result: &mut Result<Res, E>) -> Option<Self::Future> {
///         match result {
///             Ok(_) => {
///                 self.budget.deposit();
///                 None
///             }
///             // The budget is asked last: a granted retry is spent.
///             Err(_) if self.retries_left > 0 && self.budget.withdraw() => {
///                 self.retries_left -= 1;
///                 Some(future::ready(()))
///             }
///             Err(_) => None,
///         }
///     }
///
///     fn clone_request(&mut self, req: &Req) -> Option<Req> {
///         Some(req.clone())
///     }
/// }
///
/// // No standing reserve: only successes pay for retries, one per ten.
/// let config = BudgetConfig { min_retries_per_second: 0, ..BudgetConfig::default() };
/// let budget = Arc::new(RetryBudget::new(config)?);
/// for _ in 0..10 {
///     budget.deposit(); // ten successes on the same budget
/// }
///
/// let attempts = Arc::new(AtomicUsize::new(0));
/// let counted = Arc::clone(&attempts);
/// let unavailable = service_fn(move |_request: &'static str| {
///     counted.fetch_add(1, Ordering::Relaxed);
///     future::ready(Err::<(), _>("unavailable"))
/// });
/// let policy = Attempts { budget: Arc::clone(&budget), retries_left: 2 };
/// let retry = Retry::new(policy, unavailable);
///
/// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
/// let result = runtime.block_on(retry.oneshot("GetItem"));
/// assert_eq!(result, Err("unavailable"));
/// // Two retries were allowed by the policy; the budget paid for one.
/// assert_eq!(attempts.load(Ordering::Relaxed), 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg(feature = "tower")]
impl tower::retry::budget::Budget for RetryBudget {
    fn deposit(&self) {
        self.deposit_at(Instant::now());
    }

    fn withdraw(&self) -> bool {
        self.withdraw_at(Instant::now())
    }
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudget")
            .field("config", &self.shared.config)
            .field("fleet_size", &self.fleet_size())
            .finish_non_exhaustive()
    }
}

/// A budget that grants every retry: the classic "N attempts and nothing else" client.
///
/// It exists to measure what stormguard protects against (the fleet simulator's
/// `three-attempts` policy, baselines in benchmarks), and for the rare dependency whose
/// retries are paid for elsewhere. Do not use it against a dependency that can fail as a
/// whole: at 100 % failure it multiplies the load by the attempt limit.
///
/// ```
/// use stormguard_core::{Budget, Unlimited};
///
/// let b = Unlimited;
/// assert!((0..1000).all(|_| b.withdraw()));
/// assert_eq!(b.balance(), f64::INFINITY);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unlimited;

impl Budget for Unlimited {
    fn deposit_at(&self, _now: Instant) {}

    fn withdraw_at(&self, _now: Instant) -> bool {
        true
    }

    fn balance_at(&self, _now: Instant) -> f64 {
        f64::INFINITY
    }
}

#[cfg(test)]
mod tests;
