//! An adaptive concurrency limit: how many calls may run at once, learned from latency.
//!
//! See [`AdaptiveLimitConfig`](crate::AdaptiveLimitConfig) for what it does and why.

use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

use crate::error::ConfigError;
use crate::field::check;

/// The adaptive worker limit's bounds and pace: how many calls may run at once, learned
/// from latency.
///
/// Deserializes from an object of these fields, each optional (its default when absent),
/// durations with their unit (`"100ms"`); unknown fields are refused.
///
/// A fixed worker count asks the operator to know the server's capacity. Set too high,
/// the extra calls queue *inside* the handler (a database pool, a downstream channel)
/// where the admission queue cannot see them: latency climbs for everyone, callers time
/// out, and nothing is shed, so the retry storm the queue exists to stop comes back. Set
/// too low, capacity sits idle. The adaptive limit finds the count from what it measures.
///
/// # The algorithm: TCP Vegas on call latency
///
/// When the server runs `L` calls at once and its real capacity is `C`, any `L > C`
/// waits somewhere inside: latency rises from the no-load latency `m` to about `m·L/C`.
/// Vegas reads that back as the number of calls queued inside:
///
/// ```text
/// queued ≈ L · (1 − m / rtt)        (= L − C when L > C, ≈ 0 when L ≤ C)
/// ```
///
/// and steers `queued` into a small band `[α, β]`, with `β = max(1, log10 L, L/16)` and `α = β/4`:
/// above `β` the limit drops at once to the capacity the window measured (`L·m/rtt`) plus the
/// middle of the band (by at least `α`); below `α` (`β/2` once `β > 1`) it grows, by `α` and then
/// by twice the last step after each window that grew it with nothing queued inside, so a large
/// server reaches its capacity in a few windows. Dropping at once matters: a limit far too high (a
/// deploy made calls slower, or the start value was a guess) makes every call wait inside the
/// handler until callers time out, and stepping down a little per window would take seconds. So the
/// limit settles a few calls above `C`: every unit of real capacity stays busy, and the calls
/// beyond it wait in the admission queue, where they can be ordered, expired and shed (retries
/// first), instead of inside the handler. Each call queued inside adds `1/C` of a service time to
/// every call, so the band is narrow: one call at most for a small limit, a sixteenth of the limit
/// for a large one, where a window's mean latency is known to a few percent and `L` times that
/// error reads as calls queued. Netflix's `VegasLimit` keeps `3·log10 L` to `6·log10 L` queued,
/// which settled too far above `C` and cost goodput.
///
/// Why Vegas rather than a gradient (Netflix's Gradient2, Envoy's adaptive concurrency
/// filter) or AIMD? AIMD needs drops to learn, and the drops it needs are the
/// timeouts we want to avoid. A gradient limit multiplies the limit by `m / rtt` and
/// adds a queue allowance; it converges too, but its resting point depends on a
/// smoothing factor and a tolerance, where Vegas's is stated in calls ("a few calls
/// queued inside"), which is what an operator can check against a known capacity.
///
/// Details that matter in practice:
///
/// - **One decision per window**, not per call: the window's mean latency is compared
///   with `m` once the window has lasted [`AdaptiveLimitConfig::window`] (and at least
///   two no-load latencies) and holds [`AdaptiveLimitConfig::min_window_samples`]
///   samples. Single calls are too noisy to steer by.
/// - **No growth while idle.** The limit grows only if, during the window, it was
///   reached (as many calls ran at once as it allowed): a quiet server does not talk
///   itself into a limit it has never tested.
/// - **Measuring the no-load latency `m`.** It can only be seen when nothing queues
///   inside. Taking the smallest latency ever seen drifts low on a lucky sample and
///   never follows a lasting slowdown; taking recent samples drifts high when the limit
///   is too high (every sample then includes the internal queue), which raises the limit
///   further. So, as Envoy does, the limit *probes*: at the first call and then every
///   [`AdaptiveLimitConfig::probe_interval`] (jittered by ±25 % so a fleet does not probe
///   together) it drops to [`AdaptiveLimitConfig::min_limit`], waits until no more than
///   that many calls run, takes the mean latency of the next
///   [`AdaptiveLimitConfig::min_window_samples`] calls (a quarter of them at the first
///   probe), without their slowest eighth, as `m`, and returns to the limit it had. A
///   mean, because the windows are read by theirs: on real time a sleep of 1 ms takes
///   about 1.3 or 2.3 ms by where the timer's tick falls, and a median is one mode or the
///   other, a third from every window's mean. Between probes `m` follows a faster window
///   down at once.
/// - **A higher floor is read from two windows, not probed.** Vegas cannot tell a higher
///   latency floor (a slower dependency, a capacity drop that slows every call) from
///   queueing: with the old `m` it cuts the limit below the capacity and holds it there.
///   Probing at the floor to find out costs most of the capacity for the length of the
///   probe, in exactly the overload the limit is for (in the storm it cost a tenth of the
///   goodput during the slowdown and a second of recovery after it). But the cut itself
///   tells: while calls queue inside, the latency is proportional to the calls let in
///   (`rtt ≈ m·L/C`), so two saturated windows at limits 10 % or more apart show the
///   same `rtt / L`. When the lower limit's `rtt / L` is 1.3 times the higher's or more,
///   the latency did not fall with the limit: those calls did not queue, and what they
///   took is the new floor. A floor that *fell* while every window stays saturated is
///   only seen from above (every window includes the calls queued inside), so after a
///   second of that a probe measures it.
/// - **A run of shallow cuts is tested as one deep cut.** A window a few percent over the
///   floor by noise (a stall, a late timer, the scheduler) reads as a call or two queued
///   inside and cuts a little; one after another, such cuts took the limit of a service
///   whose latency never moved with them down to a handful of calls. So the window that
///   made the first of a run of cuts (where the limit held the calls running) is compared
///   with the window in which the run has gone a sixth deep, within 8 windows, as a deep
///   cut is: latency that did not fall with the limit shows a higher floor, and the limit
///   goes back to the capacity the two windows show.
/// - **A window that did not reach the limit cuts only far over the band** (3 `β`): the
///   limit did not let those calls in, and a moderate reading there is as likely noise.
///   A capacity drop reads far over it and still cuts at once.
/// - **Growth within the lower half of the band.** Above the one-call band (`β > 1`) a
///   saturated window grows the limit while it reads fewer than `β/2` calls queued inside,
///   not `α`: a reading of a few percent over the floor, usual on real time, no longer
///   holds a healthy service's limit where it started. Below it, growth by one call is
///   tried and taken back as described next.
/// - **What the windows' own noise reads is no evidence.** The limit keeps a moving mean of
///   how much a window's mean latency moves from the last one at about the same limit
///   (both reaching it, each move counted at most a quarter), and above the one-call band
///   reads as queued inside only the calls beyond one and a half times that share of the
///   limit. On exact latencies it is nothing; on real time a window's mean moves by a tenth
///   with the runtime's load, which at a limit of 40 read as four calls queued inside.
/// - **A growth is judged by the throughput it bought.** With callers on the same machine,
///   or a runtime busy with other work, each call let in makes every call a little slower
///   (the runtime wakes each later): from 26 to 39 calls running, a 1 ms handler's latency
///   rose a fifth and its throughput a quarter. Vegas reads that rise as calls queued
///   inside and held such a limit near its start. So above the one-call band the limit
///   keeps, as its base, the first window that reached it since it last fell; once the
///   calls running have grown a tenth or more from the base, a window whose throughput
///   (calls running over latency, Little's law) grew by at least half as much, less the
///   windows' own noise (below), shows the calls let in were served, whatever Vegas reads: the limit grows on (by 15 % at least)
///   from that window as the new base. A growth that bought less is judged by Vegas as
///   before. A limit resting in the band that has not grown enough to judge tries a step of
///   15 % and goes back if the next window shows it wasted, held back as a refuted growth
///   by one call is (below).
/// - **What a growth bought is no queue.** Past the last growth that bought throughput,
///   Vegas reads the calls queued inside against the latency those calls were served at
///   (the faster of the growth's two windows), not against the floor, for as long as the
///   limit lets as many run. Against the floor, the calls' own rise with each call let in
///   read as queued inside, and the first growth past the capacity cut the limit to three
///   quarters of it: a sawtooth that served 0.89 of a fixed limit at the capacity in a
///   model of a 1 ms handler with 256 callers, 0.97 now.
/// - **After a cut, only calls that started under the new limit count**: the calls let
///   in before it still queue inside, and would read as a need to cut again.
/// - **A window in which callers left is a lower bound.** A call abandoned mid-run took
///   at least its time so far
///   ([`AdmissionQueue::abandon_at`](crate::AdmissionQueue::abandon_at)). When a tenth
///   of a window's calls were abandoned, the window never grows the limit and never shows a
///   lower floor, and if calls still queue inside, it cuts the limit by `β/2`: under
///   overload the calls that queue inside are those whose callers give up. Such a window
///   still answers the test of a deep cut made just before it by a window whose callers
///   stayed: a lower bound (the larger of the mean with the calls cut short and the mean
///   of the calls served in full) that already shows the latency did not fall with the
///   limit shows a higher floor. Without that, a slowdown that made callers leave read as
///   calls queued inside, window after window, and took the limit down to
///   [`AdaptiveLimitConfig::min_limit`] for as long as it lasted.
/// - **Near a small capacity, one call too many is tried, not kept.** Where the band is
///   one call (`β = 1`, limits up to 16), the limit at `C + 1` reads one call queued
///   inside, which the band allows, so it would rest there, that call waiting inside the
///   handler and slowing every other. A growth by one call whose next window shows the
///   call waited goes back, and the limit does not grow again for 2 windows, then 4, up
///   to 16, until a growth shows room (the capacity rose).
/// - **An answer that was not served is no latency.** A handler that answers
///   `UNAVAILABLE` or `RESOURCE_EXHAUSTED` at once (passing on its own dependency's shed,
///   say) took a worker for a moment and served nothing; read as a call, it would look like
///   a fast success, raise the limit and drag the floor down, letting in more calls to a
///   handler that is already refusing them
///   ([`AdmissionQueue::finish_not_served_at`](crate::AdmissionQueue::finish_not_served_at)).
///   Such calls are left out of every latency mean, the floor and the probe, and a window in
///   which a tenth of the calls were not served never grows the limit.
///
/// The limit runs on the instants it is given (`*_at(now)`), so the simulator drives it on
/// a virtual clock; [`AdmissionQueue`](crate::AdmissionQueue) feeds it unless
/// [`AdmissionConfig::workers`](crate::AdmissionConfig::workers) is a fixed number.
///
/// ```
/// use stormguard_core::{
///     AdaptiveLimitConfig, AdmissionConfig, AdmissionController, AdmissionQueue, WorkerLimit,
/// };
///
/// let adaptive = AdaptiveLimitConfig {
///     initial_limit: 20, min_limit: 2, max_limit: 100, ..AdaptiveLimitConfig::default()
/// };
/// let config = AdmissionConfig {
///     workers: WorkerLimit::Adaptive(adaptive),
///     ..AdmissionConfig::default()
/// };
/// let queue: AdmissionQueue<()> = AdmissionQueue::new(AdmissionController::new(config)?);
/// assert_eq!(queue.worker_limit(), 20);
/// assert_eq!(queue.min_latency(), None); // nothing measured yet
/// # Ok::<(), stormguard_core::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(
    default,
    deny_unknown_fields,
    expecting = "an object of adaptive limit settings"
)]
pub struct AdaptiveLimitConfig {
    /// Where the limit starts, before anything has been measured (within the bounds).
    /// Default 16.
    #[serde(deserialize_with = "crate::field::whole")]
    pub initial_limit: usize,
    /// The floor: the limit never goes below it, and it is the limit during a probe.
    /// At least 1. Default 2.
    #[serde(deserialize_with = "crate::field::whole")]
    pub min_limit: usize,
    /// The ceiling. At least `min_limit`. Default 1 000.
    #[serde(deserialize_with = "crate::field::whole")]
    pub max_limit: usize,
    /// The shortest decision window. Above zero. Default 100 ms (a window also lasts at
    /// least two no-load latencies).
    #[serde(with = "crate::field::duration")]
    pub window: Duration,
    /// Samples a window (and a probe) needs before it decides. At least 1. Default 16.
    #[serde(deserialize_with = "crate::field::whole")]
    pub min_window_samples: usize,
    /// Time between probes of the no-load latency (jittered ±25 %). Above zero.
    /// Default 30 s.
    #[serde(with = "crate::field::duration")]
    pub probe_interval: Duration,
}

