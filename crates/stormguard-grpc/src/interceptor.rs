//! [`RetryInterceptor`]: the settings every call shares, and the start of a call.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use grpc::client::interceptor::Intercept;
use grpc::client::{CallOptions, Invoke};
use grpc::core::RequestHeaders;
use stormguard_core::context::CallContext;
use stormguard_core::{
    CallTimes, ClientConfig, Code, ConfigError, Instant, LayerName, Refusal, RetryController,
};

use crate::metrics::CallMetrics;
use crate::recv::RetryRecvStream;
use crate::send::{Log, RetrySendStream};
use crate::stats::InterceptorStats;
use crate::wire;

/// The request bytes a call keeps so that it can be sent again (64 KiB, as the tonic
/// layer's default): a request larger than this is sent once and not retried.
pub const DEFAULT_REPLAY_LIMIT: usize = 64 * 1024;

/// stormguard's retry decision as a client interceptor for the `grpc` crate.
///
/// Attach it to a channel with `InvokeExt::with_interceptor`; every call through the pair
/// is decided by the interceptor's [`RetryController`]: the same engine, budget and
/// breaker as stormguard's tonic `RetryLayer` (give both the same controller and they
/// share them). Clones share the controller and the [`stats`](Self::stats).
///
/// ```no_run
/// use std::sync::Arc;
/// use grpc::client::{Channel, ChannelOptions};
/// use grpc::client::interceptor::InvokeExt;
/// use grpc::credentials::LocalChannelCredentials;
/// use stormguard_grpc::{ClientConfig, RetryInterceptor};
///
/// # fn demo() -> Result<(), stormguard_grpc::ConfigError> {
/// let channel = Channel::new(
///     "dns:///127.0.0.1:50051",
///     Arc::new(LocalChannelCredentials::new()),
///     ChannelOptions::default(),
/// );
/// let interceptor = RetryInterceptor::from_config(&ClientConfig::default())?
///     .with_default_timeout(std::time::Duration::from_millis(500));
/// let stats = interceptor.stats();
/// let channel = channel.with_interceptor(interceptor);
/// // Generated clients (and `Invoke::invoke`) use `channel` as they used the bare one.
/// # let _ = (channel, stats);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RetryInterceptor {
    settings: Arc<Settings>,
}

/// What every call of an interceptor shares.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) controller: RetryController,
    pub(crate) stats: InterceptorStats,
    pub(crate) replay_limit: usize,
    pub(crate) default_timeout: Option<Duration>,
    pub(crate) per_attempt_timeout: Option<Duration>,
    /// The interceptor's name in its logs and metrics (`stormguard.layer`).
    pub(crate) name: Arc<LayerName>,
    #[cfg(feature = "opentelemetry")]
    pub(crate) meter: Option<opentelemetry::metrics::Meter>,
    /// The `grpc.target` of gRFC A96's histograms (`with_target`).
    #[cfg(feature = "opentelemetry")]
    pub(crate) target: Option<Arc<str>>,
    /// The instruments, registered on `meter` when the interceptor starts its first call:
    /// by then `with_meter`, `with_name` and `with_target` have all been applied, in
    /// whatever order.
    #[cfg(feature = "opentelemetry")]
    pub(crate) metrics: std::sync::OnceLock<Arc<crate::metrics::InterceptorMetrics>>,
}

impl Settings {
    /// The metrics of a new call to `path` (none without a meter).
    fn call_metrics(&self, path: &str) -> CallMetrics {
        #[cfg(feature = "opentelemetry")]
        if let Some(meter) = &self.meter {
            let metrics = self.metrics.get_or_init(|| {
                Arc::new(crate::metrics::InterceptorMetrics::register(
                    meter,
                    &self.stats,
                    &self.controller,
                    &self.name,
                    self.target.clone(),
                ))
            });
            return metrics.call(path);
        }
        let _ = path;
        CallMetrics::none()
    }
}

impl fmt::Debug for RetryInterceptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &*self.settings;
        f.debug_struct("RetryInterceptor")
            .field("controller", &s.controller)
            .field("replay_limit", &s.replay_limit)
            .field("default_timeout", &s.default_timeout)
            .field("per_attempt_timeout", &s.per_attempt_timeout)
            .finish_non_exhaustive()
    }
}

impl RetryInterceptor {
    /// An interceptor that decides every retry with `controller`.
    ///
    /// Requests are kept for replay up to [`DEFAULT_REPLAY_LIMIT`] bytes; calls without a
    /// deadline of their own have none (see [`with_default_timeout`](Self::with_default_timeout)).
    pub fn new(controller: impl Into<RetryController>) -> Self {
        RetryInterceptor {
            settings: Arc::new(Settings {
                controller: controller.into(),
                stats: InterceptorStats::default(),
                replay_limit: DEFAULT_REPLAY_LIMIT,
                default_timeout: None,
                per_attempt_timeout: None,
                name: Arc::default(),
                #[cfg(feature = "opentelemetry")]
                meter: None,
                #[cfg(feature = "opentelemetry")]
                target: None,
                #[cfg(feature = "opentelemetry")]
                metrics: std::sync::OnceLock::new(),
            }),
        }
    }

