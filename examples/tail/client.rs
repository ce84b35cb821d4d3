//! The client side: how each policy makes one logical `Reserve` call.
//!
//! Every policy sends over one tonic `Channel` to the server; each call carries its
//! deadline (`grpc-timeout`) and the phase of the run it belongs to ([`PHASE_HEADER`]), which
//! every copy of it carries too.

use std::time::Duration;

use clap::ValueEnum;
use stormguard_client::{Retry, RetryLayer, RetryStats};
use stormguard_core::ClientConfig;
use stormguard_core::MethodScope;
use stormguard_core::{HedgeDelay, HedgingPolicy, LearnedDelay};
use stormguard_demo::storm::{INVENTORY_SERVICE, RESERVE_METHOD};
use stormguard_demo::{InventoryClient, ReserveReply, ReserveRequest};
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tower::hedge::Hedge;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, Layer, ServiceBuilder, ServiceExt};
use tower_resilience::hedge::{HedgeError, HedgeLayer};

use crate::server::{PHASE_HEADER, Phase};

/// The client policies compared, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Policy {
    /// A plain tonic channel: one attempt per call
    None,
    /// tower's `hedge` middleware: one hedge after the p95 of recent latency
    TowerHedge,
    /// stormguard's RetryLayer: one hedge after a fixed 15 ms, paid from the retry budget
    Hedging,
    /// stormguard's RetryLayer: one hedge after the learned delay (its defaults)
    HedgingLearned,
    /// tower-resilience's hedge: one hedge after a fixed 15 ms
    ResilienceHedge,
}

impl Policy {
    /// The policies a run compares unless told otherwise (the peer's on request:
    /// `docs/comparison.md`).
    pub(crate) const DEFAULT: [Policy; 4] = [
        Policy::None,
        Policy::TowerHedge,
        Policy::Hedging,
        Policy::HedgingLearned,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Policy::None => "none",
            Policy::TowerHedge => "tower-hedge",
            Policy::Hedging => "hedging",
            Policy::HedgingLearned => "hedging-learned",
            Policy::ResilienceHedge => "resilience-hedge",
        }
    }
}

/// `hedging`'s and `resilience-hedge`'s fixed delay: a bit above the p99 of a normal attempt
/// (10 ms of service, which the 1 ms timer makes 10–12 ms, plus the round trip).
pub(crate) const FIXED_DELAY: Duration = Duration::from_millis(15);
/// `tower-hedge`: the percentile of recent latency it hedges after (the same as stormguard's
/// learned default), the samples it needs first, and how long one histogram collects before
/// it is used (it then covers the previous period alone, so the warm-up must be longer).
pub(crate) const TOWER_PERCENTILE: f32 = 0.95;
pub(crate) const TOWER_MIN_POINTS: u64 = 100;
pub(crate) const TOWER_PERIOD: Duration = Duration::from_secs(1);

/// One logical call as the tower-hedge and resilience-hedge policies see it: everything
/// needed to send it again.
///
/// tower's `Hedge` (and tower-resilience's) sends a second copy of the request, so it needs a request it can clone,
/// and a tonic request cannot be cloned (its body is a stream, and `tonic::Request` is not
/// `Clone`). For a unary call the user keeps the message instead, which is the buffered
/// body, and puts the hedge *above* the generated client: each copy becomes a fresh
/// `tonic::Request` with the same message, metadata and timeout.
#[derive(Clone, Debug)]
pub(crate) struct Call {
    pub(crate) message: ReserveRequest,
    pub(crate) phase: Phase,
    pub(crate) deadline: Duration,
}

impl Call {
    fn request(self) -> tonic::Request<ReserveRequest> {
        let mut request = tonic::Request::new(self.message);
        request.set_timeout(self.deadline);
        request.metadata_mut().insert(
            PHASE_HEADER,
            MetadataValue::from_static(self.phase.as_str()),
        );
        request
    }
}

/// `Reserve` is idempotent (keyed by its `request_id`), so every call may be hedged.
#[derive(Clone, Copy, Debug)]
struct Idempotent;

impl tower::hedge::Policy<Call> for Idempotent {
    fn clone_request(&self, call: &Call) -> Option<Call> {
        Some(call.clone())
    }

    fn can_retry(&self, _call: &Call) -> bool {
        true
    }
}

