//! Replicas found by DNS (feature `dns`): see [`Dns`] and [`Replicas::from_dns`].

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Weak};

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use stormguard_core::{
    ConfigError, Instant, Refresh, RefreshAnswer, RefreshConfig, RefreshCounts, RefreshHealth,
};
use tokio::sync::{Notify, oneshot, watch};
use tonic::transport::{Channel, Endpoint};

use super::{EndpointKey, Replicas, Shared, Unresolved};
use stormguard_core::ReplicaConfig;

/// Makes each replica's [`Endpoint`] from its default (`http://{address}`).
type Configure = Arc<dyn Fn(Endpoint) -> Endpoint + Send + Sync>;

/// Where and how [`Replicas::from_dns`] finds its replicas: a name, a port, the name
/// servers to ask, when to ask again.
///
/// On Kubernetes a client finds its replicas through a headless Service, whose name
/// answers with one A/AAAA record per ready pod; the records change with every deploy,
/// scale-up and eviction. tonic resolves a name once per connection, so a channel over it
/// talks to whichever pod it found first. [`Replicas::from_dns`] resolves the name with
/// hickory-resolver on a task, and applies what changed: a record that disappears stops
/// getting new attempts at once (those in flight finish, then its connection closes), a
/// new one joins with slow start, and an address that comes back is a new replica. When
/// to resolve, and what an answer changes, are [`stormguard_core::Refresh`]'s decisions:
/// on a jittered timer bounded by the records' TTL, early when a replica refuses
/// connections or is ejected, and never an empty set because the DNS server failed.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use stormguard_client::ReplicaConfig;
/// use stormguard_client::replicas::{Dns, Replicas};
///
/// // The system's resolver configuration (`/etc/resolv.conf`), the port from the name.
/// let replicas = Replicas::from_dns(ReplicaConfig::default(), Dns::new("inventory.prod.svc:50051")?)?;
/// // Or your own DNS server.
/// let dns = Dns::new("inventory.internal")?
///     .port(50051)
///     .name_servers(["10.0.0.53:53".parse()?]);
/// let other = Replicas::from_dns(ReplicaConfig::default(), dns)?;
/// # let _ = (replicas, other);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Dns {
    host: String,
    port: Option<u16>,
    name_servers: Vec<SocketAddr>,
    refresh: RefreshConfig,
    configure: Option<Configure>,
}

impl fmt::Debug for Dns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dns")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("name_servers", &self.name_servers)
            .field("refresh", &self.refresh)
            .finish_non_exhaustive()
    }
}

/// Why [`Dns`] or [`Replicas::from_dns`] refused its input.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// The target is not `host` or `host:port`.
    #[error("stormguard: `{0}` is not a DNS name, with or without a port")]
    BadTarget(String),
    /// No port in the name, and none given with [`Dns::port`].
    #[error("stormguard: no port for `{0}`: write `{0}:PORT` or call `Dns::port`")]
    NoPort(String),
    /// The refresh settings are out of range.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The system's resolver configuration could not be read (give name servers instead).
    #[error("stormguard: cannot read the system's resolver configuration: {0}")]
    System(String),
}

impl Dns {
    /// The replicas `target` resolves to: `"inventory.prod.svc:50051"`, or a name without
    /// a port and [`port`](Self::port). Every A and AAAA record is a replica.
    pub fn new(target: &str) -> Result<Dns, DnsError> {
        let bad = || DnsError::BadTarget(target.to_owned());
        let (host, port) = match target.rsplit_once(':') {
            Some((host, port)) => (host, Some(port.parse::<u16>().map_err(|_| bad())?)),
            None => (target, None),
        };
        let valid = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_';
        if host.is_empty() || !host.chars().all(valid) {
            return Err(bad());
        }
        Ok(Dns {
            host: host.to_owned(),
            port,
            name_servers: Vec::new(),
            refresh: RefreshConfig::default(),
            configure: None,
        })
    }

    /// The replicas' port, when the name has none (the name's own wins).
    pub fn port(mut self, port: u16) -> Self {
        self.port = self.port.or(Some(port));
        self
    }

    /// Asks these name servers (over UDP, then TCP for a truncated answer) instead of the
    /// system's configuration.
    pub fn name_servers(mut self, servers: impl IntoIterator<Item = SocketAddr>) -> Self {
        self.name_servers = servers.into_iter().collect();
        self
    }

    /// When to resolve again (the default: at most once a second, at least every 30 s,
    /// within the records' TTL).
    pub fn refresh(mut self, config: RefreshConfig) -> Self {
        self.refresh = config;
        self
    }

