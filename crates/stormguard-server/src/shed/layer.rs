use std::fmt;
use std::sync::Arc;

use stormguard_core::ConfigError;
use stormguard_core::CriticalityTable;
use stormguard_core::LayerName;
use stormguard_core::{AdmissionConfig, AdmissionController};
use tower_layer::Layer;

use super::Shared;
use super::events::ShedEvents;
use super::exempt::NeverShed;
use super::gate::Gate;
use super::load::LoadReporter;
use super::service::ShedService;
use super::shutdown::ShutdownHandle;
use super::stats::ShedStats;

/// Puts services behind one admission queue that sheds retries before first attempts.
///
/// One layer is one queue: every service it wraps (on a tonic server, the whole
/// router) shares the same workers, queue and counters. Cloning the layer shares them
/// too; build a second layer for a second queue.
///
/// A layer has a name, which its logs and metrics carry (`stormguard.layer`): the one given
/// to [`with_name`](Self::with_name), else the service (`pkg.Svc`) of the first call it
/// may shed (health checks and other calls that are never shed do not name it). Name a
/// layer that guards several services.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use stormguard_server::AdmissionConfig;
/// use stormguard_server::ShedLayer;
///
/// // The worker limit is learned from latency: nothing to size.
/// let layer = ShedLayer::from_config(&AdmissionConfig::default())?;
/// let stats = layer.stats();
/// tonic::transport::Server::builder()
///     .layer(layer)
///     // .add_service(InventoryServer::new(svc))
/// #   .add_routes(tonic::service::Routes::default())
///     .serve("127.0.0.1:50051".parse()?)
///     .await?;
/// println!("{:?}", stats.snapshot());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ShedLayer {
    shared: Shared,
    /// The health service a shutdown sets `NOT_SERVING`: one cell shared by the layer, its
    /// clones and every [`ShutdownHandle`] taken from them, so a handle taken before
    /// [`with_readiness`](Self::with_readiness) still sees it.
    #[cfg(feature = "health")]
    readiness: super::health::ReadinessCell,
    #[cfg(feature = "opentelemetry")]
    meter: Option<opentelemetry::metrics::Meter>,
    /// The queue's instruments, registered on `meter` when the layer first wraps a
    /// service, once per queue (a meter keeps every callback registered on it).
    #[cfg(feature = "opentelemetry")]
    metrics: Arc<std::sync::OnceLock<crate::shed::metrics::ServerMetrics>>,
    /// The adaptive limit's bounds (`min_limit`, `max_limit`), exported beside the limit.
    #[cfg(feature = "opentelemetry")]
    limit_bounds: Option<(usize, usize)>,
}

impl ShedLayer {
    /// A layer with its own queue, for a valid `config` (checked by
    /// [`AdmissionController::new`], whose error names the first bad field). One config
    /// builds as many layers as it is given to, each with its own queue.
    pub fn from_config(config: &AdmissionConfig) -> Result<Self, ConfigError> {
        AdmissionController::new(config.clone()).map(Self::new)
    }

    /// A layer with its own queue, driven by `policy` (already validated).
    pub fn new(policy: AdmissionController) -> Self {
        #[cfg(feature = "opentelemetry")]
        let limit_bounds = match &policy.config().workers {
            stormguard_core::WorkerLimit::Adaptive(a) => Some((a.min_limit, a.max_limit)),
            stormguard_core::WorkerLimit::Fixed(_) => None,
        };
        let gate = Arc::new(Gate::new(policy));
        ShedLayer {
            shared: Shared {
                events: Arc::new(ShedEvents::new(Arc::default(), Arc::clone(&gate))),
                gate,
                criticality: Arc::new(CriticalityTable::default()),
                never_shed: Arc::default(),
                bypassed: Arc::default(),
                drains: Arc::default(),
                retry_allowance: None,
                load: None,
            },
            #[cfg(feature = "health")]
            readiness: Arc::default(),
            #[cfg(feature = "opentelemetry")]
            meter: None,
            #[cfg(feature = "opentelemetry")]
            metrics: Arc::default(),
            #[cfg(feature = "opentelemetry")]
            limit_bounds,
        }
    }

