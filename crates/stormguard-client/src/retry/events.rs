//! What a layer tells on-call: its name, a summary of the retries it refused at most once
//! a second, and every transition of its circuit breaker.
//!
//! | event | level | fields |
//! |---|---|---|
//! | `stormguard: retry refused` (each one) | DEBUG | `stormguard.layer`, `rpc.method`, `retry.refused`, `retry.attempt`, `deadline.left_ms` |
//! | `stormguard: N retries refused in the last S s` | INFO | `stormguard.layer`, `rpc.method` (of the latest), `refused.attempts`, `refused.deadline`, `refused.breaker`, `refused.budget`, `refused.key_budget`, `refused.allowance`, `refused.saturated`, `summary.window_ms` |
//! | `stormguard: call rejected by the client throttle` (each one) | DEBUG | `stormguard.layer`, `rpc.method`, `throttle.criticality`, `throttle.probability` |
//! | `stormguard: N calls rejected by the client throttle in the last S s` | INFO | `stormguard.layer`, `rpc.method` (of the latest), `throttled.sheddable`, `throttled.default`, `throttled.critical`, `summary.window_ms` |
//! | `stormguard: committed call cut at its deadline` (each one: see [`ResponseBody`](super::ResponseBody)) | DEBUG | `stormguard.layer`, `rpc.method` |
//! | `stormguard: circuit breaker opened`, `... half-opened`, `... closed` | INFO | `stormguard.layer`, `breaker.from`, `breaker.to`, `breaker.failure_rate` (opened from closed), `breaker.open_ms` (opened) |
//!
//! The summary counts the refusals that mean a dependency fails beyond what the policy pays
//! for (the causes of [`Refusal::is_retryable_but_refused`]); the others (a code that is not
//! retried, a pushback, ...) are what a healthy service does all the time and stay at DEBUG.
//! It is written by the first refusal at least a second after the previous summary (see
//! [`EventSummary`]), so a lone refusal after a quiet spell is written at once and a storm
//! gives one line a second. Refusals after the last summary wait for the next one.
//!
//! Breaker transitions are reported by the calls that end after them (each call looks when
//! it ends, one atomic load while nothing changed), once per transition however many calls
//! end together.

use std::sync::Arc;

use stormguard_core::Criticality;
use stormguard_core::Instant;
use stormguard_core::{BreakerState, BreakerTransition, TransitionWatch};
use stormguard_core::{DEFAULT_SUMMARY_INTERVAL, EventSummary, LayerName};
use stormguard_core::{Refusal, RetryController};

/// The refusals the summary counts, in the order of its counts.
const SUMMARISED: [Refusal; 7] = [
    Refusal::Attempts,
    Refusal::Deadline,
    Refusal::Breaker,
    Refusal::Budget,
    Refusal::KeyBudget,
    Refusal::Allowance,
    Refusal::Saturated,
];

/// The event state of one layer, shared by every call through it.
#[derive(Debug)]
pub(crate) struct LayerEvents {
    name: Arc<LayerName>,
    refusals: EventSummary<{ SUMMARISED.len() }>,
    /// Calls the adaptive throttle refused, by criticality (lowest first).
    throttled: EventSummary<{ Criticality::ALL.len() }>,
    breaker: Option<TransitionWatch>,
}

impl LayerEvents {
    /// Events of a layer called `name` whose breaker (if any) is `controller`'s.
    pub(crate) fn new(name: Arc<LayerName>, controller: &RetryController) -> Self {
        LayerEvents {
            name,
            refusals: EventSummary::new(DEFAULT_SUMMARY_INTERVAL, Instant::now()),
            throttled: EventSummary::new(DEFAULT_SUMMARY_INTERVAL, Instant::now()),
            breaker: controller.breaker().map(|b| b.watch()),
        }
    }

    /// The layer's name, shared with its metrics.
    pub(crate) fn name(&self) -> &Arc<LayerName> {
        &self.name
    }

    fn layer(&self) -> &str {
        self.name.get().map_or("", |n| n)
    }

    /// A retry of a call to `path` was refused: counted, and the summary written when due.
    pub(crate) fn refused(&self, refusal: Refusal, path: &str) {
        let Some(cause) = SUMMARISED.iter().position(|r| *r == refusal) else {
            return;
        };
        let Some(summary) = self.refusals.record_at(cause, Instant::now()) else {
            return;
        };
        let [
            attempts,
            deadline,
            breaker,
            budget,
            key_budget,
            allowance,
            saturated,
        ] = summary.counts;
        tracing::info!(
            stormguard.layer = self.layer(),
            rpc.method = path,
            refused.attempts = attempts,
            refused.deadline = deadline,
            refused.breaker = breaker,
            refused.budget = budget,
            refused.key_budget = key_budget,
            refused.allowance = allowance,
            refused.saturated = saturated,
            summary.window_ms = summary.elapsed.as_millis() as u64,
            "stormguard: {} retries refused in the last {:.1} s",
            summary.total(),
            summary.elapsed.as_secs_f64(),
        );
    }

    /// The adaptive throttle refused a call of `class` to `path`: counted, and the summary
    /// written when due (as for refused retries, at most once a second).
    pub(crate) fn throttled(&self, class: Criticality, path: &str) {
        let cause = Criticality::ALL
            .iter()
            .position(|c| *c == class)
            .unwrap_or(1);
        let Some(summary) = self.throttled.record_at(cause, Instant::now()) else {
            return;
        };
        let [sheddable, default, critical] = summary.counts;
        tracing::info!(
            stormguard.layer = self.layer(),
            rpc.method = path,
            throttled.sheddable = sheddable,
            throttled.default = default,
            throttled.critical = critical,
            summary.window_ms = summary.elapsed.as_millis() as u64,
            "stormguard: {} calls rejected by the client throttle in the last {:.1} s",
            summary.total(),
            summary.elapsed.as_secs_f64(),
        );
    }

    /// Writes the breaker's transitions that no call has reported yet.
    pub(crate) fn report_breaker(&self) {
        let Some(taken) = self.breaker.as_ref().and_then(TransitionWatch::take) else {
            return;
        };
        if taken.missed() > 0 {
            tracing::info!(
                stormguard.layer = self.layer(),
                breaker.missed = taken.missed(),
                "stormguard: circuit breaker transitions not reported (too many at once)"
            );
        }
        for transition in taken {
            self.transition(&transition);
        }
    }

    fn transition(&self, t: &BreakerTransition) {
        let open_ms = t.open_for().map(|d| d.as_millis() as u64);
        macro_rules! transition {
            ($message:literal) => {
                tracing::info!(
                    stormguard.layer = self.layer(),
                    breaker.from = t.from.as_str(),
                    breaker.to = t.to.as_str(),
                    breaker.failure_rate = t.failure_rate,
                    breaker.open_ms = open_ms,
                    $message
                )
            };
        }
        match t.to {
            BreakerState::Open { .. } => transition!("stormguard: circuit breaker opened"),
            BreakerState::HalfOpen => transition!("stormguard: circuit breaker half-opened"),
            BreakerState::Closed => transition!("stormguard: circuit breaker closed"),
        }
    }
}

#[cfg(test)]
mod tests;
