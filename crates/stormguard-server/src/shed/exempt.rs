//! Calls the layer never sheds: health checks by default, and whatever the user names.
//!
//! # Why
//!
//! A health check shed under overload reads as "this server is dead": the orchestrator
//! restarts it or takes it out of rotation, and its load moves to the others, which
//! makes the overload worse. So calls to `grpc.health.v1.Health` are never shed by
//! default. They do not wait for a worker either (a health check that queues behind
//! the backlog times out just the same): they run at once, beside the workers, and are
//! counted apart ([`ShedStats::never_shed`](crate::ShedStats::never_shed)). Keep such
//! methods cheap: the layer does not bound them.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use stormguard_core::ConfigError;
use stormguard_core::MethodMap;
use stormguard_core::MethodScope;

/// The gRPC health service (`grpc.health.v1.Health`), never shed unless
/// [`ShedLayer::shed_health_checks`](crate::ShedLayer::shed_health_checks) is called.
pub const HEALTH_SERVICE: &str = "grpc.health.v1.Health";

type Predicate = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// The calls a layer never sheds, matched on the request path (`/package.Service/Method`).
#[derive(Clone)]
pub(crate) struct NeverShed {
    health: bool,
    /// The services and methods named, matched like the service config's names.
    named: MethodMap<()>,
    predicate: Option<Predicate>,
}

impl Default for NeverShed {
    fn default() -> Self {
        NeverShed {
            health: true,
            named: MethodMap::new(),
            predicate: None,
        }
    }
}

impl NeverShed {
    /// Whether a call to `path` bypasses the queue.
    pub(crate) fn matches(&self, path: &str) -> bool {
        if self.health && is_health_check(path) {
            return true;
        }
        if self.named.get(path).is_some() {
            return true;
        }
        self.predicate.as_ref().is_some_and(|p| p(path))
    }

    /// Adds `entry`: a service (`package.Service`) or a method (`/package.Service/Method`).
    pub(crate) fn add(&mut self, entry: &str) -> Result<(), ConfigError> {
        let bad = |why: &str| ConfigError::invalid("never_shed", format!("{entry:?}: {why}"));
        if entry.is_empty() || entry.contains(char::is_whitespace) {
            return Err(bad(
                "expected `package.Service` or `/package.Service/Method`",
            ));
        }
        match entry.strip_prefix('/') {
            Some(rest) => match rest.split_once('/') {
                Some((service, method))
                    if !service.is_empty() && !method.is_empty() && !method.contains('/') =>
                {
                    self.named.insert(MethodScope::Method(service, method), ());
                }
                _ => return Err(bad("a method path is `/package.Service/Method`")),
            },
            None if entry.contains('/') => {
                return Err(bad(
                    "a service is named without slashes (`package.Service`)",
                ));
            }
            None => self.named.insert(MethodScope::Service(entry), ()),
        }
        Ok(())
    }

    pub(crate) fn set_predicate(&mut self, predicate: Predicate) {
        self.predicate = Some(predicate);
    }

    pub(crate) fn set_health(&mut self, health: bool) {
        self.health = health;
    }
}

/// Whether `path` is `/grpc.health.v1.Health/Method` (compared in place: every call that
/// can be shed asks).
fn is_health_check(path: &str) -> bool {
    path.strip_prefix('/')
        .and_then(|rest| rest.strip_prefix(HEALTH_SERVICE))
        .is_some_and(|method| method.starts_with('/'))
}

impl fmt::Debug for NeverShed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NeverShed")
            .field("health", &self.health)
            .field("named", &self.named)
            .field("predicate", &self.predicate.is_some())
            .finish()
    }
}

/// Counts the calls that bypassed the queue.
#[derive(Debug, Default)]
pub(crate) struct Bypassed(AtomicU64);

impl Bypassed {
    pub(crate) fn record(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests;