    /// Name this layer `name` in its logs and metrics (the `stormguard.layer` attribute)
    /// instead of the service of its first call. Give it before the layer wraps a service:
    /// the metrics take the name the layer has then.
    ///
    /// ```
    /// use stormguard_server::AdmissionConfig;
    /// use stormguard_server::ShedLayer;
    ///
    /// let layer = ShedLayer::from_config(&AdmissionConfig::default())?.with_name("inventory");
    /// assert_eq!(layer.name(), Some("inventory"));
    /// # Ok::<(), stormguard_server::ConfigError>(())
    /// ```
    pub fn with_name(mut self, name: impl Into<Arc<str>>) -> Self {
        let name = Arc::new(LayerName::named(name));
        self.shared.events = Arc::new(ShedEvents::new(name, Arc::clone(&self.shared.gate)));
        self
    }

    /// The layer's name: the one given to [`with_name`](Self::with_name), else the service
    /// of its first call that could be shed (`None` before it).
    pub fn name(&self) -> Option<&str> {
        self.shared.events.name().get().map(|n| &**n)
    }

    /// The highest criticality a peer may claim, per method (the
    /// `stormguard-criticality` request header). A call's class is the lower of its
    /// claim and `table`'s class for its path; a missing or malformed claim is
    /// `default`. Without this, every method allows at most `default`: a peer's
    /// `critical` is read as `default`, and `sheddable` is honoured.
    ///
    /// ```
    /// use stormguard_server::AdmissionConfig;
    /// use stormguard_server::{Criticality, CriticalityTable};
    /// use stormguard_server::ShedLayer;
    ///
    /// let table = CriticalityTable::default()
    ///     .with_method("/shop.Cart/Checkout", Criticality::Critical)?
    ///     .with_method("/shop.Reports/", Criticality::Sheddable)?;
    /// let layer = ShedLayer::from_config(&AdmissionConfig::default())?.with_criticality(table);
    /// # Ok::<(), stormguard_server::ConfigError>(())
    /// ```
    pub fn with_criticality(mut self, table: CriticalityTable) -> Self {
        self.shared.criticality = Arc::new(table);
        self
    }

    /// Never sheds calls to `entries`, each a whole service (`package.Service`) or one
    /// method (`/package.Service/Method`), on top of the health service (see
    /// [`exempt`](crate::shed::exempt)). Such calls run at once, without a worker.
    ///
    /// ```
    /// use stormguard_server::AdmissionConfig;
    /// use stormguard_server::ShedLayer;
    ///
    /// let layer = ShedLayer::from_config(&AdmissionConfig::default())?
    ///     .never_shed(["my.pkg.Admin", "/my.pkg.Inventory/Ping"])?;
    /// assert!(ShedLayer::from_config(&AdmissionConfig::default())?
    ///     .never_shed(["Inventory/Ping"])
    ///     .is_err());
    /// # Ok::<(), stormguard_server::ConfigError>(())
    /// ```
    pub fn never_shed<I>(self, entries: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let mut never = NeverShed::clone(&self.shared.never_shed);
        for entry in entries {
            never.add(entry.as_ref())?;
        }
        Ok(self.with_never_shed(never))
    }

    /// Never sheds calls whose path (`/package.Service/Method`) `predicate` accepts, on
    /// top of the named ones. Called again, it replaces the previous predicate.
    ///
    /// ```
    /// use stormguard_server::AdmissionConfig;
    /// use stormguard_server::ShedLayer;
    ///
    /// let layer = ShedLayer::from_config(&AdmissionConfig::default())?
    ///     .never_shed_if(|path| path.ends_with("/Ping"));
    /// # Ok::<(), stormguard_server::ConfigError>(())
    /// ```
    pub fn never_shed_if(self, predicate: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        let mut never = NeverShed::clone(&self.shared.never_shed);
        never.set_predicate(Arc::new(predicate));
        self.with_never_shed(never)
    }

