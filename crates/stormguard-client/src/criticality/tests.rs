#![allow(clippy::unwrap_used)]
use super::*;
use stormguard_core::Criticality;
use tower::{ServiceExt, service_fn};

#[tokio::test]
async fn stamps_by_method_and_keeps_a_callers_value() {
    let table = CriticalityTable::new(Criticality::Sheddable)
        .with_method("/a.S/Pay", Criticality::Critical)
        .unwrap();
    let echo = service_fn(|r: http::Request<()>| async move {
        Ok::<_, std::convert::Infallible>(
            r.headers()
                .get(STORMGUARD_CRITICALITY)
                .map(|v| v.to_str().unwrap().to_owned()),
        )
    });
    let svc = CriticalityLayer::new(table).layer(echo);
    let call = |path: &str, given: Option<&'static str>| {
        let mut r = http::Request::builder().uri(format!("http://x{path}"));
        if let Some(v) = given {
            r = r.header(STORMGUARD_CRITICALITY, v);
        }
        svc.clone().oneshot(r.body(()).unwrap())
    };
    assert_eq!(
        call("/a.S/Pay", None).await.unwrap().as_deref(),
        Some("critical")
    );
    assert_eq!(
        call("/a.S/Get", None).await.unwrap().as_deref(),
        Some("sheddable")
    );
    assert_eq!(
        call("/a.S/Pay", Some("default")).await.unwrap().as_deref(),
        Some("default")
    );
}
