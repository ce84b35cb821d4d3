//! An adaptive concurrency limit: how many calls may run at once, learned from latency.
//!
//! See [`AdaptiveLimit`](crate::AdaptiveLimit) for what it does and why.

use std::time::Duration;

use serde::Deserialize;

use crate::ConfigError;
use crate::Instant;
use crate::config::check;

/// The adaptive limit's bounds and pace. `AdaptiveLimitConfig::validate` says what is
/// accepted.
///
/// Deserializes from an object of these fields, each optional (its default when absent),
/// durations with their unit (`"100ms"`); unknown fields are refused.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(
    default,
    deny_unknown_fields,
    expecting = "an object of adaptive limit settings"
)]
pub struct AdaptiveLimitConfig {
    /// Where the limit starts, before anything has been measured (within the bounds).
    /// Default 16.
    #[serde(deserialize_with = "crate::config::whole")]
    pub initial_limit: usize,
    /// The floor: the limit never goes below it, and it is the limit during a probe.
    /// At least 1. Default 2.
    #[serde(deserialize_with = "crate::config::whole")]
    pub min_limit: usize,
    /// The ceiling. At least `min_limit`. Default 1 000.
    #[serde(deserialize_with = "crate::config::whole")]
    pub max_limit: usize,
    /// The shortest decision window. Above zero. Default 100 ms (a window also lasts at
    /// least two no-load latencies).
    #[serde(with = "crate::config::duration")]
    pub window: Duration,
    /// Samples a window (and a probe) needs before it decides. At least 1. Default 16.
    #[serde(deserialize_with = "crate::config::whole")]
    pub min_window_samples: usize,
    /// Time between probes of the no-load latency (jittered ±25 %). Above zero.
    /// Default 30 s.
    #[serde(with = "crate::config::duration")]
    pub probe_interval: Duration,
    /// Seed of the probe jitter.
    #[serde(deserialize_with = "crate::config::whole")]
    pub seed: u64,
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
            seed: 0x11_ad_a9,
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
    sum_secs: f64,
    /// The most calls running at once seen during the window.
    max_running: usize,
    /// The sum over samples of the calls that ran alongside each (itself included).
    sum_running: usize,
    /// Samples of calls whose caller left before they finished.
    abandoned: usize,
}

/// What the last decided window saw: the limit in force, its mean latency, and whether
/// the limit was the bound (as many calls ran as it allowed).
#[derive(Clone, Copy, Debug)]
struct Seen {
    limit: f64,
    rtt: f64,
    saturated: bool,
}

/// What a window saw when it closed.
#[derive(Clone, Copy, Debug)]
struct Closed {
    /// The no-load latency known when it closed.
    m: Duration,
    /// Its mean latency, seconds.
    rtt: f64,
    /// The most calls that ran at once.
    used: f64,
    /// The mean of the calls running alongside each sample.
    mean_running: f64,
    /// Whether many callers left before their calls finished.
    censored: bool,
}

#[derive(Debug)]
struct Probe {
    /// The limit to return to.
    saved: f64,
    /// From when samples count: calls that started once no more than the floor ran.
    clean_from: Option<Instant>,
    samples: Vec<Duration>,
}

