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
//! and steers `queued` into a small band `[α, β]`, with `l = max(1, log10 L)`, `α = 2l`,
//! `β = 4l`: above `β` the limit drops to the capacity the window measured (`L·m/rtt`)
//! plus the middle of the band (at least by `l`); below `α` it grows by `l`, and by `β`
//! at once when nothing is queued at all. Dropping at once matters: a limit far too high
//! (a deploy made calls slower, or the start value was a guess) makes every call wait
//! inside the handler until callers time out, and stepping down by `l` per window would
//! take seconds. So the limit settles a few calls above `C`: every
//! unit of real capacity stays busy, and the calls beyond it wait in the admission queue,
//! where they can be ordered, expired and shed (retries first), instead of inside the
//! handler. (Netflix's `VegasLimit` uses `3l` and `6l`; with C = 16 that settled at 21–22
//! and its internal wait cost ~8 % of goodput against `workers = C` under 2× overload
//! with 50 ms per attempt, where `2l`/`4l` settled at 19 and matched it:
//! `examples/adaptive.rs`.)
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
//! - **No growth while idle.** The limit grows only if, during the window, at least
//!   half of it was in use: a quiet server does not talk itself into a limit it has
//!   never tested.
//! - **Measuring the no-load latency `m`.** It can only be seen when nothing queues
//!   inside. Taking the smallest latency ever seen drifts low on a lucky sample and
//!   never follows a lasting slowdown; taking recent samples drifts high when the limit
//!   is too high (every sample then includes the internal queue), which raises the limit
//!   further. So, as Envoy does, the limit *probes*: at the first call and then every
//!   [`AdaptiveLimitConfig::probe_interval`] (jittered by ±25 % so a fleet does not probe
//!   together) it drops to [`AdaptiveLimitConfig::min_limit`], waits until no more than
//!   that many calls run, takes the median latency of the next
//!   [`AdaptiveLimitConfig::min_window_samples`] calls as `m`, and returns to the limit it
//!   had. Between probes `m` may only fall (to a lower window mean). A limit cut below
//!   half of where the last probe left it, or a window clearly faster than `m`, probes
//!   again at once (at most once a second): Vegas cannot tell a higher latency floor (a
//!   slower dependency, a capacity drop that slows every call) from queueing, and without
//!   a new `m` it would hold the limit far below the real capacity, or (once the floor
//!   falls back) let it drift above it, until the next scheduled probe.
//! - Calls whose caller left mid-run are samples too (their time so far is a lower
//!   bound on their latency): under overload, those are the slow ones.
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
    /// The limit when the last probe ended, and when that was.
    after_probe: Option<(f64, Instant)>,
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
            after_probe: None,
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

    /// One call that started at `started` left its worker at `now` (finished, or its
    /// caller left mid-run); `running` calls still run. Returns the limit from now on.
    pub fn sample_at(&mut self, now: Instant, started: Instant, running: usize) -> usize {
        let latency = now.saturating_duration_since(started);
        if self.probe.is_none() && self.next_probe.is_none_or(|at| now >= at) {
            self.probe = Some(Probe {
                saved: self.limit,
                clean_from: None,
                samples: Vec::with_capacity(self.config.min_window_samples),
            });
            self.limit = self.config.min_limit as f64;
            self.window = None;
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
                self.after_probe = Some((probe.saved, now));
                self.probe = None;
                let jitter = 0.75 + 0.5 * self.rng.f64();
                self.next_probe = now.checked_add(self.config.probe_interval.mul_f64(jitter));
            }
            return self.limit();
        }
        let window = self.window.get_or_insert(Window {
            started: now,
            count: 0,
            sum_secs: 0.0,
            max_running: 0,
        });
        window.count += 1;
        window.sum_secs += latency.as_secs_f64();
        // `running` is after this call left: it ran alongside them.
        window.max_running = window.max_running.max(running + 1);
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
        self.window = None;
        // A whole window faster than the floor: the floor fell (the slowdown is over).
        let floor_fell = rtt < 0.8 * m.as_secs_f64();
        let m = m.as_secs_f64().min(rtt);
        if rtt > 0.0 {
            self.min_latency = Duration::try_from_secs_f64(m).ok().or(self.min_latency);
        }
        self.limit = self.next_limit(m, rtt, used);
        // The floor fell, or the limit was cut below half of where the last probe left
        // it: either the handler's capacity fell or its latency floor rose (a slower
        // dependency), which Vegas cannot tell from queueing. A probe tells which; at
        // most one a second.
        if let Some((reference, at)) = self.after_probe
            && (floor_fell || self.limit < reference / 2.0)
            && now.saturating_duration_since(at) >= Duration::from_secs(1)
        {
            self.next_probe = Some(now);
            self.after_probe = Some((self.limit, now));
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
        let (alpha, beta) = (2.0 * l, 4.0 * l);
        // Growing a limit that was not used tests nothing.
        let busy = used * 2.0 >= limit;
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

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
    fn a_slower_floor_is_probed_again_and_the_limit_follows_it_both_ways() {
        let mut limit = AdaptiveLimit::new(config(), 16, 0).unwrap();
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
        while t0 < slow.1 - Duration::from_millis(300) {
            drive(&mut limit, &mut t0, 16.0, service, 1, None);
        }
        // Vegas first reads the slower calls as queueing and cuts the limit; the cut
        // starts a probe, which finds the new floor, and the limit returns above the
        // capacity instead of staying far below it until the next scheduled probe.
        let m = limit.min_latency().unwrap();
        assert!(
            m >= 25 * MS && m < 27 * MS,
            "floor during the slowdown: {m:?}"
        );
        let during = limit.limit();
        assert!((17..=24).contains(&during), "during the slowdown: {during}");
        let back = t0;
        while t0 < back + Duration::from_millis(1500) {
            drive(&mut limit, &mut t0, 16.0, service, 1, None);
        }
        // Once calls are faster than the floor again, it is probed again too.
        let m = limit.min_latency().unwrap();
        assert!(m < 11 * MS, "floor after: {m:?}");
        assert!(
            (17..=24).contains(&limit.limit()),
            "after: {}",
            limit.limit()
        );
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