    /// Treats health checks (`grpc.health.v1.Health`) like any other call: queued,
    /// and shed under overload. Off by default, for the reasons in
    /// [`exempt`](crate::shed::exempt).
    pub fn shed_health_checks(self) -> Self {
        let mut never = NeverShed::clone(&self.shared.never_shed);
        never.set_health(false);
        self.with_never_shed(never)
    }

    /// Give each inbound request an allowance of at most `retries` retries, shared by every
    /// call its handler makes through a client `RetryLayer` (off by default).
    ///
    /// A caller that sends `x-retry-budget: N` lowers the request's allowance to `N`; it
    /// can never raise it above `retries`, and a malformed, negative or huge value (above
    /// [`MAX_ALLOWANCE`]) is ignored. Each retry a client layer makes inside the
    /// request spends one, once every other rule (budget included) allowed it; when none
    /// is left the retry is refused (counted as `allowance`) and the failure goes up marked
    /// "do not retry". Every outgoing attempt carries what is left as `x-retry-budget`, so
    /// the next service (with this set too) continues the count: a logical operation makes
    /// a bounded number of retries across all its services.
    ///
    /// ```
    /// use stormguard_server::AdmissionConfig;
    /// use stormguard_server::ShedLayer;
    ///
    /// let layer = ShedLayer::from_config(&AdmissionConfig::default())
    ///     .unwrap()
    ///     .with_retry_allowance(2);
    /// # let _ = layer;
    /// ```
    ///
    /// [`MAX_ALLOWANCE`]: stormguard_core::wire::MAX_ALLOWANCE
    pub fn with_retry_allowance(mut self, retries: u32) -> Self {
        self.shared.retry_allowance = Some(retries);
        self
    }

    /// Attach a load report (gRPC ORCA, gRFC A51) to every answer: an
    /// `xds.data.orca.v3.OrcaLoadReport` in the `endpoint-load-metrics-bin` trailer, or in
    /// the headers of a trailers-only answer (the layer's own shed, expired and
    /// shutting-down answers included). Off by default; the config key is
    /// `admission.load_reports` ([`ShedSettings`](stormguard_core::ShedSettings)).
    ///
    /// The report says: `application_utilization` = calls running / the current worker
    /// limit, `rps_fractional` = calls that arrived per second, `eps` = calls shed per
    /// second, and the named metrics `queue_depth` (calls waiting) and `time_queued_ms`
    /// (how long this call waited; both left out at zero). On the wire it is the base64 of
    /// the protobuf, a few dozen bytes (the load report tests pin its size). A client's
    /// `RetryLayer` built with load reports refuses retries while they say the server is
    /// saturated, and the endpoint-aware channel weights replicas by them (see
    /// [`stormguard_core::LoadReport`]).
    ///
    /// ```
    /// use stormguard_server::AdmissionConfig;
    /// use stormguard_server::ShedLayer;
    ///
    /// let layer = ShedLayer::from_config(&AdmissionConfig::default())?.with_load_reports();
    /// assert!(layer.sends_load_reports());
    /// # Ok::<(), stormguard_server::ConfigError>(())
    /// ```
    pub fn with_load_reports(mut self) -> Self {
        self.shared.load = Some(Arc::new(LoadReporter::new()));
        self
    }

