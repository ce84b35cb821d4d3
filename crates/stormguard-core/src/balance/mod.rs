//! Choosing a replica for each attempt, and keeping failing replicas out of the choice.
//!
//! See [`ReplicaSet`](crate::ReplicaSet) for what it does and why.

mod config;
mod resolve;
pub(crate) mod weights;

pub use config::{
    EjectionConfig, HealthCheckConfig, LoadConfig, ReplicaConfig, ReportWeightConfig,
    SlowStartConfig,
};
pub use resolve::{
    Refresh, RefreshAnswer, RefreshConfig, RefreshCounts, RefreshHealth, RefreshUpdate,
};
use weights::ReportWeight;

use std::fmt;
use std::time::Duration;
use tokio::time::Instant;

use crate::error::ConfigError;

/// A replica's identity within its [`ReplicaSet`], never reused. (The default, 0, is the
/// first replica a set adds.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplicaId(u64);

impl ReplicaId {
    /// The number behind the id (for a budget key or a log line).
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "replica-{}", self.0)
    }
}

/// How an attempt on a replica ended, for its health. The layer reads it from the answer;
/// the [docs](ReplicaSet) say which answers are which.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicaOutcome {
    /// An answer from a working replica: `OK`, or an application status (`NOT_FOUND`,
    /// `INVALID_ARGUMENT`, ...), or a committed response.
    Success,
    /// The replica is broken: a transport failure, `UNAVAILABLE` without a pushback,
    /// `INTERNAL`, `UNKNOWN`, `DATA_LOSS`. Counts towards ejection.
    Failure,
    /// No connection could be made to the replica (its process is down or restarting): a
    /// failure like [`Failure`](Self::Failure), except that ejections for it do not
    /// double. Probing such a replica costs nothing (the attempt never left, and is
    /// retried elsewhere at once), so it is probed every `base_time` and serves again
    /// soon after it comes back.
    Refused,
    /// The replica is busy: a pushback, `RESOURCE_EXHAUSTED`, or a server-side
    /// `DEADLINE_EXCEEDED`. Lowers its health in the choice; never ejects it.
    Overload,
    /// The attempt was dropped before it answered (its timeout ran out, the caller went
    /// away): its time so far is a latency sample, nothing more.
    CutOff,
}

/// Where a replica stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicaState {
    /// In the choice at its full share.
    Active,
    /// In the choice, its share ramping up until `until` (slow start).
    Warming {
        /// When it reaches a full share.
        until: Instant,
    },
    /// Out of the choice until `until`.
    Ejected {
        /// When a probe may go to it.
        until: Instant,
    },
    /// Its ejection ended: one probe attempt at a time decides whether it returns.
    Probing,
}

impl ReplicaState {
    /// Whether the replica is out of the choice.
    pub fn is_ejected(&self) -> bool {
        matches!(self, ReplicaState::Ejected { .. })
    }

    /// A short name for metrics and logs: `active`, `warming`, `ejected`, `probing`.
    pub fn as_str(&self) -> &'static str {
        match self {
            ReplicaState::Active => "active",
            ReplicaState::Warming { .. } => "warming",
            ReplicaState::Ejected { .. } => "ejected",
            ReplicaState::Probing => "probing",
        }
    }
}

/// What a call does when [`ReplicaSet::pick_at`] finds no replica for it
/// ([`ReplicaSet::unpicked`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unpicked {
    /// Wait for a replica: one has not had its first health answer, or the set's first
    /// resolution is under way. The wait is bounded by the call's deadline, or by
    /// [`FIRST_PICK_WAIT`] for a call without one.
    Wait,
    /// Fail at once: every replica's health check has said it does not serve (or its
    /// connection failed).
    NotServing,
    /// Fail at once: the set holds no replica (and no first resolution is under way).
    Empty,
}

/// How long a call without a deadline waits for its first replica
/// ([`Unpicked::Wait`]) before it fails: 10 s.
pub const FIRST_PICK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What a replica's client-side health check (gRFC A17, `grpc.health.v1.Health/Watch`)
/// says of it. Only [`Unchecked`](Self::Unchecked) and [`Serving`](Self::Serving) let it
/// take new attempts; attempts in flight on a
/// replica that stops taking them finish.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ServingStatus {
    /// Not health-checked: checks are off (the default), or its server does not implement
    /// the health service (A17: the check is disabled for it, the replica counts as
    /// healthy).
    #[default]
    Unchecked,
    /// Checked, with no answer yet since its connection was made (or since it failed).
    Unknown,
    /// `SERVING`.
    Serving,
    /// `NOT_SERVING` (or a status this client does not know).
    NotServing,
    /// `SERVICE_UNKNOWN`: the server does not know the service name asked about.
    ServiceUnknown,
}

