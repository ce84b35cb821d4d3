//! The layer's timer: one per call, re-armed for each attempt.
//!
//! It fires at the [`AttemptPlan::fire_at`](stormguard_core::retry::AttemptPlan::fire_at)
//! of the attempt in flight (the earlier of the call's deadline and the attempt's own), and
//! watches the call's deadline alone while a retry waits; a committed call's response body
//! arms one of its own at the call's deadline (see [`ResponseBody`](super::body::ResponseBody)). It also counts the time an
//! attempt waits for the channel, which the channel's own `grpc-timeout` timer does not.

use std::future::Future as _;
use std::pin::Pin;
use std::task::Context;

use pin_project_lite::pin_project;
use stormguard_core::Instant;
use tokio::time::Sleep;

pin_project! {
    /// A timer that may be unarmed; arming it again reuses its registration.
    pub(super) struct Timer {
        #[pin]
        sleep: Option<Sleep>,
    }
}

impl Timer {
    /// A timer armed at `at`, or unarmed.
    pub(super) fn at(at: Option<Instant>) -> Self {
        Timer {
            sleep: at.map(tokio::time::sleep_until),
        }
    }

    /// Points the timer at `at` (or disarms it).
    pub(super) fn arm(self: Pin<&mut Self>, at: Option<Instant>) {
        let mut sleep = self.project().sleep;
        match (at, sleep.as_mut().as_pin_mut()) {
            (Some(at), Some(armed)) => {
                if armed.deadline() != at {
                    armed.reset(at);
                }
            }
            (Some(at), None) => sleep.set(Some(tokio::time::sleep_until(at))),
            (None, _) => sleep.set(None),
        }
    }

    /// Whether the timer is armed.
    pub(super) fn is_armed(&self) -> bool {
        self.sleep.is_some()
    }

    /// Whether the timer is armed and has fired (registers `cx` to be woken when it does).
    pub(super) fn poll_fired(self: Pin<&mut Self>, cx: &mut Context<'_>) -> bool {
        self.project()
            .sleep
            .as_pin_mut()
            .is_some_and(|sleep| sleep.poll(cx).is_ready())
    }
}
