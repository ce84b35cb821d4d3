//! The service a [`ShedLayer`](crate::ShedLayer) wraps each service in.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderName, HeaderValue};

use stormguard_core::CallClass;
use stormguard_core::CriticalityTable;
use stormguard_core::Instant;
use stormguard_core::{context::CallContext, context::RequestScope};
use stormguard_core::{wire::attempt_class, wire::decode_grpc_timeout, wire::parse_criticality};
use stormguard_core::{
    wire::http::GRPC_PREVIOUS_RPC_ATTEMPTS, wire::http::GRPC_TIMEOUT,
    wire::http::STORMGUARD_CRITICALITY, wire::http::X_RETRY_ATTEMPT, wire::http::X_RETRY_BUDGET,
    wire::http::first_values,
};
use tower_service::Service;

use super::body::ShedBody;
use super::future::ResponseFuture;
use super::stats::ShedStats;

use super::drain::{Discard, Drains};
use super::events::{QueuedEvents, ShedEvents};
use super::exempt::{Bypassed, NeverShed};
use super::gate::{Entry, Gate, Ticket};
use super::load::{CallReport, LoadReporter};

/// A service behind the admission queue. Built by [`ShedLayer`](crate::ShedLayer); every
/// clone, and every service the same layer wraps, shares one queue.
#[derive(Clone)]
pub struct ShedService<S> {
    inner: S,
    // One reference to count when the transport clones the service for each request.
    shared: Arc<Shared>,
}

/// What a [`ShedLayer`](crate::ShedLayer) gives every service it wraps: the one queue, the
/// rules its calls are admitted by, and where they are counted and logged.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) gate: Arc<Gate>,
    pub(crate) criticality: Arc<CriticalityTable>,
    pub(crate) never_shed: Arc<NeverShed>,
    pub(crate) bypassed: Arc<Bypassed>,
    pub(crate) drains: Arc<Drains>,
    pub(crate) retry_allowance: Option<u32>,
    pub(crate) events: Arc<ShedEvents>,
    pub(crate) load: Option<Arc<LoadReporter>>,
}

impl Shared {
    /// The queue's counters.
    pub(crate) fn stats(&self) -> ShedStats {
        ShedStats::new(
            Arc::clone(&self.gate),
            Arc::clone(&self.drains),
            Arc::clone(&self.bypassed),
        )
    }
}

impl<S> ShedService<S> {
    /// `inner` behind the queue and rules of `shared`.
    pub(crate) fn new(inner: S, shared: Shared) -> Self {
        ShedService {
            inner,
            shared: Arc::new(shared),
        }
    }

