//! From what a run measured to the figures of the table and the JSON.

use std::fmt::Write as _;

use serde::Serialize;

use crate::run::{PhaseData, RunData};

/// The whole result, as `--json` writes it. `policies` is the contract other tools read
/// (docs/examples.md); the other fields are added.
#[derive(Debug, Serialize)]
pub(crate) struct TailReport {
    pub(crate) policies: Vec<PolicyReport>,
    /// The measured capacity, calls per second (slow attempts included).
    pub(crate) capacity: f64,
    /// Logical calls offered per second at the normal load, and during the overload.
    pub(crate) rate: f64,
    pub(crate) overload_rate: f64,
    pub(crate) workers: usize,
    pub(crate) service_time_ms: f64,
    /// The share of the attempts reaching the handler that are slow, and how much slower.
    pub(crate) slow_share: f64,
    pub(crate) slowdown: u32,
    /// `hedging`'s fixed delay.
    pub(crate) hedge_delay_ms: f64,
    pub(crate) deadline_ms: u64,
    pub(crate) warmup_s: f64,
    pub(crate) normal_s: f64,
    pub(crate) overload_s: f64,
    pub(crate) seed: u64,
}

/// One policy. The first six fields are the contract.
#[derive(Debug, Serialize)]
pub(crate) struct PolicyReport {
    pub(crate) name: &'static str,
    /// Latency percentiles of the calls that succeeded at the normal load, in ms.
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) p999_ms: f64,
    /// Attempts the server received per logical call, minus one, at the normal load.
    pub(crate) extra_attempts_per_call: f64,
    pub(crate) overload: OverloadReport,
    /// Logical calls at the normal load, and the share that succeeded within the deadline.
    pub(crate) calls: u64,
    pub(crate) success: f64,
    /// Attempts the server received at the normal load, and of those the slow ones.
    pub(crate) attempts: u64,
    pub(crate) slow_attempts: u64,
    /// The worst call that succeeded at the normal load, in ms.
    pub(crate) max_ms: f64,
    /// stormguard's layer, over the whole run (warm-up and overload included): hedges
    /// sent, hedges that answered their call, and hedges due but refused by the budget.
    pub(crate) hedges: Option<u64>,
    pub(crate) hedges_won: Option<u64>,
    pub(crate) hedges_refused_budget: Option<u64>,
}

#[derive(Debug, Serialize)]
pub(crate) struct OverloadReport {
    /// Attempts the server received per logical call, minus one.
    pub(crate) extra_attempts_per_call: f64,
    /// Calls that succeeded within their deadline per second, as a share of the measured
    /// capacity.
    pub(crate) goodput: f64,
    /// The same in calls per second.
    pub(crate) goodput_per_s: f64,
    pub(crate) calls: u64,
    pub(crate) success: f64,
    pub(crate) attempts: u64,
    /// Latency percentiles of the calls that succeeded, in ms.
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
}

fn round(x: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (x * scale).round() / scale
}

fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// The `q` quantile (nearest rank) of sorted latencies in µs, in ms.
fn quantile_ms(sorted_us: &[u64], q: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let rank = ((sorted_us.len() as f64) * q).ceil() as usize;
    round(
        sorted_us[rank.clamp(1, sorted_us.len()) - 1] as f64 / 1000.0,
        2,
    )
}

fn extra(phase: &PhaseData) -> f64 {
    if phase.calls == 0 {
        return 0.0;
    }
    round(phase.received as f64 / phase.calls as f64 - 1.0, 4)
}

/// The figures of one policy's run; `capacity` in calls per second.
pub(crate) fn summarize(
    name: &'static str,
    data: &RunData,
    capacity: f64,
    overload_s: f64,
) -> PolicyReport {
    let mut normal = data.normal.ok_us.clone();
    normal.sort_unstable();
    let mut overload = data.overload.ok_us.clone();
    overload.sort_unstable();
    let goodput_per_s = overload.len() as f64 / overload_s;
    PolicyReport {
        name,
        p50_ms: quantile_ms(&normal, 0.50),
        p99_ms: quantile_ms(&normal, 0.99),
        p999_ms: quantile_ms(&normal, 0.999),
        extra_attempts_per_call: extra(&data.normal),
        overload: OverloadReport {
            extra_attempts_per_call: extra(&data.overload),
            goodput: round(goodput_per_s / capacity, 4),
            goodput_per_s: round(goodput_per_s, 1),
            calls: data.overload.calls,
            success: round(share(overload.len() as u64, data.overload.calls), 4),
            attempts: data.overload.received,
            p50_ms: quantile_ms(&overload, 0.50),
            p99_ms: quantile_ms(&overload, 0.99),
        },
        calls: data.normal.calls,
        success: round(share(normal.len() as u64, data.normal.calls), 4),
        attempts: data.normal.received,
        slow_attempts: data.normal.slow,
        max_ms: quantile_ms(&normal, 1.0),
        hedges: data.hedges,
        hedges_won: data.hedges_won,
        hedges_refused_budget: data.hedges_refused_budget,
    }
}

/// The table printed on stdout (markdown, as docs/examples.md shows it).
pub(crate) fn table(report: &TailReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| policy | p50 | p99 | p99.9 | max | extra attempts | success | overload: extra attempts | goodput | success |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for p in &report.policies {
        let _ = writeln!(
            out,
            "| {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.2} % | {:.2} % | {:.2} % | {:.2} ({:.0}/s) | {:.1} % |",
            p.name,
            p.p50_ms,
            p.p99_ms,
            p.p999_ms,
            p.max_ms,
            100.0 * p.extra_attempts_per_call,
            100.0 * p.success,
            100.0 * p.overload.extra_attempts_per_call,
            p.overload.goodput,
            p.overload.goodput_per_s,
            100.0 * p.overload.success,
        );
    }
    out
}
