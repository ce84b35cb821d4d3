//! The layer's side of the client-side adaptive throttle
//! ([`stormguard_core::AdaptiveThrottle`]): which calls it asks about, and which answers
//! it records. The formula, the window and the draw are core's.
//!
//! A call asks the throttle once, before its first attempt, with the class of its
//! `stormguard-criticality` header (`default` without one: put a
//! [`CriticalityLayer`](crate::CriticalityLayer) *outside* the retry layer for the
//! throttle to see the class it stamps). A call refused locally is never sent: it is
//! answered at once with `UNAVAILABLE` marked `grpc-retry-pushback-ms: -1`, as a call
//! refused by an open breaker is. Retries and hedges are not asked (the retry budget
//! bounds them), but every attempt's answer is recorded: a trailers-only status or
//! response headers that commit the call (the server took it: an accept). An attempt that
//! ran out of time (the layer's timer, or one below it) is a request without an accept;
//! one that failed in transport is recorded nowhere.

use stormguard_core::AttemptEnd;
use stormguard_core::Code;
use stormguard_core::Criticality;
use stormguard_core::Instant;
use stormguard_core::wire::http::STORMGUARD_CRITICALITY;
use stormguard_core::wire::parse_criticality;
use stormguard_core::{AdaptiveThrottle, Throttled};

use super::classify::{Last, Outcome};

/// The throttle of a call that was let through, and the class its answers count for.
#[derive(Debug)]
pub(super) struct CallThrottle {
    throttle: AdaptiveThrottle,
    class: Criticality,
}

impl CallThrottle {
    /// Asks `throttle` whether the call with `headers` may be sent at `now`.
    pub(super) fn admit(
        throttle: &AdaptiveThrottle,
        headers: &http::HeaderMap,
        now: Instant,
    ) -> Result<CallThrottle, Throttled> {
        let class = parse_criticality(
            headers
                .get(&STORMGUARD_CRITICALITY)
                .map(http::HeaderValue::as_bytes),
        );
        throttle.admit_at(class, now)?;
        Ok(CallThrottle {
            throttle: throttle.clone(),
            class,
        })
    }

    /// Records how an attempt ended, if the server answered it.
    pub(super) fn record<B>(&self, outcome: &Outcome<B>, now: Instant) {
        match outcome {
            Outcome::Ok(_) | Outcome::Committed(_) => {
                self.throttle
                    .record_answer_at(self.class, Code::Ok, false, now);
            }
            Outcome::Failed {
                end: AttemptEnd::Failed(f),
                last: Last::Response(_),
                ..
            } => {
                let shed_mark = f.pushback.is_some() || f.unprocessed;
                self.throttle
                    .record_answer_at(self.class, f.code, shed_mark, now);
            }
            Outcome::Failed {
                end: AttemptEnd::TimedOut { unsent: false, .. },
                ..
            } => self.timed_out(now),
            // A transport error: the server said nothing.
            Outcome::Failed { .. } => {}
        }
    }

    /// The attempt ran out of time without an answer: a request, not an accept.
    pub(super) fn timed_out(&self, now: Instant) {
        self.throttle.record_timeout_at(self.class, now);
    }
}
