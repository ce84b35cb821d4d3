//! An adaptive concurrency limit: how many calls may run at once, learned from latency.
//!
//! A fixed worker count asks the operator to know the server's capacity. Set too high,
//! the extra calls queue *inside* the handler (a database pool, a downstream channel)
//! where the admission queue cannot see them: latency climbs for everyone, callers time
//! out, and nothing is shed, so the retry storm the queue exists to stop comes back. Set
//! too low, capacity sits idle. [`AdaptiveLimit`] finds the count from what it measures.
//!
//! # The algorithm: TCP Vegas on call latency
//!
//! When the server runs `L` calls at once and its real capacity is `C`, any `L > C`
//! waits somewhere inside: latency rises from the no-load latency `m` to about `m·L/C`.
//! Vegas reads that back as the number of calls queued inside:
//!
//! ```text
//! queued ≈ L · (1 − m / rtt)        (= L − C when L > C, ≈ 0 when L ≤ C)
//! ```
//!
//! and steers `queued` into a small band `[α, β]`, with `l = max(1, log10 L)`, `α = l`,
//! `β = 3l`: above `β` the limit drops to the capacity the window measured (`L·m/rtt`)
//! plus the middle of the band (at least by `l`); below `α` it grows by `l`, and by `β`
//! at once when at most `l` is queued. Dropping at once matters: a limit far too high
//! (a deploy made calls slower, or the start value was a guess) makes every call wait
//! inside the handler until callers time out, and stepping down by `l` per window would
//! take seconds. So the limit settles a few calls above `C`: every
//! unit of real capacity stays busy, and the calls beyond it wait in the admission queue,
//! where they can be ordered, expired and shed (retries first), instead of inside the
//! handler. Each call queued inside adds `1/C` of a service time to every call, so the
//! band is narrow: Netflix's `VegasLimit` uses `3l` and `6l`, which with C = 16 settled
//! at 21–22 and cost ~8 % of goodput against `workers = C` under 2× overload
//! (`examples/adaptive.rs`); `2l`/`4l` matched `workers = C` there, but when the storm
//! made every call 2.5 times slower, the 2–4 calls it kept queued inside made callers
//! leave (`tests/integration/limit_storm_model.rs`).
//!
//! Why Vegas rather than a gradient (Netflix's Gradient2, Envoy's adaptive concurrency
//! filter) or AIMD? AIMD needs drops to learn, and the drops it needs are the
//! timeouts we want to avoid. A gradient limit multiplies the limit by `m / rtt` and
//! adds a queue allowance; it converges too, but its resting point depends on a
//! smoothing factor and a tolerance, where Vegas's is stated in calls ("a few calls
//! queued inside"), which is what an operator can check against a known capacity.
//!
//! Details that matter in practice:
//!
//! - **One decision per window**, not per call: the window's mean latency is compared
//!   with `m` once the window has lasted [`AdaptiveLimitConfig::window`] (and at least
//!   two no-load latencies) and holds [`AdaptiveLimitConfig::min_window_samples`]
//!   samples. Single calls are too noisy to steer by.
//! - **No growth while idle.** The limit grows only if, during the window, it was
//!   reached (as many calls ran at once as it allowed): a quiet server does not talk
//!   itself into a limit it has never tested.
//! - **Measuring the no-load latency `m`.** It can only be seen when nothing queues
//!   inside. Taking the smallest latency ever seen drifts low on a lucky sample and
//!   never follows a lasting slowdown; taking recent samples drifts high when the limit
//!   is too high (every sample then includes the internal queue), which raises the limit
//!   further. So, as Envoy does, the limit *probes*: at the first call and then every
//!   [`AdaptiveLimitConfig::probe_interval`] (jittered by ±25 % so a fleet does not probe
//!   together) it drops to [`AdaptiveLimitConfig::min_limit`], waits until no more than
//!   that many calls run, takes the median latency of the next
//!   [`AdaptiveLimitConfig::min_window_samples`] calls as `m`, and returns to the limit it
//!   had. Between probes `m` follows a faster window down at once.
//! - **A higher floor is read from two windows, not probed.** Vegas cannot tell a higher
//!   latency floor (a slower dependency, a capacity drop that slows every call) from
//!   queueing: with the old `m` it cuts the limit below the capacity and holds it there.
//!   Probing at the floor to find out costs most of the capacity for the length of the
//!   probe, in exactly the overload the limit is for (in the storm it cost a tenth of the
//!   goodput during the slowdown and a second of recovery after it). But the cut itself
//!   tells: while calls queue inside, the latency is proportional to the calls let in
//!   (`rtt ≈ m·L/C`), so two saturated windows at limits 10 % or more apart show the
//!   same `rtt / L`. When the lower limit's `rtt / L` is 1.3 times the higher's or more,
//!   the latency did not fall with the limit: those calls did not queue, and what they
//!   took is the new floor. A floor that *fell* while every window stays saturated is
//!   only seen from above (every window includes the calls queued inside), so after a
//!   second of that a probe measures it.
//! - **After a cut, only calls that started under the new limit count**: the calls let
//!   in before it still queue inside, and would read as a need to cut again.
//! - **A window in which callers left is a lower bound.** A call abandoned mid-run took
//!   at least its time so far ([`AdaptiveLimit::abandoned_at`]). When a tenth of a
//!   window's calls were abandoned, the window never grows the limit and never shows a
//!   floor, and if calls still queue inside, it cuts the limit by `l`: under overload the
//!   calls that queue inside are those whose callers give up.
//!
//! Everything runs on the instants it is given (`*_at(now)`), so the simulator can drive
//! it on a virtual clock; [`crate::queue::AdmissionQueue`] feeds it when
//! [`AdmissionConfig::adaptive`](crate::admission::AdmissionConfig::adaptive) is set.
//!
//! ```
//! use std::time::Duration;
//! use stormguard_core::Instant;
//! use stormguard_core::limit::{AdaptiveLimit, AdaptiveLimitConfig};
//!
//! let config = AdaptiveLimitConfig { min_limit: 2, max_limit: 100, ..AdaptiveLimitConfig::default() };
//! let mut limit = AdaptiveLimit::new(config, 20, 7).expect("valid");
//! let t0 = Instant::now();
//! // The first sample starts a probe at the floor.
//! limit.sample_at(t0, t0, 0);
//! assert_eq!(limit.limit(), 2);
//! ```