impl Default for AdaptiveLimitConfig {
    fn default() -> Self {
        AdaptiveLimitConfig {
            initial_limit: 16,
            min_limit: 2,
            max_limit: 1000,
            window: Duration::from_millis(100),
            min_window_samples: 16,
            probe_interval: Duration::from_secs(30),
        }
    }
}

impl AdaptiveLimitConfig {
    /// Checks every field; the error names the first bad one (`admission.adaptive.<field>`).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field: &str, reason: String| {
            Err(ConfigError::invalid(
                format!("admission.adaptive.{field}"),
                reason,
            ))
        };
        check::at_least_one("admission.adaptive.min_limit", self.min_limit as u64)?;
        if self.max_limit < self.min_limit {
            return bad(
                "max_limit",
                format!("{} is below min_limit ({})", self.max_limit, self.min_limit),
            );
        }
        if self.window.is_zero() || self.window > Duration::from_secs(3600) {
            return bad("window", format!("{:?} is outside (0, 1h]", self.window));
        }
        check::at_least_one(
            "admission.adaptive.min_window_samples",
            self.min_window_samples as u64,
        )?;
        if self.probe_interval.is_zero() || self.probe_interval > Duration::from_secs(86_400) {
            return bad(
                "probe_interval",
                format!("{:?} is outside (0, 24h]", self.probe_interval),
            );
        }
        Ok(())
    }
}

