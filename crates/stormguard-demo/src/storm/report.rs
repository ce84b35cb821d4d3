//! Per-second counters of one run, and what the storm's report says about them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::Policy;

/// Counters of one run, one slot per second since `start`. Events after the last second
/// count in the last one (in-flight retries of its calls).
#[derive(Debug)]
pub(crate) struct Timeline {
    start: Instant,
    seconds: Vec<[AtomicU64; 4]>,
    connection_errors: AtomicU64,
}

const OFFERED: usize = 0;
const GOODPUT: usize = 1;
const ATTEMPTS: usize = 2;
const SHED: usize = 3;

impl Timeline {
    pub(crate) fn new(start: Instant, seconds: usize) -> Self {
        Timeline {
            start,
            seconds: (0..seconds.max(1)).map(|_| Default::default()).collect(),
            connection_errors: AtomicU64::new(0),
        }
    }

    /// The slot of `at`.
    pub(crate) fn second(&self, at: Instant) -> usize {
        let s = at.saturating_duration_since(self.start).as_secs();
        usize::try_from(s).map_or(self.seconds.len() - 1, |s| s.min(self.seconds.len() - 1))
    }

    fn add(&self, second: usize, what: usize) {
        if let Some(slot) = self.seconds.get(second) {
            slot[what].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A logical call arrived in `second`.
    pub(crate) fn offered(&self, second: usize) {
        self.add(second, OFFERED);
    }

    /// A logical call that arrived in `second` succeeded within its deadline.
    pub(crate) fn goodput(&self, second: usize) {
        self.add(second, GOODPUT);
    }

    /// A physical attempt was sent at `at`.
    pub(crate) fn attempt(&self, at: Instant) {
        self.add(self.second(at), ATTEMPTS);
    }

    /// A shed answer arrived at `at`.
    pub(crate) fn shed(&self, at: Instant) {
        self.add(self.second(at), SHED);
    }

    /// The connection failed under an attempt.
    pub(crate) fn connection_error(&self) {
        self.connection_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn connection_errors(&self) -> u64 {
        self.connection_errors.load(Ordering::Relaxed)
    }

    pub(crate) fn attempts(&self) -> u64 {
        self.seconds
            .iter()
            .map(|s| s[ATTEMPTS].load(Ordering::Relaxed))
            .sum()
    }

    /// The counters now, one [`Second`] per slot.
    pub(crate) fn snapshot(&self) -> Vec<Second> {
        self.seconds
            .iter()
            .enumerate()
            .map(|(t, s)| {
                let load = |i: usize| s[i].load(Ordering::Relaxed);
                Second {
                    t: u32::try_from(t).unwrap_or(u32::MAX),
                    offered: load(OFFERED),
                    goodput: load(GOODPUT),
                    attempts: load(ATTEMPTS),
                    shed: load(SHED),
                }
            })
            .collect()
    }
}

/// One second of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Second {
    /// Seconds since the run started.
    pub t: u32,
    /// Logical calls that arrived in this second.
    pub offered: u64,
    /// Of those, the calls that succeeded within their deadline.
    pub goodput: u64,
    /// Physical attempts sent in this second.
    pub attempts: u64,
    /// Answers shed by the server (they carry `grpc-retry-pushback-ms`) received in this
    /// second.
    pub shed: u64,
}

/// What one policy's run measured.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyRun {
    /// The policy.
    pub policy: Policy,
    /// One entry per second.
    pub timeline: Vec<Second>,
    /// Retries (for `hedging`, hedges) the client's budget (or A6 throttle) refused; `None`
    /// for clients without one.
    pub budget_refusals: Option<u64>,
    /// Attempts that failed because the connection failed (an h2 `GOAWAY`, a reset
    /// connection). Zero when the h2 settings hold.
    pub connection_errors: u64,
    /// CPU the server spent on shed answers
    /// ([`LoopbackStorm::reject_cost`](super::LoopbackStorm::reject_cost)); zero without a cost.
    pub reject_cpu: Duration,
    /// Calls the client's adaptive throttle refused locally; `None` for clients without
    /// stormguard's layer.
    pub throttled: Option<u64>,
    /// Retries the client refused because the server's load reports said it was
    /// saturated; `None` for the policies that do not read them.
    pub saturated_refusals: Option<u64>,
    /// What the client's hedging did; `None` for the policies that do not hedge.
    pub hedges: Option<Hedges>,
}

/// The hedges of one run, from the client layer's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Hedges {
    /// Copies sent after a call's first (counted in the attempts too).
    pub sent: u64,
    /// Calls answered by a hedge rather than by their first copy.
    pub won: u64,
    /// Hedges that were due and not sent, by cause (`budget`, `pushback`, `deadline`, ...),
    /// the causes that refused none left out.
    pub refused: BTreeMap<&'static str, u64>,
}

