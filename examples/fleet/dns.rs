//! `--discovery dns`: the replicas found through a DNS server on loopback whose records
//! change as on Kubernetes (scale up, scale down, a rolling deploy to new addresses, a pod
//! killed while its record stays, the DNS server down, a pod that reports `NOT_SERVING`
//! before it stops), each replica a process on its own loopback address (127.0.0.2,
//! 127.0.0.3, ..., one port), the client the `stormguard` policy over `Replicas::from_dns`
//! with client-side health checks on (gRFC A17: each replica's `grpc.health.v1.Health/Watch`
//! stream, the whole server's status; `--no-health-checks`: off).
//!
//! Per scenario it reports the resolutions and the failed ones; per policy the contract's
//! figures, the attempts that reached an address after a resolution that no longer listed
//! it, and the attempts that reached a replica after the client had its `NOT_SERVING`
//! report.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use clap::ValueEnum;
use serde::Serialize;
use stormguard::client::replicas::{Dns, Replicas};
use stormguard::client::{HealthCheckConfig, ReplicaConfig, RetryLayer, ServingStatus};
use stormguard_demo::InventoryClient;
use stormguard_demo::dns::DnsServer;
use stormguard_demo::storm::stormguard_client_config;
use tokio::time::Instant;
use tower::ServiceExt;

use crate::meters::Meters;
use crate::process::{Replica, SharedReports};
use crate::run::{
    Caller, ClientCounts, Observe, RunConfig, generate, layered, replica_seed, unix_us,
};

/// The name the DNS server answers for.
const NAME: &str = "inventory.fleet.test";
/// The records' TTL: the client resolves about once a second.
const TTL_SECS: u32 = 1;
/// How long a removed replica's process lives on after its record went (the pod's grace).
const GRACE: Duration = Duration::from_secs(1);

/// `--scenarios` with `--discovery dns`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum DnsScenario {
    /// 3 records, then 5: the new replicas ramp up
    ScaleUp,
    /// 5 records, then 3; the 2 processes stop gracefully a second later
    ScaleDown,
    /// Each of 3 records replaced by a new replica's, one by one; old ones drained
    RollingNewAddresses,
    /// One replica killed (SIGKILL); its record stays for 2 s
    KilledRecordStays,
    /// The DNS server stops answering (10 s; --quick: to the end)
    DnsDown,
    /// One replica's shutdown begins (its health service says NOT_SERVING) while its
    /// record stays; it stops a second later
    NotServing,
}

impl DnsScenario {
    pub(crate) const ALL: [DnsScenario; 6] = [
        DnsScenario::ScaleUp,
        DnsScenario::ScaleDown,
        DnsScenario::RollingNewAddresses,
        DnsScenario::KilledRecordStays,
        DnsScenario::DnsDown,
        DnsScenario::NotServing,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DnsScenario::ScaleUp => "scale-up",
            DnsScenario::ScaleDown => "scale-down",
            DnsScenario::RollingNewAddresses => "rolling-new-addresses",
            DnsScenario::KilledRecordStays => "killed-record-stays",
            DnsScenario::DnsDown => "dns-down",
            DnsScenario::NotServing => "not-serving",
        }
    }

    /// Replica processes, and how many of them are listed at first.
    fn fleet(self) -> (usize, usize) {
        match self {
            DnsScenario::ScaleUp => (5, 3),
            DnsScenario::ScaleDown => (5, 5),
            DnsScenario::RollingNewAddresses => (6, 3),
            DnsScenario::KilledRecordStays | DnsScenario::DnsDown | DnsScenario::NotServing => {
                (3, 3)
            }
        }
    }
}

