//! Stamping each call with its criticality: `CriticalityLayer`.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::HeaderValue;
use stormguard_core::ConfigError;
use stormguard_core::CriticalityTable;
use stormguard_core::wire::http::STORMGUARD_CRITICALITY;
use tower_layer::Layer;
use tower_service::Service;

/// Stamps each call with its method's criticality (the `stormguard-criticality` header).
///
/// A server sheds sheddable work first, then retries, then the rest (see
/// [`Criticality`](crate::Criticality)). It learns a call's class from the
/// `stormguard-criticality` request header; this layer sets that header from a
/// [`CriticalityTable`] of classes per method, so the code that makes the calls does not
/// have to. A call that already carries the header (set by the caller for that one call)
/// keeps it. The server caps whatever a call claims at what its own table grants the
/// method, so stamping `critical` only helps where the server allows it.
///
/// ```
/// use stormguard_client::CriticalityLayer;
/// use tower::ServiceBuilder;
///
/// let layer = CriticalityLayer::from_json(r#"{ "criticality": {
///     "default": "default",
///     "methods": { "/shop.Cart/Checkout": "critical", "/shop.Recs/": "sheddable" } } }"#)
///     .expect("valid");
/// # let channel = tower::service_fn(|_: http::Request<()>| async {
/// #     Ok::<_, std::convert::Infallible>(http::Response::new(()))
/// # });
/// // Outside or inside the RetryLayer: retries carry the header either way.
/// let svc = ServiceBuilder::new().layer(layer).service(channel);
/// # let _ = svc;
/// ```
#[derive(Clone, Debug)]
pub struct CriticalityLayer {
    table: Arc<CriticalityTable>,
}

impl CriticalityLayer {
    /// Stamps calls with their class in `table`.
    pub fn new(table: CriticalityTable) -> Self {
        CriticalityLayer {
            table: Arc::new(table),
        }
    }

    /// Reads the table from `{"criticality": {"default": CLASS, "methods": {PATH: CLASS}}}`
    /// (see [`CriticalityTable::from_json`]); an error names the field as written.
    pub fn from_json(json: &str) -> Result<Self, ConfigError> {
        CriticalityTable::from_json(json).map(Self::new)
    }
}

impl<S> Layer<S> for CriticalityLayer {
    type Service = StampCriticality<S>;

    fn layer(&self, inner: S) -> Self::Service {
        StampCriticality {
            inner,
            table: Arc::clone(&self.table),
        }
    }
}

/// The service built by [`CriticalityLayer`]. Ready exactly when its inner service is.
#[derive(Clone, Debug)]
pub struct StampCriticality<S> {
    inner: S,
    table: Arc<CriticalityTable>,
}

impl<S, B> Service<http::Request<B>> for StampCriticality<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        if !request.headers().contains_key(STORMGUARD_CRITICALITY) {
            let class = self.table.class_for(request.uri().path());
            request.headers_mut().insert(
                STORMGUARD_CRITICALITY,
                HeaderValue::from_static(class.as_str()),
            );
        }
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests;
