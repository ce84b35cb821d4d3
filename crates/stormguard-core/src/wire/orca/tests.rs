#![allow(clippy::unwrap_used)]
use super::*;
use std::time::Duration;

use tokio::time::Instant;

use crate::admission::RateMeter;
use crate::balance::weights::a58_weight;

use prost::Message as _;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn absurd_fields_are_refused() {
    let good = OrcaLoadReport {
        application_utilization: 0.5,
        rps_fractional: 10.0,
        ..OrcaLoadReport::default()
    };
    assert!(LoadReport::from_message(&good).is_ok());
    type Spoil = fn(&mut OrcaLoadReport);
    let cases: [(&str, Spoil); 8] = [
        ("cpu_utilization", |m| m.cpu_utilization = f64::NAN),
        ("cpu_utilization", |m| m.cpu_utilization = -0.1),
        ("application_utilization", |m| {
            m.application_utilization = MAX_UTILIZATION * 2.0
        }),
        ("mem_utilization", |m| m.mem_utilization = 1.5),
        ("rps_fractional", |m| m.rps_fractional = f64::INFINITY),
        ("eps", |m| m.eps = -1.0),
        ("utilization", |m| {
            m.utilization.insert("disk".into(), 2.0);
        }),
        ("named_metrics", |m| {
            m.named_metrics.insert("x".into(), f64::NAN);
        }),
    ];
    for (field, spoil) in cases {
        let mut m = good.clone();
        spoil(&mut m);
        assert_eq!(
            LoadReport::from_message(&m),
            Err(LoadReportError::OutOfRange(field))
        );
    }
}

#[test]
fn utilization_falls_back_to_cpu() {
    let m = OrcaLoadReport {
        cpu_utilization: 0.7,
        ..OrcaLoadReport::default()
    };
    assert_eq!(LoadReport::from_message(&m).unwrap().utilization, 0.7);
    let m = OrcaLoadReport {
        cpu_utilization: 0.7,
        application_utilization: 0.3,
        ..OrcaLoadReport::default()
    };
    assert_eq!(LoadReport::from_message(&m).unwrap().utilization, 0.3);
}

#[test]
fn the_message_round_trips() {
    let mut m = OrcaLoadReport {
        application_utilization: 1.0,
        rps_fractional: 12.5,
        eps: 0.5,
        ..OrcaLoadReport::default()
    };
    m.named_metrics.insert(QUEUE_DEPTH.into(), 3.0);
    let bytes = m.encode_to_vec();
    assert_eq!(OrcaLoadReport::decode(&bytes[..]).unwrap(), m);
}

#[test]
fn rate_meter_counts_about_a_second() {
    let t0 = Instant::now();
    let mut m = RateMeter::new_at(t0);
    for i in 0..100 {
        m.record_at(t0 + ms(i * 10));
    }
    assert_eq!(m.rate_at(t0 + ms(999)), 100.0);
    let r = m.rate_at(t0 + ms(1500));
    assert!((r - 50.0).abs() < 1e-9, "{r}");
    assert_eq!(m.rate_at(t0 + ms(4000)), 0.0);
}

#[test]
fn a58_weight_penalises_errors() {
    let r = LoadReport {
        utilization: 0.5,
        rps: 100.0,
        eps: 10.0,
        queue_depth: None,
    };
    assert_eq!(a58_weight(&r, 0.0), Some(200.0));
    assert_eq!(a58_weight(&r, 1.0), Some(100.0 / 0.6));
    assert_eq!(a58_weight(&LoadReport { rps: 0.0, ..r }, 1.0), None);
}