/// The JSON of a `--discovery dns` run.
#[derive(Debug, Serialize)]
pub(crate) struct DnsReport {
    pub(crate) discovery: &'static str,
    pub(crate) scenarios: Vec<DnsScenarioReport>,
    pub(crate) rate: f64,
    pub(crate) deadline_ms: u64,
    pub(crate) fault_s: f64,
    pub(crate) seed: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct DnsScenarioReport {
    pub(crate) name: &'static str,
    /// Resolutions the client made during the runs, and those that failed.
    pub(crate) resolutions: u64,
    pub(crate) dns_failures: u64,
    pub(crate) policies: Vec<DnsPolicyReport>,
}

#[derive(Debug, Serialize)]
pub(crate) struct DnsPolicyReport {
    pub(crate) name: &'static str,
    /// Share of the calls from the change on that succeeded.
    pub(crate) success: f64,
    pub(crate) failed_calls: u64,
    pub(crate) failed_calls_after_1s: u64,
    pub(crate) p99_ms: f64,
    /// Attempts that reached an address after a resolution that no longer listed it.
    pub(crate) attempts_to_removed_after_resolution: u64,
    /// `not-serving`: attempts that reached the replica after the client had its
    /// `NOT_SERVING` report (had it none, after the replica was told to stop); 0 in the
    /// other scenarios.
    pub(crate) attempts_after_not_serving: u64,
    pub(crate) calls: u64,
}

/// The replica processes of a run, on 127.0.0.2, 127.0.0.3, ..., all on one port.
async fn start_fleet(
    n: usize,
    config: &RunConfig,
    reports: &SharedReports,
) -> Result<Vec<Replica>, String> {
    let mut last = String::new();
    for _ in 0..5 {
        let mut fleet: Vec<Replica> = Vec::with_capacity(n);
        let mut port = 0;
        for i in 0..n {
            let seed = replica_seed(config.seed, i);
            match Replica::start_on(ip(i), i, port, seed, Duration::ZERO, reports).await {
                Ok(replica) => {
                    port = replica.port;
                    fleet.push(replica);
                }
                Err(e) => {
                    last = e;
                    break;
                }
            }
        }
        if fleet.len() == n {
            return Ok(fleet);
        }
    }
    Err(format!("no port free on every replica's address: {last}"))
}

/// Replica `i`'s address.
fn ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + i as u8))
}

/// When something happened to each address (since the run's start).
type Removed = Arc<Mutex<HashMap<IpAddr, Duration>>>;

/// When things happened to each address during a run.
#[derive(Default)]
struct Marks {
    /// Left the client's set.
    removed: Removed,
    /// Told to stop while still listed (`not-serving`).
    told: Removed,
    /// Seen `NOT_SERVING` by the client's health check.
    not_serving: Removed,
}

/// Runs the `stormguard` policy through `scenario`, with client-side health checks if
/// `checks`.
pub(crate) async fn run(
    scenario: DnsScenario,
    config: &RunConfig,
    (checks, meters): (bool, &Meters),
    progress: &(dyn Fn(f64) + Send + Sync),
) -> Result<(DnsPolicyReport, u64, u64), String> {
    let reports = SharedReports::default();
    let (processes, listed) = scenario.fleet();
    let mut fleet = start_fleet(processes, config, &reports).await?;
    let port = fleet[0].port;
    let dns = DnsServer::start(NAME, (0..listed).map(ip), TTL_SECS)
        .await
        .map_err(|e| format!("dns server: {e}"))?;
    let counts = Arc::new(ClientCounts::new(config.timing.buckets()));
    let (caller, replicas) = client(scenario, (&dns, port), config, (checks, meters), &counts)?;
    // Connections up before the clock starts: calls with no id, not counted anywhere.
    for _ in 0..4 * listed {
        let _ = caller.clone().oneshot(0).await;
    }
    let before = replicas
        .dns_reports()
        .map(|r| r.borrow().counts)
        .unwrap_or_default();
    let start = Instant::now();
    let start_unix = unix_us();
    counts.start.get_or_init(|| start);
    let marks = Marks::default();
    let watch = tokio::spawn(watch_removals(
        replicas.clone(),
        start,
        marks.removed.clone(),
    ));
    let health = tokio::spawn(watch_not_serving(
        replicas.clone(),
        start,
        marks.not_serving.clone(),
    ));
    let driver = {
        let (config, dns, told) = (*config, dns.clone(), marks.told.clone());
        tokio::spawn(async move {
            let result = change(scenario, &mut fleet, &dns, &config, start, &told).await;
            (fleet, result)
        })
    };
    let calls = generate(&caller, config, start, progress).await?;
    let (mut fleet, result) = driver
        .await
        .map_err(|e| format!("the change's task: {e}"))?;
    result?;
    watch.abort();
    health.abort();
    let after = replicas
        .dns_reports()
        .map(|r| r.borrow().counts)
        .unwrap_or_default();
    drop(caller);
    for replica in &mut fleet {
        replica.stop().await?;
    }
    let received = std::mem::take(
        &mut reports
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .received,
    );
    let (to_removed, after_not_serving) = marked_attempts(&received, start_unix, &marks);
    let report = summarize(config, &calls, to_removed, after_not_serving);
    Ok((
        report,
        after.resolutions - before.resolutions,
        after.failures - before.failures,
    ))
}