/// The current limit and what it was learned from. See the [docs](AdaptiveLimit).
///
/// A fixed worker count asks the operator to know the server's capacity. Set too high,
/// the extra calls queue *inside* the handler (a database pool, a downstream channel)
/// where the admission queue cannot see them: latency climbs for everyone, callers time
/// out, and nothing is shed, so the retry storm the queue exists to stop comes back. Set
/// too low, capacity sits idle. [`AdaptiveLimit`] finds the count from what it measures.
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
/// and steers `queued` into a small band `[α, β]`, with `l = max(1, log10 L)`, `α = l`,
/// `β = 3l`: above `β` the limit drops to the capacity the window measured (`L·m/rtt`)
/// plus the middle of the band (at least by `l`); below `α` it grows by `l`, and by `β`
/// at once when at most `l` is queued. Dropping at once matters: a limit far too high
/// (a deploy made calls slower, or the start value was a guess) makes every call wait
/// inside the handler until callers time out, and stepping down by `l` per window would
/// take seconds. So the limit settles a few calls above `C`: every
/// unit of real capacity stays busy, and the calls beyond it wait in the admission queue,
/// where they can be ordered, expired and shed (retries first), instead of inside the
/// handler. Each call queued inside adds `1/C` of a service time to every call, so the
/// band is narrow: Netflix's `VegasLimit` uses `3l` and `6l`, which settled too far above
/// `C` and cost goodput, and `2l`/`4l` kept enough calls queued inside under a slowdown to
/// make callers leave (`docs/admission.md`, "Why the band is `l` to `2l`", has the runs).
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
///   that many calls run, takes the median latency of the next
///   [`AdaptiveLimitConfig::min_window_samples`] calls as `m`, and returns to the limit it
///   had. Between probes `m` follows a faster window down at once.
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
/// - **After a cut, only calls that started under the new limit count**: the calls let
///   in before it still queue inside, and would read as a need to cut again.
/// - **A window in which callers left is a lower bound.** A call abandoned mid-run took
///   at least its time so far ([`AdaptiveLimit::abandoned_at`]). When a tenth of a
///   window's calls were abandoned, the window never grows the limit and never shows a
///   floor, and if calls still queue inside, it cuts the limit by `l`: under overload the
///   calls that queue inside are those whose callers give up.
///
/// Everything runs on the instants it is given (`*_at(now)`), so the simulator can drive
/// it on a virtual clock; [`crate::AdmissionQueue`] feeds it unless
/// [`AdmissionConfig::workers`](crate::AdmissionConfig::workers) is a fixed number.
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::Instant;
/// use stormguard_core::{AdaptiveLimit, AdaptiveLimitConfig};
///
/// let config = AdaptiveLimitConfig {
///     initial_limit: 20, min_limit: 2, max_limit: 100, ..AdaptiveLimitConfig::default()
/// };
/// let mut limit = AdaptiveLimit::new(config, 7).expect("valid");
/// let t0 = Instant::now();
/// // The first sample starts a probe at the floor.
/// limit.sample_at(t0, t0, 0);
/// assert_eq!(limit.limit(), 2);
/// ```
#[derive(Debug)]
pub struct AdaptiveLimit {
    config: AdaptiveLimitConfig,
    limit: f64,
    min_latency: Option<Duration>,
    window: Option<Window>,
    probe: Option<Probe>,
    /// When the next probe starts (`None`: at the first sample).
    next_probe: Option<Instant>,
    /// The last window in which the limit was the bound and few callers left.
    last: Option<Seen>,
    /// When a window first showed the floor falling, while windows stay saturated.
    fell_at: Option<Instant>,
    /// Samples count from calls started at or after this instant (the last cut).
    counted_from: Option<Instant>,
    rng: fastrand::Rng,
}

impl AdaptiveLimit {
    /// A limit starting at `config.initial_limit` (clamped to the bounds) for a valid
    /// `config`; `seed` varies the probe jitter between servers.
    pub fn new(config: AdaptiveLimitConfig, seed: u64) -> Result<Self, ConfigError> {
        config.validate()?;
        let limit = config
            .initial_limit
            .clamp(config.min_limit, config.max_limit) as f64;
        let rng = fastrand::Rng::with_seed(config.seed ^ seed);
        Ok(AdaptiveLimit {
            config,
            limit,
            min_latency: None,
            window: None,
            probe: None,
            next_probe: None,
            last: None,
            fell_at: None,
            counted_from: None,
            rng,
        })
    }

    /// Calls that may run at once now.
    pub fn limit(&self) -> usize {
        // Within [min_limit, max_limit], both usize: the cast cannot truncate.
        self.limit.round() as usize
    }

    /// The no-load latency `m` the limit steers by (`None` until the first probe ends).
    pub fn min_latency(&self) -> Option<Duration> {
        self.min_latency
    }

    #[cfg(test)]
    /// Whether a probe of the no-load latency is under way (the limit is at the floor).
    pub(crate) fn probing(&self) -> bool {
        self.probe.is_some()
    }