    /// An interceptor for `config` (validated first), its random draws seeded by
    /// [`ClientConfig::seed`] (`None`: a fresh seed), as the tonic layer's `from_config`.
    ///
    /// ```
    /// use stormguard_grpc::{ClientConfig, RetryInterceptor};
    ///
    /// let json = r#"{"methodConfig":[{"name":[{}],"retryPolicy":{"maxAttempts":3,
    ///   "initialBackoff":"0.05s","maxBackoff":"1s","backoffMultiplier":2,
    ///   "retryableStatusCodes":["UNAVAILABLE"]}}]}"#;
    /// let config = ClientConfig::from_service_config_json(json)?;
    /// let interceptor = RetryInterceptor::from_config(&config)?;
    /// # let _ = interceptor;
    /// # Ok::<(), stormguard_grpc::ConfigError>(())
    /// ```
    pub fn from_config(config: &ClientConfig) -> Result<Self, ConfigError> {
        let seed = config.seed.unwrap_or_else(|| fastrand::u64(..));
        let seeded = config.clone().with_seed(seed);
        RetryController::from_config(&seeded).map(Self::new)
    }

    /// Keep up to `bytes` of each request (its encoded messages) so that it can be sent
    /// again. A call whose request is larger is sent once and not retried (refused as
    /// `replay_limit`).
    pub fn with_replay_limit(mut self, bytes: usize) -> Self {
        Arc::make_mut(&mut self.settings).replay_limit = bytes;
        self
    }

    /// Give calls that carry no deadline (none in their `CallOptions`, no `grpc-timeout` in
    /// their metadata, none in the current [`CallContext`], no limit for their method in
    /// the service config) this one, for all their attempts.
    pub fn with_default_timeout(mut self, timeout: Duration) -> Self {
        Arc::make_mut(&mut self.settings).default_timeout = Some(timeout);
        self
    }

    /// Limit each attempt of methods whose retry policy sets no per-attempt timeout to
    /// `timeout`: an attempt that runs out of it is abandoned (its stream cancelled) and
    /// counted as a failure of the dependency, then retried under the usual rules.
    pub fn with_per_attempt_timeout(mut self, timeout: Duration) -> Self {
        Arc::make_mut(&mut self.settings).per_attempt_timeout = Some(timeout);
        self
    }

