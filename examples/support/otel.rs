//! `--otel-stdout`: an example's metrics, exported to stdout by OpenTelemetry's stdout
//! exporter every `interval` and once more when the example ends. Needs the
//! `otel-examples` feature (`cargo run --features otel-examples --example ...`); without
//! it the flag is refused with a message saying so.

/// Where an example's metrics go.
pub(crate) struct Export {
    #[cfg(feature = "otel-examples")]
    provider: opentelemetry_sdk::metrics::SdkMeterProvider,
}

impl Export {
    /// A meter provider of its own (nothing global) exporting to stdout.
    #[cfg(feature = "otel-examples")]
    pub(crate) fn stdout(interval: std::time::Duration) -> Result<Self, String> {
        use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
        let reader = PeriodicReader::builder(opentelemetry_stdout::MetricExporter::default())
            .with_interval(interval)
            .build();
        Ok(Export {
            provider: SdkMeterProvider::builder().with_reader(reader).build(),
        })
    }

    /// Without the feature there is nothing to export with.
    #[cfg(not(feature = "otel-examples"))]
    pub(crate) fn stdout(_interval: std::time::Duration) -> Result<Self, String> {
        Err("--otel-stdout needs the otel-examples feature: \
             cargo run --features otel-examples --example ..."
            .to_owned())
    }

    /// The meter the example's layer records into.
    #[cfg(feature = "otel-examples")]
    pub(crate) fn meter(&self) -> opentelemetry::metrics::Meter {
        use opentelemetry::metrics::MeterProvider as _;
        self.provider.meter("stormguard-example")
    }

    /// Exports what is left and stops.
    pub(crate) fn finish(self) {
        #[cfg(feature = "otel-examples")]
        {
            if let Err(e) = self.provider.force_flush() {
                eprintln!("otel: flush: {e}");
            }
            if let Err(e) = self.provider.shutdown() {
                eprintln!("otel: shutdown: {e}");
            }
        }
    }
}