/// The attempts of `received` that reached an address after it left the client's set, and
/// those that reached one after it was told to stop (from when the client's health check
/// saw it `NOT_SERVING`, else from the telling).
fn marked_attempts(
    received: &[crate::process::Received],
    start_unix: u64,
    marks: &Marks,
) -> (u64, u64) {
    let to_removed = attempts_after(received, start_unix, &read(&marks.removed));
    let mut cutoffs = read(&marks.told);
    for (ip, seen) in read(&marks.not_serving) {
        if let Some(at) = cutoffs.get_mut(&ip) {
            *at = seen;
        }
    }
    (to_removed, attempts_after(received, start_unix, &cutoffs))
}

fn read(marks: &Removed) -> HashMap<IpAddr, Duration> {
    marks.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

/// Attempts of the run that reached an address later than its cutoff (since the run's
/// start, Unix µs `start_unix`).
fn attempts_after(
    received: &[crate::process::Received],
    start_unix: u64,
    cutoffs: &HashMap<IpAddr, Duration>,
) -> u64 {
    received
        .iter()
        .filter(|r| r.call != 0 && r.at_us >= start_unix)
        .filter(|r| {
            cutoffs
                .get(&ip(r.replica))
                .is_some_and(|cut| r.at_us - start_unix > cut.as_micros() as u64)
        })
        .count() as u64
}

type Channel = Replicas<tonic::transport::Channel, stormguard::client::replicas::EndpointKey>;

/// The `stormguard` policy over the replicas `dns` lists (health checks if `checks`).
fn client(
    scenario: DnsScenario,
    (dns, port): (&DnsServer, u16),
    config: &RunConfig,
    (checks, meters): (bool, &Meters),
    counts: &Arc<ClientCounts>,
) -> Result<(Caller, Channel), String> {
    let target = Dns::new(NAME)
        .map_err(|e| e.to_string())?
        .port(port)
        .name_servers([dns.addr()])
        .endpoint(|e| {
            e.http2_max_local_error_reset_streams(None)
                .tcp_nodelay(true)
        });
    let checked = ReplicaConfig {
        health_check: checks.then(|| HealthCheckConfig::service("")),
        ..ReplicaConfig::default()
    };
    let replicas = Replicas::from_dns(checked, target)
        .map(|replicas| meters.replicas(replicas))
        .map_err(|e| e.to_string())?;
    let layer = RetryLayer::from_config(&stormguard_client_config(None).with_seed(config.seed))
        .map_err(|e| e.to_string())?
        .over_replicas();
    let layer = meters.retry(layer, &format!("{}.stormguard", scenario.as_str()));
    let service = tower::ServiceBuilder::new()
        .layer(layer)
        .service(Observe::new(replicas.clone(), counts.clone()));
    Ok((
        layered(InventoryClient::new(service), config.deadline),
        replicas,
    ))
}

/// Notes when each address leaves the client's set.
async fn watch_removals(replicas: Channel, start: Instant, removed: Removed) {
    let Some(mut reports) = replicas.dns_reports() else {
        return;
    };
    let mut listed: Vec<SocketAddr> = reports.borrow().records.clone();
    while reports.changed().await.is_ok() {
        let now: Vec<SocketAddr> = reports.borrow_and_update().records.clone();
        let mut gone = removed.lock().unwrap_or_else(PoisonError::into_inner);
        for addr in listed.iter().filter(|a| !now.contains(a)) {
            gone.entry(addr.ip()).or_insert_with(|| start.elapsed());
        }
        listed = now;
    }
}

/// Notes when the client's health check first sees each address `NOT_SERVING`.
async fn watch_not_serving(replicas: Channel, start: Instant, seen: Removed) {
    let mut changes = replicas.health_changes();
    loop {
        let now = start.elapsed();
        for r in replicas.snapshot() {
            let ip = r.key.uri().host().and_then(|h| h.parse::<IpAddr>().ok());
            if let (Some(ip), ServingStatus::NotServing) = (ip, r.snapshot.serving) {
                let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
                seen.entry(ip).or_insert(now);
            }
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

/// The scenario's change, on the run's clock (`told`: when a replica still listed is told
/// to stop).
async fn change(
    scenario: DnsScenario,
    fleet: &mut [Replica],
    dns: &DnsServer,
    config: &RunConfig,
    start: Instant,
    told: &Removed,
) -> Result<(), String> {
    let timing = &config.timing;
    let at = |d: Duration| start + d;
    tokio::time::sleep_until(at(timing.fault)).await;
    match scenario {
        DnsScenario::ScaleUp => dns.set_records((0..5).map(ip)),
        DnsScenario::ScaleDown => {
            dns.set_records((0..3).map(ip));
            tokio::time::sleep_until(at(timing.fault + GRACE)).await;
            for replica in &mut fleet[3..] {
                replica.stop().await?;
            }
        }
        DnsScenario::RollingNewAddresses => {
            for (step, old) in fleet[..3].iter_mut().enumerate() {
                let gap = timing.rolling_gap.saturating_mul(step as u32);
                tokio::time::sleep_until(at(timing.fault + gap)).await;
                dns.set_records((step + 1..3).chain(3..=3 + step).map(ip));
                tokio::time::sleep(GRACE).await;
                old.stop().await?;
            }
        }
        DnsScenario::KilledRecordStays => {
            fleet[0].kill();
            tokio::time::sleep_until(at(timing.fault + 2 * GRACE)).await;
            dns.set_records((1..3).map(ip));
        }
        DnsScenario::DnsDown => {
            dns.set_answering(false);
            let back = (timing.fault + Duration::from_secs(10)).min(timing.total);
            tokio::time::sleep_until(at(back)).await;
            dns.set_answering(true);
        }
        DnsScenario::NotServing => {
            told.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(ip(0), start.elapsed());
            // NOT_SERVING now (the shutdown begun), its connections for GRACE more; the
            // record stays.
            fleet[0].stop_after(GRACE).await?;
        }
    }
    Ok(())
}

/// The contract's figures of one run.
fn summarize(
    config: &RunConfig,
    calls: &[crate::run::Call],
    to_removed: u64,
    after_not_serving: u64,
) -> DnsPolicyReport {
    let fault = config.timing.fault;
    let after: Vec<_> = calls.iter().filter(|c| c.at >= fault).collect();
    let ok = after.iter().filter(|c| c.ok).count();
    let mut latencies: Vec<u128> = after.iter().map(|c| c.latency.as_micros()).collect();
    latencies.sort_unstable();
    let p99 = latencies
        .get(((latencies.len() as f64 * 0.99).ceil() as usize).saturating_sub(1))
        .map_or(0.0, |us| (*us as f64 / 100.0).round() / 10.0);
    DnsPolicyReport {
        name: "stormguard",
        success: if after.is_empty() {
            0.0
        } else {
            ((ok as f64 / after.len() as f64) * 1e5).round() / 1e5
        },
        failed_calls: calls.iter().filter(|c| !c.ok).count() as u64,
        failed_calls_after_1s: after
            .iter()
            .filter(|c| !c.ok && c.at >= fault + Duration::from_secs(1))
            .count() as u64,
        p99_ms: p99,
        attempts_to_removed_after_resolution: to_removed,
        attempts_after_not_serving: after_not_serving,
        calls: calls.len() as u64,
    }
}

/// The table of a `--discovery dns` run.
pub(crate) fn table(report: &DnsReport) -> String {
    let mut out = String::from(
        "| scenario | policy | success | failed | after 1 s | p99 ms | to removed | after NOT_SERVING | resolutions | dns failures |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in &report.scenarios {
        for p in &s.policies {
            out.push_str(&format!(
                "| {} | {} | {:.4} | {} | {} | {:.1} | {} | {} | {} | {} |\n",
                s.name,
                p.name,
                p.success,
                p.failed_calls,
                p.failed_calls_after_1s,
                p.p99_ms,
                p.attempts_to_removed_after_resolution,
                p.attempts_after_not_serving,
                s.resolutions,
                s.dns_failures
            ));
        }
    }
    out
}
