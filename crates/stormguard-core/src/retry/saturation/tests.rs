#![allow(clippy::unwrap_used)]
use std::time::Duration;

use tokio::time::Instant;

use super::*;

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

#[test]
fn saturation_needs_a_queue_and_fades() {
    let sat = Saturation::new(SaturationConfig::default()).unwrap();
    let t0 = Instant::now();
    sat.record_at(0, &report(1.0, 0.0), t0);
    assert!(!sat.refuses_retry_at(1, t0), "busy but nothing queued");
    sat.record_at(0, &report(1.0, 2.0), t0);
    assert!(
        sat.refuses_retry_at(1, t0),
        "half the reports say saturated"
    );
    // Unsaturated reports outweigh it as they come.
    sat.record_at(0, &report(0.5, 0.0), t0 + ms(10));
    assert!(!sat.refuses_retry_at(1, t0 + ms(10)));
    sat.record_at(0, &report(1.0, 5.0), t0 + ms(2000));
    sat.record_at(0, &report(1.0, 5.0), t0 + ms(2000));
    assert!(
        sat.refuses_retry_at(1, t0 + ms(2000)),
        "old reports decayed"
    );
    assert!(sat.refuses_retry_at(1, t0 + ms(5900)));
    assert!(
        !sat.refuses_retry_at(1, t0 + ms(6000)),
        "nothing heard for 4 windows"
    );
}

#[test]
fn config_is_checked() {
    let bad = [
        SaturationConfig {
            utilization: 0.0,
            ..SaturationConfig::default()
        },
        SaturationConfig {
            queue_depth: f64::NAN,
            ..SaturationConfig::default()
        },
        SaturationConfig {
            window: Duration::ZERO,
            ..SaturationConfig::default()
        },
    ];
    for c in bad {
        assert!(Saturation::new(c).is_err());
    }
}

#[test]
fn config_key_reads_and_names_its_fields() {
    use crate::config::ClientConfig;
    let c = ClientConfig::from_json(
        r#"{"retry": {"load_reports": {"utilization": 0.9, "queue_depth": 2, "window": "500ms"}}}"#,
    )
    .unwrap();
    assert_eq!(
        c.load_reports,
        Some(SaturationConfig {
            utilization: 0.9,
            queue_depth: 2.0,
            window: ms(500),
        })
    );
    let c = ClientConfig::from_json(r#"{"retry": {"load_reports": {}}}"#).unwrap();
    assert_eq!(c.load_reports, Some(SaturationConfig::default()));
    assert_eq!(ClientConfig::from_json("{}").unwrap().load_reports, None);
    let e =
        ClientConfig::from_json(r#"{"retry": {"load_reports": {"utilization": -1}}}"#).unwrap_err();
    assert!(
        e.to_string().contains("retry.load_reports.utilization"),
        "{e}"
    );
    let e = ClientConfig::from_json(r#"{"methods": {"/a.B/": {"load_reports": {}}}}"#).unwrap_err();
    assert!(e.to_string().contains("load_reports"), "{e}");
    let controller = crate::retry::RetryController::from_config(
        &(ClientConfig::from_json(r#"{"retry": {"load_reports": {}}}"#).unwrap()).with_seed(1),
    )
    .unwrap();
    assert!(controller.saturation().is_some());
}

#[test]
fn one_saturated_endpoint_refuses_alone_not_beside_an_idle_one() {
    let sat = Saturation::new(SaturationConfig::default()).unwrap();
    let now = Instant::now();
    sat.record_at(1, &report(1.0, 4.0), now);
    assert!(sat.refuses_retry_at(1, now));
    assert!(
        !sat.refuses_retry_at(2, now),
        "a second replica, not heard from yet"
    );
    sat.record_at(2, &report(0.2, 0.0), now);
    assert!(
        !sat.refuses_retry_at(1, now),
        "replica 2 can take the retry"
    );
    assert!(sat.is_saturated_at(1, now));
}

#[test]
fn a_retry_is_refused_while_every_endpoint_heard_from_is_saturated() {
    let sat = Saturation::new(SaturationConfig::default()).unwrap();
    let busy = LoadReport {
        utilization: 1.0,
        rps: 50.0,
        eps: 0.0,
        queue_depth: Some(4.0),
    };
    let idle = LoadReport {
        utilization: 0.2,
        rps: 50.0,
        eps: 0.0,
        queue_depth: Some(0.0),
    };
    let now = Instant::now();
    sat.record_at(1, &busy, now);
    assert!(sat.refuses_retry_at(1, now));
    assert!(
        !sat.refuses_retry_at(2, now),
        "a second replica, not heard from yet"
    );
    sat.record_at(2, &idle, now);
    assert!(
        !sat.refuses_retry_at(1, now),
        "replica 2 can take the retry"
    );
    assert!(
        !sat.refuses_retry_at(1, now + Duration::from_secs(5)),
        "old reports expire"
    );
}
