//! From what a run measured to the figures of the table and the JSON.
//!
//! Server side, every replica reports each attempt it received (call id, attempt number,
//! arrival, latency, status); client side, [`Observe`](crate::run::Observe) counts every
//! attempt sent and the ones that failed with their connection. A connection failure
//! reached no server: it is put down to the replica whose process was down at that moment
//! (the only one that refuses connections), or to none when no replica was down.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::run::{BAD, BUCKET, Call, Down, RunData, Scenario, Timing};

/// The whole result, as `--json` writes it.
#[derive(Debug, Serialize)]
pub(crate) struct FleetReport {
    pub(crate) replicas: usize,
    pub(crate) scenarios: Vec<ScenarioReport>,
    /// Logical calls offered per second.
    pub(crate) rate: f64,
    /// The fleet's capacity the rate is a share of (calls per second).
    pub(crate) capacity: f64,
    pub(crate) deadline_ms: u64,
    pub(crate) per_attempt_ms: u64,
    /// The width of a timeline bucket.
    pub(crate) bucket_s: f64,
    pub(crate) seed: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct ScenarioReport {
    pub(crate) name: &'static str,
    pub(crate) policies: Vec<PolicyReport>,
    /// When the fault began.
    pub(crate) fault_s: f64,
    /// The replica the fault hits (`rolling`: each in turn, so none).
    pub(crate) bad_replica: Option<usize>,
}

/// One policy in one scenario. The first fields are the JSON contract other tools read
/// (docs/examples.md); the rest are added.
#[derive(Debug, Serialize)]
pub(crate) struct PolicyReport {
    pub(crate) name: &'static str,
    /// Share of the calls arriving from the fault on that succeeded within the deadline.
    pub(crate) success: f64,
    /// Attempts sent from the fault on, per call arriving from then.
    pub(crate) attempts_per_call: f64,
    /// Of the retries (every attempt after a call's first, transparent ones included) of
    /// calls arriving from the fault on whose
    /// replica is known, the share that reached a replica an earlier attempt of the same
    /// call had reached.
    pub(crate) retries_to_tried_replica_share: f64,
    /// Share of the attempts reaching replicas (or refused by a dead one) that reached
    /// the bad replica, from 2 s after the fault to the end.
    pub(crate) bad_replica_share_after_2s: f64,
    /// Calls of the whole run that failed.
    pub(crate) failed_calls: u64,
    /// Calls arriving from 1 s after the fault on that failed.
    pub(crate) failed_calls_after_1s: u64,
    /// 99th percentile latency of the calls arriving from the fault on, failures included.
    pub(crate) p99_ms: f64,
    /// Seconds from the fault until the client's channel ejected the bad replica.
    pub(crate) ejected_after_s: Option<f64>,
    pub(crate) timeline: Vec<Bucket>,
    /// Logical calls of the whole run.
    pub(crate) calls: u64,
    pub(crate) success_before_fault: f64,
    pub(crate) attempts_per_call_before_fault: f64,
    /// Each replica's share of the attempts that reached a replica before the fault.
    pub(crate) replica_shares_before_fault: Vec<f64>,
    /// Attempts per second reaching the bad replica, from 2 s after the fault on.
    pub(crate) bad_replica_attempts_per_s_after_2s: f64,
    /// Seconds from a replica's return until it answers its fair share of OK calls (80 %
    /// of 1/N over 300 ms); `rolling`: the slowest replica; `null` when no replica
    /// returns, or one never gets there.
    pub(crate) returned_share_after_s: Option<f64>,
    /// `restart`: the p99 of the OK answers of the returning replica from its return on,
    /// and of the other replicas over the same time (server side).
    pub(crate) returning_p99_ms: Option<f64>,
    pub(crate) others_p99_ms: Option<f64>,
    /// Calls arriving from the fault on that failed although every attempt of theirs with
    /// a known replica reached a healthy one.
    pub(crate) failed_calls_only_healthy: u64,
    /// The retries `retries_to_tried_replica_share` counts, and of those the transparent
    /// ones (which repeat the attempt number of the attempt they replace).
    pub(crate) retries: u64,
    pub(crate) transparent_retries: u64,
    /// Attempts that failed with their connection.
    pub(crate) connection_failures: u64,
    /// `layer`, `stormguard`: retries the budget refused.
    pub(crate) budget_refusals: Option<u64>,
    /// `stormguard`: ejections of any replica over the run.
    pub(crate) ejections: Option<u64>,
}

/// One timeline bucket ([`BUCKET`] wide).
#[derive(Debug, Serialize)]
pub(crate) struct Bucket {
    /// The bucket's start, seconds.
    pub(crate) t: f64,
    /// Calls arriving.
    pub(crate) offered: u64,
    /// Of those, calls that succeeded.
    pub(crate) ok: u64,
    /// Attempts the client sent.
    pub(crate) attempts: u64,
    /// Attempts reaching the bad replica, or refused by it while it was down.
    pub(crate) bad_replica_attempts: u64,
    /// Attempts each replica received.
    pub(crate) replica_attempts: Vec<u64>,
    pub(crate) connection_failures: u64,
}

fn bucket_of(d: Duration) -> usize {
    (d.as_micros() / BUCKET.as_micros()) as usize
}

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

fn round(x: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (x * scale).round() / scale
}

/// The 99th percentile of `values` (µs), in ms.
fn p99_ms(mut values: Vec<u64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_unstable();
    let rank = ((values.len() as f64) * 0.99).ceil() as usize;
    round(values[rank.clamp(1, values.len()) - 1] as f64 / 1000.0, 1)
}

/// Which replica was down at `at_us`, if any.
fn down_at(downs: &[Down], at_us: u64) -> Option<usize> {
    downs
        .iter()
        .find(|d| us(d.from) <= at_us && d.to.is_none_or(|to| at_us < us(to)))
        .map(|d| d.replica)
}

/// One attempt whose replica is known.
#[derive(Clone, Copy)]
struct Placed {
    replica: Option<usize>,
    attempt: u32,
    at_us: u64,
}

/// The bad replica at `at_us`: the one being restarted (`rolling`), else the fault's.
fn bad_at(scenario: Scenario, data: &RunData, at_us: u64) -> Option<usize> {
    match scenario {
        Scenario::Rolling => down_at(&data.downs, at_us),
        _ => Some(BAD),
    }
}

/// Every attempt of the run with its replica, by call (received by one, or refused while
/// one was down), and the timeline of `n` buckets.
fn place_attempts(
    scenario: Scenario,
    n: usize,
    replicas: usize,
    data: &RunData,
) -> (HashMap<u64, Vec<Placed>>, Vec<Bucket>) {
    let mut by_call: HashMap<u64, Vec<Placed>> = HashMap::new();
    let mut timeline: Vec<Bucket> = (0..n)
        .map(|b| Bucket {
            t: round((b as f64) * BUCKET.as_secs_f64(), 1),
            offered: 0,
            ok: 0,
            attempts: data.attempts.get(b).copied().unwrap_or(0),
            bad_replica_attempts: 0,
            replica_attempts: vec![0; replicas],
            connection_failures: 0,
        })
        .collect();
    for r in &data.received {
        by_call.entry(r.call).or_default().push(Placed {
            replica: Some(r.replica),
            attempt: r.attempt,
            at_us: r.at_us,
        });
        if let Some(bucket) = timeline.get_mut((r.at_us / us(BUCKET)) as usize) {
            bucket.replica_attempts[r.replica] += 1;
            if bad_at(scenario, data, r.at_us) == Some(r.replica) {
                bucket.bad_replica_attempts += 1;
            }
        }
    }
    for f in &data.refused {
        let at_us = us(f.at);
        let replica = down_at(&data.downs, at_us);
        by_call.entry(f.call).or_default().push(Placed {
            replica,
            attempt: f.attempt,
            at_us,
        });
        if let Some(bucket) = timeline.get_mut(bucket_of(f.at)) {
            bucket.connection_failures += 1;
            if replica.is_some() && replica == bad_at(scenario, data, at_us) {
                bucket.bad_replica_attempts += 1;
            }
        }
    }
    for c in &data.calls {
        if let Some(bucket) = timeline.get_mut(bucket_of(c.at)) {
            bucket.offered += 1;
            bucket.ok += u64::from(c.ok);
        }
    }
    (by_call, timeline)
}

/// Retries after the fault: all, transparent, to a replica the call had tried; and the
/// failed calls that met only healthy replicas.
#[derive(Default)]
struct Retries {
    all: u64,
    transparent: u64,
    to_tried: u64,
    failed_only_healthy: u64,
}

impl Retries {
    fn of(
        scenario: Scenario,
        data: &RunData,
        after: &[&Call],
        by_call: &mut HashMap<u64, Vec<Placed>>,
    ) -> Retries {
        let mut retries = Retries::default();
        for c in after {
            let Some(placed) = by_call.get_mut(&c.id) else {
                continue;
            };
            placed.sort_by_key(|p| p.at_us);
            for (i, p) in placed.iter().enumerate() {
                if i == 0 || p.replica.is_none() {
                    continue;
                }
                retries.all += 1;
                // A transparent retry repeats the attempt number of the attempt it replaces.
                if p.attempt <= placed[i - 1].attempt {
                    retries.transparent += 1;
                }
                if placed[..i].iter().any(|q| q.replica == p.replica) {
                    retries.to_tried += 1;
                }
            }
            let healthy = |p: &Placed| {
                p.replica
                    .is_some_and(|r| bad_at(scenario, data, p.at_us) != Some(r))
            };
            if !c.ok && !placed.is_empty() && placed.iter().all(healthy) {
                retries.failed_only_healthy += 1;
            }
        }
        retries
    }
}

/// The p99 latency of OK answers after a `restart` replica returned: of the returning
/// replica's, and of the others'. `None` for other scenarios.
fn restart_p99_ms(scenario: Scenario, data: &RunData) -> (Option<f64>, Option<f64>) {
    match (scenario, data.downs.first()) {
        (Scenario::Restart, Some(Down { to: Some(back), .. })) => {
            let ok = |bad: bool| {
                data.received
                    .iter()
                    .filter(|r| r.code == 0 && r.at_us >= us(*back) && (r.replica == BAD) == bad)
                    .map(|r| r.latency_us)
                    .collect::<Vec<_>>()
            };
            (Some(p99_ms(ok(true))), Some(p99_ms(ok(false))))
        }
        _ => (None, None),
    }
}

/// The attempts that reached the bad replica from 2 s after the fault on, all attempts
/// then, and the seconds they span.
fn bad_after_2s(timing: &Timing, timeline: &[Bucket]) -> (u64, u64, f64) {
    let n = timeline.len();
    let window = bucket_of(timing.fault + Duration::from_secs(2)).min(n);
    let (bad, all) = timeline[window..].iter().fold((0, 0), |(bad, all), b| {
        let reached: u64 = b.replica_attempts.iter().sum();
        (
            bad + b.bad_replica_attempts,
            all + reached + b.connection_failures,
        )
    });
    (bad, all, (n - window) as f64 * BUCKET.as_secs_f64())
}

/// The figures of one run.
pub(crate) fn summarize(
    name: &'static str,
    scenario: Scenario,
    timing: &Timing,
    replicas: usize,
    data: &RunData,
) -> PolicyReport {
    let n = timing.buckets();
    let fault_us = us(timing.fault);
    let (mut by_call, timeline) = place_attempts(scenario, n, replicas, data);

    let after: Vec<_> = data.calls.iter().filter(|c| c.at >= timing.fault).collect();
    let before: Vec<_> = data.calls.iter().filter(|c| c.at < timing.fault).collect();
    let fault_b = bucket_of(timing.fault);
    let attempts_after: u64 = data.attempts.iter().skip(fault_b).sum();
    let attempts_before: u64 = data.attempts.iter().take(fault_b).sum();
    let retries = Retries::of(scenario, data, &after, &mut by_call);

    let (bad, all, window_s) = bad_after_2s(timing, &timeline);

    let (returning_p99_ms, others_p99_ms) = restart_p99_ms(scenario, data);

    PolicyReport {
        name,
        success: success_of(&after),
        attempts_per_call: round(share(attempts_after, after.len() as u64), 3),
        retries_to_tried_replica_share: round(share(retries.to_tried, retries.all), 4),
        bad_replica_share_after_2s: round(share(bad, all), 4),
        failed_calls: data.calls.iter().filter(|c| !c.ok).count() as u64,
        failed_calls_after_1s: after
            .iter()
            .filter(|c| !c.ok && c.at >= timing.fault + Duration::from_secs(1))
            .count() as u64,
        p99_ms: p99_ms(after.iter().map(|c| us(c.latency)).collect()),
        ejected_after_s: data
            .ejected_at
            .map(|t| round(t.saturating_sub(timing.fault).as_secs_f64(), 2)),
        calls: data.calls.len() as u64,
        success_before_fault: success_of(&before),
        attempts_per_call_before_fault: round(share(attempts_before, before.len() as u64), 3),
        replica_shares_before_fault: replica_shares(&timeline[..fault_b], replicas),
        bad_replica_attempts_per_s_after_2s: if window_s > 0.0 {
            round(bad as f64 / window_s, 1)
        } else {
            0.0
        },
        returned_share_after_s: returned_share_after_s(scenario, data, &timeline, fault_us),
        returning_p99_ms,
        others_p99_ms,
        failed_calls_only_healthy: retries.failed_only_healthy,
        retries: retries.all,
        transparent_retries: retries.transparent,
        connection_failures: data.refused.len() as u64,
        budget_refusals: data.budget_refusals,
        ejections: data.ejections,
        timeline,
    }
}

/// The share of `calls` that succeeded, to 5 places.
fn success_of(calls: &[&Call]) -> f64 {
    round(
        share(
            calls.iter().filter(|c| c.ok).count() as u64,
            calls.len() as u64,
        ),
        5,
    )
}

/// Each of the `replicas`' share of the attempts that reached one over `timeline`, to 4
/// places.
fn replica_shares(timeline: &[Bucket], replicas: usize) -> Vec<f64> {
    let reached: Vec<u64> = (0..replicas)
        .map(|r| timeline.iter().map(|b| b.replica_attempts[r]).sum())
        .collect();
    let total: u64 = reached.iter().sum();
    reached.iter().map(|&r| round(share(r, total), 4)).collect()
}

/// Seconds from each return until the replica answers 80 % of its fair share of OK
/// answers over 300 ms; the slowest of them. `None` when none returns or one never does.
fn returned_share_after_s(
    scenario: Scenario,
    data: &RunData,
    timeline: &[Bucket],
    fault_us: u64,
) -> Option<f64> {
    if !matches!(scenario, Scenario::Restart | Scenario::Rolling) {
        return None;
    }
    let replicas = timeline.first()?.replica_attempts.len();
    let mut ok = vec![vec![0u64; replicas]; timeline.len()];
    for r in data
        .received
        .iter()
        .filter(|r| r.code == 0 && r.at_us >= fault_us)
    {
        if let Some(b) = ok.get_mut((r.at_us / us(BUCKET)) as usize) {
            b[r.replica] += 1;
        }
    }
    let mut slowest: Option<f64> = None;
    for down in &data.downs {
        let back = down.to?;
        let from = bucket_of(back);
        let reached = (from..ok.len().saturating_sub(2)).find(|&b| {
            let window = &ok[b..b + 3];
            let own: u64 = window.iter().map(|w| w[down.replica]).sum();
            let all: u64 = window.iter().flatten().sum();
            all > 0 && own as f64 >= 0.8 * all as f64 / replicas as f64
        })?;
        let after = (reached as f64 * BUCKET.as_secs_f64() - back.as_secs_f64()).max(0.0);
        slowest = Some(slowest.map_or(after, |s: f64| s.max(after)));
    }
    slowest.map(|s| round(s, 2))
}

/// The table, one block per scenario.
pub(crate) fn table(report: &FleetReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| scenario | policy | success | before | attempts/call | retries to tried | bad share | bad/s | ejected | back at share | p99 | failed | after 1 s | only healthy |"
    );
    let _ = writeln!(
        out,
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let secs = |s: Option<f64>| s.map_or_else(|| "–".to_owned(), |s| format!("{s:.2} s"));
    for s in &report.scenarios {
        for p in &s.policies {
            let _ = writeln!(
                out,
                "| {} | {} | {:.2} % | {:.2} % | {:.2} | {:.1} % | {:.1} % | {:.0} | {} | {} | {:.1} ms | {} | {} | {} |",
                s.name,
                p.name,
                100.0 * p.success,
                100.0 * p.success_before_fault,
                p.attempts_per_call,
                100.0 * p.retries_to_tried_replica_share,
                100.0 * p.bad_replica_share_after_2s,
                p.bad_replica_attempts_per_s_after_2s,
                secs(p.ejected_after_s),
                secs(p.returned_share_after_s),
                p.p99_ms,
                p.failed_calls,
                p.failed_calls_after_1s,
                p.failed_calls_only_healthy,
            );
        }
    }
    out
}