#[derive(Debug)]
struct Window {
    started: Instant,
    count: usize,
    /// The latency of the calls that finished, summed.
    sum_secs: f64,
    /// The time so far of the calls whose caller left, summed: only a lower bound.
    sum_abandoned_secs: f64,
    /// The sum over samples of the calls that ran alongside each (itself included).
    sum_running: usize,
    /// Samples of calls whose caller left before they finished.
    abandoned: usize,
    /// Samples of calls answered without being served (an overload answer).
    not_served: usize,
}

/// How a call that held a worker ended, as the limit reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Answered as served: its time is a latency sample.
    Served,
    /// Answered without being served (shed, refused, expired): no latency sample.
    NotServed,
    /// Its caller left mid-run: its time so far is a lower bound.
    Abandoned,
    /// Its response streams on, idle between messages: no sample at all.
    Streaming,
}

/// What a window that cut the limit saw: the calls that ran at once on average and
/// their mean latency. The window after the cut is compared with it.
#[derive(Clone, Copy, Debug)]
struct Seen {
    running: f64,
    rtt: f64,
}

/// What a window saw when it closed.
#[derive(Clone, Copy, Debug)]
struct Closed {
    /// The no-load latency known when it closed.
    m: Duration,
    /// Its mean latency, seconds.
    rtt: f64,
    /// The mean latency a test of a higher floor reads, seconds: `rtt`, or where callers
    /// left, the tighter of its two lower bounds.
    floor_rtt: f64,
    /// The mean of the calls running alongside each sample.
    mean_running: f64,
    /// Whether many callers left before their calls finished.
    censored: bool,
    /// Whether many calls were answered without being served.
    refusing: bool,
}

#[derive(Debug)]
struct Probe {
    /// When it began.
    began: Instant,
    /// The limit to return to.
    saved: f64,
    /// From when samples count: calls that started once no more than the floor ran.
    clean_from: Option<Instant>,
    samples: Vec<Duration>,
}

/// The current limit and what it was learned from (the reasoning is on
/// [`AdaptiveLimitConfig`]). Driven by [`AdmissionQueue`](crate::AdmissionQueue).
#[derive(Debug)]
pub(crate) struct AdaptiveLimit {
    config: AdaptiveLimitConfig,
    limit: f64,
    min_latency: Option<Duration>,
    window: Option<Window>,
    probe: Option<Probe>,
    /// When the next probe starts (`None`: at the first sample).
    next_probe: Option<Instant>,
    /// The last window that cut the limit, until the window after the cut is compared
    /// with it.
    last: Option<Seen>,
    /// The window that made the first of a run of shallow cuts and the windows since,
    /// until the limit grows again, the cuts together are deep enough to test, or the run
    /// is older than `SERIES_WINDOWS` (the service may have changed since).
    cuts_from: Option<(Seen, u32)>,
    /// When a window first showed the floor falling, while windows stay saturated.
    fell_at: Option<Instant>,
    /// The first saturated window since the limit last fell (or a probe ended): a growth
    /// since is judged by the throughput it bought.
    base: Option<Seen>,
    /// The window of the last growth that bought throughput: as many calls as it ran were
    /// served at its latency with none queued inside. While the limit lets that many run,
    /// Vegas reads calls queued inside against that latency, not the floor.
    served: Option<Seen>,
    /// Samples count from calls started at or after this instant (the last cut).
    counted_from: Option<Instant>,
    /// Windows in a row that grew the limit: each doubles the next step.
    growth: u32,
    /// The last growth that let one more call run at once, until the window after it
    /// answers: the limit before it.
    raised_from: Option<f64>,
    /// How much a window's mean latency moves from one window to the next with nothing
    /// changed, as a share of it: a moving mean of the absolute log-ratio of consecutive
    /// windows' latencies at about the same limit (each at most `NOISE_CLIP`).
    noise: f64,
    /// The last window's limit and mean latency, for `noise`.
    previous: Option<(f64, f64)>,
    /// The last trial step from within the band, until the window after it answers: the
    /// limit before it.
    tried_from: Option<f64>,
    /// Windows a refuted growth holds the limit back for; doubles each time.
    hold: u32,
    /// Windows left before the limit may grow again.
    hold_left: u32,
    /// When the last sample came.
    last_sample: Option<Instant>,
    rng: fastrand::Rng,
}

