//! The rates a server reports in its load reports (`rps_fractional`, `eps`).

use std::time::Duration;

use tokio::time::Instant;

/// Calls per second over a sliding window of about one second (the current second and
/// a share of the previous one), for a server's `rps_fractional` and `eps`.
#[derive(Clone, Copy, Debug)]
pub struct RateMeter {
    start: Instant,
    current: u64,
    previous: u64,
}

impl RateMeter {
    /// A meter whose first second starts at `now`.
    pub fn new_at(now: Instant) -> Self {
        RateMeter {
            start: now,
            current: 0,
            previous: 0,
        }
    }

    fn roll_at(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.start);
        if elapsed >= Duration::from_secs(2) {
            self.previous = 0;
            self.current = 0;
            self.start = now;
        } else if elapsed >= Duration::from_secs(1) {
            self.previous = self.current;
            self.current = 0;
            self.start += Duration::from_secs(1);
        }
    }

    /// One event at `now`.
    pub fn record_at(&mut self, now: Instant) {
        self.roll_at(now);
        self.current = self.current.saturating_add(1);
    }

    /// Events per second at `now`: this second's so far plus the previous second's share
    /// of the last second.
    pub fn rate_at(&mut self, now: Instant) -> f64 {
        self.roll_at(now);
        let into = now
            .saturating_duration_since(self.start)
            .as_secs_f64()
            .min(1.0);
        self.current as f64 + self.previous as f64 * (1.0 - into)
    }
}