impl std::fmt::Display for Hedges {
    /// `1234 hedges sent, 567 won; refused: budget 89, pushback 12`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} hedges sent, {} won; refused:", self.sent, self.won)?;
        if self.refused.is_empty() {
            return write!(f, " none");
        }
        for (i, (cause, n)) in self.refused.iter().enumerate() {
            write!(f, "{} {cause} {n}", if i == 0 { "" } else { "," })?;
        }
        Ok(())
    }
}

/// The trigger of a run: when the service slowed down, and how much goodput it allowed.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TriggerReport {
    /// The second the service time rose.
    pub start_s: u32,
    /// The second it came back.
    pub end_s: u32,
    /// The reduced capacity (measured completions per second) over the offered rate: the
    /// most goodput the trigger allows.
    pub capacity_share: f64,
}

/// The summary of one policy's run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PolicySummary {
    /// The policy's name (`naive`, `jitter`, `grpc-throttle`, `client-only`,
    /// `server-only`, `stormguard`, `hedging`).
    pub name: &'static str,
    /// Seconds after the trigger's end until goodput stayed at or above 95 % of offered
    /// for 3 s; `None` when that never happened within the run.
    pub recovery_s: Option<u32>,
    /// Attempts per logical call during the trigger.
    pub amplification_during_trigger: f64,
    /// Attempts per logical call after the trigger.
    pub amplification_after_trigger: f64,
    /// Goodput as a share of offered calls before the trigger.
    pub goodput_before: f64,
    /// The same during the trigger.
    pub goodput_during: f64,
    /// The same after the trigger.
    pub goodput_after: f64,
    /// Successes per second over the whole run, as a share of the capacity measured before
    /// it: what the server's work was worth (1.0: every unit of capacity went into a call
    /// that succeeded in time).
    pub goodput_share_of_capacity: f64,
    /// CPU the server spent on shed answers over the run, in milliseconds
    /// ([`LoopbackStorm::reject_cost`](super::LoopbackStorm::reject_cost); 0 without a cost).
    pub reject_cpu_ms: f64,
    /// Calls the client's adaptive throttle refused locally (`None`: no stormguard layer).
    #[serde(skip)]
    pub throttled: Option<u64>,
    /// Retries refused because the server's load reports (ORCA) said it was saturated,
    /// for the policy that reads them (in the JSON only for it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub saturated_refusals: Option<u64>,
    /// The run, second by second.
    pub timeline: Vec<Second>,
    /// Shed answers over the whole run.
    #[serde(skip)]
    pub shed: u64,
    /// Retries (for `hedging`, hedges) refused by the budget over the whole run (`None`: no
    /// budget).
    #[serde(skip)]
    pub budget_refusals: Option<u64>,
    /// Attempts lost to connection failures.
    #[serde(skip)]
    pub connection_errors: u64,
    /// The hedges of the run, for the policy that hedges (in the JSON only for it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hedges: Option<Hedges>,
}