/// Mixed into the admission config's seed so that the probe jitter and the pushback
/// jitter, seeded alike, draw different numbers.
const PROBE_STREAM: u64 = 0x11_ad_a9;

impl AdaptiveLimit {
    /// A limit starting at `config.initial_limit` (clamped to the bounds) for a valid
    /// `config`; `seed` (the admission config's) varies the probe jitter between servers.
    pub(crate) fn new(config: AdaptiveLimitConfig, seed: u64) -> Result<Self, ConfigError> {
        config.validate()?;
        let limit = config
            .initial_limit
            .clamp(config.min_limit, config.max_limit) as f64;
        let rng = fastrand::Rng::with_seed(seed ^ PROBE_STREAM);
        Ok(AdaptiveLimit {
            config,
            limit,
            min_latency: None,
            window: None,
            probe: None,
            next_probe: None,
            last: None,
            cuts_from: None,
            fell_at: None,
            base: None,
            served: None,
            counted_from: None,
            growth: 0,
            raised_from: None,
            tried_from: None,
            noise: 0.0,
            previous: None,
            hold: 0,
            hold_left: 0,
            last_sample: None,
            rng,
        })
    }

    /// Calls that may run at once now.
    pub(crate) fn limit(&self) -> usize {
        // Within [min_limit, max_limit], both usize: the cast cannot truncate.
        self.limit.round() as usize
    }

    /// The no-load latency `m` the limit steers by (`None` until the first probe ends).
    pub(crate) fn min_latency(&self) -> Option<Duration> {
        self.min_latency
    }

    /// One call that started at `started` ended at `now` as `ended` says; `running` calls
    /// still run. Returns the limit from now on.
    pub(crate) fn record_at(
        &mut self,
        now: Instant,
        started: Instant,
        running: usize,
        ended: Ended,
    ) -> usize {
        if ended == Ended::Streaming {
            // A stream's length is no call's latency, and its start says nothing of it.
            return self.limit();
        }
        let latency = now.saturating_duration_since(started);
        self.start_probe_if_due_at(now);
        self.last_sample = Some(now);
        if self.probe.is_some() {
            // A call whose caller left, or that was not served, says nothing of how long
            // calls take.
            if ended == Ended::Served {
                self.probe_sample_at(now, started, latency, running);
            }
            return self.limit();
        }
        if self.counted_from.is_some_and(|from| started < from) {
            return self.limit();
        }
        if let Some(closed) = self.accumulate_at(now, latency, running, ended) {
            self.close_window_at(now, closed);
        }
        self.limit()
    }

    /// Starts a probe when one is due: the limit drops to the floor until the probe has
    /// measured the no-load latency.
    fn start_probe_if_due_at(&mut self, now: Instant) {
        if self.probe.is_some() || self.next_probe.is_some_and(|at| now < at) {
            // The path of every call between probes: nothing due, nothing to read.
            return;
        }
        let idle = self
            .last_sample
            .is_some_and(|at| now.saturating_duration_since(at) >= IDLE);
        // From here no probe runs and one is due (or none has run yet).
        if self.next_probe.is_some() && idle {
            // The first calls after a quiet spell run at the limit learned before: a
            // burst is no moment to serve at half of it. The probe comes later.
            self.next_probe = now.checked_add(self.jittered_interval());
            return;
        }
        self.probe = Some(Probe {
            began: now,
            saved: self.limit,
            clean_from: None,
            samples: Vec::with_capacity(self.config.min_window_samples),
        });
        self.limit = self.probe_limit();
        self.window = None;
        self.last = None;
        self.cuts_from = None;
        self.fell_at = None;
        self.served = None;
        self.base = None;
    }

    /// The time to the next probe: the probe interval, jittered by ±25 % so that a fleet
    /// does not probe together.
    fn jittered_interval(&mut self) -> Duration {
        let jitter = 0.75 + 0.5 * self.rng.f64();
        self.config.probe_interval.mul_f64(jitter)
    }

    /// The limit during a probe. The first, with nothing known, is at the floor. Later
    /// ones are at half the limit: it sits a call or two above the capacity, so half of it
    /// queues nothing inside, and the probe costs at most half the capacity for a few
    /// service times instead of pinning the server at the floor (which sheds real
    /// traffic for as long as the probe lasts).
    fn probe_limit(&self) -> f64 {
        let floor = self.config.min_limit as f64;
        match self.min_latency {
            None => floor,
            Some(_) => (self.limit / 2.0).floor().max(floor),
        }
    }