impl ServingStatus {
    /// Whether a replica with this status takes new attempts: unchecked or `SERVING`.
    /// The one place that decides it ([`ReplicaSet::pick_at`] asks it).
    pub(crate) fn takes_attempts(self) -> bool {
        matches!(self, ServingStatus::Unchecked | ServingStatus::Serving)
    }

    /// A short name for metrics and logs: `unchecked`, `unknown`, `serving`,
    /// `not_serving`, `service_unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            ServingStatus::Unchecked => "unchecked",
            ServingStatus::Unknown => "unknown",
            ServingStatus::Serving => "serving",
            ServingStatus::NotServing => "not_serving",
            ServingStatus::ServiceUnknown => "service_unknown",
        }
    }
}

/// Why a replica was ejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EjectReason {
    /// [`EjectionConfig::consecutive_failures`] in a row.
    ConsecutiveFailures,
    /// [`EjectionConfig::failure_share`] over the window.
    FailureShare,
    /// The probe after an ejection failed.
    ProbeFailed,
}

impl EjectReason {
    /// `consecutive_failures`, `failure_share` or `probe_failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            EjectReason::ConsecutiveFailures => "consecutive_failures",
            EjectReason::FailureShare => "failure_share",
            EjectReason::ProbeFailed => "probe_failed",
        }
    }
}

/// A change of a replica's standing, for logs and metrics (each reported once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicaEvent {
    /// Taken out of the choice for `duration`.
    Ejected {
        /// The replica.
        id: ReplicaId,
        /// Why.
        reason: EjectReason,
        /// For how long.
        duration: Duration,
        /// Its ejections so far, this one included.
        ejections: u64,
    },
    /// Its probe succeeded: back in the choice (with slow start).
    Returned {
        /// The replica.
        id: ReplicaId,
    },
}

/// What is known of one replica, for stats and metrics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReplicaSnapshot {
    /// The replica.
    pub id: ReplicaId,
    /// Where it stands.
    pub state: ReplicaState,
    /// Attempts in flight on it.
    pub in_flight: u32,
    /// Attempts sent to it.
    pub attempts: u64,
    /// Its answers that were [`ReplicaOutcome::Failure`].
    pub failures: u64,
    /// Its answers that were [`ReplicaOutcome::Overload`].
    pub overloads: u64,
    /// Times it was ejected.
    pub ejections: u64,
    /// Its peak-EWMA latency now.
    pub latency: Duration,
    /// Its health now, in [0, 1] (1: no recent failure).
    pub health: f64,
    /// Its slow-start weight now, in (0, 1].
    pub weight: f64,
    /// What its load reports multiply its share by now, in (0, 1] (1: no report counts;
    /// see `ReplicaSet::report_factor_at`).
    pub report_factor: f64,
    /// What its health check says ([`ServingStatus::Unchecked`] when checks are off).
    pub serving: ServingStatus,
    /// Times its health-check status changed ([`ReplicaSet::set_serving`]).
    pub serving_changes: u64,
}

/// The weight of one new answer in the health EWMA.
const HEALTH_ALPHA: f64 = 0.1;
/// Health never divides the cost by less than this (a replica with no health left still
/// has a finite cost, so that when every replica is failing the least bad one is chosen).
const MIN_HEALTH: f64 = 0.01;

struct Replica {
    id: ReplicaId,
    state: ReplicaState,
    /// Ejections in a row (for the doubling), cleared after a healthy window.
    streak: u32,
    /// When it last returned or was added (the healthy window counts from here).
    since: Instant,
    consecutive: u32,
    window_start: Instant,
    window: [Counts; 2],
    in_flight: u32,
    /// Peak-EWMA latency in nanoseconds, as of `latency_at`.
    latency_ns: f64,
    latency_at: Instant,
    /// Health EWMA, as of `health_at`.
    health: f64,
    health_at: Instant,
    /// Its latest load report's A58 weight, when it sent one that weights.
    report: Option<ReportWeight>,
    attempts: u64,
    failures: u64,
    overloads: u64,
    ejections: u64,
    /// What its health check says.
    serving: ServingStatus,
    serving_changes: u64,
    /// Whether its health check has reported since it joined (A17: until then it is
    /// connecting, and a call that finds no replica waits for it).
    reported: bool,
}

