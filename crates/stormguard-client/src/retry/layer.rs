use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use stormguard_core::AdaptiveThrottle;
use stormguard_core::LayerName;
use stormguard_core::RetryController;
use stormguard_core::{ClientConfig, ConfigError};
use tower_layer::Layer;

use super::events::LayerEvents;
use super::replay::DEFAULT_REPLAY_LIMIT;
use super::service::Retry;
use super::shared::Shared;
use super::stats::RetryStats;

/// Wraps a tonic channel (any `Clone` service of `http::Request<tonic::body::Body>`) in a
/// [`Retry`] service.
///
/// One layer is one dependency's retry policy: a single [`RetryController`] (method table,
/// budget, breaker) and a single set of counters, shared by every service the layer builds
/// and by every clone of those services.
///
/// A layer has a name, which its logs and metrics carry (`stormguard.layer`): the one given
/// to [`with_name`](Self::with_name), else the service (`pkg.Svc`) of its first call. Name
/// layers that call the same service (or a channel to several services), so that their
/// series and events stay apart.
#[derive(Clone)]
pub struct RetryLayer {
    pub(super) shared: Arc<Shared>,
}

impl RetryLayer {
    /// A layer that decides every retry with `controller`.
    ///
    /// Request bodies are buffered for replay up to [`DEFAULT_REPLAY_LIMIT`] bytes; calls
    /// without a deadline of their own have none (see [`with_default_timeout`](Self::with_default_timeout)).
    pub fn new(controller: impl Into<RetryController>) -> Self {
        let controller = controller.into();
        let events = Arc::new(LayerEvents::new(Arc::default(), &controller));
        RetryLayer {
            shared: Arc::new(Shared {
                controller,
                stats: RetryStats::new(),
                replay_limit: DEFAULT_REPLAY_LIMIT,
                default_timeout: None,
                per_attempt_timeout: None,
                over_replicas: false,
                budget_key: None,
                stamps: Arc::default(),
                events,
                throttle: None,
                #[cfg(feature = "opentelemetry")]
                meter: None,
                #[cfg(feature = "opentelemetry")]
                target: None,
                #[cfg(feature = "opentelemetry")]
                metrics: std::sync::OnceLock::new(),
            }),
        }
    }

    /// A layer for `config` (validated first), its random draws seeded by
    /// [`ClientConfig::seed`](stormguard_core::ClientConfig::seed) (`None`: a fresh seed).
    ///
    /// ```
    /// use stormguard_client::RetryLayer;
    /// use stormguard_client::ClientConfig;
    ///
    /// let layer = RetryLayer::from_config(&ClientConfig::default()).unwrap();
    /// let json = r#"{"methodConfig":[{"name":[{}],"retryPolicy":{"maxAttempts":2,
    ///   "initialBackoff":"0.1s","maxBackoff":"1s","backoffMultiplier":2,
    ///   "retryableStatusCodes":["UNAVAILABLE"]}}]}"#;
    /// let from_grpc = RetryLayer::from_config(&ClientConfig::from_service_config_json(json).unwrap()).unwrap();
    /// # let _ = (layer, from_grpc);
    /// ```
    pub fn from_config(config: &ClientConfig) -> Result<Self, ConfigError> {
        // One seed for every draw: the config's (a reproducible run), or a fresh one.
        let seed = config.seed.unwrap_or_else(|| fastrand::u64(..));
        let seeded = config.clone().with_seed(seed);
        let mut layer = RetryController::from_config(&seeded).map(Self::new)?;
        if let Some(throttle) = &config.adaptive_throttle {
            // Its own stream of draws, apart from the backoff's and the breaker's.
            let throttle = AdaptiveThrottle::new(throttle.clone(), seed ^ 0xAD_A971_7E00)?;
            layer = layer.with_adaptive_throttle(throttle);
        }
        warn_of_notices(config);
        Ok(layer)
    }

    /// Buffer up to `bytes` of each request body so that it can be replayed. A call whose
    /// body is larger is sent once and not retried (counted as `replay_limit`). Memory held
    /// for replay is at most `bytes` per call in flight.
    pub fn with_replay_limit(mut self, bytes: usize) -> Self {
        Arc::make_mut(&mut self.shared).replay_limit = bytes;
        self
    }