    /// One sample during a probe: counted once no more than the probe's limit ran when
    /// its call started; with enough of them, the median is the no-load latency and the limit
    /// returns to where it was.
    fn probe_sample_at(
        &mut self,
        now: Instant,
        started: Instant,
        latency: Duration,
        running: usize,
    ) {
        let Some(probe) = &mut self.probe else {
            return;
        };
        if probe.clean_from.is_some_and(|from| started >= from) {
            probe.samples.push(latency);
        }
        if probe.clean_from.is_none() && running as f64 <= self.limit {
            probe.clean_from = Some(now);
        }
        // The first probe, with nothing known yet, serves at the floor: a quarter of the
        // samples keeps that short; a later one refines the floor. (On real time a few
        // samples may read the floor a tenth away from the mean, by where a timer's tick
        // falls: a run of shallow cuts that the latency does not follow restores it.)
        let wanted = match self.min_latency {
            None => self.config.min_window_samples.div_ceil(4),
            Some(_) => self.config.min_window_samples,
        };
        // Calls that hold their workers for long (streams) can keep the probe from ever
        // seeing few enough run: it ends after `PROBE_LONGEST` with what it has.
        let overdue = now.saturating_duration_since(probe.began) >= PROBE_LONGEST;
        if probe.samples.len() >= wanted || overdue {
            probe.samples.sort_unstable();
            if let Some(floor) = mean_without_stalls(&probe.samples) {
                let floor = floor.max(Duration::from_micros(1));
                // The calls that finish first are the fast ones, so a probe reads a
                // little low: it lowers a known floor only by more than that.
                self.min_latency = Some(match self.min_latency {
                    Some(m) if floor < m && floor > m.mul_f64(FOLLOWED_DOWN) => m,
                    _ => floor,
                });
            }
            self.limit = probe.saved;
            self.probe = None;
            self.next_probe = now.checked_add(self.jittered_interval());
        }
    }

    /// Adds one sample to the current window; returns what the window saw when it closes
    /// (enough samples over its span, once the no-load latency is known).
    fn accumulate_at(
        &mut self,
        now: Instant,
        latency: Duration,
        running: usize,
        ended: Ended,
    ) -> Option<Closed> {
        let window = self.window.get_or_insert(Window {
            started: now,
            count: 0,
            sum_secs: 0.0,
            sum_abandoned_secs: 0.0,
            sum_running: 0,
            abandoned: 0,
            not_served: 0,
        });
        window.count += 1;
        match ended {
            Ended::Served => window.sum_secs += latency.as_secs_f64(),
            Ended::NotServed => window.not_served += 1,
            Ended::Abandoned => {
                window.abandoned += 1;
                window.sum_abandoned_secs += latency.as_secs_f64();
            }
            Ended::Streaming => {}
        }
        // `running` is after this call left: it ran alongside them.
        window.sum_running += running + 1;
        let m = self.min_latency?;
        // The window after a cut answers one question (did the latency fall with the
        // limit?) while capacity may sit idle: half the samples over two floors do.
        let (span, samples) = if self.last.is_some() {
            (
                m.saturating_mul(2),
                self.config.min_window_samples.div_ceil(2),
            )
        } else {
            (
                self.config.window.max(m.saturating_mul(2)),
                self.config.min_window_samples,
            )
        };
        if window.count < samples || now.saturating_duration_since(window.started) < span {
            return None;
        }
        let censored = window.abandoned as f64 >= CENSORED_SHARE * window.count as f64;
        let refusing = window.not_served as f64 >= CENSORED_SHARE * window.count as f64;
        let served = window.count - window.abandoned - window.not_served;
        let timed = served + window.abandoned;
        let window = self.window.take()?;
        if timed == 0 {
            // Nothing was served, and no caller left mid-run: no latency to steer by.
            return None;
        }
        // A call whose caller left is no fast answer: its time counts only in a window
        // read as a lower bound. A call that was not served counts in none.
        let rtt = if censored || served == 0 {
            (window.sum_secs + window.sum_abandoned_secs) / timed as f64
        } else {
            window.sum_secs / served as f64
        };
        // Where callers left, two lower bounds of the true mean: all calls with the time so
        // far of those cut short, and the calls served in full (those cut short were the
        // longer ones). A test of a higher floor reads the tighter.
        let floor_rtt = if censored && served > 0 {
            rtt.max(window.sum_secs / served as f64)
        } else {
            rtt
        };
        Some(Closed {
            m,
            rtt,
            floor_rtt,
            mean_running: window.sum_running as f64 / window.count as f64,
            censored,
            refusing,
        })
    }