#[derive(Clone, Copy, Default)]
struct Counts {
    answers: u32,
    failures: u32,
}

/// What an ended attempt measured, and the replica's estimates just before it.
struct Sample {
    /// How long the attempt took, ns.
    elapsed: f64,
    /// The replica's latency estimate at `now`, ns.
    latency_now: f64,
    /// The replica's health at `now`.
    health_now: f64,
    /// The latency's decay time, seconds.
    decay: f64,
    now: Instant,
}

impl Replica {
    /// The window of the failure share: two halves, the older one dropped as time moves.
    fn roll_window_at(&mut self, now: Instant, window: Duration) {
        let half = window / 2;
        let since_start = now.saturating_duration_since(self.window_start);
        if since_start >= window {
            self.window = [Counts::default(); 2];
            self.window_start = now;
        } else if since_start >= half {
            self.window = [self.window[1], Counts::default()];
            self.window_start += half;
        }
    }

    /// Peak EWMA: a slower answer is taken at once, a faster one blends in.
    fn sample_latency(&mut self, s: &Sample) {
        self.latency_ns = if s.elapsed > s.latency_now {
            s.elapsed
        } else {
            let dt = s
                .now
                .saturating_duration_since(self.latency_at)
                .as_secs_f64();
            let w = (-dt / s.decay).exp();
            s.latency_now * w + s.elapsed * (1.0 - w)
        };
        self.latency_at = s.now;
    }

    /// One answer into the health EWMA: 1 for an answer, 0 for a failure or an overload.
    fn sample_health(&mut self, s: &Sample, x: f64) {
        self.health = s.health_now + (x - s.health_now) * HEALTH_ALPHA;
        self.health_at = s.now;
    }

    /// Why its failures eject it now, if they do.
    fn ejection_reason(&self, e: &EjectionConfig) -> Option<EjectReason> {
        let answers = self.window[0].answers + self.window[1].answers;
        let failures = self.window[0].failures + self.window[1].failures;
        if e.consecutive_failures > 0 && self.consecutive >= e.consecutive_failures {
            Some(EjectReason::ConsecutiveFailures)
        } else if e.min_requests > 0
            && answers >= e.min_requests
            && f64::from(failures) >= e.failure_share * f64::from(answers)
        {
            Some(EjectReason::FailureShare)
        } else {
            None
        }
    }
}

