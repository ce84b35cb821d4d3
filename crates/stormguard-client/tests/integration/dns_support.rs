//! What the DNS discovery tests run on: Inventory replicas ("pods") on distinct loopback
//! addresses sharing one port, each serving its connections itself so that a test can
//! kill it (listener and connections closed at once), the demo's DNS server, and a client
//! over `Replicas::from_dns`.
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use stormguard_client::replicas::{Dns, DnsReport, EndpointKey, Replicas};
use stormguard_client::{RefreshConfig, ReplicaConfig, RetryLayer};
use stormguard_core::{BackoffConfig, RetryPolicy};
use stormguard_core::{Budget, BudgetConfig, MethodTable, RetryBudget, RetryController};
use stormguard_demo::dns::DnsServer;
use stormguard_demo::server::{DemoConfig, DemoControl, DemoInventory};
use stormguard_demo::{InventoryClient, InventoryServer, ReserveRequest};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tonic::transport::Channel;

pub(crate) const NAME: &str = "inventory.stormguard.test";

/// Every wait on the channel's state is bounded by this, so a missing behaviour fails
/// the test instead of hanging it.
pub(crate) const PATIENCE: Duration = Duration::from_secs(10);

/// One replica: the demo Inventory on `addr`, its connections owned by one task.
pub(crate) struct Pod {
    pub(crate) addr: SocketAddr,
    pub(crate) control: DemoControl,
    /// Its connections open now.
    connections: watch::Sender<usize>,
    task: tokio::task::JoinHandle<()>,
}

/// Counts one open connection of a pod while it lives.
struct Open(watch::Sender<usize>);