    /// A window closed at `now`: the floor follows what it saw, and the limit takes the
    /// Vegas step (held back when callers left), or goes to the capacity that the window
    /// and the one before the last cut show.
    fn close_window_at(&mut self, now: Instant, closed: Closed) {
        let Closed {
            m,
            rtt,
            floor_rtt,
            mean_running,
            censored,
            refusing,
        } = closed;
        let saturated = mean_running >= 0.9 * self.limit.round();
        let seen = Seen {
            running: mean_running,
            rtt,
        };
        let tested = Seen {
            rtt: floor_rtt,
            ..seen
        };
        let (m, capacity) = self.follow_floor_at(now, m, tested, saturated, censored);
        if rtt > 0.0 {
            self.min_latency = Duration::try_from_secs_f64(m).ok().or(self.min_latency);
        }
        let before = self.limit;
        let (_, beta) = band(before);
        // While the limit lets as many calls run as a growth that bought throughput ran,
        // their latency then is no queueing (see `served`).
        if self.served.is_some_and(|served| before < served.running) {
            self.served = None;
        }
        let reference = self.served.map_or(m, |served| m.max(served.rtt));
        let queued = queued(before, reference, rtt);
        if saturated && !censored && !refusing && rtt > 0.0 {
            self.follow_noise(before, rtt);
        } else {
            // Fewer calls ran than the limit allows: the latency moved with the demand.
            self.previous = None;
        }
        // What the window's noise alone reads as calls queued inside is no evidence either
        // way: the Vegas step reads what is beyond it. Where the band is one call (`β = 1`),
        // the test of a growth by one call decides instead (`next_limit`).
        let beyond_noise = if queued > 0.0 && beta > 1.0 {
            (queued - NOISE_BANDS * self.noise * before).max(0.0)
        } else {
            queued
        };
        let mut next = match capacity {
            // The floor rose: the calls take longer, but as many run at once.
            Some(capacity) => capacity + beta / 2.0,
            None => self.next_limit(
                beyond_noise,
                reference,
                rtt,
                saturated && !censored && !refusing,
                saturated,
                seen,
            ),
        };
        if refusing {
            // A tenth of the calls or more were not served: the handler refuses work, which
            // is no room for more.
            next = next.min(before);
        }
        if censored && capacity.is_none() {
            // Callers left: no evidence of room, and while calls still queue inside, that
            // queue is what made them leave.
            next = next.min(before);
            if queued >= beta / 2.0 {
                next = next.min(before - beta / 2.0);
            }
        }
        self.limit = next.clamp(self.config.min_limit as f64, self.config.max_limit as f64);
        if self.limit < before {
            self.base = None;
        } else if saturated && !censored && !refusing && self.base.is_none() {
            self.base = Some(seen);
        }
        if self.limit < before {
            // Calls let in under the higher limit still queue inside: the next window
            // counts only the calls that start under the new one.
            self.counted_from = Some(now);
            if !censored && capacity.is_none() {
                if self.limit <= CUT_TESTED * before {
                    // A deep cut is a test of "those calls queued inside": the next window
                    // answers (a shallow one moves the latency too little to tell).
                    self.last = Some(seen);
                } else {
                    // A run of shallow cuts is tested once it is as deep: on real time a
                    // latency a little above the floor by noise alone (the timer's tick,
                    // the scheduler) reads as a call or two queued inside, window after
                    // window, and cut after shallow cut would take the limit of a service
                    // whose latency never moved with it down to the floor.
                    // Only where the limit held the calls running: elsewhere the demand did.
                    match &mut self.cuts_from {
                        Some((_, age)) if *age < SERIES_WINDOWS => {}
                        run if saturated => *run = Some((seen, 0)),
                        run => *run = None,
                    }
                }
            }
        } else if self.limit > before {
            self.cuts_from = None;
        }
    }

    /// Follows how much a window's mean latency moves by itself: the window just closed at
    /// `limit` read `rtt`. Only consecutive windows that reached the limit, at about the same
    /// limit, count (a change of the limit moves the latency by what it let in), and no
    /// single pair counts for more than `NOISE_CLIP` (a capacity drop is a change, not
    /// noise).
    fn follow_noise(&mut self, limit: f64, rtt: f64) {
        if let Some((was, before)) = self.previous.replace((limit, rtt))
            && (limit - was).abs() <= NOISE_SAME_LIMIT * was
            && before > 0.0
        {
            let moved = (rtt / before).ln().abs().min(NOISE_CLIP);
            self.noise += (moved - self.noise) / NOISE_WINDOWS;
        }
    }

    /// The no-load latency (seconds) after a window that saw `seen`, from the floor `m`
    /// known before it, and the capacity when this window and the one that made the last
    /// cut show a higher floor; schedules a probe when the floor fell while windows stay
    /// `saturated`.
    fn follow_floor_at(
        &mut self,
        now: Instant,
        m: Duration,
        seen: Seen,
        saturated: bool,
        censored: bool,
    ) -> (f64, Option<f64>) {
        let rtt = seen.rtt;
        // The window after a cut shows whether the floor rose (see `floor_between`).
        let shown = self.last.take().and_then(|last| floor_between(last, seen));
        // So does a window after a run of shallow cuts that together went as deep.
        let shown = shown.or_else(|| {
            let (from, age) = self.cuts_from.as_mut()?;
            *age += 1;
            let from = *from;
            if !saturated || seen.running > CUT_TESTED * from.running {
                return None;
            }
            self.cuts_from = None;
            floor_between(from, seen)
        });
        if censored {
            // Its mean is a lower bound, the calls cut short by their callers: it shows no
            // lower floor. But it still answers the test of a deep cut made by a window
            // whose callers stayed: a lower bound that already shows the latency did not
            // fall with the limit shows a higher floor (the true mean is higher still).
            let m = m.as_secs_f64();
            return match shown {
                Some((floor, capacity)) => (floor.max(m), Some(capacity)),
                None => (m, None),
            };
        }
        // Between probes the floor follows a clearly faster window down at once (not one
        // a little faster by chance: following every low mean would ratchet the floor
        // down on noise, and the limit with it)...
        if rtt < 0.8 * m.as_secs_f64() {
            self.fell_at.get_or_insert(now);
        }
        let mut m = m.as_secs_f64();
        if rtt < FOLLOWED_DOWN * m {
            m = rtt;
        }
        let mut capacity = None;
        // ...and up when the window after a cut shows it.
        if let Some((floor, c)) = shown {
            m = floor;
            capacity = Some(c);
        }
        if !saturated {
            // Calls that do not queue inside show the floor as it is.
            self.fell_at = None;
        }
        // A floor that fell while every window stays saturated is only known from above
        // (the windows' means include the calls queued inside), so the limit would sit
        // too high: after a second of that, a probe measures it.
        if saturated
            && self
                .fell_at
                .is_some_and(|at| now.saturating_duration_since(at) >= Duration::from_secs(1))
        {
            self.next_probe = Some(now);
            self.fell_at = None;
        }
        (m, capacity)
    }

