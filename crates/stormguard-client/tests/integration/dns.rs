//! DNS discovery end to end: `Replicas::from_dns` against a real DNS server on loopback
//! whose records the test changes, with real tonic replicas on 127.0.0.2, 127.0.0.3, ...
//! (Linux routes all of 127/8 to the loopback interface). Re-resolution runs every 50 to
//! 200 ms; each step waits on the channel's DNS reports, never on the clock.
//!
//! - scale up: the new replicas are added with slow start, no call fails;
//! - scale down, calls not idempotent: attempts in flight on the removed replicas finish,
//!   no new attempt reaches them after the resolution, no call fails;
//! - a rolling deploy replacing every record one by one: no call fails;
//! - the DNS server down: the last good set is kept, no call fails, failures counted;
//! - a replica killed while its record stays: ejected, and the early re-resolution its
//!   refusals ask for drops its record long before the timer would; back at the same
//!   address, it is a new replica;
//! - a name that never resolved: the first call fails at once with the name and why;
//! - IPv6 records.
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv6Addr};
use std::time::Duration;

use crate::dns_support::*;
use stormguard_client::RefreshConfig;
use stormguard_client::replicas::{EndpointKey, Replicas};
use stormguard_demo::dns::DnsServer;
use tonic::transport::Channel;

async fn dns_for(pods: &[&Pod], ttl_secs: u32) -> DnsServer {
    DnsServer::start(NAME, pods.iter().map(|p| p.ip()), ttl_secs)
        .await
        .unwrap()
}

#[tokio::test]
async fn scale_up_adds_replicas_with_slow_start_and_no_call_fails() {
    let pods = pods(2, 5, 0).await;
    let port = pods[0].addr.port();
    let dns = dns_for(&[&pods[0], &pods[1], &pods[2]], 1).await;
    let (replicas, client) = client(&dns, port, quick_refresh(), true);
    let mut failed = batch(&client, 20).await;
    assert_eq!(replicas.len(), 3);
    dns.set_records(pods.iter().map(Pod::ip));
    let all: Vec<&Pod> = pods.iter().collect();
    wait_report(&replicas, "the new records", |r| lists(r, &all)).await;
    // The new replicas ramp up: they join warming, not at a full share.
    let warming: Vec<_> = replicas
        .snapshot()
        .into_iter()
        .filter(|r| r.snapshot.state.as_str() == "warming")
        .map(|r| r.key.to_string())
        .collect();
    let new: Vec<_> = pods[3..]
        .iter()
        .map(|p| format!("http://{}", p.addr))
        .collect();
    assert_eq!(warming, new);
    for _ in 0..10 {
        failed += batch(&client, 20).await;
    }
    assert_eq!(failed, 0);
    assert!(
        pods[3..].iter().all(|p| p.entered() > 0),
        "the new replicas serve"
    );
}

#[tokio::test]
async fn scale_down_finishes_attempts_in_flight_and_sends_no_new_one() {
    let pods = pods(2, 5, 0).await;
    let port = pods[0].addr.port();
    let all: Vec<&Pod> = pods.iter().collect();
    let dns = dns_for(&all, 1).await;
    // Not idempotent: a call fails unless no attempt of it reached a replica it cannot
    // reach again.
    let (replicas, client) = client(&dns, port, quick_refresh(), false);
    let mut failed = batch(&client, 20).await;
    // Hold attempts in flight on the two replicas that will go.
    let leaving = &pods[3..];
    for pod in leaving {
        pod.control.close_gate();
    }
    let held = {
        let client = client.clone();
        tokio::spawn(async move { batch(&client, 40).await })
    };
    for pod in leaving {
        tokio::time::timeout(PATIENCE, pod.control.wait_running(1))
            .await
            .unwrap();
    }
    dns.set_records(pods[..3].iter().map(Pod::ip));
    let staying: Vec<&Pod> = pods[..3].iter().collect();
    wait_report(&replicas, "the removal", |r| lists(r, &staying)).await;
    let entered_at_removal: Vec<u64> = leaving.iter().map(Pod::entered).collect();
    assert!(
        leaving.iter().all(|pod| pod.connections() > 0),
        "the attempts in flight hold their connections"
    );
    // The attempts in flight finish: their calls succeed.
    for pod in leaving {
        pod.control.open_gate();
    }
    failed += held.await.unwrap();
    // With them, the client's connections to the removed replicas close, before the
    // processes stop.
    for pod in leaving {
        tokio::time::timeout(PATIENCE, pod.wait_no_connection())
            .await
            .expect("the removed replica's connection closes once its attempts finished");
    }
    for _ in 0..5 {
        failed += batch(&client, 20).await;
    }
    // The processes stop after their grace period; nothing notices.
    for pod in leaving {
        pod.kill();
    }
    for _ in 0..5 {
        failed += batch(&client, 20).await;
    }
    assert_eq!(failed, 0);
    let entered_after: Vec<u64> = leaving.iter().map(Pod::entered).collect();
    assert_eq!(
        entered_after, entered_at_removal,
        "attempts after the resolution"
    );
    assert_eq!(replicas.len(), 3);
}

