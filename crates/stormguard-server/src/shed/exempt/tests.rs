#![allow(clippy::unwrap_used)]
use super::*;

#[test]
fn health_is_exempt_by_default_and_can_be_turned_off() {
    let mut never = NeverShed::default();
    assert!(never.matches("/grpc.health.v1.Health/Check"));
    assert!(never.matches("/grpc.health.v1.Health/Watch"));
    assert!(!never.matches("/grpc.health.v1.HealthX/Check"));
    assert!(!never.matches("/grpc.health.v1.Health"));
    assert!(!never.matches("grpc.health.v1.Health/Check"));
    assert!(!never.matches("/pkg.Svc/Check"));
    never.set_health(false);
    assert!(!never.matches("/grpc.health.v1.Health/Check"));
}

#[test]
fn services_methods_and_a_predicate_can_be_named() {
    let mut never = NeverShed::default();
    never.add("pkg.Admin").unwrap();
    never.add("/pkg.Inventory/Ping").unwrap();
    assert!(never.matches("/pkg.Admin/Anything"));
    assert!(never.matches("/pkg.Inventory/Ping"));
    assert!(!never.matches("/pkg.Inventory/Reserve"));
    assert!(!never.matches("/pkg.Inventory/Ping/x"));
    never.set_predicate(Arc::new(|path: &str| path.ends_with("/Reserve")));
    assert!(never.matches("/pkg.Inventory/Reserve"));
}

#[test]
fn malformed_entries_are_refused_with_the_field_named() {
    for bad in [
        "",
        "pkg.Svc/M",
        "/pkg.Svc",
        "/pkg.Svc/",
        "//M",
        "/a/b/c",
        "pkg Svc",
    ] {
        let err = NeverShed::default().add(bad).unwrap_err();
        assert!(err.to_string().contains("never_shed"), "{bad:?}: {err}");
    }
}
