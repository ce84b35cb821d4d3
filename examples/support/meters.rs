//! `--metrics-addr` for the examples that build layers of their own: each layer records
//! into the export's meter (see `otel.rs`) under a name of its own, so that the series of
//! two layers on one endpoint stay apart and the dashboard's `layer` variable can pick
//! them. Without the `otel-examples` feature there is no export (`otel::Export::start`
//! refused the flag) and every layer is left as it is.

#![allow(dead_code, reason = "each example instruments the layers it builds")]

use stormguard::client::RetryLayer;
use stormguard::client::replicas::Replicas;
use stormguard_demo::storm::Instruments;

use super::otel::Export;

/// The meter the layers record into, if the example exports its metrics.
#[derive(Clone, Debug, Default)]
pub(crate) struct Meters {
    #[cfg(feature = "otel-examples")]
    meter: Option<opentelemetry::metrics::Meter>,
}

impl Meters {
    /// The meter of `export`; none without an export.
    pub(crate) fn of(export: Option<&Export>) -> Self {
        #[cfg(feature = "otel-examples")]
        {
            Meters {
                meter: export.map(Export::meter),
            }
        }
        #[cfg(not(feature = "otel-examples"))]
        {
            let _ = export;
            Meters {}
        }
    }

    /// `layer` recording into the meter as `name`.
    pub(crate) fn retry(&self, layer: RetryLayer, name: &str) -> RetryLayer {
        #[cfg(feature = "otel-examples")]
        if let Some(meter) = &self.meter {
            return layer.with_meter(meter).with_name(name);
        }
        let _ = name;
        layer
    }

    /// `replicas` recording into the meter (its series are keyed by replica).
    pub(crate) fn replicas<S, K>(&self, replicas: Replicas<S, K>) -> Replicas<S, K>
    where
        S: Send + 'static,
        K: Clone + Eq + std::hash::Hash + std::fmt::Display + Send + 'static,
    {
        #[cfg(feature = "otel-examples")]
        if let Some(meter) = &self.meter {
            return replicas.with_meter(meter);
        }
        replicas
    }

    /// What the storm and the chain apply to their layers: each `RetryLayer` and
    /// `ShedLayer` recording into the meter under the name the run gives it.
    pub(crate) fn instruments(&self) -> Instruments {
        #[cfg(feature = "otel-examples")]
        if let Some(meter) = &self.meter {
            let (client, server) = (meter.clone(), meter.clone());
            return Instruments::new(
                move |layer, name| layer.with_meter(&client).with_name(name),
                move |layer, name| layer.with_meter(&server).with_name(name),
            );
        }
        Instruments::default()
    }
}
