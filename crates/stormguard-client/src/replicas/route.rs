//! What a logical call has tried: passed down from the retry layer in each attempt's
//! request extensions, written by the channel when it picks a replica.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use stormguard_core::LoadReport;
use stormguard_core::ReplicaId;

use super::EndAttempt;

/// How many of a call's replicas a [`Route`] remembers (its latest ones).
pub(crate) const REMEMBERED: usize = 8;

/// The replicas one logical call has used so far, shared by its attempts.
///
/// The [`RetryLayer`](crate::RetryLayer) built with
/// [`over_replicas`](crate::RetryLayer::over_replicas) puts one `Route` in the extensions
/// of every attempt of a call; [`Replicas`](super::Replicas) reads it to send a retry to a
/// replica the call has not tried, records the replica it chose, and the retry layer then
/// charges the retry budget of that replica. Clones share the same record.
///
/// ```
/// use stormguard_client::replicas::Route;
///
/// let route = Route::new();
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(route.clone());
/// assert_eq!(route.attempts(), 0);
/// assert!(route.last().is_none());
/// ```
#[derive(Clone, Default)]
pub struct Route(Arc<Mutex<Tried>>);

#[derive(Default)]
struct Tried {
    ids: [Option<ReplicaId>; REMEMBERED],
    count: u32,
    /// The channel that chose the latest replica: where its load report goes.
    channel: Option<Arc<dyn EndAttempt>>,
    /// While the latest attempt waits for a replica to take it: what it waits for.
    waiting: Option<Arc<str>>,
}

impl Route {
    /// A route that has tried nothing yet.
    pub fn new() -> Self {
        Route::default()
    }

    /// The replica of the latest attempt, if one was chosen.
    pub fn last(&self) -> Option<ReplicaId> {
        let tried = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match tried.count {
            0 => None,
            n => tried.ids[(n as usize - 1) % REMEMBERED],
        }
    }

    /// Attempts that were sent to a replica.
    pub fn attempts(&self) -> u32 {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).count
    }

    /// Whether an attempt of this call went to `id`.
    pub fn has_tried(&self, id: ReplicaId) -> bool {
        let tried = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        tried.ids.contains(&Some(id))
    }

    /// Copies the replicas tried into `into`; returns how many.
    pub(crate) fn tried(&self, into: &mut [ReplicaId; REMEMBERED]) -> usize {
        let tried = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let mut n = 0;
        for id in tried.ids.iter().flatten() {
            into[n] = *id;
            n += 1;
        }
        n
    }

    /// The latest attempt waits for a replica to take it (`why`), or no longer (`None`).
    pub(crate) fn set_waiting(&self, why: Option<Arc<str>>) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .waiting = why;
    }

    /// What the latest attempt waits for, while it waits for a replica.
    pub(crate) fn waiting(&self) -> Option<Arc<str>> {
        let tried = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        tried.waiting.clone()
    }

    /// An attempt went to `id`, chosen by `channel`.
    pub(crate) fn record(&self, id: ReplicaId, channel: Arc<dyn EndAttempt>) {
        let mut tried = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        tried.waiting = None;
        let slot = tried.count as usize % REMEMBERED;
        tried.ids[slot] = Some(id);
        tried.count = tried.count.saturating_add(1);
        tried.channel = Some(channel);
    }

    /// How many replicas the channel that chose the latest replica holds (1 before any
    /// was chosen): where a retry could go.
    pub(crate) fn replicas(&self) -> usize {
        let channel = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .channel
            .clone();
        channel.map_or(1, |c| c.replicas())
    }

    /// The latest attempt's replica answered with `report`: the channel that chose it
    /// weights it by the report (see [`ReplicaSet::record_load_at`]). The retry layer calls
    /// this for every report it reads.
    ///
    /// [`ReplicaSet::record_load_at`]: stormguard_core::ReplicaSet::record_load_at
    pub(crate) fn record_load(&self, report: &LoadReport) {
        let (id, channel) = {
            let tried = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            let id = match tried.count {
                0 => None,
                n => tried.ids[(n as usize - 1) % REMEMBERED],
            };
            (id, tried.channel.clone())
        };
        if let (Some(id), Some(channel)) = (id, channel) {
            channel.load_report(id, report);
        }
    }
}

impl fmt::Debug for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Route")
            .field("attempts", &self.attempts())
            .field("last", &self.last())
            .finish()
    }
}

#[cfg(test)]
mod tests;
