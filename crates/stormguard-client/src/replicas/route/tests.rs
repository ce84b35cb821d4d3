#![allow(clippy::unwrap_used)]
use super::*;
use stormguard_core::Instant;
use stormguard_core::{ReplicaConfig, ReplicaSet};

#[test]
fn remembers_the_latest_replicas() {
    let mut set = ReplicaSet::new(ReplicaConfig::default()).unwrap();
    let ids: Vec<_> = (0..10).map(|_| set.insert_at(Instant::now())).collect();
    let route = Route::new();
    struct Nowhere;
    impl EndAttempt for Nowhere {
        fn end(&self, _: ReplicaId, _: stormguard_core::ReplicaOutcome, _: Instant) {}
        fn load_report(&self, _: ReplicaId, _: &LoadReport) {}
        fn replicas(&self) -> usize {
            1
        }
    }
    let channel: Arc<dyn EndAttempt> = Arc::new(Nowhere);
    for &id in &ids {
        route.record(id, Arc::clone(&channel));
    }
    assert_eq!(route.attempts(), 10);
    assert_eq!(route.last(), Some(ids[9]));
    let mut buf = [ids[0]; REMEMBERED];
    assert_eq!(route.tried(&mut buf), REMEMBERED);
    assert!(route.has_tried(ids[9]) && route.has_tried(ids[2]));
    assert!(!route.has_tried(ids[1]), "the oldest are forgotten");
}