    /// Sets up each replica's [`Endpoint`] (timeouts, keepalive, TLS), given the default
    /// one for its address.
    pub fn endpoint(
        mut self,
        configure: impl Fn(Endpoint) -> Endpoint + Send + Sync + 'static,
    ) -> Self {
        self.configure = Some(Arc::new(configure));
        self
    }

    fn resolver(&self) -> Result<TokioResolver, DnsError> {
        let mut builder = if self.name_servers.is_empty() {
            TokioResolver::builder_tokio().map_err(|e| DnsError::System(e.to_string()))?
        } else {
            let servers = self.name_servers.iter().map(|addr| {
                let mut udp = ConnectionConfig::udp();
                udp.port = addr.port();
                let mut tcp = ConnectionConfig::tcp();
                tcp.port = addr.port();
                NameServerConfig::new(addr.ip(), true, vec![udp, tcp])
            });
            let config = ResolverConfig::from_parts(None, Vec::new(), servers.collect());
            TokioResolver::builder_with_config(config, TokioRuntimeProvider::default())
        };
        let options = builder.options_mut();
        options.timeout = self.refresh.timeout;
        options.attempts = 1;
        builder.build().map_err(|e| DnsError::System(e.to_string()))
    }
}

/// Where a DNS-fed channel stands ([`Replicas::dns_reports`]).
#[derive(Debug, Clone, Default)]
pub struct DnsReport {
    /// The name resolved.
    pub name: Arc<str>,
    /// What the resolutions so far did: how many, how many failed, records added and removed.
    pub counts: RefreshCounts,
    /// The records of the last good answer.
    pub records: Vec<SocketAddr>,
    /// While resolutions fail: the last one's error (the last good set is kept).
    pub failing: Option<Arc<str>>,
}

impl Replicas<Channel, EndpointKey> {
    /// A channel over the addresses `dns` resolves to (see [`Dns`]), each
    /// a replica with its own lazily connected [`Channel`], keyed `http://{address}`. A
    /// task on the current tokio runtime resolves the name and applies what changed; it
    /// ends with the channel's last clone. A call made before the first resolution ends
    /// waits for it, within its deadline ([`NotYet`](super::NotYet) after it); a call that
    /// then finds no replica fails with [`Unresolved`]. Must be called within a tokio
    /// runtime.
    pub fn from_dns(config: ReplicaConfig, dns: Dns) -> Result<Self, DnsError> {
        let port = dns.port.ok_or_else(|| DnsError::NoPort(dns.host.clone()))?;
        let now = Instant::now();
        let refresh = Refresh::new(dns.refresh.clone(), now)?;
        let resolver = dns.resolver()?;
        let early = Arc::new(Notify::new());
        let name: Arc<str> = Arc::from(dns.host.as_str());
        let (reports, _) = watch::channel(DnsReport {
            name: Arc::clone(&name),
            ..DnsReport::default()
        });
        let shared = super::transport::channels(config, |shared| {
            shared.early = Some(Arc::clone(&early));
            shared.dns = Some(reports.clone());
            shared.lock().resolving = Some(Arc::clone(&name));
        })?;
        let (alive, gone) = oneshot::channel();
        let task = Task {
            shared: Arc::downgrade(&shared),
            name,
            port,
            configure: dns.configure,
            resolver,
            refresh,
            early,
            reports,
        };
        tokio::spawn(task.run(gone));
        Ok(Replicas {
            shared,
            _alive: Some(Arc::new(alive)),
        })
    }
}

impl<S, K> Replicas<S, K> {
    /// For a channel made by [`from_dns`](Replicas::from_dns): its resolutions so far, as a
    /// [`watch`] that changes after each (`wait_for` a count, a record, a failure).
    pub fn dns_reports(&self) -> Option<watch::Receiver<DnsReport>> {
        self.shared.dns.as_ref().map(watch::Sender::subscribe)
    }
}

/// The task that resolves the name and applies what changed.
struct Task {
    shared: Weak<Shared<Channel, EndpointKey>>,
    name: Arc<str>,
    port: u16,
    configure: Option<Configure>,
    resolver: TokioResolver,
    refresh: Refresh<IpAddr>,
    early: Arc<Notify>,
    reports: watch::Sender<DnsReport>,
}

impl Task {
    async fn run(mut self, mut gone: oneshot::Receiver<()>) {
        loop {
            tokio::select! {
                _ = &mut gone => return,
                () = self.early.notified() => {
                    self.refresh.early_at(Instant::now());
                    continue;
                }
                () = tokio::time::sleep_until(self.refresh.due_at()) => {}
            }
            let deadline = self.refresh.begin_at(Instant::now());
            let looked_up = tokio::select! {
                _ = &mut gone => return,
                r = tokio::time::timeout_at(deadline, self.lookup()) => r,
            };
            let (answer, error) = match looked_up {
                Ok(Ok(answer)) => (answer, None),
                Ok(Err(error)) => (RefreshAnswer::Failed, Some(error)),
                Err(_) => (RefreshAnswer::Failed, Some("timed out".to_owned())),
            };
            if !self.apply(answer, error) {
                return;
            }
        }
    }

