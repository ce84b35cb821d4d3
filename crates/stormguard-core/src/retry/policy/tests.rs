use super::*;

#[test]
fn most_specific_entry_wins() {
    let fast = RetryPolicy {
        max_attempts: 2,
        ..RetryPolicy::default()
    };
    let slow = RetryPolicy {
        max_attempts: 4,
        ..RetryPolicy::default()
    };
    let mut t = MethodTable::uniform(RetryPolicy::default());
    t.set_retry(MethodScope::Service("a.S"), Some(fast.clone()));
    t.set_retry(MethodScope::Method("a.S", "M"), Some(slow.clone()));
    t.set_retry(MethodScope::Method("a.S", "Never"), None);
    assert_eq!(t.lookup("/a.S/M").map(|p| p.max_attempts), Some(4));
    assert_eq!(t.lookup("/a.S/Other").map(|p| p.max_attempts), Some(2));
    assert_eq!(t.lookup("/b.S/M").map(|p| p.max_attempts), Some(3));
    assert!(t.lookup("/a.S/Never").is_none());
    assert_eq!(t.policies().count(), 3);
}

#[test]
fn a_method_is_retried_or_hedged_by_its_most_specific_entry() {
    let mut t = MethodTable::none();
    t.set_hedging(MethodScope::Service("a.S"), Some(HedgingPolicy::default()));
    t.set_retry(
        MethodScope::Method("a.S", "Write"),
        Some(RetryPolicy::default()),
    );
    assert!(t.lookup_hedging("/a.S/Read").is_some());
    assert!(t.lookup("/a.S/Read").is_none());
    assert!(t.lookup_hedging("/a.S/Write").is_none());
    assert!(t.lookup("/a.S/Write").is_some());
    // The last setting at a level wins.
    t.set_retry(MethodScope::Service("a.S"), Some(RetryPolicy::default()));
    assert!(t.lookup_hedging("/a.S/Read").is_none());
    assert!(t.lookup("/a.S/Read").is_some());
    t.set_hedging(MethodScope::Default, Some(HedgingPolicy::default()));
    assert!(t.lookup_hedging("/b.S/Any").is_some());
    assert_eq!(t.hedging_policies().count(), 1);
}

#[test]
fn empty_table_retries_nothing() {
    let t = MethodTable::none();
    assert!(t.lookup("/a.S/M").is_none());
    assert!(t.lookup("").is_none());
    assert!(t.lookup("garbage").is_none());
}

#[test]
fn attempts_above_five_count_as_five() {
    let p = RetryPolicy {
        max_attempts: 9,
        ..RetryPolicy::default()
    };
    assert!(p.validate("p").is_ok());
    assert_eq!(p.effective_max_attempts(), 5);
}

#[test]
fn validation_names_the_field() {
    let p = RetryPolicy {
        max_attempts: 1,
        ..RetryPolicy::default()
    };
    assert!(matches!(
        p.validate("methodConfig[0].retryPolicy"),
        Err(ConfigError::Invalid { field, .. }) if field == "methodConfig[0].retryPolicy.maxAttempts"
    ));
    let p = RetryPolicy {
        retryable_codes: CodeSet::EMPTY,
        ..RetryPolicy::default()
    };
    assert!(matches!(
        p.validate("r"),
        Err(ConfigError::Invalid { field, .. }) if field == "r.retryableStatusCodes"
    ));
    let p = RetryPolicy {
        retryable_codes: CodeSet::single(Code::Ok),
        ..RetryPolicy::default()
    };
    assert!(p.validate("r").is_err());
}

#[test]
fn timeout_is_looked_up_like_a_policy() {
    let mut table = MethodTable::none();
    table.set_timeout(
        MethodScope::Service("pkg.Svc"),
        Some(Duration::from_secs(1)),
    );
    table.set_timeout(MethodScope::Method("pkg.Svc", "Slow"), None);
    assert_eq!(table.timeout("/pkg.Svc/Get"), Some(Duration::from_secs(1)));
    assert_eq!(table.timeout("/pkg.Svc/Slow"), None);
    assert_eq!(table.timeout("/other.Svc/Get"), None);
}