    /// Hands the layer the server's health service (feature `health`): when the shutdown
    /// begins ([`ShutdownHandle::begin`]), `service` (a name the health service answers
    /// for; `""` is the whole server's) is set `NOT_SERVING`, so that the readiness probe
    /// fails and the pod leaves the Service's endpoints while the queue answers with
    /// pushback; clients that watch it (gRFC A17's client-side health checks) stop sending
    /// it attempts. Then the service's open `Watch` streams end, so that they do not hold
    /// tonic's graceful shutdown, and the name is no longer known (answered `NOT_FOUND`).
    ///
    /// It may come before or after [`shutdown_handle`](Self::shutdown_handle): the layer,
    /// its clones and every handle taken from them share one readiness, so a handle taken
    /// earlier sets the service given here. Given twice, the last one is set.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stormguard_server::ConfigError> {
    /// use stormguard_server::AdmissionConfig;
    /// use stormguard_server::ShedLayer;
    ///
    /// let (reporter, health) = tonic_health::server::health_reporter();
    /// let layer = ShedLayer::from_config(&AdmissionConfig::default())?.with_readiness(reporter, "");
    /// let shutdown = layer.shutdown_handle();
    /// // Server::builder().layer(layer).add_service(health).add_service(...)
    /// # let _ = health;
    /// shutdown.begin(); // the health service says NOT_SERVING from now on
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "health")]
    pub fn with_readiness(
        self,
        reporter: tonic_health::server::HealthReporter,
        service: impl Into<String>,
    ) -> Self {
        super::health::set(
            &self.readiness,
            super::health::Readiness::new(reporter, service.into()),
        );
        self
    }

    /// Whether answers carry a load report ([`with_load_reports`](Self::with_load_reports)).
    pub fn sends_load_reports(&self) -> bool {
        self.shared.load.is_some()
    }

    /// A layer for the whole `admission` document: its queue, and load reports when
    /// `admission.load_reports` is `true`.
    ///
    /// ```
    /// use stormguard_server::ShedSettings;
    /// use stormguard_server::ShedLayer;
    ///
    /// let settings = ShedSettings::from_json(r#"{"admission": {"load_reports": true}}"#)?;
    /// assert!(ShedLayer::from_settings(&settings)?.sends_load_reports());
    /// # Ok::<(), stormguard_server::ConfigError>(())
    /// ```
    pub fn from_settings(settings: &stormguard_core::ShedSettings) -> Result<Self, ConfigError> {
        let layer = Self::from_config(&settings.admission)?;
        Ok(if settings.load_reports {
            layer.with_load_reports()
        } else {
            layer
        })
    }

    /// Record this layer's metrics into `meter` (feature `opentelemetry`); the
    /// [`metrics`](crate::shed::metrics) module lists them. Nothing global is read or set: the
    /// application owns the meter provider and its exporters. The instruments are
    /// registered when the layer first wraps a service, so this goes before or after
    /// [`with_name`](Self::with_name) alike; one queue registers them once.
    ///
    /// ```
    /// use opentelemetry::metrics::MeterProvider as _;
    /// use stormguard_server::AdmissionConfig;
    /// use stormguard_server::ShedLayer;
    ///
    /// # fn provider() -> impl opentelemetry::metrics::MeterProvider { opentelemetry::metrics::noop::NoopMeterProvider::new() }
    /// let meter = provider().meter("inventory");
    /// let layer = ShedLayer::from_config(&AdmissionConfig::default()).unwrap().with_meter(&meter);
    /// # let _ = layer;
    /// ```
    #[cfg(feature = "opentelemetry")]
    pub fn with_meter(mut self, meter: &opentelemetry::metrics::Meter) -> Self {
        self.meter = Some(meter.clone());
        self
    }

    /// Registers the queue's instruments, once, if the layer has a meter.
    fn register_metrics(&self) {
        #[cfg(feature = "opentelemetry")]
        if let Some(meter) = &self.meter {
            self.metrics.get_or_init(|| {
                crate::shed::metrics::ServerMetrics::register(
                    meter,
                    &self.shared.gate,
                    self.shared.events.name(),
                    self.limit_bounds,
                )
            });
        }
    }

    fn with_never_shed(mut self, never: NeverShed) -> Self {
        self.shared.never_shed = Arc::new(never);
        self
    }

    /// A handle that shuts this layer's queue down gracefully (see [`ShutdownHandle`]):
    /// take it before handing the layer to the server builder, before or after
    /// `with_readiness` (the `health` feature) alike.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle::new(
            Arc::clone(&self.shared.gate),
            #[cfg(feature = "health")]
            Arc::clone(&self.readiness),
        )
    }

    /// The queue's counters.
    pub fn stats(&self) -> ShedStats {
        self.shared.stats()
    }
}

impl<S> Layer<S> for ShedLayer {
    type Service = ShedService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        self.register_metrics();
        ShedService::new(inner, self.shared.clone())
    }
}

impl fmt::Debug for ShedLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShedLayer")
            .field("name", &self.name())
            .field("queue", &self.shared.gate.counters().snapshot())
            .field("never_shed", &self.shared.never_shed)
            .finish()
    }
}