    /// One call that started at `started` finished at `now`; `running` calls still run.
    /// Returns the limit from now on.
    pub fn sample_at(&mut self, now: Instant, started: Instant, running: usize) -> usize {
        self.record_at(now, started, running, false)
    }

    /// One call that started at `started` was abandoned by its caller at `now`, before it
    /// finished; `running` calls still run. Returns the limit from now on.
    pub fn abandoned_at(&mut self, now: Instant, started: Instant, running: usize) -> usize {
        self.record_at(now, started, running, true)
    }

    fn record_at(
        &mut self,
        now: Instant,
        started: Instant,
        running: usize,
        abandoned: bool,
    ) -> usize {
        let latency = now.saturating_duration_since(started);
        self.start_probe_if_due_at(now);
        if self.probe.is_some() {
            self.probe_sample_at(now, started, latency, running);
            return self.limit();
        }
        if self.counted_from.is_some_and(|from| started < from) {
            return self.limit();
        }
        if let Some(closed) = self.accumulate_at(now, latency, running, abandoned) {
            self.close_window_at(now, closed);
        }
        self.limit()
    }

    /// Starts a probe when one is due: the limit drops to the floor until the probe has
    /// measured the no-load latency.
    fn start_probe_if_due_at(&mut self, now: Instant) {
        if self.probe.is_none() && self.next_probe.is_none_or(|at| now >= at) {
            self.probe = Some(Probe {
                saved: self.limit,
                clean_from: None,
                samples: Vec::with_capacity(self.config.min_window_samples),
            });
            self.limit = self.config.min_limit as f64;
            self.window = None;
            self.last = None;
            self.fell_at = None;
        }
    }

