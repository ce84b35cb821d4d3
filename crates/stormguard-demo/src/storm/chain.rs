//! The chain: gateway → orders → inventory, three tonic services on loopback, each hop
//! calling the next through a retrying client.
//!
//! With `naive` every hop (the users' client included) retries 3 times with no budget and
//! no signal, so a dead inventory sees 3 × 3 × 3 = 27 calls per user request. With
//! `stormguard` every client has a `RetryLayer` and every server a `ShedLayer`, all with
//! defaults: only the hop next to the failure retries, within its budget, and its answer
//! tells the hops above not to retry (`grpc-retry-pushback-ms: -1`). The gateway and
//! orders serve the same `Reserve` method as the inventory and forward it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;
use stormguard_core::AdmissionConfig;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::{Request, Response, Status};
use tower::ServiceExt;

use super::client::{
    Caller, Delays, Naive, Observe, connect, layered_caller, layered_client, naive_caller,
    stormguard_client_config,
};
use super::report::Timeline;
use super::server::{Serving, serve_costed};
use super::{Instruments, Policy, StormError};
use crate::server::{DemoConfig, DemoInventory};
use crate::{Inventory, InventoryClient, ReserveReply, ReserveRequest, WatchStockRequest};

/// The chain's knobs.
#[derive(Clone, Debug, PartialEq)]
pub struct ChainConfig {
    /// User requests per second (evenly spaced).
    pub rate: f64,
    /// How long users send requests.
    pub duration: Duration,
    /// Every user request's deadline (and each naive hop's): long enough for 27 attempts.
    pub deadline: Duration,
    /// Attempts per naive hop.
    pub naive_attempts: u32,
    /// Delay between a naive hop's attempts.
    pub naive_backoff: Duration,
    /// Share of the inventory's calls that fail in the flaky case.
    pub flaky_rate: f64,
    /// Seed of the failures and the jitter.
    pub seed: u64,
}

impl ChainConfig {
    /// 100 requests/s for 8 s, 5 s deadline (27 naive attempts fit in it even on a busy
    /// machine), 3 attempts with 10 ms between them, 20 % failures in the flaky case.
    pub fn standard() -> Self {
        ChainConfig {
            rate: 100.0,
            duration: Duration::from_secs(8),
            deadline: Duration::from_secs(5),
            naive_attempts: 3,
            naive_backoff: Duration::from_millis(10),
            flaky_rate: 0.2,
            seed: 1,
        }
    }

    /// 25 requests/s for 2 s, for tests.
    pub fn quick() -> Self {
        ChainConfig {
            rate: 25.0,
            duration: Duration::from_secs(2),
            ..ChainConfig::standard()
        }
    }
}

/// One policy's result in one case.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChainResult {
    /// `naive` or `stormguard`.
    pub name: &'static str,
    /// Requests the users sent to the gateway.
    pub user_requests: u64,
    /// Attempts that reached the inventory.
    pub bottom_calls: u64,
    /// `bottom_calls / user_requests`.
    pub bottom_calls_per_request: f64,
    /// Share of user requests that succeeded.
    pub success: f64,
}

/// One case: both policies.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChainCase {
    /// `naive`, then `stormguard`.
    pub policies: Vec<ChainResult>,
}

/// Both cases. Serializes to the JSON the `chain` example writes with `--json`: the dead
/// case at the top level, the flaky one under `"flaky"`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChainReport {
    /// Inventory always answers `UNAVAILABLE`.
    #[serde(flatten)]
    pub dead: ChainCase,
    /// Inventory fails a share of calls at random.
    pub flaky: ChainCase,
}

impl ChainReport {
    /// Both cases as a text table.
    pub fn table(&self, flaky_rate: f64) -> String {
        let mut out = String::from(
            "| inventory | policy | user requests | bottom calls | per request | success |\n\
             |---|---|---:|---:|---:|---:|\n",
        );
        let flaky = format!("fails {:.0} %", flaky_rate * 100.0);
        for (case, results) in [("dead", &self.dead), (flaky.as_str(), &self.flaky)] {
            for r in &results.policies {
                out.push_str(&format!(
                    "| {case} | {} | {} | {} | {:.2} | {:.1} % |\n",
                    r.name,
                    r.user_requests,
                    r.bottom_calls,
                    r.bottom_calls_per_request,
                    r.success * 100.0
                ));
            }
        }
        out
    }
}

/// The policies the chain compares.
pub const CHAIN_POLICIES: [Policy; 2] = [Policy::Naive, Policy::Stormguard];

/// A hop in the middle: serves `Reserve` by calling the next hop.
#[derive(Clone)]
struct Relay {
    next: Caller,
}

#[tonic::async_trait]
impl Inventory for Relay {
    async fn reserve(
        &self,
        _request: Request<ReserveRequest>,
    ) -> Result<Response<ReserveReply>, Status> {
        // The status of a failed call goes up as it came, with its metadata.
        self.next.clone().oneshot(()).await.map(Response::new)
    }

    type WatchStockStream = <DemoInventory as Inventory>::WatchStockStream;