    /// The queue's counters.
    pub fn stats(&self) -> ShedStats {
        self.shared.stats()
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S> fmt::Debug for ShedService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShedService")
            .field("queue", &self.shared.gate.counters().snapshot())
            .finish_non_exhaustive()
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for ShedService<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, ReqBody, B> Service<http::Request<ReqBody>> for ShedService<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<B>> + Clone,
    ReqBody: http_body::Body + Send + Unpin + 'static,
    B: http_body::Body,
{
    type Response = http::Response<ShedBody<B>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, http::Request<ReqBody>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let now = Instant::now();
        let inbound = self.inbound(&request, now);
        if self.shared.never_shed.matches(request.uri().path()) {
            self.shared.bypassed.record();
            let future = self.inner.call(request);
            return ResponseFuture::bypass(inbound.context, inbound.scope, future);
        }
        // The first call that can be shed names a layer that has no name.
        self.shared
            .events
            .name()
            .get_or_name_after(request.uri().path());
        let mut report = self.shared.load.as_ref().map(|load| {
            load.arrived_at(now);
            CallReport::new(Arc::clone(load), Arc::clone(&self.shared.gate), now)
        });
        let entry = self.shared.gate.enter(now, inbound.class, inbound.deadline);
        if let Some(report) = report.as_mut()
            && !matches!(entry, Entry::Queued(_))
        {
            // Not queued: its time queued is zero.
            report.started_at(now);
        }
        match entry {
            Entry::Admitted(permit) => {
                let cut = self.cut(&inbound, request.uri());
                let future = self.inner.call(request);
                let Inbound { context, scope, .. } = inbound;
                ResponseFuture::running(context, scope, future, permit, report, cut)
            }
            Entry::Queued(ticket) => self.queue(request, inbound, ticket, report),
            Entry::Shed(shed) => {
                self.shared
                    .events
                    .shed(request.uri().path(), inbound.class, &shed, false);
                super::drain::discard_request(request, &self.shared.drains);
                let code = self.shared.gate.shed_code(shed.pushback);
                let retry_info = self.shared.gate.sends_retry_info();
                let answer = super::response::shed(code, shed.reason, shed.pushback, retry_info);
                ResponseFuture::answered(super::load::with_report(answer, report.as_ref(), true))
            }
            Entry::Expired => {
                self.shared
                    .events
                    .expired(request.uri().path(), inbound.class, false);
                super::drain::discard_request(request, &self.shared.drains);
                let answer = super::response::expired();
                ResponseFuture::answered(super::load::with_report(answer, report.as_ref(), false))
            }
            Entry::Closing => {
                super::drain::discard_request(request, &self.shared.drains);
                let answer = super::response::shutting_down(self.shared.gate.sends_retry_info());
                ResponseFuture::answered(super::load::with_report(answer, report.as_ref(), false))
            }
        }
    }
}

/// What the layer reads of an inbound call's headers, once: its class, its deadline, and
/// what its handler's outgoing calls inherit.
struct Inbound {
    class: CallClass,
    deadline: Option<Instant>,
    context: CallContext,
    scope: RequestScope,
}

impl<S> ShedService<S> {
    /// Reads the headers of `request`, arrived at `now`.
    fn inbound<B>(&self, request: &http::Request<B>, now: Instant) -> Inbound {
        // Statics, not the `const`s: a `const` name is built and dropped at every use.
        static NAMES: [HeaderName; 5] = [
            GRPC_PREVIOUS_RPC_ATTEMPTS,
            X_RETRY_ATTEMPT,
            STORMGUARD_CRITICALITY,
            GRPC_TIMEOUT,
            X_RETRY_BUDGET,
        ];
        let [previous, x_attempt, criticality, timeout, peer_allowance] =
            first_values(request.headers(), NAMES.each_ref()).map(|v| v.map(HeaderValue::as_bytes));
        let class = attempt_class(previous, x_attempt);
        // A peer's claim, never above what this server grants the method.
        let criticality = self
            .shared
            .criticality
            .resolve(request.uri().path(), parse_criticality(criticality));
        let deadline = timeout
            // Malformed (or non-ASCII) values read as "no deadline", as tonic does.
            .and_then(|v| decode_grpc_timeout(v).ok())
            .and_then(|t| now.checked_add(t));
        // The handler's outgoing calls inherit this call's deadline (see `CallContext`).
        let context = match deadline {
            Some(d) => CallContext::new().with_deadline(d),
            None => CallContext::new(),
        };
        // What the handler's outgoing calls share: the request's retry allowance, when the
        // layer has one (lowered, never raised, by the caller's `x-retry-budget`), and
        // whether one of them was refused a retry.
        let scope = match self.shared.retry_allowance {
            Some(limit) => {
                let scope = RequestScope::new().with_allowance(limit);
                match peer_allowance {
                    Some(peer) => scope.with_peer_allowance(peer),
                    None => scope,
                }
            }
            None => RequestScope::new(),
        };
        Inbound {
            class: CallClass::new(class, criticality),
            deadline,
            context,
            scope,
        }
    }

    /// A call waits for a worker with `ticket`, holding the service that was made ready
    /// for it (a clone takes its place for the next `poll_ready`) and its request, whose
    /// body is discarded if it never runs.
    fn queue<B>(
        &mut self,
        request: http::Request<B>,
        inbound: Inbound,
        ticket: Ticket,
        report: Option<CallReport>,
    ) -> ResponseFuture<S, http::Request<B>>
    where
        S: Service<http::Request<B>> + Clone,
        B: http_body::Body + Send + Unpin + 'static,
    {
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        let cut_at = inbound.deadline.map(|d| self.shared.gate.cut_at(d));
        let events = QueuedEvents::new(&self.shared.events, request.uri(), inbound.class);
        let request = Discard::new(request, &self.shared.drains);
        let Inbound { context, scope, .. } = inbound;
        ResponseFuture::queued(context, scope, ticket, ready, request, events, report)
            .cut_at(cut_at)
    }

    /// When an admitted call with a deadline is cut (see `ResponseFuture`, `ShedBody`), and
    /// what tells of it.
    fn cut(&self, inbound: &Inbound, uri: &http::Uri) -> Option<(Instant, QueuedEvents)> {
        let at = self.shared.gate.cut_at(inbound.deadline?);
        Some((
            at,
            QueuedEvents::new(&self.shared.events, uri, inbound.class),
        ))
    }
}