    /// Give calls that carry no deadline (no `grpc-timeout` from `Request::set_timeout`,
    /// none in the [`CallContext`](crate::context::CallContext), and no limit for their
    /// method in the service config, see
    /// [`MethodTable::timeout`](stormguard_core::MethodTable::timeout)) this one.
    /// Retries then stop when it runs out, and each attempt tells the server how long it
    /// has.
    pub fn with_default_timeout(mut self, timeout: Duration) -> Self {
        Arc::make_mut(&mut self.shared).default_timeout = Some(timeout);
        self
    }

    /// Limit each attempt of methods whose [`RetryPolicy`] sets no
    /// [`per_attempt_timeout`](stormguard_core::RetryPolicy::per_attempt_timeout)
    /// (and of methods with no policy) to `timeout`. The policy's own value, when set, wins.
    ///
    /// Each attempt carries the smaller of this and what is left of the call's deadline as
    /// `grpc-timeout`. An attempt that runs out of it is abandoned (its stream is reset) and
    /// counted as a failure of the dependency, then retried under the usual rules; when the
    /// layer does not retry it, the caller gets `DEADLINE_EXCEEDED` marked
    /// `grpc-retry-pushback-ms: -1`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard_client::RetryLayer;
    /// use stormguard_client::ClientConfig;
    ///
    /// let layer = RetryLayer::from_config(&ClientConfig::default())
    ///     .unwrap()
    ///     .with_default_timeout(Duration::from_millis(150))
    ///     .with_per_attempt_timeout(Duration::from_millis(50));
    /// # let _ = layer;
    /// ```
    ///
    /// [`RetryPolicy`]: stormguard_core::RetryPolicy
    pub fn with_per_attempt_timeout(mut self, timeout: Duration) -> Self {
        Arc::make_mut(&mut self.shared).per_attempt_timeout = Some(timeout);
        self
    }

    /// Refuse calls locally while the dependency refuses most of them for overload: the SRE
    /// book's client-side throttling (see
    /// [`AdaptiveThrottle`](crate::AdaptiveThrottle) for the formula and its
    /// settings). Off by default; a config's `adaptive_throttle` turns it on in
    /// [`from_config`](Self::from_config).
    ///
    /// One throttle per layer (a layer is one dependency), shared by every service the
    /// layer builds and their clones. Before each call's first attempt the layer asks it,
    /// with the class of the call's `stormguard-criticality` header (a
    /// [`CriticalityLayer`](crate::CriticalityLayer) outside this layer stamps it); a call
    /// refused is answered at once with `UNAVAILABLE` marked `grpc-retry-pushback-ms: -1`
    /// and never reaches the inner service, counted in
    /// [`RetrySnapshot::throttled`](crate::RetrySnapshot::throttled) by class. Every
    /// attempt's answer, retries and hedges included, is recorded in it. A call the
    /// throttle lets through costs a lock and an atomic increment, no allocation.
    ///
    /// ```
    /// use stormguard_client::RetryLayer;
    /// use stormguard_client::{AdaptiveThrottle, AdaptiveThrottleConfig};
    /// use stormguard_client::ClientConfig;
    ///
    /// let throttle = AdaptiveThrottle::new(AdaptiveThrottleConfig::default(), 7)?;
    /// let layer = RetryLayer::from_config(&ClientConfig::default())?
    ///     .with_adaptive_throttle(throttle);
    /// assert!(layer.adaptive_throttle().is_some());
    /// # Ok::<(), stormguard_client::ConfigError>(())
    /// ```
    pub fn with_adaptive_throttle(mut self, throttle: AdaptiveThrottle) -> Self {
        Arc::make_mut(&mut self.shared).throttle = Some(throttle);
        self
    }

    /// The layer's adaptive throttle, if it has one.
    pub fn adaptive_throttle(&self) -> Option<&AdaptiveThrottle> {
        self.shared.throttle.as_ref()
    }

    /// Count into `stats` instead of the layer's own counters (to share counters across
    /// layers, or to keep a handle made before the layer). Before or after `with_meter`
    /// (feature `opentelemetry`): the instruments read these counters either way.
    pub fn with_stats(mut self, stats: RetryStats) -> Self {
        self.configure().stats = stats;
        self
    }

    /// Name this layer `name` in its logs and metrics (the `stormguard.layer` attribute)
    /// instead of the service of its first call.
    ///
    /// ```
    /// use stormguard_client::RetryLayer;
    /// use stormguard_client::ClientConfig;
    ///
    /// let layer = RetryLayer::from_config(&ClientConfig::default()).unwrap().with_name("inventory-eu");
    /// assert_eq!(layer.name(), Some("inventory-eu"));
    /// ```
    pub fn with_name(mut self, name: impl Into<Arc<str>>) -> Self {
        let shared = self.configure();
        let name = Arc::new(LayerName::named(name));
        shared.events = Arc::new(LayerEvents::new(name, &shared.controller));
        self
    }