#[tokio::test]
async fn a_rolling_deploy_to_new_addresses_fails_no_call() {
    let pods = pods(2, 6, 0).await;
    let port = pods[0].addr.port();
    let (old, new) = pods.split_at(3);
    let dns = dns_for(&old.iter().collect::<Vec<_>>(), 1).await;
    let (replicas, client) = client(&dns, port, quick_refresh(), false);
    let mut failed = batch(&client, 20).await;
    for step in 0..3 {
        // One old pod's record replaced by one new pod's.
        let listed: Vec<&Pod> = old[step + 1..].iter().chain(&new[..=step]).collect();
        dns.set_records(listed.iter().map(|p| p.ip()));
        wait_report(&replicas, "the next step", |r| lists(r, &listed)).await;
        let entered = old[step].entered();
        failed += batch(&client, 20).await;
        // Drained (no attempt left on it), then stopped.
        assert_eq!(old[step].entered(), entered, "step {step}");
        old[step].kill();
        failed += batch(&client, 20).await;
    }
    assert_eq!(failed, 0);
    let keys: Vec<String> = replicas
        .snapshot()
        .iter()
        .map(|r| r.key.to_string())
        .collect();
    let want: Vec<String> = new.iter().map(|p| format!("http://{}", p.addr)).collect();
    assert_eq!(keys, want);
}

#[tokio::test]
async fn the_last_good_set_is_kept_while_the_dns_server_is_down() {
    let pods = pods(2, 3, 0).await;
    let port = pods[0].addr.port();
    let all: Vec<&Pod> = pods.iter().collect();
    let dns = dns_for(&all, 1).await;
    let (replicas, client) = client(&dns, port, quick_refresh(), true);
    let mut failed = batch(&client, 20).await;
    dns.set_answering(false);
    let down = wait_report(&replicas, "a failed resolution", |r| r.failing.is_some()).await;
    assert!(lists(&down, &all), "{down:?}");
    // Two more failed resolutions while calls go on.
    let failures = down.counts.failures;
    for _ in 0..2 {
        failed += batch(&client, 20).await;
        wait_report(&replicas, "another failure", |r| {
            r.counts.failures > failures
        })
        .await;
    }
    assert_eq!(replicas.len(), 3);
    dns.set_answering(true);
    let back = wait_report(&replicas, "recovery", |r| r.failing.is_none()).await;
    failed += batch(&client, 20).await;
    assert_eq!(failed, 0);
    assert!(
        back.counts.failures >= 2 && back.counts.removed == 0,
        "{back:?}"
    );
}