/// The whole storm: the trigger and every policy's summary. Serializes to the JSON the
/// `storm` example writes with `--json`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StormReport {
    /// The trigger.
    pub trigger: TriggerReport,
    /// One summary per policy, in the order run.
    pub policies: Vec<PolicySummary>,
    /// Measured completions per second at the normal service time.
    #[serde(skip)]
    pub capacity: f64,
    /// Measured completions per second during the trigger.
    #[serde(skip)]
    pub reduced_capacity: f64,
    /// Logical calls offered per second.
    #[serde(skip)]
    pub offered_rate: f64,
    /// The sustained overload, as a multiple of the capacity, when the run was one
    /// ([`LoopbackStorm::overload`](super::LoopbackStorm::overload)): the table then shows
    /// goodput as a share of capacity and the CPU spent rejecting.
    #[serde(skip)]
    pub overload: Option<f64>,
}

/// Goodput must stay at or above this share of offered calls...
pub const RECOVERED_SHARE: f64 = 0.95;
/// ...for this many consecutive seconds for a run to count as recovered.
pub const RECOVERED_FOR_S: usize = 3;

/// The first second at or after `end_s` from which goodput stays at or above
/// [`RECOVERED_SHARE`] of offered for [`RECOVERED_FOR_S`] seconds, counted from `end_s`;
/// `None` when no such stretch fits in the timeline.
pub fn recovery_s(timeline: &[Second], end_s: u32) -> Option<u32> {
    let end = usize::try_from(end_s).ok()?;
    let good = |s: &Second| s.offered > 0 && s.goodput as f64 >= RECOVERED_SHARE * s.offered as f64;
    (end..timeline.len())
        .find(|&k| {
            timeline
                .get(k..k + RECOVERED_FOR_S)
                .is_some_and(|w| w.iter().all(good))
        })
        .and_then(|k| u32::try_from(k - end).ok())
}

fn window(timeline: &[Second], from: usize, to: usize) -> (u64, u64, u64) {
    let w = timeline
        .get(from.min(timeline.len())..to.min(timeline.len()))
        .unwrap_or(&[]);
    w.iter().fold((0, 0, 0), |(o, g, a), s| {
        (o + s.offered, g + s.goodput, a + s.attempts)
    })
}

fn ratio(n: u64, d: u64) -> f64 {
    if d == 0 { 0.0 } else { n as f64 / d as f64 }
}

/// Summarises one run whose trigger lasted from `start_s` to `end_s`.
pub fn summarize(run: &PolicyRun, start_s: u32, end_s: u32) -> PolicySummary {
    let (start, end) = (start_s as usize, end_s as usize);
    let t = &run.timeline;
    let (o_before, g_before, _) = window(t, 0, start);
    let (o_during, g_during, a_during) = window(t, start, end);
    let (o_after, g_after, a_after) = window(t, end, t.len());
    PolicySummary {
        name: run.policy.as_str(),
        recovery_s: recovery_s(t, end_s),
        amplification_during_trigger: ratio(a_during, o_during),
        amplification_after_trigger: ratio(a_after, o_after),
        goodput_before: ratio(g_before, o_before),
        goodput_during: ratio(g_during, o_during),
        goodput_after: ratio(g_after, o_after),
        // Filled in by `storm_report`, which knows the capacity.
        goodput_share_of_capacity: 0.0,
        reject_cpu_ms: run.reject_cpu.as_secs_f64() * 1000.0,
        throttled: run.throttled,
        saturated_refusals: run.saturated_refusals,
        timeline: run.timeline.clone(),
        shed: t.iter().map(|s| s.shed).sum(),
        budget_refusals: run.budget_refusals,
        connection_errors: run.connection_errors,
        hedges: run.hedges.clone(),
    }
}

