//! stormguard's hand-written `OrcaLoadReport` (core's `orca` module) against the types
//! generated from the vendored published proto: the same bytes, both ways, every field.

#![allow(deprecated)] // the published proto's `rps` (field 3) is deprecated
#![allow(clippy::unwrap_used)]

use prost::Message as _;
use stormguard_core::OrcaLoadReport as Mirror;
use stormguard_demo::orca::OrcaLoadReport as Published;

fn every_field() -> Published {
    Published {
        cpu_utilization: 0.25,
        mem_utilization: 0.5,
        rps: 7,
        request_cost: [("bytes".to_owned(), 3487.0)].into(),
        utilization: [("disk".to_owned(), 0.75)].into(),
        rps_fractional: 120.5,
        eps: 1.5,
        named_metrics: [
            ("queue_depth".to_owned(), 4.0),
            ("time_queued_ms".to_owned(), 12.5),
        ]
        .into(),
        application_utilization: 1.0,
    }
}

#[test]
fn the_published_bytes_decode_with_the_mirror() {
    let sent = every_field();
    let got = Mirror::decode(&sent.encode_to_vec()[..]).unwrap();
    assert_eq!(got.cpu_utilization, sent.cpu_utilization);
    assert_eq!(got.mem_utilization, sent.mem_utilization);
    assert_eq!(got.rps_fractional, sent.rps_fractional);
    assert_eq!(got.eps, sent.eps);
    assert_eq!(got.application_utilization, sent.application_utilization);
    let map = |m: &std::collections::HashMap<String, f64>| {
        m.iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    assert_eq!(got.request_cost, map(&sent.request_cost));
    assert_eq!(got.utilization, map(&sent.utilization));
    assert_eq!(got.named_metrics, map(&sent.named_metrics));
    // The deprecated integer `rps` (field 3) is skipped, not misread.
    let value = stormguard_core::wire::encode_load_report(&got);
    let checked = stormguard_core::wire::parse_load_report([value.as_bytes()])
        .unwrap()
        .unwrap();
    assert_eq!(checked.utilization, 1.0);
    assert_eq!(checked.queue_depth, Some(4.0));
}

#[test]
fn the_mirror_bytes_decode_with_the_published_types() {
    let mut sent = Mirror::decode(&every_field().encode_to_vec()[..]).unwrap();
    sent.named_metrics.insert("extra".to_owned(), -2.0);
    let got = Published::decode(&sent.encode_to_vec()[..]).unwrap();
    let mut want = every_field();
    want.rps = 0;
    want.named_metrics.insert("extra".to_owned(), -2.0);
    assert_eq!(got, want);
}
