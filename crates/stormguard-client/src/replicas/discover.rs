//! Replicas that come and go: tower `Change`s applied by a background task.

use std::fmt;
use std::future::{Future, poll_fn};
use std::hash::Hash;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::Poll;

use tower::discover::Discover;

use super::Replicas;
use crate::status::BoxError;
use stormguard_core::ReplicaConfig;

impl<S, K> Replicas<S, K>
where
    S: Send + 'static,
    K: Clone + Eq + Hash + fmt::Display + Send + 'static,
{
    /// A channel fed by `discover` (any tower [`Discover`]: a stream of [`Change`](super::Change)s).
    /// A task on the current tokio runtime applies each change as it comes (a replica
    /// inserted after the first call ramps up with slow start; a removed one finishes
    /// its attempts in flight) and ends when the stream ends, fails, or every clone of
    /// the channel is gone. Must be called within a tokio runtime.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use stormguard_client::ReplicaConfig;
    /// use stormguard_client::replicas::Replicas;
    /// use tower::discover::ServiceList;
    ///
    /// // Any `Discover`; here a fixed list, keyed 0, 1, 2.
    /// let answer = tower::service_fn(|_: http::Request<()>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(()))
    /// });
    /// let replicas = Replicas::discover(ReplicaConfig::default(), ServiceList::new(vec![answer; 3]))?;
    /// tokio::task::yield_now().await; // the task applies the changes
    /// assert_eq!(replicas.len(), 3);
    /// # Ok(()) }
    /// ```
    pub fn discover<D>(
        config: ReplicaConfig,
        discover: D,
    ) -> Result<Self, stormguard_core::ConfigError>
    where
        D: Discover<Key = K, Service = S> + Send + 'static,
        D::Error: Into<BoxError>,
    {
        let (replicas, mut gone) = Replicas::empty(config)?.watched();
        let weak = Arc::downgrade(&replicas.shared);
        tokio::spawn(async move {
            let mut discover = pin!(discover);
            loop {
                // The next change, unless the channel's last clone is gone first (the
                // stream may stay pending for ever).
                let change = poll_fn(|cx| {
                    if Pin::new(&mut gone).poll(cx).is_ready() {
                        return Poll::Ready(None);
                    }
                    discover.as_mut().poll_discover(cx).map(Some)
                })
                .await;
                let (Some(change), Some(shared)) = (change, weak.upgrade()) else {
                    return;
                };
                match change {
                    Some(Ok(change)) => shared.apply(change),
                    Some(Err(err)) => {
                        let err: BoxError = err.into();
                        tracing::warn!(error = %err, "stormguard: replica discovery failed; the replicas stay as they are");
                        return;
                    }
                    None => return,
                }
            }
        });
        Ok(replicas)
    }
}

#[cfg(feature = "transport")]
mod transport {
    use tokio::sync::mpsc;
    use tonic::transport::{Channel, Endpoint};
    use tower::discover::Change;

    use super::*;

    impl<K> Replicas<Channel, K>
    where
        K: Clone + Eq + Hash + fmt::Display + Send + 'static,
    {
        /// A channel fed through the returned sender, as tonic's
        /// `Channel::balance_channel`: `Change::Insert(key, endpoint)` adds a replica with
        /// its own lazily connected [`Channel`], `Change::Remove(key)` removes it. The task
        /// that applies them ends when the sender is dropped. Must be called within a
        /// tokio runtime.
        pub fn balance_channel(
            config: ReplicaConfig,
            capacity: usize,
        ) -> Result<(Self, mpsc::Sender<Change<K, Endpoint>>), stormguard_core::ConfigError>
        {
            let replicas = Replicas::over(super::super::transport::channels(config, |_| {})?);
            let (tx, mut rx) = mpsc::channel::<Change<K, Endpoint>>(capacity.max(1));
            let weak = Arc::downgrade(&replicas.shared);
            tokio::spawn(async move {
                while let Some(change) = rx.recv().await {
                    let Some(shared) = weak.upgrade() else { return };
                    let change = match change {
                        Change::Insert(key, endpoint) => {
                            Change::Insert(key, endpoint.connect_lazy())
                        }
                        Change::Remove(key) => Change::Remove(key),
                    };
                    shared.apply(change);
                }
            });
            Ok((replicas, tx))
        }
    }
}

#[cfg(test)]
mod tests;