    /// One resolution: every A and AAAA record, valid for the smallest TTL.
    async fn lookup(&self) -> Result<RefreshAnswer<IpAddr>, String> {
        // Each resolution asks the server: the refresh decides how long answers hold.
        self.resolver.clear_cache();
        let lookup = self
            .resolver
            .lookup_ip(&*self.name)
            .await
            .map_err(|e| lookup_error(&e))?;
        let ttl = lookup
            .valid_until()
            .saturating_duration_since(std::time::Instant::now());
        Ok(RefreshAnswer::Found {
            records: lookup.iter().collect(),
            ttl,
        })
    }

    /// Applies an answer to the channel; false once the channel is gone.
    fn apply(&mut self, answer: RefreshAnswer<IpAddr>, error: Option<String>) -> bool {
        let Some(shared) = self.shared.upgrade() else {
            return false;
        };
        let found = matches!(&answer, RefreshAnswer::Found { records, .. } if !records.is_empty());
        let update = self.refresh.answer_at(answer, Instant::now());
        let error: Option<Arc<str>> = match (found, error) {
            (true, _) => None,
            (false, Some(e)) => Some(e.into()),
            (false, None) => Some("no A or AAAA record".into()),
        };
        for ip in &update.removed {
            super::remove_key(&mut shared.lock(), &self.key(*ip));
        }
        for ip in &update.added {
            let key = self.key(*ip);
            let endpoint = Endpoint::from(key.uri().clone());
            let endpoint = match &self.configure {
                Some(configure) => configure(endpoint),
                None => endpoint,
            };
            shared.insert(key, endpoint.connect_lazy());
        }
        {
            let mut inner = shared.lock();
            inner.unresolved = error.as_ref().map(|reason| Unresolved {
                name: Arc::clone(&self.name),
                reason: Arc::clone(reason),
            });
            if self.refresh.resolved() {
                inner.unresolved = None;
            }
            inner.resolving = None;
        }
        // The first resolution's end (or a change of the set) ends the wait of the calls
        // waiting for a replica: they pick, or fail with the resolver's error.
        shared.picks_changed();
        self.log(&update, error.as_deref());
        let counts = self.refresh.counts();
        let records = self
            .refresh
            .records()
            .map(|ip| SocketAddr::new(*ip, self.port))
            .collect();
        self.reports.send_replace(DnsReport {
            name: Arc::clone(&self.name),
            counts,
            records,
            failing: error,
        });
        true
    }

    fn key(&self, ip: IpAddr) -> EndpointKey {
        let addr = SocketAddr::new(ip, self.port);
        let uri = http::Uri::try_from(format!("http://{addr}"))
            .unwrap_or_else(|_| http::Uri::from_static("http://invalid"));
        EndpointKey(uri)
    }

    /// Changes at INFO; the start and end of failures once each, at WARN and INFO.
    fn log(&self, update: &stormguard_core::RefreshUpdate<IpAddr>, error: Option<&str>) {
        let name = &*self.name;
        if !update.added.is_empty() || !update.removed.is_empty() {
            tracing::info!(
                name,
                added = ?update.added,
                removed = ?update.removed,
                replicas = self.refresh.records().count(),
                "stormguard: dns replicas changed"
            );
        }
        match update.health {
            Some(RefreshHealth::Failing) if !self.refresh.resolved() => tracing::warn!(
                name,
                error = error.unwrap_or(""),
                "stormguard: dns resolution failing; no address has resolved yet"
            ),
            Some(RefreshHealth::Failing) => tracing::warn!(
                name,
                error = error.unwrap_or(""),
                replicas = self.refresh.records().count(),
                "stormguard: dns resolution failing; the last good replicas stay"
            ),
            Some(RefreshHealth::Recovered) => {
                tracing::info!(name, "stormguard: dns resolution answers again")
            }
            None => {}
        }
    }
}

/// A failed lookup's reason, as a user reads it: a name that does not exist or has no
/// address is said so (for A and AAAA alike), anything else as the resolver says it.
fn lookup_error(e: &hickory_resolver::net::NetError) -> String {
    if e.is_nx_domain() {
        "the name does not exist (NXDOMAIN for A and AAAA)".to_owned()
    } else if e.is_no_records_found() {
        "the name has no A or AAAA record".to_owned()
    } else {
        e.to_string()
    }
}