    /// Whether a refuted growth still holds the limit back this window (and counts the
    /// window off).
    fn held_back(&mut self) -> bool {
        if self.hold_left == 0 {
            return false;
        }
        self.hold_left -= 1;
        self.growth = 0;
        true
    }

    /// The Vegas step: the new limit after a window of mean latency `rtt` with no-load
    /// latency `m`, in which `queued` calls seemed to queue inside; the limit grows only
    /// after a window that was `saturated` (as many calls ran, on average, as it allowed):
    /// growing a limit that was not used tests nothing. `bound`: whether the limit held the
    /// calls running (`saturated` before the guards for callers that left and calls not
    /// served); a window it did not bind cuts only far over the band (`CUT_AT_ONCE`).
    fn next_limit(
        &mut self,
        queued: f64,
        m: f64,
        rtt: f64,
        saturated: bool,
        bound: bool,
        seen: Seen,
    ) -> f64 {
        let limit = self.limit;
        let (alpha, beta) = band(limit);
        let noise = self.noise;
        let growth = self.base.map(|base| judge_growth(base, seen, noise));
        if let Some(from) = self.tried_from.take()
            && saturated
        {
            if growth == Some(Growth::Wasted) {
                // The calls the trial let in waited inside: back, and no trial for a while.
                self.hold = (self.hold * 2).clamp(2, HOLD_LONGEST);
                self.hold_left = self.hold;
                self.growth = 0;
                return from;
            }
            self.hold = 0;
        }
        if let Some(from) = self.raised_from.take() {
            if saturated && queued >= REFUTES_GROWTH {
                // The call the growth let in waited inside: back to where it was, and no
                // growth for a while.
                self.hold = (self.hold * 2).clamp(2, HOLD_LONGEST);
                self.hold_left = self.hold;
                self.growth = 0;
                return from;
            }
            if saturated {
                self.hold = 0;
            }
        }
        let grows_below = if beta > 1.0 { beta / 2.0 } else { alpha };
        // A limit that grew since its base and bought throughput with most of the calls it
        // let in is still below the capacity, whatever Vegas reads: the latency rose with the
        // load on the machine, not with calls waiting inside. It grows on, by `TRIAL` at
        // least (less would not be judged), from a new base.
        let bought = beta > 1.0 && saturated && growth == Some(Growth::Bought);
        if bought {
            // Of the two windows, the faster: a base slowed by a stall elsewhere on the
            // machine is no latency of calls served.
            self.served = self
                .base
                .replace(seen)
                .map(|base| if base.rtt <= seen.rtt { base } else { seen });
        }
        // Within the band, one that has not grown enough since its base to tell tries a
        // step of `TRIAL`, which the next window judges.
        if beta > 1.0
            && saturated
            && (grows_below..=beta).contains(&queued)
            && growth == Some(Growth::TooSmall)
        {
            if self.held_back() {
                return limit;
            }
            self.tried_from = Some(limit);
            self.growth = 0;
            return (limit * (1.0 + TRIAL)).clamp(limit, self.config.max_limit as f64);
        }
        let next = if (queued < grows_below || bought) && saturated {
            if self.held_back() {
                return limit;
            }
            // Each window that grows the limit with nothing queued inside doubles the
            // next step, from `l/2`: a large server reaches its capacity in a few windows.
            let mut step = (alpha * f64::from(1u32 << self.growth.min(16))).min(limit);
            if bought {
                step = step.max(TRIAL * limit);
            }
            self.growth += 1;
            let next =
                (limit + step).clamp(self.config.min_limit as f64, self.config.max_limit as f64);
            if next.round() == limit.round() + 1.0 && beta <= 1.0 {
                self.raised_from = Some(limit);
            }
            return next;
        } else if queued > beta && (bound || queued > CUT_AT_ONCE * beta) {
            // `L · m / rtt` is the capacity the window measured: go at once to it plus
            // the middle of the band, or by `α` if that is less of a step.
            let target = limit * m / rtt + (alpha + beta) / 2.0;
            target.min(limit - alpha)
        } else {
            // A window in which fewer calls ran than the limit allows, a little over the
            // band, holds: the limit did not let those calls in, and on real time a stall
            // or a late timer moves one window's mean by a tenth. Far over the band (a
            // capacity drop), it cuts at once.
            limit
        };
        self.growth = 0;
        next.clamp(self.config.min_limit as f64, self.config.max_limit as f64)
    }
}

/// The band `[α, β]` of calls the limit keeps queued inside: `β = max(1, log10 L, L/16)`,
/// `α = β/4`. One call at most for a small limit, where each call queued inside adds a
/// large share of a service time to every call; a sixteenth of the limit for a large one,
/// where a window's mean latency and the floor are known to a few percent and `L` times
/// that error reads as calls queued.
fn band(limit: f64) -> (f64, f64) {
    let beta = limit.log10().max(limit / 16.0).max(1.0);
    (beta / 4.0, beta)
}

/// Whether the calls running grew by `GROWTH_JUDGED` or more from `base` to `now`, and if
/// so, whether the throughput (`running / rtt`, Little's law) grew by at least `BOUGHT` of
/// that, less what the windows' own `noise` moves a latency by: most of the calls let in
/// were served, not queued inside.
fn judge_growth(base: Seen, now: Seen, noise: f64) -> Growth {
    if base.running <= 0.0 || base.rtt <= 0.0 || now.rtt <= 0.0 {
        return Growth::TooSmall;
    }
    let more_calls = now.running / base.running - 1.0;
    let more_served = (now.running / now.rtt) / (base.running / base.rtt) - 1.0;
    if more_calls < GROWTH_JUDGED {
        Growth::TooSmall
    } else if more_served >= BOUGHT * more_calls - NOISE_BANDS * noise {
        Growth::Bought
    } else {
        Growth::Wasted
    }
}

