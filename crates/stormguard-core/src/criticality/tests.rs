#![allow(clippy::unwrap_used)]
use super::*;

#[test]
fn a_value_names_a_class_only_exactly() {
    assert_eq!(
        Criticality::from_value(b"critical"),
        Some(Criticality::Critical)
    );
    assert_eq!(Criticality::from_value(b"Critical"), None);
    assert_eq!(Criticality::from_value(b" sheddable"), None);
}

#[test]
fn table_matches_exact_then_longest_prefix() {
    use Criticality::*;
    let t = CriticalityTable::new(Sheddable)
        .with_method("/a.S/", Default)
        .unwrap()
        .with_method("/a.S/Pay", Critical)
        .unwrap()
        .with_method("/a.", Critical)
        .unwrap();
    assert_eq!(t.class_for("/a.S/Pay"), Critical);
    assert_eq!(t.class_for("/a.S/Payx"), Default);
    assert_eq!(t.class_for("/a.S/Get"), Default);
    assert_eq!(t.class_for("/b.S/Get"), Sheddable);
    // "/a." does not end in '/': exact only.
    assert_eq!(t.class_for("/a.T/Get"), Sheddable);
    assert!(
        CriticalityTable::default()
            .with_method("a.S/", Default)
            .is_err()
    );
    assert!(
        CriticalityTable::default()
            .with_method("/", Default)
            .is_err()
    );
}

#[test]
fn a_peer_never_gets_more_than_the_table_allows() {
    use Criticality::*;
    let t = CriticalityTable::default()
        .with_method("/a.S/Pay", Critical)
        .unwrap();
    assert_eq!(t.resolve("/a.S/Get", Critical), Default);
    assert_eq!(t.resolve("/a.S/Pay", Critical), Critical);
    assert_eq!(t.resolve("/a.S/Pay", Sheddable), Sheddable);
    assert_eq!(t.resolve("/a.S/Pay", Default), Default);
    let capped = t.with_method("/a.S/Report", Sheddable).unwrap();
    for claim in Criticality::ALL {
        assert_eq!(capped.resolve("/a.S/Report", claim), Sheddable);
    }
}
