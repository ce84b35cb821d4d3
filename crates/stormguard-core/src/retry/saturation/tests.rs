#![allow(clippy::unwrap_used)]
use std::time::Duration;

use super::*;
use crate::Instant;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn report(utilization: f64, queue: f64) -> LoadReport {
    LoadReport {
        utilization,
        rps: 100.0,
        eps: 0.0,
        queue_depth: Some(queue),
    }
}

#[test]
fn endpoints_are_bounded() {
    let sat = Saturation::new(SaturationConfig::default()).unwrap();
    let t0 = Instant::now();
    for k in 0..(MAX_ENDPOINTS as u64 + 10) {
        sat.record_at(k, &report(1.0, 1.0), t0 + ms(k));
    }
    assert_eq!(sat.lock().len(), MAX_ENDPOINTS);
    assert!(!sat.lock().contains_key(&0), "the oldest made room");
}
