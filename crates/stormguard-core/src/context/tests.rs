#![allow(clippy::unwrap_used)]
use super::*;

#[test]
fn a_peer_can_lower_the_allowance_but_never_raise_or_create_it() {
    let lowered = RequestScope::new()
        .with_allowance(3)
        .with_peer_allowance(b"1");
    assert_eq!(lowered.allowance(), Some(1));
    let kept = RequestScope::new()
        .with_allowance(3)
        .with_peer_allowance(b"9");
    assert_eq!(kept.allowance(), Some(3));
    let ignored = RequestScope::new()
        .with_allowance(3)
        .with_peer_allowance(b"-2");
    assert_eq!(ignored.allowance(), Some(3));
    let off = RequestScope::new().with_peer_allowance(b"1");
    assert_eq!(off.allowance(), None);
}

#[tokio::test]
async fn spending_stops_at_zero_and_refunds_give_back() {
    let (first, second, refunded, outside) =
        request_scope(RequestScope::new().with_allowance(1), async {
            let first = spend_retry();
            let second = spend_retry();
            refund_retry();
            (first, second, remaining_allowance(), ())
        })
        .await;
    assert_eq!(
        (first, second, refunded, outside),
        (true, false, Some(1), ())
    );
    // No scope, or a scope without an allowance: nothing limits.
    assert!(spend_retry());
    assert!(request_scope(RequestScope::new(), async { spend_retry() }).await);
}

#[tokio::test]
async fn a_refusal_is_seen_by_whoever_holds_the_scope() {
    let mut fut = std::pin::pin!(request_scope(RequestScope::new(), async {
        mark_downstream_refused();
    }));
    (&mut fut).await;
    let scope = fut.as_mut().take_value().unwrap();
    assert!(scope.downstream_refused());
}

#[test]
fn a_deadline_can_be_shortened_but_not_extended() {
    let now = Instant::now();
    let ctx = CallContext::new().with_deadline(now + Duration::from_secs(5));
    let shorter = ctx.with_deadline(now + Duration::from_secs(1));
    assert_eq!(shorter.deadline(), Some(now + Duration::from_secs(1)));
    let longer = shorter.with_deadline(now + Duration::from_secs(9));
    assert_eq!(longer.deadline(), Some(now + Duration::from_secs(1)));
}

#[test]
fn an_absurd_timeout_saturates_instead_of_panicking() {
    let ctx = CallContext::new().with_timeout(Duration::MAX);
    let left = ctx.remaining_at(Instant::now()).expect("a deadline is set");
    assert!(left > Duration::from_secs(365 * 24 * 3600));
    // An earlier deadline still wins over the far one.
    let soon = Instant::now() + Duration::from_secs(1);
    assert_eq!(ctx.with_deadline(soon).deadline(), Some(soon));
}

#[test]
fn remaining_time_saturates_at_zero() {
    let now = Instant::now();
    let ctx = CallContext::new().with_deadline(now);
    assert_eq!(
        ctx.remaining_at(now + Duration::from_secs(1)),
        Some(Duration::ZERO)
    );
    assert_eq!(CallContext::new().remaining_at(now), None);
}

#[tokio::test]
async fn scopes_nest_and_end() {
    let outer = CallContext::new().with_previous_attempts(1);
    let inner = CallContext::new().with_previous_attempts(2);
    let seen = scope(outer, async {
        let a = CallContext::current();
        let b = scope(inner, async { CallContext::current() }).await;
        (a, b, CallContext::current())
    })
    .await;
    assert_eq!(seen, (Some(outer), Some(inner), Some(outer)));
    assert_eq!(CallContext::current(), None);
}

#[tokio::test]
async fn a_peer_allowance_lowers_the_scope_s_and_each_retry_spends_one() {
    let scope = RequestScope::new()
        .with_allowance(2)
        .with_peer_allowance(b"1");
    let left = request_scope(scope, async {
        assert!(spend_retry());
        (spend_retry(), remaining_allowance())
    })
    .await;
    assert_eq!(left, (false, Some(0)));
}