    /// One sample during a probe: counted once no more than the floor ran when its call
    /// started; with enough of them, the median is the no-load latency and the limit
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
        if probe.clean_from.is_none() && running <= self.config.min_limit {
            probe.clean_from = Some(now);
        }
        if probe.samples.len() >= self.config.min_window_samples {
            probe.samples.sort_unstable();
            let median = probe.samples[probe.samples.len() / 2];
            self.min_latency = Some(median.max(Duration::from_micros(1)));
            self.limit = probe.saved;
            self.probe = None;
            let jitter = 0.75 + 0.5 * self.rng.f64();
            self.next_probe = now.checked_add(self.config.probe_interval.mul_f64(jitter));
        }
    }

    /// Adds one sample to the current window; returns what the window saw when it closes
    /// (enough samples over its span, once the no-load latency is known).
    fn accumulate_at(
        &mut self,
        now: Instant,
        latency: Duration,
        running: usize,
        abandoned: bool,
    ) -> Option<Closed> {
        let window = self.window.get_or_insert(Window {
            started: now,
            count: 0,
            sum_secs: 0.0,
            max_running: 0,
            sum_running: 0,
            abandoned: 0,
        });
        window.abandoned += usize::from(abandoned);
        window.count += 1;
        window.sum_secs += latency.as_secs_f64();
        // `running` is after this call left: it ran alongside them.
        window.max_running = window.max_running.max(running + 1);
        window.sum_running += running + 1;
        let m = self.min_latency?;
        let span = self.config.window.max(m.saturating_mul(2));
        if window.count < self.config.min_window_samples
            || now.saturating_duration_since(window.started) < span
        {
            return None;
        }
        let closed = Closed {
            m,
            rtt: window.sum_secs / window.count as f64,
            used: window.max_running as f64,
            mean_running: window.sum_running as f64 / window.count as f64,
            censored: window.abandoned as f64 >= CENSORED_SHARE * window.count as f64,
        };
        self.window = None;
        Some(closed)
    }

    /// A window closed at `now`: the floor follows what it saw, and the limit takes the
    /// Vegas step (held back when callers left).
    fn close_window_at(&mut self, now: Instant, closed: Closed) {
        let Closed {
            m,
            rtt,
            used,
            mean_running,
            censored,
        } = closed;
        let seen = Seen {
            limit: self.limit,
            rtt,
            saturated: mean_running >= 0.9 * self.limit.round(),
        };
        let m = self.follow_floor_at(now, m, seen, censored);
        if rtt > 0.0 {
            self.min_latency = Duration::try_from_secs_f64(m).ok().or(self.min_latency);
        }
        let before = self.limit;
        let mut next = self.next_limit(m, rtt, used);
        if censored {
            // Callers left: no evidence of room, and while calls still queue inside, that
            // queue is what made them leave.
            let l = before.log10().max(1.0);
            let queued = if rtt > 0.0 {
                before * (1.0 - m / rtt)
            } else {
                0.0
            };
            next = next.min(before);
            if queued >= l / 2.0 {
                next = next.min(before - l);
            }
        }
        self.limit = next.clamp(self.config.min_limit as f64, self.config.max_limit as f64);
        if self.limit < before {
            // Calls let in under the higher limit still queue inside: the next window
            // counts only the calls that start under the new one.
            self.counted_from = Some(now);
        }
    }

    /// The no-load latency (seconds) after a window that saw `seen`, from the floor `m`
    /// known before it; schedules a probe when the floor fell while windows stay saturated.
    fn follow_floor_at(&mut self, now: Instant, m: Duration, seen: Seen, censored: bool) -> f64 {
        let rtt = seen.rtt;
        // Between probes the floor follows a faster window down at once...
        if rtt < 0.8 * m.as_secs_f64() {
            self.fell_at.get_or_insert(now);
        }
        let mut m = m.as_secs_f64().min(rtt);
        // ...and up when two saturated windows show it (see `floor_between`). A window in
        // which many callers left is not one of them: its mean is only a lower bound.
        if seen.saturated && !censored {
            if let Some(floor) = self.last.and_then(|last| floor_between(last, seen)) {
                m = floor;
            }
            self.last = Some(seen);
        } else if !seen.saturated {
            self.last = None;
            // Calls that do not queue inside show the floor as it is.
            self.fell_at = None;
        }
        // A floor that fell while every window stays saturated is only known from above
        // (the windows' means include the calls queued inside), so the limit would sit
        // too high: after a second of that, a probe measures it.
        if seen.saturated
            && self
                .fell_at
                .is_some_and(|at| now.saturating_duration_since(at) >= Duration::from_secs(1))
        {
            self.next_probe = Some(now);
            self.fell_at = None;
        }
        m
    }

    /// The Vegas step: the new limit after a window of mean latency `rtt` with no-load
    /// latency `m`, in which at most `used` calls ran at once.
    fn next_limit(&self, m: f64, rtt: f64, used: f64) -> f64 {
        let limit = self.limit;
        let queued = if rtt > 0.0 {
            limit * (1.0 - m / rtt)
        } else {
            0.0
        };
        let l = limit.log10().max(1.0);
        let (alpha, beta) = (l, 3.0 * l);
        // Growing a limit that was not used tests nothing.
        let busy = used >= limit.round();
        let next = if queued <= l && busy {
            limit + beta
        } else if queued < alpha && busy {
            limit + l
        } else if queued > beta {
            // `L · m / rtt` is the capacity the window measured: go at once to it plus
            // the middle of the band, or by `l` if that is less of a step.
            let target = limit * m / rtt + (alpha + beta) / 2.0;
            target.min(limit - l)
        } else {
            limit
        };
        next.clamp(self.config.min_limit as f64, self.config.max_limit as f64)
    }
}

/// The share of a window's samples abandoned by their callers from which its mean
/// latency counts only as a lower bound.
const CENSORED_SHARE: f64 = 0.1;

/// The latency floor two saturated windows at different limits show, if they show one.
/// While calls queue inside, the latency is proportional to the calls let in
/// (`rtt ≈ m·L/C`), so `rtt / L` is the same at both limits. When the lower limit's
/// `rtt / L` is clearly higher, the latency did not fall with the limit: its calls did
/// not queue inside, and what they took is the floor.
fn floor_between(a: Seen, b: Seen) -> Option<f64> {
    let (lo, hi) = if a.limit < b.limit { (a, b) } else { (b, a) };
    if lo.limit > 0.9 * hi.limit || lo.rtt <= 0.0 || hi.rtt <= 0.0 {
        return None;
    }
    (lo.rtt / lo.limit > 1.3 * hi.rtt / hi.limit).then_some(lo.rtt)
}

#[cfg(test)]
mod tests;