/// Sends each copy of a call as a fresh request through a client over `channel`.
fn send(
    channel: Channel,
) -> impl tower::Service<
    Call,
    Response = ReserveReply,
    Error = tonic::Status,
    Future = impl Future<Output = Result<ReserveReply, tonic::Status>> + Send,
> + Clone
+ Send
+ Sync
+ 'static {
    let client = InventoryClient::new(channel);
    tower::service_fn(move |call: Call| {
        let mut client = client.clone();
        async move {
            client
                .reserve(call.request())
                .await
                .map(tonic::Response::into_inner)
        }
    })
}

/// Makes logical calls, whatever the policy. Clones share the channel and the policy's
/// state (histograms, budget).
#[derive(Clone)]
pub(crate) enum Caller {
    Plain(InventoryClient<Channel>),
    /// A hedge above the generated client: tower's (not `Clone`: a `Buffer` in front of
    /// it, as tower's docs suggest for a service shared by many tasks) or
    /// tower-resilience's.
    Hedged(BoxCloneSyncService<Call, ReserveReply, BoxError>),
    Layered(InventoryClient<Retry<Channel>>, RetryStats),
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Caller::Plain(_) => "Caller::Plain",
            Caller::Hedged(_) => "Caller::Hedged",
            Caller::Layered(..) => "Caller::Layered",
        })
    }
}

/// The hedging policy of `Reserve` for the two stormguard policies: one hedge, A6's other
/// defaults (no non-fatal codes: any answer ends the call, except a hedge a stormguard
/// server shed, which never ran and so does not fail the copy still running).
pub(crate) fn hedging_policy(delay: HedgeDelay) -> HedgingPolicy {
    HedgingPolicy {
        max_attempts: 2,
        delay,
        ..HedgingPolicy::default()
    }
}

impl Caller {
    /// The caller of `policy` over `channel`.
    pub(crate) fn new(policy: Policy, channel: Channel, seed: u64) -> Result<Self, BoxError> {
        let delay = match policy {
            Policy::None => return Ok(Caller::Plain(InventoryClient::new(channel))),
            Policy::TowerHedge => {
                let hedge = Hedge::new(
                    send(channel),
                    Idempotent,
                    TOWER_MIN_POINTS,
                    TOWER_PERCENTILE,
                    TOWER_PERIOD,
                );
                let shared = tower::buffer::Buffer::new(hedge, 1024);
                return Ok(Caller::Hedged(BoxCloneSyncService::new(shared)));
            }
            Policy::ResilienceHedge => {
                // 2 attempts (its default and its guide's), the second after a fixed delay.
                let hedge = HedgeLayer::builder()
                    .delay(FIXED_DELAY)
                    .max_hedged_attempts(2)
                    .build()
                    .layer(send(channel))
                    .map_err(|e: HedgeError<tonic::Status>| BoxError::from(e.into_inner()));
                return Ok(Caller::Hedged(BoxCloneSyncService::new(hedge)));
            }
            Policy::Hedging => HedgeDelay::Fixed(FIXED_DELAY),
            Policy::HedgingLearned => HedgeDelay::Learned(LearnedDelay::default()),
        };
        let mut config = ClientConfig::default();
        config.methods.set_hedging(
            MethodScope::Method(INVENTORY_SERVICE, RESERVE_METHOD),
            Some(hedging_policy(delay)),
        );
        let layer = RetryLayer::from_config(&config.clone().with_seed(seed))?;
        let stats = layer.stats();
        let service = ServiceBuilder::new().layer(layer).service(channel);
        Ok(Caller::Layered(InventoryClient::new(service), stats))
    }

    /// The layer's counters (the stormguard policies).
    pub(crate) fn stats(&self) -> Option<&RetryStats> {
        match self {
            Caller::Layered(_, stats) => Some(stats),
            _ => None,
        }
    }

    /// One logical `Reserve` call of `phase`, with `deadline`.
    pub(crate) async fn reserve(self, phase: Phase, deadline: Duration) -> Result<(), BoxError> {
        let call = Call {
            message: ReserveRequest {
                sku: "tail".to_owned(),
                quantity: 1,
                ..ReserveRequest::default()
            },
            phase,
            deadline,
        };
        match self {
            Caller::Plain(mut client) => {
                client.reserve(call.request()).await?;
            }
            Caller::Layered(mut client, _) => {
                client.reserve(call.request()).await?;
            }
            Caller::Hedged(service) => {
                service.oneshot(call).await?;
            }
        }
        Ok(())
    }
}