/// The report of a whole storm.
pub fn storm_report(
    runs: &[PolicyRun],
    start_s: u32,
    end_s: u32,
    capacity: f64,
    reduced_capacity: f64,
    offered_rate: f64,
) -> StormReport {
    StormReport {
        trigger: TriggerReport {
            start_s,
            end_s,
            capacity_share: if offered_rate > 0.0 {
                reduced_capacity / offered_rate
            } else {
                0.0
            },
        },
        policies: runs
            .iter()
            .map(|r| {
                let goodput: u64 = r.timeline.iter().map(|s| s.goodput).sum();
                let per_second = ratio(goodput, r.timeline.len() as u64);
                PolicySummary {
                    goodput_share_of_capacity: if capacity > 0.0 {
                        per_second / capacity
                    } else {
                        0.0
                    },
                    ..summarize(r, start_s, end_s)
                }
            })
            .collect(),
        capacity,
        reduced_capacity,
        offered_rate,
        overload: None,
    }
}

fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

impl StormReport {
    /// The report as a text table, one row per policy.
    pub fn table(&self) -> String {
        if self.overload.is_some() {
            return self.overload_table();
        }
        let mut out = String::new();
        let _ = writeln!(
            out,
            "| policy | goodput before | during | after | attempts/call during | after | recovery | shed | budget refusals |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---|---:|---:|");
        for p in &self.policies {
            let recovery = p
                .recovery_s
                .map_or_else(|| "never".to_owned(), |s| format!("{s} s"));
            let refusals = p
                .budget_refusals
                .map_or_else(|| "–".to_owned(), |n| n.to_string());
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {:.2} | {:.2} | {} | {} | {} |",
                p.name,
                pct(p.goodput_before),
                pct(p.goodput_during),
                pct(p.goodput_after),
                p.amplification_during_trigger,
                p.amplification_after_trigger,
                recovery,
                p.shed,
                refusals,
            );
        }
        for p in &self.policies {
            if let Some(n) = p.saturated_refusals {
                let _ = writeln!(
                    out,
                    "\n{}: {n} retries refused because the server's load reports said it was saturated",
                    p.name
                );
            }
        }
        out
    }

    /// The table of a sustained overload: goodput as a share of offered and of capacity,
    /// attempts per call, shed answers, CPU spent on them, local refusals.
    fn overload_table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "| policy | goodput / offered | goodput / capacity | attempts/call | shed | reject CPU | throttled locally |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|");
        for p in &self.policies {
            let throttled = p
                .throttled
                .map_or_else(|| "–".to_owned(), |n| n.to_string());
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.2} | {} | {:.0} ms | {} |",
                p.name,
                pct(p.goodput_during),
                pct(p.goodput_share_of_capacity),
                p.amplification_during_trigger,
                p.shed,
                p.reject_cpu_ms,
                throttled,
            );
        }
        out
    }

    /// One line on the capacity and the offered load.
    pub fn headline(
        &self,
        trigger_slowdown: f64,
        per_attempt: Duration,
        deadline: Duration,
    ) -> String {
        if let Some(overload) = self.overload {
            return format!(
                "capacity {:.0} calls/s measured, offered {:.0}/s ({overload}x capacity) for the \
                 whole run, no trigger; deadline {deadline:?}, {per_attempt:?} per attempt",
                self.capacity, self.offered_rate,
            );
        }
        format!(
            "capacity {:.0} calls/s measured ({:.0}/s during the trigger), offered {:.0}/s ({:.0} %); \
             service time x{trigger_slowdown} from {} s to {} s: at most {:.1} % of offered can succeed then; \
             deadline {deadline:?}, {per_attempt:?} per attempt",
            self.capacity,
            self.reduced_capacity,
            self.offered_rate,
            100.0 * self.offered_rate / self.capacity.max(1.0),
            self.trigger.start_s,
            self.trigger.end_s,
            100.0 * self.trigger.capacity_share.min(1.0),
        )
    }
}

#[cfg(test)]
mod tests;