/// The replicas of one dependency, their health and the choice between them. Not
/// thread-safe itself: a layer keeps it behind a lock (every operation is short and
/// allocates nothing once the set is built).
///
/// # Why the choice is made per attempt, seeing what the call already tried
///
/// tower's power-of-two-choices balancer picks an endpoint in `poll_ready`, before it sees
/// the request, and tonic's connections report no load, so the pick is uniform: a retry
/// goes straight back to the replica that just failed one time in *n*, and a replica that
/// fails fast keeps its full share. A [`ReplicaSet`] picks per attempt, given the replicas
/// the logical call has already tried, by the **power of two choices** over a cost that
/// sees what tonic does not:
///
/// - *load*: a peak-EWMA of the replica's latency (a slow answer raises it at once, it
///   decays over [`LoadConfig::decay`]) times the attempts in flight on it plus one;
/// - *health*: an EWMA of its answers in which a failure or an overload answer counts 0 and
///   anything else 1, divided into the cost, so a replica that fails fast (and so finishes
///   calls fastest) does not attract a least-loaded choice; the memory of failures fades
///   over [`LoadConfig::failure_decay`] while the replica gets no traffic, so it is tried
///   again;
/// - *slow start*: a replica that is new or returns from ejection takes a share that ramps
///   from [`SlowStartConfig::min_weight`] to a full share over [`SlowStartConfig::window`]
///   (without it, a cold process is flattened by its full share of synchronized retries).
///
/// # Why eject, and why not on overload
///
/// A replica whose process died stays in tonic's balancer while reconnects fail, and one
/// that answers every call `UNAVAILABLE` keeps a weight above zero. Outlier ejection takes
/// such a replica out of the choice entirely, in the spirit of Envoy's outlier detection
/// and linkerd's failure accrual: after [`EjectionConfig::consecutive_failures`] failures
/// in a row, or when failures reach [`EjectionConfig::failure_share`] of at least
/// [`EjectionConfig::min_requests`] answers over [`EjectionConfig::window`]. It stays out
/// for a jittered time that doubles with each ejection in a row (from
/// [`EjectionConfig::base_time`] to [`EjectionConfig::max_time`]); then a single probe
/// attempt is let through, and its answer returns the replica (with slow start) or ejects
/// it again for longer. At most [`EjectionConfig::max_ejected_share`] of the replicas (at
/// least one, never the last) are out at once, so a fault that hits every replica cannot
/// empty the set.
///
/// Only answers that say the replica is broken count: a transport failure, `UNAVAILABLE`
/// without a pushback, `INTERNAL`, `UNKNOWN`, `DATA_LOSS` ([`ReplicaOutcome::Failure`]). An
/// overload answer (a shed with a pushback, `RESOURCE_EXHAUSTED`) or an attempt cut off by
/// its timeout says the replica is busy, not broken: it lowers the replica's health or
/// raises its latency, so the choice sends it less, but never ejects it. Ejecting busy
/// replicas moves their load onto the rest, which is how an overload spreads.
///
/// # Load reports (ORCA) may only lower a replica's share
///
/// A replica that sends load reports (gRPC ORCA; a stormguard server built with
/// `ShedLayer::with_load_reports`) gets gRPC A58's weight,
/// `qps / (utilization + eps / qps × error_utilization_penalty)`, its utilization
/// `application_utilization`, else `cpu_utilization` (`crate::balance::a58_weight`). As in
/// A58, a replica's reports weight it only after a blackout period from its first report
/// ([`ReportWeightConfig::blackout_period`]) and stop weighting it when none came for
/// [`ReportWeightConfig::expiration_period`] (its blackout starts again). Unlike A58, the
/// weight never replaces the cost above: it divides into it as a factor in
/// [[`ReportWeightConfig::min_factor`], 1], the replica's weight over the largest weight of
/// the replicas whose reports count (`ReplicaSet::report_factor_at`). So a report can
/// only *lower* a replica's share below what the channel gives it without reports, never
/// raise one above it: a replica that lies about its load cannot attract traffic, and a
/// replica that sends no reports keeps its report-free share.
///
/// Everything takes the time as an argument (`*_at(now)`) and draws from a seeded RNG, so a
/// test or a simulator drives it deterministically.
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::Instant;
/// use stormguard_core::{ReplicaConfig, ReplicaOutcome, ReplicaSet};
///
/// let config = ReplicaConfig { seed: Some(7), ..ReplicaConfig::default() };
/// let mut set = ReplicaSet::new(config)?;
/// let now = Instant::now();
/// let a = set.insert_at(now);
/// let b = set.insert_at(now);
///
/// // Five failures in a row eject `a`.
/// for _ in 0..5 {
///     let pick = set.pick_at(&[b], now).unwrap(); // `b` already tried: `a` is chosen
///     assert_eq!(pick, a);
///     set.end_at(a, ReplicaOutcome::Failure, now, now);
/// }
/// assert!(set.snapshot_at(a, now).unwrap().state.is_ejected());
/// // Now every attempt goes to `b`, even a retry that already tried it.
/// assert_eq!(set.pick_at(&[b], now), Some(b));
/// # Ok::<(), stormguard_core::ConfigError>(())
/// ```
pub struct ReplicaSet {
    config: ReplicaConfig,
    replicas: Vec<Replica>,
    next_id: u64,
    rng: fastrand::Rng,
    scratch: Vec<usize>,
    transitions: Vec<ReplicaEvent>,
}

impl fmt::Debug for ReplicaSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplicaSet")
            .field("replicas", &self.replicas.len())
            .finish_non_exhaustive()
    }
}

impl ReplicaSet {
    /// An empty set for `config` (validated first).
    pub fn new(config: ReplicaConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let seed = config.seed.unwrap_or_else(|| fastrand::u64(..));
        Ok(ReplicaSet {
            config,
            replicas: Vec::new(),
            next_id: 0,
            rng: fastrand::Rng::with_seed(seed),
            scratch: Vec::new(),
            transitions: Vec::new(),
        })
    }