impl Open {
    fn new(connections: &watch::Sender<usize>) -> Self {
        connections.send_modify(|n| *n += 1);
        Open(connections.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

impl Pod {
    /// A pod on `ip:port`.
    pub(crate) async fn start(ip: IpAddr, port: u16) -> std::io::Result<Pod> {
        let listener = TcpListener::bind(SocketAddr::new(ip, port)).await?;
        let addr = listener.local_addr()?;
        let inventory = DemoInventory::new(DemoConfig {
            service_time: Duration::from_millis(1),
            ..DemoConfig::default()
        });
        let control = inventory.control();
        let routes = tonic::service::Routes::new(InventoryServer::new(inventory));
        let connections = watch::Sender::new(0);
        let counted = connections.clone();
        let task = tokio::spawn(async move {
            // Dropped with the task: a killed pod's connections close with its listener.
            let mut connections = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let svc = TowerToHyperService::new(routes.clone());
                let open = Open::new(&counted);
                connections.spawn(async move {
                    let _open = open;
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(Pod {
            addr,
            control,
            connections,
            task,
        })
    }

    /// Stops the pod at once, as `kill -9`: new connections are refused, open ones close.
    pub(crate) fn kill(&self) {
        self.task.abort();
    }

    /// Returns once none of its connections is open (a client closed them).
    pub(crate) async fn wait_no_connection(&self) {
        let mut open = self.connections.subscribe();
        let _ = open.wait_for(|n| *n == 0).await;
    }

    /// Its connections open now.
    pub(crate) fn connections(&self) -> usize {
        *self.connections.borrow()
    }

    /// Attempts that reached it so far.
    pub(crate) fn entered(&self) -> u64 {
        self.control.counts().entered
    }

    pub(crate) fn ip(&self) -> IpAddr {
        self.addr.ip()
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `n` pods on 127.0.0.`first`, 127.0.0.`first + 1`, ..., all on `port` (0: one free on
/// the first address, taken by the others).
pub(crate) async fn pods(first: u8, n: u8, port: u16) -> Vec<Pod> {
    for _ in 0..20 {
        let mut pods = Vec::new();
        let mut port = port;
        for i in 0..n {
            let ip = IpAddr::V4(Ipv4Addr::new(127, 0, 0, first + i));
            match Pod::start(ip, port).await {
                Ok(pod) => {
                    port = pod.addr.port();
                    pods.push(pod);
                }
                Err(_) => break,
            }
        }
        if pods.len() == usize::from(n) {
            return pods;
        }
    }
    panic!("no port free on 127.0.0.{first}..+{n}");
}

/// Resolutions every 50 to 200 ms (a 1 s TTL is bounded by `max_interval`), 200 ms timeout.
pub(crate) fn quick_refresh() -> RefreshConfig {
    RefreshConfig {
        min_interval: Duration::from_millis(50),
        max_interval: Duration::from_millis(200),
        timeout: Duration::from_millis(200),
        seed: Some(7),
        ..RefreshConfig::default()
    }
}

pub(crate) type Client = InventoryClient<stormguard_client::Retry<Replicas<Channel, EndpointKey>>>;

/// A retry policy with a tiny backoff; `idempotent` as given.
pub(crate) fn policy(idempotent: bool) -> RetryPolicy {
    RetryPolicy {
        idempotent,
        backoff: BackoffConfig::FullJitter {
            base: Duration::from_millis(1),
            cap: Duration::from_millis(5),
            multiplier: 2.0,
        },
        ..RetryPolicy::default()
    }
}

/// The channel over `dns` (the test's server, `port`, `refresh`) and a client through
/// the retry layer with a roomy budget.
pub(crate) fn client(
    dns: &DnsServer,
    port: u16,
    refresh: RefreshConfig,
    idempotent: bool,
) -> (Replicas<Channel, EndpointKey>, Client) {
    let target = Dns::new(NAME)
        .unwrap()
        .port(port)
        .name_servers([dns.addr()])
        .refresh(refresh);
    let config = ReplicaConfig {
        seed: Some(3),
        ..ReplicaConfig::default()
    };
    let replicas = Replicas::from_dns(config, target).unwrap();
    let budget: Arc<dyn Budget> = Arc::new(
        RetryBudget::new(BudgetConfig {
            min_retries_per_second: 1000,
            ..BudgetConfig::default()
        })
        .unwrap(),
    );
    let controller =
        RetryController::new(MethodTable::uniform(policy(idempotent)), budget, None, 7).unwrap();
    let layer = RetryLayer::new(controller).over_replicas();
    let svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service(replicas.clone());
    (replicas, InventoryClient::new(svc))
}

/// `n` calls at once; how many failed.
pub(crate) async fn batch(client: &Client, n: usize) -> usize {
    let mut calls = JoinSet::new();
    for i in 0..n {
        let mut c = client.clone();
        calls.spawn(async move {
            let mut request = tonic::Request::new(ReserveRequest {
                sku: "sku-1".into(),
                quantity: 1,
                request_id: format!("call-{i}"),
                payload: Vec::new(),
            });
            request.set_timeout(Duration::from_secs(2));
            c.reserve(request).await
        });
    }
    let mut failed = 0;
    while let Some(done) = calls.join_next().await {
        if !matches!(done, Ok(Ok(_))) {
            failed += 1;
        }
    }
    failed
}

/// Waits until the channel's DNS report satisfies `until` (at most [`PATIENCE`]).
pub(crate) async fn wait_report(
    replicas: &Replicas<Channel, EndpointKey>,
    what: &str,
    until: impl FnMut(&DnsReport) -> bool,
) -> DnsReport {
    let mut reports: watch::Receiver<DnsReport> = replicas.dns_reports().unwrap();
    let found = match tokio::time::timeout(PATIENCE, reports.wait_for(until)).await {
        Ok(Ok(report)) => Some(report.clone()),
        _ => None,
    };
    found.unwrap_or_else(|| panic!("{what}: not within {PATIENCE:?}: {:?}", *reports.borrow()))
}

/// Whether the last good set is exactly `pods`.
pub(crate) fn lists(report: &DnsReport, pods: &[&Pod]) -> bool {
    let mut want: Vec<SocketAddr> = pods.iter().map(|p| p.addr).collect();
    want.sort();
    let mut have = report.records.clone();
    have.sort();
    have == want
}
