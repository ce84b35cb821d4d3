use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue};
use stormguard_core::wire::http::GRPC_TIMEOUT;

use super::SavedHeaders;

fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    map
}

fn pairs(map: &HeaderMap) -> Vec<(String, String)> {
    map.iter()
        .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("?").to_string()))
        .collect()
}

#[test]
fn a_retry_sends_the_kept_headers_in_the_first_attempts_order() {
    for order in [
        // tonic's own order: the caller's metadata, then its two fixed headers.
        &[
            ("x-a", "1"),
            ("x-b", "2"),
            ("te", "trailers"),
            ("content-type", "application/grpc"),
        ][..],
        &[
            ("te", "trailers"),
            ("x-a", "1"),
            ("content-type", "application/grpc"),
            ("x-b", "2"),
        ],
        &[("content-type", "application/grpc"), ("te", "trailers")],
        &[("x-a", "1")],
        &[],
    ] {
        let headers = map(order);
        let kept = SavedHeaders::of(&headers, None);
        assert!(matches!(kept, SavedHeaders::Few(_)), "{order:?}");
        assert_eq!(pairs(&kept.to_map()), pairs(&headers), "{order:?}");
    }
}

#[test]
fn more_headers_than_the_slots_hold_are_kept_in_a_copied_map() {
    let headers = map(&[
        ("x-a", "1"),
        ("x-b", "2"),
        ("x-c", "3"),
        ("x-d", "4"),
        ("te", "trailers"),
        ("content-type", "application/grpc"),
    ]);
    let kept = SavedHeaders::of(&headers, None);
    assert!(matches!(kept, SavedHeaders::Many(_)));
    assert_eq!(pairs(&kept.to_map()), pairs(&headers));
}

#[test]
fn a_renewed_header_is_not_kept() {
    let headers = map(&[
        ("grpc-timeout", "100m"),
        ("te", "trailers"),
        ("content-type", "application/grpc"),
        ("x-a", "1"),
    ]);
    for kept in [
        SavedHeaders::of(&headers, Some(&GRPC_TIMEOUT)),
        // Overflowing into a copied map drops it as well.
        SavedHeaders::of(
            &map(&[
                ("grpc-timeout", "100m"),
                ("x-a", "1"),
                ("x-b", "2"),
                ("x-c", "3"),
                ("x-d", "4"),
                ("x-e", "5"),
            ]),
            Some(&GRPC_TIMEOUT),
        ),
    ] {
        let kept = kept.to_map();
        assert!(kept.get(&GRPC_TIMEOUT).is_none());
        assert!(kept.get("x-a").is_some());
    }
    let kept = SavedHeaders::of(&headers, Some(&GRPC_TIMEOUT)).to_map();
    assert_eq!(
        pairs(&kept),
        [
            ("te", "trailers"),
            ("content-type", "application/grpc"),
            ("x-a", "1")
        ]
        .map(|(n, v)| (n.to_string(), v.to_string()))
    );
    assert_eq!(
        kept.get(CONTENT_TYPE).map(|v| v.as_bytes()),
        Some(&b"application/grpc"[..])
    );
}