    #[cfg(test)]
    /// The configuration.
    pub(crate) fn config(&self) -> &ReplicaConfig {
        &self.config
    }

    /// How many replicas the set holds.
    pub fn len(&self) -> usize {
        self.replicas.len()
    }

    /// Whether the set holds no replica.
    pub fn is_empty(&self) -> bool {
        self.replicas.is_empty()
    }

    /// Adds a replica that starts at a full share (the set a client starts with).
    pub fn insert_at(&mut self, now: Instant) -> ReplicaId {
        self.add(now, ReplicaState::Active)
    }

    /// Adds a replica that joins a set already serving: its share ramps up over the
    /// slow-start window.
    pub fn insert_warming_at(&mut self, now: Instant) -> ReplicaId {
        let state = self.warming_from(now);
        self.add(now, state)
    }

    fn warming_from(&self, now: Instant) -> ReplicaState {
        if self.config.slow_start.window.is_zero() {
            ReplicaState::Active
        } else {
            ReplicaState::Warming {
                until: now + self.config.slow_start.window,
            }
        }
    }

    fn add(&mut self, now: Instant, state: ReplicaState) -> ReplicaId {
        let id = ReplicaId(self.next_id);
        self.next_id += 1;
        self.replicas.push(Replica {
            id,
            state,
            streak: 0,
            since: now,
            consecutive: 0,
            window_start: now,
            window: [Counts::default(); 2],
            in_flight: 0,
            latency_ns: self.config.load.default_rtt.as_nanos() as f64,
            latency_at: now,
            health: 1.0,
            health_at: now,
            report: None,
            attempts: 0,
            failures: 0,
            overloads: 0,
            ejections: 0,
            // With health checks on, a replica takes no attempt before its first answer.
            serving: if self.config.health_check.is_some() {
                ServingStatus::Unknown
            } else {
                ServingStatus::Unchecked
            },
            serving_changes: 0,
            reported: false,
        });
        id
    }

    /// What replica `id`'s health check says now (gRFC A17; a client's health-check task
    /// calls this for each answer, and with [`ServingStatus::Unknown`] when the replica's
    /// connection fails). With [`ReplicaConfig::health_check`] set, a replica starts
    /// [`Unknown`](ServingStatus::Unknown); otherwise [`Unchecked`](ServingStatus::Unchecked). From the call on, [`pick_at`](Self::pick_at)
    /// gives the replica new attempts only while the status
    /// takes them (`Unchecked` or `Serving`). Returns the previous status when it
    /// changed (counted in the snapshot's `serving_changes`), `None` when it did not or
    /// the replica is gone.
    pub fn set_serving(&mut self, id: ReplicaId, status: ServingStatus) -> Option<ServingStatus> {
        let i = self.index(id)?;
        let r = &mut self.replicas[i];
        r.reported = true;
        let before = r.serving;
        if before == status {
            return None;
        }
        r.serving = status;
        r.serving_changes += 1;
        Some(before)
    }

    /// Removes a replica; answers that arrive for it later are ignored.
    pub fn remove(&mut self, id: ReplicaId) -> bool {
        match self.index(id) {
            Some(i) => {
                self.replicas.remove(i);
                true
            }
            None => false,
        }
    }