/// What a growth of the calls running since the base bought.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Growth {
    /// Too little growth to tell from a window's noise.
    TooSmall,
    /// Throughput, for most of the calls let in.
    Bought,
    /// Little: most of the calls let in waited inside.
    Wasted,
}

/// Vegas's reading of the calls queued inside at `limit`, with floor `m` and mean
/// latency `rtt`: `L · (1 − m / rtt)`.
fn queued(limit: f64, m: f64, rtt: f64) -> f64 {
    if rtt > 0.0 {
        limit * (1.0 - m / rtt)
    } else {
        0.0
    }
}

/// The mean of `sorted` without its slowest eighth, `None` when empty.
///
/// The probe's reading of the no-load latency. A window is read by its mean, so the floor
/// it is compared with must be a mean too: on real time a sleep of 1 ms takes about 1.3 or
/// 2.3 ms, by where the timer's tick falls, and the median of such samples is one mode or
/// the other, up to a third away from the mean of every window that follows. The slowest
/// eighth left out is a stall of the runtime, which a window's many samples dilute and a
/// probe's few do not. Exact where latencies are.
fn mean_without_stalls(sorted: &[Duration]) -> Option<Duration> {
    let kept = sorted
        .get(..sorted.len() - sorted.len() / 8)
        .filter(|k| !k.is_empty())?;
    let sum: f64 = kept.iter().map(Duration::as_secs_f64).sum();
    Duration::try_from_secs_f64(sum / kept.len() as f64).ok()
}

/// The share of a window's samples abandoned by their callers from which its mean
/// latency counts only as a lower bound; and the share of calls not served from which a
/// window does not grow the limit.
const CENSORED_SHARE: f64 = 0.1;

/// The latency floor and the capacity that the window which cut the limit (`hi`) and
/// the window after the cut (`lo`) show, if they show one. While calls queue inside, the
/// latency is proportional to the calls running at once (`rtt ≈ m·N/C`): the lower
/// window's latency would be the higher one's times `N_lo / N_hi`. When it is clearly
/// more than that, the lower window's calls did not all queue inside: what they took is
/// the floor, and the higher window's latency says how many ran at once at that floor,
/// `C = N_hi · rtt_lo / rtt_hi` (at least `N_lo`).
fn floor_between(hi: Seen, lo: Seen) -> Option<(f64, f64)> {
    if lo.running > 0.95 * hi.running || lo.rtt <= 0.0 || hi.rtt <= 0.0 {
        return None;
    }
    let if_queued = hi.rtt * lo.running / hi.running;
    (lo.rtt > FLOOR_SHOWN * if_queued).then(|| {
        let capacity = (hi.running * lo.rtt / hi.rtt).clamp(lo.running, hi.running);
        (lo.rtt, capacity)
    })
}

/// How many of the measured window-to-window moves of the latency (`AdaptiveLimit::noise`,
/// times the limit) a reading of calls queued inside must exceed to count. A mean absolute
/// log-ratio of two windows is about 1.1 standard deviations of one window's mean: one and a
/// half of it leave out most of what noise reads, and on exact latencies it is nothing.
const NOISE_BANDS: f64 = 1.5;

/// The most one pair of windows moves the noise estimate by (as a log-ratio): a stall of the
/// runtime, or a capacity drop, is not the noise of every window.
const NOISE_CLIP: f64 = 0.25;

/// Two windows whose limits differ by at most this share are "at the same limit" for the
/// noise estimate.
const NOISE_SAME_LIMIT: f64 = 0.1;

/// Windows the noise estimate averages over (the weight of the newest pair is one over it).
const NOISE_WINDOWS: f64 = 8.0;

/// How much more calls must run than at the base for a growth to be judged by its
/// throughput: below it a window's noise decides.
const GROWTH_JUDGED: f64 = 0.1;

/// The share of a growth in calls running that must show as throughput for the growth to
/// have bought it.
const BOUGHT: f64 = 0.5;

/// The step a limit in the band tries when it has not grown enough since its base to be
/// judged: a little over `GROWTH_JUDGED`.
const TRIAL: f64 = 0.15;

/// The longest a refuted growth holds the limit back, in windows.
const HOLD_LONGEST: u32 = 16;

/// Calls queued inside, in the window after a growth by one call, that show the call
/// waited inside (it reads as 1 when it did, as 0 when there was room).
const REFUTES_GROWTH: f64 = 0.5;

/// A cut to at most this share of the limit is compared with the window after it
/// (`floor_between`): the latency pure queueing predicts then differs from the floor by
/// more than a window's noise.
const CUT_TESTED: f64 = 0.85;

/// A window whose mean latency is below this share of the floor moves the floor down to
/// it: more than the noise of a window's mean.
const FOLLOWED_DOWN: f64 = 0.9;

/// The most windows a run of shallow cuts is tested over, from the window that made its
/// first: a longer one may straddle a change of the service itself (a slowdown), which a
/// test of "those calls queued inside" would read as a higher floor.
const SERIES_WINDOWS: u32 = 8;

/// How far over the band (in `β`s) the reading of a window in which fewer calls ran than
/// the limit allows must be to cut it.
const CUT_AT_ONCE: f64 = 3.0;

/// The longest a probe holds the limit down, whatever it has measured by then.
const PROBE_LONGEST: Duration = Duration::from_secs(1);

/// A quiet spell after which a due probe is put off: the burst that ends it is served at
/// the limit learned before.
const IDLE: Duration = Duration::from_secs(1);

/// How much above the latency pure queueing predicts a lower limit's latency must be to
/// show a floor: well above the noise of a window's mean.
const FLOOR_SHOWN: f64 = 1.15;

#[cfg(test)]
mod storm_model;
#[cfg(test)]
mod tests;