    /// For a layer over [`Replicas`](crate::replicas::Replicas): each call carries a
    /// [`Route`](crate::replicas::Route) in its attempts' extensions, so that the channel
    /// sends a retry to a replica the call has not tried, and the layer charges each retry
    /// to the replica whose attempt failed (its own
    /// [`KeyedBudgets`](stormguard_core::KeyedBudgets) account, beside the shared
    /// budget): a failing replica cannot spend the retries the healthy ones earned. Costs
    /// two allocations per call (the route and its entry in the extensions); over a
    /// channel that is not endpoint-aware it changes nothing else.
    ///
    /// ```
    /// use stormguard_client::RetryLayer;
    /// use stormguard_client::ClientConfig;
    ///
    /// let layer = RetryLayer::from_config(&ClientConfig::default()).unwrap().over_replicas();
    /// # let _ = layer;
    /// ```
    pub fn over_replicas(mut self) -> Self {
        self.configure().over_replicas = true;
        self
    }

    /// Charges each call's retries to a key taken from its request (a shard that may go
    /// bad: a method, or a metadata value that routes to a shard), beside the shared
    /// budget: a key whose calls keep failing spends only what its own successes earned
    /// (plus the floor), and calls to the other keys keep their retries. `key` returns
    /// `None` for calls that only the shared budget pays for. The accounts are those of the
    /// controller's [`KeyedBudgets`](stormguard_core::KeyedBudgets), bounded in how
    /// many keys they track (the key used longest ago is forgotten first), so a key from
    /// metadata cannot grow memory without bound. A controller built from a config with
    /// stormguard's budget has them; over [`over_replicas`](Self::over_replicas) the
    /// request's key wins over the replica's.
    ///
    /// ```
    /// use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    /// use stormguard_client::RetryLayer;
    /// use stormguard_client::ClientConfig;
    ///
    /// // One account per tenant shard, read from the `x-shard` metadata.
    /// let layer = RetryLayer::from_config(&ClientConfig::default()).unwrap().budget_key(|request| {
    ///     let shard = request.headers().get("x-shard")?;
    ///     Some(BuildHasherDefault::<DefaultHasher>::default().hash_one(shard.as_bytes()))
    /// });
    /// # let _ = layer;
    /// ```
    pub fn budget_key(
        mut self,
        key: impl Fn(&http::Request<tonic::body::Body>) -> Option<u64> + Send + Sync + 'static,
    ) -> Self {
        self.configure().budget_key = Some(Arc::new(key));
        self
    }

    /// Refuse retries and hedges while the dependency's load reports (gRPC ORCA, the
    /// `endpoint-load-metrics-bin` trailer a stormguard server sends with
    /// `ShedLayer::with_load_reports`) say it is saturated, before it starts shedding
    /// (counted as `saturated`; see [`stormguard_core::LoadReport`]). The config key is
    /// `retry.load_reports`. Over [`over_replicas`](Self::over_replicas) saturation is per
    /// replica: a retry is refused only while every replica heard from is saturated, and
    /// the channel weights each replica by its reports either way.
    ///
    /// ```
    /// use stormguard_client::RetryLayer;
    /// use stormguard_client::ClientConfig;
    /// use stormguard_client::SaturationConfig;
    ///
    /// let layer = RetryLayer::from_config(&ClientConfig::default())?
    ///     .with_load_reports(SaturationConfig { utilization: 0.9, ..SaturationConfig::default() })?;
    /// assert!(layer.controller().saturation().is_some());
    /// # Ok::<(), stormguard_client::ConfigError>(())
    /// ```
    pub fn with_load_reports(
        mut self,
        config: stormguard_core::SaturationConfig,
    ) -> Result<Self, ConfigError> {
        let saturation = Arc::new(stormguard_core::Saturation::new(config)?);
        let shared = self.configure();
        shared.controller = shared.controller.clone().with_saturation(saturation);
        Ok(self)
    }

    /// The layer's name: the one given to [`with_name`](Self::with_name), else the service
    /// of its first call (`None` before it).
    pub fn name(&self) -> Option<&str> {
        self.shared.events.name().get().map(|n| &**n)
    }