    /// Name this interceptor `name` in its logs and metrics (the `stormguard.layer`
    /// attribute) instead of the service of its first call.
    ///
    /// ```
    /// use stormguard_grpc::{ClientConfig, RetryInterceptor};
    ///
    /// let interceptor = RetryInterceptor::from_config(&ClientConfig::default())?.with_name("inventory");
    /// assert_eq!(interceptor.name(), Some("inventory"));
    /// # Ok::<(), stormguard_grpc::ConfigError>(())
    /// ```
    pub fn with_name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.configure().name = Arc::new(LayerName::named(name));
        self
    }

    /// The interceptor's name: the one given to [`with_name`](Self::with_name), else the
    /// service of its first call (`None` before it).
    pub fn name(&self) -> Option<&str> {
        self.settings.name.get().map(|n| &**n)
    }

    /// Record this interceptor's metrics into `meter` (feature `opentelemetry`): the tonic
    /// `RetryLayer`'s instruments, gRFC A96's four per-call retry histograms among them,
    /// registered by the same code; the [`metrics`](crate::metrics) module lists them.
    /// Nothing global is read or set. The instruments are registered when the interceptor
    /// starts its first call, so this goes before or after [`with_name`](Self::with_name)
    /// and [`with_target`](Self::with_target) alike.
    ///
    /// ```
    /// use opentelemetry::metrics::MeterProvider as _;
    /// use stormguard_grpc::{ClientConfig, RetryInterceptor};
    ///
    /// # fn provider() -> impl opentelemetry::metrics::MeterProvider { opentelemetry::metrics::noop::NoopMeterProvider::new() }
    /// let meter = provider().meter("checkout");
    /// let interceptor = RetryInterceptor::from_config(&ClientConfig::default())?
    ///     .with_meter(&meter)
    ///     .with_name("inventory");
    /// # let _ = interceptor;
    /// # Ok::<(), stormguard_grpc::ConfigError>(())
    /// ```
    #[cfg(feature = "opentelemetry")]
    pub fn with_meter(mut self, meter: &opentelemetry::metrics::Meter) -> Self {
        self.configure().meter = Some(meter.clone());
        self
    }

    /// The channel's target (`dns:///inventory.internal:443`), which an interceptor cannot
    /// see: the `grpc.target` attribute of gRFC A96's per-call retry histograms (feature
    /// `opentelemetry`). Without it they carry the interceptor's name (see
    /// [`with_name`](Self::with_name)).
    ///
    /// ```
    /// use opentelemetry::metrics::MeterProvider as _;
    /// use stormguard_grpc::{ClientConfig, RetryInterceptor};
    ///
    /// # fn provider() -> impl opentelemetry::metrics::MeterProvider { opentelemetry::metrics::noop::NoopMeterProvider::new() }
    /// let meter = provider().meter("checkout");
    /// let interceptor = RetryInterceptor::from_config(&ClientConfig::default())?
    ///     .with_meter(&meter)
    ///     .with_target("dns:///inventory.internal:443");
    /// # let _ = interceptor;
    /// # Ok::<(), stormguard_grpc::ConfigError>(())
    /// ```
    #[cfg(feature = "opentelemetry")]
    pub fn with_target(mut self, target: impl Into<Arc<str>>) -> Self {
        self.configure().target = Some(target.into());
        self
    }

    /// The interceptor's settings, to change. Changing what the instruments read (name,
    /// meter, target) after a call made new settings: their instruments are registered
    /// anew when the changed interceptor starts its own first call.
    fn configure(&mut self) -> &mut Settings {
        let settings = Arc::make_mut(&mut self.settings);
        #[cfg(feature = "opentelemetry")]
        {
            settings.metrics = std::sync::OnceLock::new();
        }
        settings
    }

    /// The engine that decides: share it with a tonic `RetryLayer` (`RetryLayer::new`
    /// takes a controller) for one budget and one breaker over both clients.
    pub fn controller(&self) -> &RetryController {
        &self.settings.controller
    }

    /// The interceptor's counters, shared by its clones.
    pub fn stats(&self) -> InterceptorStats {
        self.settings.stats.clone()
    }

    /// Begins a call on `invoker`: admitted by its retry state (refused while the breaker
    /// is open or the dependency is in connection backoff; expired when its deadline has
    /// passed), then its first attempt is sent.
    async fn start<I: Invoke>(
        &self,
        mut headers: RequestHeaders,
        options: CallOptions,
        invoker: I,
    ) -> (RetrySendStream, RetryRecvStream<I>) {
        let settings = Arc::clone(&self.settings);
        settings.stats.logical();
        settings.name.get_or_name_after(headers.method_name());
        let mut metrics = settings.call_metrics(headers.method_name());
        let now = Instant::now();
        let inbound = CallContext::current().and_then(|c| c.deadline());
        let own = options.deadline().map(Instant::from_std);
        let times = CallTimes {
            caller: wire::caller_timeout(headers.metadata()),
            inbound: earliest(inbound, own),
            default: settings.default_timeout,
            per_attempt: settings.per_attempt_timeout,
        };
        let begun = settings
            .controller
            .begin_call_at(headers.method_name(), &times, now);
        let mut retry = match begun {
            Ok(retry) if retry.deadline().is_none_or(|d| d > now) => retry,
            Ok(_) => {
                let log = Log::new(false, 0);
                settings.stats.deadline_exceeded();
                settings.stats.outcome(false);
                metrics.ended(Code::DeadlineExceeded);
                let last = wire::failure(
                    Code::DeadlineExceeded,
                    "stormguard: the call's deadline had passed before it was sent",
                );
                let recv =
                    RetryRecvStream::ended(invoker, headers, settings, Arc::clone(&log), last);
                return (RetrySendStream::new(log), recv);
            }
            Err(refusal) => {
                let log = Log::new(false, 0);
                settings.stats.refused(refusal);
                settings.stats.outcome(false);
                metrics.ended(Code::Unavailable);
                let why = match refusal {
                    Refusal::ConnectBackoff => "the dependency is in connection backoff",
                    _ => "the circuit breaker is open",
                };
                let mut last = wire::failure(
                    Code::Unavailable,
                    format!("stormguard: call not sent ({refusal}): {why}"),
                );
                wire::mark_do_not_retry(&mut last);
                let recv =
                    RetryRecvStream::ended(invoker, headers, settings, Arc::clone(&log), last);
                return (RetrySendStream::new(log), recv);
            }
        };
        let plan = retry.first_attempt_at(now);
        if let Some(key) = retry.idempotency_key() {
            wire::stamp_idempotency_key(headers.metadata_mut(), key);
        }
        let log = Log::new(retry.is_retryable_method(), settings.replay_limit);
        let send = RetrySendStream::new(Arc::clone(&log));
        let recv = RetryRecvStream::start(
            invoker,
            headers,
            options,
            (settings, metrics),
            log,
            retry,
            plan,
        )
        .await;
        (send, recv)
    }
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl<I> Intercept<&I> for RetryInterceptor
where
    I: Invoke + Clone + Send + 'static,
    I::SendStream: Send,
    I::RecvStream: Send,
{
    type SendStream = RetrySendStream;
    type RecvStream = RetryRecvStream<I>;

    async fn intercept(
        &self,
        headers: RequestHeaders,
        options: CallOptions,
        next: &I,
    ) -> (Self::SendStream, Self::RecvStream) {
        self.start(headers, options, next.clone()).await
    }
}