    async fn watch_stock(
        &self,
        _request: Request<WatchStockRequest>,
    ) -> Result<Response<Self::WatchStockStream>, Status> {
        Err(Status::unimplemented("the chain forwards Reserve only"))
    }
}

/// Runs the dead case and the flaky case for both policies. `instruments` is applied to
/// the `stormguard` policy's layers, each named after its case and the service it stands
/// in front of or calls (`dead.orders`: the client layer calling orders and orders'
/// `ShedLayer`, in the dead case).
pub async fn run_chain(
    config: &ChainConfig,
    instruments: &Instruments,
) -> Result<ChainReport, StormError> {
    let mut dead = Vec::new();
    let mut flaky = Vec::new();
    for policy in CHAIN_POLICIES {
        let case = Case {
            config,
            policy,
            instruments,
        };
        dead.push(run_case(&case, "dead", 1.0).await?);
        flaky.push(run_case(&case, "flaky", config.flaky_rate).await?);
    }
    Ok(ChainReport {
        dead: ChainCase { policies: dead },
        flaky: ChainCase { policies: flaky },
    })
}

/// What every hop of one policy's run shares.
struct Case<'a> {
    config: &'a ChainConfig,
    policy: Policy,
    instruments: &'a Instruments,
}

impl Case<'_> {
    /// Serves `service` as the hop `name` of the case `case`: behind a `ShedLayer` for
    /// `stormguard`.
    async fn serve<T: Inventory>(&self, service: T, name: &str) -> Result<Serving, StormError> {
        let admission = (self.policy == Policy::Stormguard).then(AdmissionConfig::default);
        let instrument = |layer| self.instruments.server(layer, name);
        serve_costed(service, admission, None, false, &instrument).await
    }
}

/// One hop's client to the server at `serving`: attempts counted into `timeline`.
async fn hop(
    case: &Case<'_>,
    (serving, name): (&Serving, &str),
    timeline: Arc<Timeline>,
    timeout: Option<Duration>,
) -> Result<Caller, StormError> {
    let config = case.config;
    let channel = Observe::new(connect(serving.addr).await?, timeline);
    Ok(match case.policy {
        Policy::Stormguard => {
            let (client, _) = layered_client(
                channel,
                &stormguard_client_config(None),
                config.seed,
                false,
                |layer| case.instruments.client(layer, name),
            )?;
            layered_caller(client, timeout)
        }
        _ => naive_caller(
            InventoryClient::new(channel),
            Naive {
                max_attempts: config.naive_attempts,
                delays: Delays::Fixed(config.naive_backoff),
                deadline: config.deadline,
                per_attempt: None,
                seed: config.seed,
            },
        ),
    })
}

async fn run_case(case: &Case<'_>, name: &str, fail_rate: f64) -> Result<ChainResult, StormError> {
    let (config, policy) = (case.config, case.policy);
    let hop_name = |service: &str| format!("{name}.{service}");
    let inventory = DemoInventory::new(DemoConfig {
        service_time: Duration::from_millis(1),
        fail_rate,
        seed: config.seed,
    });
    let start = Instant::now();
    // Only the orders → inventory hop is counted: its attempts are the bottom calls.
    let bottom = Arc::new(Timeline::new(start, 1));
    let ignored = || Arc::new(Timeline::new(start, 1));
    let (inventory_name, orders_name, gateway_name) = (
        hop_name("inventory"),
        hop_name("orders"),
        hop_name("gateway"),
    );
    let inventory = case.serve(inventory, &inventory_name).await?;
    let to_inventory = hop(
        case,
        (&inventory, &inventory_name),
        Arc::clone(&bottom),
        None,
    )
    .await?;
    let orders = case
        .serve(Relay { next: to_inventory }, &orders_name)
        .await?;
    let to_orders = hop(case, (&orders, &orders_name), ignored(), None).await?;
    let gateway = case.serve(Relay { next: to_orders }, &gateway_name).await?;
    let user = hop(
        case,
        (&gateway, &gateway_name),
        ignored(),
        Some(config.deadline),
    )
    .await?;

    let requests = (config.rate * config.duration.as_secs_f64()).round() as u64;
    let gap = Duration::from_secs_f64(1.0 / config.rate);
    let ok = Arc::new(AtomicU64::new(0));
    let mut calls = JoinSet::new();
    let begin = Instant::now();
    for i in 0..requests {
        tokio::time::sleep_until(begin + gap.mul_f64(i as f64)).await;
        let user = user.clone();
        let ok = Arc::clone(&ok);
        calls.spawn(async move {
            if user.oneshot(()).await.is_ok() {
                ok.fetch_add(1, Ordering::Relaxed);
            }
        });
        while calls.try_join_next().is_some() {}
    }
    while calls.join_next().await.is_some() {}
    let bottom_calls = bottom.attempts();
    let ok = ok.load(Ordering::Relaxed);
    Ok(ChainResult {
        name: policy.as_str(),
        user_requests: requests,
        bottom_calls,
        bottom_calls_per_request: bottom_calls as f64 / requests.max(1) as f64,
        success: ok as f64 / requests.max(1) as f64,
    })
}