    #[cfg(test)]
    /// The ids of every replica, oldest first.
    pub(crate) fn ids(&self) -> impl Iterator<Item = ReplicaId> + '_ {
        self.replicas.iter().map(|r| r.id)
    }

    fn index(&self, id: ReplicaId) -> Option<usize> {
        // Ids only grow and replicas are appended: the vector is sorted by id.
        self.replicas.binary_search_by_key(&id, |r| r.id).ok()
    }

    /// What a call for which [`pick_at`](Self::pick_at) found no replica does: it waits
    /// while a replica may soon take it, and fails at once otherwise. `resolving`: the
    /// set's first resolution (a name's first lookup) has not ended.
    ///
    /// gRFC A17 keeps a replica connecting until its health check first answers, and a
    /// gRPC channel queues a call while a replica is connecting: a call made at start,
    /// before the first answers, would otherwise fail while every replica is healthy.
    ///
    /// ```
    /// use stormguard_core::{HealthCheckConfig, Instant, ReplicaConfig, ReplicaSet, ServingStatus, Unpicked};
    ///
    /// let config = ReplicaConfig { health_check: Some(HealthCheckConfig::service("")), ..ReplicaConfig::default() };
    /// let mut set = ReplicaSet::new(config)?;
    /// assert_eq!(set.unpicked(true), Unpicked::Wait); // the first lookup is under way
    /// assert_eq!(set.unpicked(false), Unpicked::Empty); // it ended with no address
    /// let id = set.insert_at(Instant::now());
    /// assert_eq!(set.pick_at(&[], Instant::now()), None);
    /// assert_eq!(set.unpicked(false), Unpicked::Wait); // its health check has not answered
    /// set.set_serving(id, ServingStatus::NotServing);
    /// assert_eq!(set.unpicked(false), Unpicked::NotServing);
    /// # Ok::<(), stormguard_core::ConfigError>(())
    /// ```
    pub fn unpicked(&self, resolving: bool) -> Unpicked {
        if self.replicas.is_empty() {
            return if resolving {
                Unpicked::Wait
            } else {
                Unpicked::Empty
            };
        }
        if self
            .replicas
            .iter()
            .any(|r| !r.reported && r.serving == ServingStatus::Unknown)
        {
            Unpicked::Wait
        } else {
            Unpicked::NotServing
        }
    }

    /// Chooses the replica for an attempt at `now`, avoiding those in `tried` (the ones
    /// this logical call already used) when another is in the choice, and counts the
    /// attempt as in flight on it until [`end_at`](Self::end_at). `None` when the set is
    /// empty, or when no replica's health check lets it take attempts (every one is
    /// checked and says `NOT_SERVING`, `SERVICE_UNKNOWN` or nothing yet: see
    /// [`set_serving`](Self::set_serving)); a client fails such a call at once, as gRPC's
    /// balancers do when no subchannel is ready.
    ///
    /// Only replicas whose [`ServingStatus`] takes attempts are candidates. Among them: the
    /// replicas in the choice (active, warming, or probing with no probe in flight) that
    /// the call has not tried; if there are none, those in the choice that it has; if there
    /// are none either (every replica is out), every one (the least bad one is better than
    /// failing the call here). Among the candidates two are drawn at random and the one of
    /// lower cost wins.
    pub fn pick_at(&mut self, tried: &[ReplicaId], now: Instant) -> Option<ReplicaId> {
        if self.replicas.is_empty() {
            return None;
        }
        self.refresh_at(now);
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        let serving = |r: &Replica| r.serving.takes_attempts();
        let in_choice = |r: &Replica| {
            serving(r)
                && match r.state {
                    ReplicaState::Active | ReplicaState::Warming { .. } => true,
                    ReplicaState::Probing => r.in_flight == 0,
                    ReplicaState::Ejected { .. } => false,
                }
        };
        push_indices(&mut scratch, &self.replicas, |r| {
            in_choice(r) && !tried.contains(&r.id)
        });
        if scratch.is_empty() {
            push_indices(&mut scratch, &self.replicas, in_choice);
        }
        if scratch.is_empty() {
            push_indices(&mut scratch, &self.replicas, serving);
        }
        let chosen = match scratch.len() {
            0 => {
                self.scratch = scratch;
                return None;
            }
            1 => scratch[0],
            n => {
                let a = self.rng.usize(..n);
                let mut b = self.rng.usize(..n - 1);
                if b >= a {
                    b += 1;
                }
                let (a, b) = (scratch[a], scratch[b]);
                if self.cost_at(b, now) < self.cost_at(a, now) {
                    b
                } else {
                    a
                }
            }
        };
        self.scratch = scratch;
        let r = &mut self.replicas[chosen];
        r.in_flight = r.in_flight.saturating_add(1);
        r.attempts += 1;
        Some(r.id)
    }

    /// The replica's cost at `now`: latency × (in flight + 1) / (health × slow-start
    /// weight × report factor).
    fn cost_at(&self, i: usize, now: Instant) -> f64 {
        let r = &self.replicas[i];
        let latency = self.latency_at(r, now);
        let health = self.health_at(r, now).max(MIN_HEALTH);
        let weight = self.weight_at(r, now);
        let factor = self.factor_at(r, now);
        latency * f64::from(r.in_flight + 1) / (health * weight * factor)
    }

    /// The A58 weight of `r`'s reports at `now`, if they count (past the blackout, not
    /// expired).
    fn counted_weight(&self, r: &Replica, now: Instant) -> Option<f64> {
        let config = &self.config.reports;
        let w = r.report?;
        let fresh = now.saturating_duration_since(w.last_update) < config.expiration_period;
        let past_blackout =
            now.saturating_duration_since(w.non_empty_since) >= config.blackout_period;
        (config.enabled && fresh && past_blackout).then_some(w.weight)
    }

    fn factor_at(&self, r: &Replica, now: Instant) -> f64 {
        let Some(weight) = self.counted_weight(r, now) else {
            return 1.0;
        };
        let max = self
            .replicas
            .iter()
            .filter_map(|o| self.counted_weight(o, now))
            .fold(0.0_f64, f64::max);
        if max <= 0.0 {
            return 1.0;
        }
        (weight / max).clamp(self.config.reports.min_factor, 1.0)
    }

    /// The peak-EWMA latency at `now`, in nanoseconds: while no answer arrives it returns
    /// towards the assumed `default_rtt` over `load.decay`, so a replica avoided for a slow
    /// answer comes back into the choice, and one that has not been chosen for a while
    /// (whose estimate says nothing any more) is tried again.
    fn latency_at(&self, r: &Replica, now: Instant) -> f64 {
        let floor = self.config.load.default_rtt.as_nanos() as f64;
        let elapsed = now.saturating_duration_since(r.latency_at).as_secs_f64();
        let w = (-elapsed / self.config.load.decay.as_secs_f64()).exp();
        floor + (r.latency_ns - floor) * w
    }

    /// The health at `now`: the EWMA of answers, its failures fading over
    /// `load.failure_decay` since the last answer.
    fn health_at(&self, r: &Replica, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(r.health_at).as_secs_f64();
        let w = (-elapsed / self.config.load.failure_decay.as_secs_f64()).exp();
        1.0 - (1.0 - r.health) * w
    }

    fn weight_at(&self, r: &Replica, now: Instant) -> f64 {
        let ReplicaState::Warming { until } = r.state else {
            return 1.0;
        };
        let window = self.config.slow_start.window.as_secs_f64();
        let left = until.saturating_duration_since(now).as_secs_f64();
        let ramp = if window > 0.0 {
            1.0 - left / window
        } else {
            1.0
        };
        ramp.clamp(self.config.slow_start.min_weight, 1.0)
    }

    /// Ends ejections and warm-ups that are over, and clears the ejection streak of a
    /// replica that stayed healthy for a window.
    fn refresh_at(&mut self, now: Instant) {
        let window = self.config.ejection.window;
        for r in &mut self.replicas {
            match r.state {
                ReplicaState::Ejected { until } if now >= until => r.state = ReplicaState::Probing,
                ReplicaState::Warming { until } if now >= until => r.state = ReplicaState::Active,
                _ => {}
            }
            if r.streak > 0
                && matches!(r.state, ReplicaState::Active)
                && now.saturating_duration_since(r.since) >= window
            {
                r.streak = 0;
            }
        }
    }

    /// The attempt that [`pick_at`](Self::pick_at) sent to `id` at `started` ended at
    /// `now` with `outcome`. Returns the transition it caused, if any (also kept for
    /// [`take_transitions`](Self::take_transitions)).
    pub fn end_at(
        &mut self,
        id: ReplicaId,
        outcome: ReplicaOutcome,
        started: Instant,
        now: Instant,
    ) -> Option<ReplicaEvent> {
        let i = self.index(id)?;
        let sample = Sample {
            elapsed: now.saturating_duration_since(started).as_nanos() as f64,
            latency_now: self.latency_at(&self.replicas[i], now),
            health_now: self.health_at(&self.replicas[i], now),
            decay: self.config.load.decay.as_secs_f64(),
            now,
        };
        let window = self.config.ejection.window;
        let warming = self.warming_from(now);
        let r = &mut self.replicas[i];
        r.in_flight = r.in_flight.saturating_sub(1);
        r.roll_window_at(now, window);
        let probing = matches!(r.state, ReplicaState::Probing);
        match outcome {
            ReplicaOutcome::Success | ReplicaOutcome::Overload => {
                r.sample_latency(&sample);
                if outcome == ReplicaOutcome::Success {
                    r.sample_health(&sample, 1.0);
                    r.consecutive = 0;
                    r.window[1].answers += 1;
                } else {
                    r.sample_health(&sample, 0.0);
                    r.overloads += 1;
                }
                if probing {
                    // It answered: it is back (a busy replica is still a working one).
                    r.state = warming;
                    r.since = now;
                    let t = ReplicaEvent::Returned { id };
                    self.transitions.push(t);
                    return Some(t);
                }
                None
            }
            ReplicaOutcome::CutOff => {
                r.sample_latency(&sample);
                if probing {
                    return self.eject(i, EjectReason::ProbeFailed, true, now);
                }
                None
            }
            ReplicaOutcome::Failure | ReplicaOutcome::Refused => {
                let grow = outcome == ReplicaOutcome::Failure;
                r.sample_health(&sample, 0.0);
                r.failures += 1;
                r.consecutive = r.consecutive.saturating_add(1);
                r.window[1].answers += 1;
                r.window[1].failures += 1;
                if probing {
                    return self.eject(i, EjectReason::ProbeFailed, grow, now);
                }
                if matches!(r.state, ReplicaState::Ejected { .. }) {
                    return None;
                }
                let reason = r.ejection_reason(&self.config.ejection);
                reason.and_then(|reason| self.eject(i, reason, grow, now))
            }
        }
    }

    /// Ejects replica `i` if the cap allows it; `grow`: this ejection counts towards the
    /// doubling of the next one.
    fn eject(
        &mut self,
        i: usize,
        reason: EjectReason,
        grow: bool,
        now: Instant,
    ) -> Option<ReplicaEvent> {
        let n = self.replicas.len();
        let out = self
            .replicas
            .iter()
            .filter(|r| matches!(r.state, ReplicaState::Ejected { .. }))
            .count();
        let share = self.config.ejection.max_ejected_share;
        let cap = if share == 0.0 || n < 2 {
            0
        } else {
            ((share * n as f64).floor() as usize).clamp(1, n - 1)
        };
        // A failed probe replaces the replica's own ejection: it does not need room.
        let probing = matches!(self.replicas[i].state, ReplicaState::Probing);
        if !probing && out >= cap {
            return None;
        }
        if probing && cap == 0 {
            self.replicas[i].state = ReplicaState::Active;
            return None;
        }
        let e = &self.config.ejection;
        let r = &mut self.replicas[i];
        let doubling = 2u32.saturating_pow(r.streak.min(30));
        let base = e.base_time.saturating_mul(doubling).min(e.max_time);
        let duration = base.mul_f64(1.0 + e.jitter * self.rng.f64());
        r.state = ReplicaState::Ejected {
            until: now + duration,
        };
        if grow {
            r.streak = r.streak.saturating_add(1);
        }
        r.ejections += 1;
        r.consecutive = 0;
        r.window = [Counts::default(); 2];
        r.window_start = now;
        let t = ReplicaEvent::Ejected {
            id: r.id,
            reason,
            duration,
            ejections: r.ejections,
        };
        self.transitions.push(t);
        Some(t)
    }

    /// The transitions since the last call, oldest first (at most one per ended attempt).
    pub fn take_transitions(&mut self) -> Vec<ReplicaEvent> {
        std::mem::take(&mut self.transitions)
    }

    /// What is known of replica `id` at `now`.
    pub fn snapshot_at(&self, id: ReplicaId, now: Instant) -> Option<ReplicaSnapshot> {
        let r = &self.replicas[self.index(id)?];
        let state = match r.state {
            ReplicaState::Ejected { until } if now >= until => ReplicaState::Probing,
            ReplicaState::Warming { until } if now >= until => ReplicaState::Active,
            s => s,
        };
        Some(ReplicaSnapshot {
            id: r.id,
            state,
            in_flight: r.in_flight,
            attempts: r.attempts,
            failures: r.failures,
            overloads: r.overloads,
            ejections: r.ejections,
            latency: Duration::from_nanos(self.latency_at(r, now) as u64),
            health: self.health_at(r, now),
            weight: self.weight_at(r, now),
            report_factor: self.factor_at(r, now),
            serving: r.serving,
            serving_changes: r.serving_changes,
        })
    }
}

/// Pushes onto `scratch` the index in `replicas` of each replica `keep` keeps, in order.
fn push_indices(scratch: &mut Vec<usize>, replicas: &[Replica], keep: impl Fn(&Replica) -> bool) {
    scratch.extend(
        replicas
            .iter()
            .enumerate()
            .filter(|(_, r)| keep(r))
            .map(|(i, _)| i),
    );
}

#[cfg(test)]
mod tests;
