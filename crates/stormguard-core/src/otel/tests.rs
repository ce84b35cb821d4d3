use super::*;

#[test]
fn methods_get_a_slot_each_and_the_rest_share_other() {
    let methods = Methods::new();
    let a = methods.index("/pkg.Svc/A");
    assert_eq!(methods.index("/pkg.Svc/A"), a);
    assert_ne!(methods.index("/pkg.Svc/B"), a);
    let name = methods.slots[a].name.get().expect("named");
    assert_eq!((&*name.0, &*name.1), ("pkg.Svc", "A"));
    for n in 0..2 * MAX_METHODS {
        methods.index(&format!("/pkg.Svc/M{n}"));
    }
    assert_eq!(methods.index("/pkg.Svc/Z"), MAX_METHODS, "_OTHER");
    assert_eq!(
        methods.index("/pkg.Svc/A"),
        a,
        "earlier methods keep their slot"
    );
}

#[test]
fn the_slot_past_max_methods_is_grpc_method_other() {
    assert_eq!(grpc_method("pkg.Svc", "A"), "pkg.Svc/A");
    assert_eq!(grpc_method("_OTHER", "_OTHER"), "other");
}

mod a96 {
    use std::sync::Mutex;

    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
    use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
    use opentelemetry_sdk::metrics::{SdkMeterProvider, Temporality};

    use super::*;

    /// The histograms of the last export with at least one data point: their names and
    /// how many values they recorded.
    #[derive(Clone, Default)]
    struct Exported(Arc<Mutex<Vec<(String, u64)>>>);

    impl PushMetricExporter for Exported {
        fn export(
            &self,
            metrics: &ResourceMetrics,
        ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
            let names = metrics
                .scope_metrics()
                .flat_map(|s| s.metrics())
                .filter_map(|m| {
                    let counts: Vec<u64> = match m.data() {
                        AggregatedMetrics::U64(MetricData::Histogram(h)) => {
                            h.data_points().map(|p| p.count()).collect()
                        }
                        AggregatedMetrics::F64(MetricData::Histogram(h)) => {
                            h.data_points().map(|p| p.count()).collect()
                        }
                        _ => return None,
                    };
                    let recorded = counts.iter().sum();
                    (!counts.is_empty()).then(|| (m.name().to_owned(), recorded))
                })
                .collect();
            *self.0.lock().expect("not poisoned") = names;
            std::future::ready(Ok(()))
        }

        fn force_flush(&self) -> OTelSdkResult {
            Ok(())
        }

        fn shutdown_with_timeout(&self, _: std::time::Duration) -> OTelSdkResult {
            Ok(())
        }

        fn temporality(&self) -> Temporality {
            Temporality::Cumulative
        }
    }

    const A96_NAMES: [&str; 4] = [
        "grpc.client.call.retries",
        "grpc.client.call.transparent_retries",
        "grpc.client.call.hedges",
        "grpc.client.call.retry_delay",
    ];

    /// After `calls` ran through one layer's metrics: the histograms exported (with a data
    /// point, if an empty one), and the A96 ones that recorded a value.
    fn a96_recorded(calls: impl FnOnce(&Arc<MethodMetrics>)) -> (Vec<String>, Vec<String>) {
        let exported = Exported::default();
        let provider = SdkMeterProvider::builder()
            .with_periodic_exporter(exported.clone())
            .build();
        let meter = provider.meter("stormguard-test");
        let name = Arc::new(LayerName::default());
        name.get_or_name_after("/pkg.Svc/A");
        let metrics = Arc::new(MethodMetrics::register(&meter, &name, None));
        calls(&metrics);
        provider.force_flush().expect("flushed");
        let all = exported.0.lock().expect("not poisoned").clone();
        let a96 = all
            .iter()
            .filter(|(n, recorded)| A96_NAMES.contains(&n.as_str()) && *recorded > 0)
            .map(|(n, _)| n.clone())
            .collect();
        (all.into_iter().map(|(n, _)| n).collect(), a96)
    }

    #[test]
    fn a_call_without_retries_records_none_of_them() {
        let (all, a96) = a96_recorded(|metrics| {
            let mut call = metrics.call("/pkg.Svc/A");
            call.attempt();
            call.ended(Code::Ok);
        });
        assert!(
            all.iter()
                .any(|n| n == "stormguard.client.attempts_per_call"),
            "the call itself was recorded: {all:?}"
        );
        assert!(a96.is_empty(), "{a96:?}");
        // Not even an empty series: nothing of them is bound for a method that never
        // retried.
        assert!(
            !all.iter().any(|n| A96_NAMES.contains(&n.as_str())),
            "{all:?}"
        );
    }

    #[test]
    fn a_call_that_retried_and_hedged_records_all_four() {
        let (_, mut a96) = a96_recorded(|metrics| {
            let mut call = metrics.call("/pkg.Svc/A");
            call.attempt();
            call.hedge();
            call.waiting(Instant::now());
            call.retry(false);
            call.waiting(Instant::now());
            call.retry(true);
            call.ended(Code::Unavailable);
        });
        a96.sort();
        let mut want = A96_NAMES.map(String::from).to_vec();
        want.sort();
        assert_eq!(a96, want);
    }

    #[test]
    fn a_call_with_only_a_transparent_retry_records_that_alone() {
        let (_, a96) = a96_recorded(|metrics| {
            let mut call = metrics.call("/pkg.Svc/A");
            call.attempt();
            call.waiting(Instant::now());
            call.retry(true);
            call.ended(Code::Ok);
        });
        assert_eq!(a96, ["grpc.client.call.transparent_retries"]);
    }
}