    /// Record this layer's metrics into `meter` (feature `opentelemetry`); the
    /// [`metrics`](crate::retry::metrics) module lists them. Nothing global is read or set: the
    /// application owns the meter provider and its exporters. The instruments are
    /// registered when the layer builds its first service, so this goes before or after
    /// [`with_stats`](Self::with_stats) and [`with_name`](Self::with_name) alike.
    ///
    /// ```
    /// use opentelemetry::metrics::MeterProvider as _;
    /// use stormguard_client::RetryLayer;
    /// use stormguard_client::ClientConfig;
    ///
    /// # fn provider() -> impl opentelemetry::metrics::MeterProvider { opentelemetry::metrics::noop::NoopMeterProvider::new() }
    /// let meter = provider().meter("checkout");
    /// let layer = RetryLayer::from_config(&ClientConfig::default())
    ///     .unwrap()
    ///     .with_meter(&meter)
    ///     .with_name("inventory");
    /// # let _ = layer;
    /// ```
    #[cfg(feature = "opentelemetry")]
    pub fn with_meter(mut self, meter: &opentelemetry::metrics::Meter) -> Self {
        self.configure().meter = Some(meter.clone());
        self
    }

    /// The channel's target (`dns:///inventory.internal:443`), which the layer cannot see:
    /// the `grpc.target` attribute of gRFC A96's per-call retry histograms
    /// (`grpc.client.call.retries` and the others the [`metrics`](crate::retry::metrics)
    /// module lists; feature `opentelemetry`). Without it they carry the layer's name
    /// (see [`with_name`](Self::with_name)) as their `grpc.target`.
    ///
    /// ```
    /// use opentelemetry::metrics::MeterProvider as _;
    /// use stormguard_client::RetryLayer;
    /// use stormguard_client::ClientConfig;
    ///
    /// # fn provider() -> impl opentelemetry::metrics::MeterProvider { opentelemetry::metrics::noop::NoopMeterProvider::new() }
    /// let meter = provider().meter("checkout");
    /// let layer = RetryLayer::from_config(&ClientConfig::default())
    ///     .unwrap()
    ///     .with_meter(&meter)
    ///     .with_target("dns:///inventory.internal:443");
    /// # let _ = layer;
    /// ```
    #[cfg(feature = "opentelemetry")]
    pub fn with_target(mut self, target: impl Into<Arc<str>>) -> Self {
        self.configure().target = Some(target.into());
        self
    }

    /// The layer's configuration, to change. Changing what the instruments read (counters,
    /// name, meter) after a service was built makes a new layer: its instruments are
    /// registered anew when it builds its own first service.
    fn configure(&mut self) -> &mut Shared {
        let shared = Arc::make_mut(&mut self.shared);
        #[cfg(feature = "opentelemetry")]
        {
            shared.metrics = std::sync::OnceLock::new();
        }
        shared
    }

    /// The counters of this layer.
    pub fn stats(&self) -> RetryStats {
        self.shared.stats.clone()
    }

    /// The controller that decides retries (its budget and breaker are shared by all calls).
    pub fn controller(&self) -> &RetryController {
        &self.shared.controller
    }
}

/// One WARN event when a layer is built from a config that says something that will not
/// happen ([`ClientConfig::notices`]): service-config fields that are not applied, or
/// retries configured under which no method's answers can be retried (naming the setting
/// that would enable them). A bad deploy should fail loudly, but gRPC ignores fields it
/// does not know, so the layer reports them instead of refusing the config.
fn warn_of_notices(config: &ClientConfig) {
    let notices = config.notices();
    if notices.is_empty() {
        return;
    }
    let list = notices
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    tracing::warn!(
        config.notices = notices.len(),
        config.notice = %list,
        "stormguard: the retry config has settings that will not take effect"
    );
}

impl fmt::Debug for RetryLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryLayer")
            .field("name", &self.name())
            .field("controller", &self.shared.controller)
            .field("replay_limit", &self.shared.replay_limit)
            .field("default_timeout", &self.shared.default_timeout)
            .field("per_attempt_timeout", &self.shared.per_attempt_timeout)
            .field("adaptive_throttle", &self.shared.throttle)
            .finish()
    }
}

impl<S: Clone> Layer<S> for RetryLayer {
    type Service = Retry<S>;

    fn layer(&self, inner: S) -> Retry<S> {
        self.shared.register_metrics();
        Retry::new(inner, self.shared.clone())
    }
}