#[tokio::test]
async fn a_killed_replica_whose_record_stays_is_dropped_by_an_early_resolution() {
    let pods = pods(2, 3, 0).await;
    let port = pods[0].addr.port();
    let all: Vec<&Pod> = pods.iter().collect();
    // A one-minute TTL and timer: only an early resolution can see a change in time.
    let dns = dns_for(&all, 60).await;
    let refresh = RefreshConfig {
        min_interval: Duration::from_millis(50),
        max_interval: Duration::from_secs(60),
        timeout: Duration::from_millis(200),
        jitter: 0.0,
        seed: Some(7),
    };
    let (replicas, client) = client(&dns, port, refresh, true);
    let mut failed = batch(&client, 20).await;
    let first = wait_report(&replicas, "the first answer", |r| r.counts.resolutions >= 1).await;
    pods[0].kill();
    // Its refusals eject it, and ask for an early resolution: the record is still there.
    let key = format!("http://{}", pods[0].addr);
    let resolutions = first.counts.resolutions;
    for _ in 0..5 {
        failed += batch(&client, 20).await;
    }
    let ejected = replicas
        .snapshot()
        .into_iter()
        .find(|r| r.key.to_string() == key)
        .unwrap();
    assert!(ejected.snapshot.ejections >= 1, "{ejected:?}");
    wait_report(&replicas, "an early resolution", |r| {
        r.counts.resolutions > resolutions
    })
    .await;
    // The record goes; the next refusal's early resolution drops the replica.
    dns.set_records(pods[1..].iter().map(Pod::ip));
    let staying: Vec<&Pod> = pods[1..].iter().collect();
    let dropped = tokio::time::timeout(PATIENCE, async {
        while !replicas.snapshot().iter().all(|r| r.key.to_string() != key) {
            failed += batch(&client, 5).await;
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(dropped.is_ok(), "still listed: {:?}", replicas.snapshot());
    assert!(lists(&replicas.dns_reports().unwrap().borrow(), &staying));
    assert_eq!(failed, 0);
}

#[tokio::test]
async fn an_address_back_after_its_removal_is_a_new_replica() {
    let pods = pods(2, 3, 0).await;
    let port = pods[0].addr.port();
    let all: Vec<&Pod> = pods.iter().collect();
    let dns = dns_for(&all, 1).await;
    let (replicas, client) = client(&dns, port, quick_refresh(), true);
    let mut failed = batch(&client, 20).await;
    let key = format!("http://{}", pods[0].addr);
    let state_of = |replicas: &Replicas<Channel, EndpointKey>| {
        replicas
            .snapshot()
            .into_iter()
            .find(|r| r.key.to_string() == key)
    };
    pods[0].kill();
    for _ in 0..5 {
        failed += batch(&client, 20).await;
    }
    assert!(state_of(&replicas).unwrap().snapshot.ejections >= 1);
    let staying: Vec<&Pod> = pods[1..].iter().collect();
    dns.set_records(staying.iter().map(|p| p.ip()));
    wait_report(&replicas, "the removal", |r| lists(r, &staying)).await;
    assert!(state_of(&replicas).is_none());
    let back = Pod::start(pods[0].ip(), port).await.unwrap();
    dns.set_records(all.iter().map(|p| p.ip()));
    wait_report(&replicas, "the return", |r| lists(r, &all)).await;
    let fresh = state_of(&replicas).unwrap().snapshot;
    assert_eq!((fresh.ejections, fresh.failures), (0, 0), "{fresh:?}");
    assert_eq!(fresh.state.as_str(), "warming");
    for _ in 0..5 {
        failed += batch(&client, 20).await;
    }
    assert_eq!(failed, 0);
    assert!(back.entered() > 0);
}

#[tokio::test]
async fn a_name_that_never_resolved_fails_the_first_call_with_its_reason() {
    let pods = pods(2, 1, 0).await;
    let port = pods[0].addr.port();
    // The server answers for another name only: NXDOMAIN.
    let dns = DnsServer::start("other.stormguard.test", [pods[0].ip()], 1)
        .await
        .unwrap();
    let (_replicas, first) = client(&dns, port, quick_refresh(), true);
    let status = first
        .clone()
        .reserve(stormguard_demo::ReserveRequest::default())
        .await
        .unwrap_err();
    let message = status.message();
    assert!(
        message.contains(NAME)
            && message.contains("has not resolved")
            && message.contains("does not exist (NXDOMAIN for A and AAAA)"),
        "{status:?}"
    );
    // A DNS server that does not answer: the same, after the resolution's timeout.
    dns.set_answering(false);
    let (_replicas, client) = client(&dns, port, quick_refresh(), true);
    let status = client
        .clone()
        .reserve(stormguard_demo::ReserveRequest::default())
        .await
        .unwrap_err();
    assert!(status.message().contains("has not resolved"), "{status:?}");
}

#[tokio::test]
async fn ipv6_records_are_replicas() {
    let pod = Pod::start(IpAddr::V6(Ipv6Addr::LOCALHOST), 0)
        .await
        .unwrap();
    let dns = dns_for(&[&pod], 1).await;
    let (replicas, client) = client(&dns, pod.addr.port(), quick_refresh(), true);
    assert_eq!(batch(&client, 10).await, 0);
    let keys: Vec<String> = replicas
        .snapshot()
        .iter()
        .map(|r| r.key.to_string())
        .collect();
    assert_eq!(keys, [format!("http://[::1]:{}", pod.addr.port())]);
    assert_eq!(pod.entered(), 10);
    let _: &Replicas<_, _> = &replicas;
}

/// A first call with a 300 ms deadline, while the DNS server (real, on loopback) does not
/// answer the first lookup (its timeout is 5 s): the call ends at its deadline, on paused
/// time (nothing on the network ever answers, so the clock only moves to the timers), with
/// an error that says DNS did not answer; through the retry layer and on the bare channel.
#[tokio::test(start_paused = true)]
async fn a_first_call_waits_for_the_first_lookup_no_longer_than_its_deadline() {
    let dns = DnsServer::start(NAME, [IpAddr::from([127, 0, 0, 2])], 1)
        .await
        .unwrap();
    dns.set_answering(false);
    let refresh = RefreshConfig {
        timeout: Duration::from_secs(5),
        ..quick_refresh()
    };
    let (replicas, client) = client(&dns, 50051, refresh, true);
    let deadline = Duration::from_millis(300);
    let call = || {
        let mut request = tonic::Request::new(stormguard_demo::ReserveRequest::default());
        request.set_timeout(deadline);
        request
    };
    let start = tokio::time::Instant::now();
    let status = client.clone().reserve(call()).await.unwrap_err();
    assert!(start.elapsed() <= deadline, "{:?}", start.elapsed());
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(
        status.message().contains("DNS server has not answered") && status.message().contains(NAME),
        "{status:?}"
    );
    let start = tokio::time::Instant::now();
    let status = stormguard_demo::InventoryClient::new(replicas)
        .reserve(call())
        .await
        .unwrap_err();
    assert!(
        start.elapsed() <= deadline + Duration::from_millis(1),
        "{:?}",
        start.elapsed()
    );
    assert!(
        status.message().contains("DNS server has not answered"),
        "{status:?}"
    );
}
