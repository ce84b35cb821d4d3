//! Client-side health checks per replica (gRFC A17; feature `health`): one
//! `grpc.health.v1.Health/Watch` stream per replica, on the replica's own tonic `Channel`,
//! whose answers feed the replica's [`ServingStatus`] in the channel's `ReplicaSet`.
//!
//! # Why
//!
//! A replica can know it should not take calls before any call fails: a server whose
//! shutdown began says `NOT_SERVING` (`ShedLayer::with_readiness`), while its address may
//! stay in DNS for a while (a TTL, a cache, a record that is not removed). Outlier ejection
//! only learns from failed attempts; the health stream tells the client first, and the
//! replica gets no new attempt from the moment the client has the report.
//!
//! What the task does, as A17 says: it opens the stream at once; each answer sets the
//! replica's status (`SERVING` takes attempts; `NOT_SERVING`, `SERVICE_UNKNOWN`, or no
//! answer yet does not). When the stream ends or fails, the task opens it again, at once
//! after a stream that had answered, else after a backoff (gRPC's connection backoff:
//! 1 s, × 1.6 per try, at most 30 s, ± 20 %); the last status stands meanwhile, unless the
//! connection failed: then the replica is unknown until a new stream answers. A server
//! that answers `UNIMPLEMENTED` has no health service: checks are disabled for that
//! replica (it counts as healthy), logged once at WARN. The task ends when the replica
//! leaves the channel, or the channel's last clone is dropped.

use std::sync::{Arc, Weak};
use std::time::Duration;

use stormguard_core::{Backoff, BackoffConfig, HealthCheckConfig, ReplicaId, ServingStatus};
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus as Answer;
use tonic_health::pb::health_client::HealthClient;

use super::{HealthTask, StartHealth};

/// The backoff between health streams that did not answer: gRPC's connection backoff,
/// bounded at 30 s.
const REOPEN: BackoffConfig = BackoffConfig::A6 {
    initial: Duration::from_secs(1),
    max: Duration::from_secs(30),
    multiplier: 1.6,
};

/// Where a health-check task reports (the channel's shared state).
pub(crate) trait HealthSink: Send + Sync {
    /// Replica `id`'s health check says `status`.
    fn serving(&self, id: ReplicaId, status: ServingStatus);
}

/// What starts each replica's task, for a channel with health checks on.
pub(crate) fn starter(
    config: HealthCheckConfig,
    seed: Option<u64>,
    sink: Weak<dyn HealthSink>,
) -> StartHealth<Channel> {
    let service: Arc<str> = Arc::from(config.service_name);
    let runtime = tokio::runtime::Handle::current();
    Box::new(move |id: ReplicaId, channel: &Channel| {
        let seed = seed.map_or_else(|| fastrand::u64(..), |s| s ^ id.get());
        let watch = Watch {
            id,
            client: HealthClient::new(channel.clone()),
            service: Arc::clone(&service),
            sink: sink.clone(),
            backoff: Backoff::new(REOPEN, seed),
            seed,
        };
        HealthTask(runtime.spawn(watch.run()).abort_handle())
    })
}

/// One replica's health check.
struct Watch {
    id: ReplicaId,
    client: HealthClient<Channel>,
    service: Arc<str>,
    sink: Weak<dyn HealthSink>,
    backoff: Backoff,
    seed: u64,
}

/// How a health stream ended.
enum Ended {
    /// It ended, or failed with a status the server sent: the last status stands.
    Stream { answered: bool },
    /// The connection failed: the replica is unknown until a new stream answers.
    Connection { answered: bool },
    /// `UNIMPLEMENTED`: the server has no health service.
    Unimplemented,
    /// The channel is gone.
    Gone,
}

impl Watch {
    async fn run(mut self) {
        loop {
            match self.stream().await {
                Ended::Gone => return,
                Ended::Unimplemented => {
                    tracing::warn!(
                        replica = %self.id,
                        service = &*self.service,
                        "stormguard: the replica's server does not implement grpc.health.v1.Health; health checks disabled for it"
                    );
                    self.report(ServingStatus::Unchecked);
                    return;
                }
                Ended::Connection { answered } | Ended::Stream { answered } if answered => {
                    // A17: a stream that answered is opened again at once.
                    self.backoff = Backoff::new(REOPEN, self.seed);
                    self.seed = self.seed.wrapping_add(1);
                }
                Ended::Connection { .. } | Ended::Stream { .. } => {
                    tokio::time::sleep(self.backoff.next_delay()).await;
                }
            }
        }
    }

    /// One `Watch` stream, until it ends.
    async fn stream(&mut self) -> Ended {
        let request = HealthCheckRequest {
            service: self.service.to_string(),
        };
        let mut answered = false;
        let failed = match self.client.watch(request).await {
            Err(status) => status,
            Ok(response) => {
                let mut answers = response.into_inner();
                loop {
                    match answers.message().await {
                        Ok(Some(answer)) => {
                            answered = true;
                            if !self.report(serving(answer.status())) {
                                return Ended::Gone;
                            }
                        }
                        Ok(None) => return Ended::Stream { answered },
                        Err(status) => break status,
                    }
                }
            }
        };
        if failed.code() == Code::Unimplemented && !connection_failed(&failed) {
            return Ended::Unimplemented;
        }
        if connection_failed(&failed) {
            if !self.report(ServingStatus::Unknown) {
                return Ended::Gone;
            }
            return Ended::Connection { answered };
        }
        Ended::Stream { answered }
    }

    /// Feeds the status to the channel; false once it is gone.
    fn report(&self, status: ServingStatus) -> bool {
        match self.sink.upgrade() {
            Some(sink) => {
                sink.serving(self.id, status);
                true
            }
            None => false,
        }
    }
}

/// A `Watch` answer's status: only `SERVING` serves; a status this client does not know is
/// taken as `NOT_SERVING`.
fn serving(answer: Answer) -> ServingStatus {
    match answer {
        Answer::Serving => ServingStatus::Serving,
        Answer::ServiceUnknown => ServingStatus::ServiceUnknown,
        Answer::NotServing | Answer::Unknown => ServingStatus::NotServing,
    }
}

/// Whether a failed stream's status says the connection failed rather than the server
/// answered: tonic gives a status made from a transport error that error as its source; a
/// status the server sent has none.
fn connection_failed(status: &tonic::Status) -> bool {
    std::error::Error::source(status).is_some()
}

#[cfg(test)]
mod tests;