use std::time::Duration;

use serde::Deserialize;

use crate::Instant;
use crate::error::ConfigError;

/// The adaptive limit's bounds and pace. [`AdaptiveLimitConfig::validate`] says what is
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
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field: &str, reason: String| {
            Err(ConfigError::invalid(
                format!("admission.adaptive.{field}"),
                reason,
            ))
        };
        if self.min_limit == 0 {
            return bad("min_limit", "must be at least 1".into());
        }
        if self.max_limit < self.min_limit {
            return bad(
                "max_limit",
                format!("{} is below min_limit ({})", self.max_limit, self.min_limit),
            );
        }
        if self.window.is_zero() || self.window > Duration::from_secs(3600) {
            return bad("window", format!("{:?} is outside (0, 1h]", self.window));
        }
        if self.min_window_samples == 0 {
            return bad("min_window_samples", "must be at least 1".into());
        }
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

#[derive(Debug)]
struct Probe {
    /// The limit to return to.
    saved: f64,
    /// From when samples count: calls that started once no more than the floor ran.
    clean_from: Option<Instant>,
    samples: Vec<Duration>,
}

/// The current limit and what it was learned from. See the [module docs](self).
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
    /// A limit starting at `initial` (clamped to the bounds) for a valid `config`;
    /// `seed` varies the probe jitter between servers.
    pub fn new(
        config: AdaptiveLimitConfig,
        initial: usize,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        let limit = initial.clamp(config.min_limit, config.max_limit) as f64;
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

    /// The configuration.
    pub fn config(&self) -> &AdaptiveLimitConfig {
        &self.config
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

    /// Whether a probe of the no-load latency is under way (the limit is at the floor).
    pub fn probing(&self) -> bool {
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
        if let Some(probe) = &mut self.probe {
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
            return self.limit();
        }
        if self.counted_from.is_some_and(|from| started < from) {
            return self.limit();
        }
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
        let Some(m) = self.min_latency else {
            return self.limit();
        };
        let span = self.config.window.max(m.saturating_mul(2));
        if window.count < self.config.min_window_samples
            || now.saturating_duration_since(window.started) < span
        {
            return self.limit();
        }
        let rtt = window.sum_secs / window.count as f64;
        let used = window.max_running as f64;
        let mean_running = window.sum_running as f64 / window.count as f64;
        let censored = window.abandoned as f64 >= CENSORED_SHARE * window.count as f64;
        self.window = None;
        let seen = Seen {
            limit: self.limit,
            rtt,
            saturated: mean_running >= 0.9 * self.limit.round(),
        };
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
        self.limit()
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
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const US: Duration = Duration::from_micros(1);

    /// A server of `capacity` slots with service time `service` and the limit in
    /// front: every window, `limit` calls run, each taking `service · max(1, L/C)`.
    /// Returns the limit after each window.
    fn drive(
        limit: &mut AdaptiveLimit,
        t0: &mut Instant,
        capacity: f64,
        service: impl Fn(Instant) -> Duration,
        windows: usize,
        offered: Option<usize>,
    ) -> Vec<usize> {
        let mut seen = Vec::new();
        for _ in 0..windows * 40 {
            let l = limit.limit();
            let running = offered.map_or(l, |o| o.min(l));
            let latency = service(*t0).mul_f64((running as f64 / capacity).max(1.0));
            // One call finishes every latency/running.
            *t0 += latency / u32::try_from(running.max(1)).unwrap();
            let before = limit.limit();
            let after = limit.sample_at(*t0, *t0 - latency, running - 1);
            if after != before {
                seen.push(after);
            }
        }
        seen
    }

    fn config() -> AdaptiveLimitConfig {
        AdaptiveLimitConfig {
            min_limit: 1,
            max_limit: 500,
            window: 50 * MS,
            min_window_samples: 8,
            probe_interval: Duration::from_secs(5),
            seed: 1,
        }
    }

    #[test]
    fn settles_a_few_calls_above_capacity_from_above_and_below() {
        for initial in [1, 16, 200] {
            let mut limit = AdaptiveLimit::new(config(), initial, 0).unwrap();
            let mut t = Instant::now();
            drive(&mut limit, &mut t, 16.0, |_| 10 * MS, 400, None);
            let l = limit.limit();
            assert!((17..=24).contains(&l), "from {initial}: settled at {l}");
            let m = limit.min_latency().unwrap();
            assert!(m >= 10 * MS && m < 11 * MS, "{m:?}");
        }
    }

    #[test]
    fn a_slower_floor_is_found_without_a_probe_and_the_limit_follows_it_both_ways() {
        // No scheduled probe during the run: only the first one, at the first call.
        let config = AdaptiveLimitConfig {
            probe_interval: Duration::from_secs(3600),
            ..config()
        };
        let mut limit = AdaptiveLimit::new(config, 16, 0).unwrap();
        let mut t0 = Instant::now();
        let start = t0;
        // Every call takes 2.5x longer from 2 s to 6 s: the same 16 slots, slower.
        let slow = (
            start + Duration::from_secs(2),
            start + Duration::from_secs(6),
        );
        let service = |t: Instant| {
            if t >= slow.0 && t < slow.1 {
                25 * MS
            } else {
                10 * MS
            }
        };
        drive(&mut limit, &mut t0, 16.0, service, 40, None);
        let before = limit.limit();
        assert!((17..=24).contains(&before), "{before}");
        let mut during = Vec::new();
        while t0 < slow.1 - Duration::from_millis(300) {
            during.extend(drive(&mut limit, &mut t0, 16.0, service, 1, None));
        }
        // Vegas first reads the slower calls as queueing and cuts the limit below the
        // capacity; the window after the cut shows that the latency did not fall with
        // it, which is the new floor, and the limit returns above the capacity without
        // a probe (which would have dropped it to the floor of 1).
        let m = limit.min_latency().unwrap();
        assert!(
            m >= 25 * MS && m < 27 * MS,
            "floor during the slowdown: {m:?}"
        );
        assert!(
            !during.contains(&1),
            "probed during the slowdown: {during:?}"
        );
        let now = limit.limit();
        assert!((17..=24).contains(&now), "during the slowdown: {now}");
        let back = t0;
        while t0 < back + Duration::from_millis(1500) {
            drive(&mut limit, &mut t0, 16.0, service, 1, None);
        }
        // Once calls are faster than the floor, it follows them down; every window
        // stays saturated, so a probe finds the floor itself a second later.
        let m = limit.min_latency().unwrap();
        assert!(m < 11 * MS, "floor after: {m:?}");
        assert!(
            (17..=24).contains(&limit.limit()),
            "after: {}",
            limit.limit()
        );
    }

    #[test]
    fn a_window_whose_callers_left_neither_grows_the_limit_nor_shows_a_floor() {
        let mut limit = AdaptiveLimit::new(config(), 30, 0).unwrap();
        let t0 = Instant::now();
        // A probe at the floor of 1 measures m = 10 ms.
        limit.sample_at(t0, t0, 0);
        for i in 0..8u32 {
            let start = t0 + i * 10 * MS;
            limit.sample_at(start + 10 * MS, start, 0);
        }
        assert_eq!((limit.limit(), limit.min_latency()), (30, Some(10 * MS)));
        // Windows of 30 calls running, each 10.2 ms so far, a third abandoned: hardly
        // anything seems queued, which would grow the limit, but the mean is only a
        // lower bound.
        let mut t = t0 + 100 * MS;
        for i in 0..60u32 {
            t += 2 * MS;
            if i % 3 == 0 {
                limit.abandoned_at(t, t - 10200 * US, 29);
            } else {
                limit.sample_at(t, t - 10200 * US, 29);
            }
        }
        assert_eq!(limit.limit(), 30);
        // The same windows with every call finished grow it.
        for _ in 0..30u32 {
            t += 2 * MS;
            limit.sample_at(t, t - 10200 * US, 29);
        }
        assert!(limit.limit() > 30, "{}", limit.limit());
    }

    #[test]
    fn an_idle_limit_does_not_grow() {
        let mut limit = AdaptiveLimit::new(config(), 10, 0).unwrap();
        let mut t = Instant::now();
        // Only 3 calls at a time are offered, far under capacity: no queueing inside,
        // but the limit of 10 is never used, so it stays.
        drive(&mut limit, &mut t, 16.0, |_| 10 * MS, 100, Some(3));
        assert_eq!(limit.limit(), 10);
    }

    #[test]
    fn a_probe_drops_to_the_floor_and_measures_only_clean_calls() {
        let mut limit = AdaptiveLimit::new(config(), 30, 0).unwrap();
        let t0 = Instant::now();
        // The first sample starts a probe; 20 calls still run, so nothing counts yet.
        assert_eq!(limit.sample_at(t0, t0 - 50 * MS, 20), 1);
        assert!(limit.probing());
        for i in 1..=8u32 {
            limit.sample_at(t0 + i * MS, t0 - 50 * MS, 20);
        }
        assert!(limit.probing() && limit.min_latency().is_none());
        // Once at most one runs, calls started from then on count.
        let clean = t0 + 10 * MS;
        limit.sample_at(clean, t0, 1);
        for i in 0..8u32 {
            let start = clean + i * 12 * MS;
            let latency = if i == 3 { 40 * MS } else { 12 * MS };
            assert!(limit.probing());
            limit.sample_at(start + latency, start, 0);
        }
        assert!(!limit.probing());
        assert_eq!(limit.min_latency(), Some(12 * MS));
        assert_eq!(limit.limit(), 30);
    }

    #[test]
    fn bounds_hold_and_config_is_checked() {
        let c = AdaptiveLimitConfig {
            min_limit: 4,
            max_limit: 6,
            ..config()
        };
        let mut limit = AdaptiveLimit::new(c.clone(), 100, 0).unwrap();
        assert_eq!(limit.limit(), 6);
        let mut t = Instant::now();
        for l in drive(&mut limit, &mut t, 2.0, |_| 10 * MS, 50, None) {
            assert!((4..=6).contains(&l));
        }
        for (bad, field) in [
            (
                AdaptiveLimitConfig {
                    min_limit: 0,
                    ..c.clone()
                },
                "min_limit",
            ),
            (
                AdaptiveLimitConfig {
                    max_limit: 3,
                    ..c.clone()
                },
                "max_limit",
            ),
            (
                AdaptiveLimitConfig {
                    window: Duration::ZERO,
                    ..c.clone()
                },
                "window",
            ),
            (
                AdaptiveLimitConfig {
                    min_window_samples: 0,
                    ..c.clone()
                },
                "min_window_samples",
            ),
            (
                AdaptiveLimitConfig {
                    probe_interval: Duration::ZERO,
                    ..c.clone()
                },
                "probe_interval",
            ),
        ] {
            let err = bad.validate().unwrap_err().to_string();
            assert!(
                err.contains(&format!("admission.adaptive.{field}")),
                "{err}"
            );
        }
    }
}
