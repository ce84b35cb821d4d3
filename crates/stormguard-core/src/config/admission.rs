//! The server's admission document, `{"admission": {...}}` (see the
//! [`AdmissionController`](crate::AdmissionController#configuration-from-json)).

use std::path::Path;

use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use super::document::{self, Build, Format};
use super::value::nullable;
use crate::admission::AdaptiveLimitConfig;
use crate::admission::{AdmissionConfig, QueueOrder, RetryThreshold, WorkerLimit};
use crate::error::ConfigError;
use crate::field::Int;
use crate::field::duration::Human;
use crate::wire::code::Code;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "an object with `admission`")]
struct AdmissionFile {
    admission: Option<AdmissionDoc>,
}

/// Every field optional, defaulting as in [`AdmissionConfig::default`]; unknown fields
/// refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "an object of admission settings")]
struct AdmissionDoc {
    workers: Option<Int<usize>>,
    queue_capacity: Option<Int<usize>>,
    retry_threshold: Option<ThresholdDoc>,
    sheddable_threshold: Option<ThresholdDoc>,
    #[serde(default, deserialize_with = "nullable")]
    adaptive: Option<Option<AdaptiveLimitConfig>>,
    max_time_queued: Option<Human>,
    min_time_left: Option<Human>,
    queue_order: Option<QueueOrderName>,
    lifo_from_depth: Option<Int<usize>>,
    pushback_max: Option<Human>,
    shed_code: Option<Code>,
    #[serde(default, deserialize_with = "nullable")]
    no_retry_code: Option<Option<Code>>,
    #[serde(default, deserialize_with = "nullable")]
    no_retry_depth: Option<Option<Int<usize>>>,
    #[serde(default, deserialize_with = "nullable")]
    no_retry_margin: Option<Option<Human>>,
    #[serde(default, deserialize_with = "nullable")]
    no_retry_after_shedding: Option<Option<Human>>,
    seed: Option<Int<u64>>,
    retry_info: Option<bool>,
    /// The server layer's switch, not the queue's: read by [`ShedSettings`].
    load_reports: Option<bool>,
}

/// A threshold's keys set over its own default; `null` turns a condition off.
#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "an object with `depth` and `queue_delay`"
)]
struct ThresholdDoc {
    #[serde(default, deserialize_with = "nullable")]
    depth: Option<Option<Int<usize>>>,
    #[serde(default, deserialize_with = "nullable")]
    queue_delay: Option<Option<Human>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum QueueOrderName {
    Fifo,
    AdaptiveLifo,
    LifoWhenLate,
}

impl ThresholdDoc {
    fn over(&self, mut threshold: RetryThreshold) -> RetryThreshold {
        if let Some(depth) = self.depth {
            threshold.depth = depth.map(|d| d.0);
        }
        if let Some(delay) = self.queue_delay {
            threshold.queue_delay = delay.map(|d| d.0);
        }
        threshold
    }
}

impl Build for AdmissionDoc {
    type Config = AdmissionConfig;

    fn build(self) -> Result<AdmissionConfig, ConfigError> {
        let mut c = AdmissionConfig {
            workers: worker_limit(self.workers.map(|n| n.0), self.adaptive),
            ..AdmissionConfig::default()
        };
        if let Some(Int(n)) = self.queue_capacity {
            c.queue_capacity = n;
        }
        if let Some(t) = &self.retry_threshold {
            c.retry_threshold = t.over(c.retry_threshold);
        }
        if let Some(t) = &self.sheddable_threshold {
            c.sheddable_threshold = t.over(c.sheddable_threshold);
        }
        if let Some(d) = self.max_time_queued {
            c.max_time_queued = d.0;
        }
        if let Some(d) = self.min_time_left {
            c.min_time_left = d.0;
        }
        let default_from_depth = match c.queue_order {
            QueueOrder::AdaptiveLifo { from_depth } => from_depth,
            QueueOrder::Fifo | QueueOrder::LifoWhenLate => 8,
        };
        c.queue_order = match (self.queue_order, self.lifo_from_depth.map(|n| n.0)) {
            (Some(QueueOrderName::Fifo | QueueOrderName::LifoWhenLate), Some(_)) => {
                return Err(ConfigError::invalid(
                    "admission.lifo_from_depth",
                    "only applies with queue_order \"adaptive_lifo\"",
                ));
            }
            (Some(QueueOrderName::Fifo), None) => QueueOrder::Fifo,
            (Some(QueueOrderName::LifoWhenLate), None) => QueueOrder::LifoWhenLate,
            (Some(QueueOrderName::AdaptiveLifo), depth) => QueueOrder::AdaptiveLifo {
                from_depth: depth.unwrap_or(default_from_depth),
            },
            (None, Some(from_depth)) => QueueOrder::AdaptiveLifo { from_depth },
            (None, None) => c.queue_order,
        };
        if let Some(d) = self.pushback_max {
            c.pushback_max = d.0;
        }
        if let Some(code) = self.shed_code {
            c.shed_code = code;
        }
        if let Some(code) = self.no_retry_code {
            c.no_retry_code = code;
        }
        if let Some(depth) = self.no_retry_depth {
            c.no_retry_depth = depth.map(|d| d.0);
        }
        if let Some(margin) = self.no_retry_margin {
            c.no_retry_margin = margin.map(|d| d.0);
        }
        if let Some(after) = self.no_retry_after_shedding {
            c.no_retry_after_shedding = after.map(|d| d.0);
        }
        if let Some(Int(seed)) = self.seed {
            c.seed = Some(seed);
        }
        if let Some(on) = self.retry_info {
            c.retry_info = on;
        }
        c.validate()?;
        Ok(c)
    }
}

/// The worker limit a document states: `workers: N` alone is fixed, no `workers` is
/// adaptive. The keys of earlier versions keep their meaning: with an `adaptive` object,
/// `workers` is where the adaptive limit starts; `adaptive: null` is a fixed limit of
/// `workers` (64 when absent, the fixed default of those versions).
fn worker_limit(
    workers: Option<usize>,
    adaptive: Option<Option<AdaptiveLimitConfig>>,
) -> WorkerLimit {
    match (workers, adaptive) {
        (Some(n), None) => WorkerLimit::Fixed(n),
        (None, None) => WorkerLimit::default(),
        (start, Some(Some(mut adaptive))) => {
            if let Some(n) = start {
                adaptive.initial_limit = n;
            }
            WorkerLimit::Adaptive(adaptive)
        }
        (n, Some(None)) => WorkerLimit::Fixed(n.unwrap_or(LEGACY_FIXED_WORKERS)),
    }
}

/// The fixed limit of versions before the adaptive default, which `adaptive: null` keeps.
const LEGACY_FIXED_WORKERS: usize = 64;

/// Reads a document's root object.
fn read(root: Map<String, Value>) -> Result<AdmissionConfig, ConfigError> {
    read_settings(root).map(|s| s.admission)
}

/// Reads a document's root object, the layer's switches included.
fn read_settings(root: Map<String, Value>) -> Result<ShedSettings, ConfigError> {
    match document::strict::<AdmissionFile>(root)?.admission {
        Some(doc) => {
            let load_reports = doc.load_reports.unwrap_or(false);
            Ok(ShedSettings {
                admission: doc.build()?,
                load_reports,
            })
        }
        None => Ok(ShedSettings::default()),
    }
}

/// The whole `admission` document: the queue's settings ([`AdmissionConfig`]) and the
/// server layer's own switches beside them. `AdmissionConfig::from_*` read the same
/// documents and leave the switches out.
///
/// ```
/// use stormguard_core::ShedSettings;
///
/// let s = ShedSettings::from_json(r#"{ "admission": { "workers": 8, "load_reports": true } }"#)?;
/// assert!(s.load_reports);
/// assert_eq!(s.admission.workers.fixed(), Some(8));
/// # Ok::<(), stormguard_core::ConfigError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShedSettings {
    /// The queue.
    pub admission: AdmissionConfig,
    /// `admission.load_reports`: attach an ORCA load report to every answer
    /// (`endpoint-load-metrics-bin`; see [`LoadReport`](crate::LoadReport)). Default `false`.
    pub load_reports: bool,
}

impl ShedSettings {
    /// Reads the `admission` document from JSON; errors as [`AdmissionConfig::from_json`].
    pub fn from_json(json: &str) -> Result<Self, ConfigError> {
        Self::from_text(json, Format::Json)
    }

    /// Reads the `admission` document in `format`.
    pub(crate) fn from_text(text: &str, format: Format) -> Result<Self, ConfigError> {
        read_settings(document::parse(text, format)?)
    }

    /// Reads the `admission` document from a file (JSON, YAML or TOML by its extension).
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        document::read_file(path.as_ref(), read_settings)
    }
}

/// The fields of the `admission` object (`{"workers": 8, ...}`), validated as
/// [`AdmissionConfig::from_json`] validates them: an application can hold the admission
/// config in its own config struct and get the same checks. An error from validation
/// names the field as `admission.<field>`.
impl<'de> Deserialize<'de> for AdmissionConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        document::built::<AdmissionDoc, D>(d)
    }
}

impl AdmissionConfig {
    /// Reads the `admission` document (see the [docs](crate::AdmissionController#configuration-from-json))
    /// and validates it. An error names the field as the document spells it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard_core::{AdmissionConfig, QueueOrder};
    ///
    /// let config = AdmissionConfig::from_json(r#"{ "admission": {
    ///     "workers": 8, "queue_capacity": 32, "max_time_queued": "250ms",
    ///     "queue_order": "fifo" } }"#).expect("valid");
    /// assert_eq!(config.workers.fixed(), Some(8));
    /// assert_eq!(config.max_time_queued, Duration::from_millis(250));
    /// assert_eq!(config.queue_order, QueueOrder::Fifo);
    ///
    /// let bad = AdmissionConfig::from_json(r#"{ "admission": { "pushback_max": "soon" } }"#);
    /// assert!(bad.unwrap_err().to_string().contains("admission.pushback_max"));
    /// ```
    pub fn from_json(json: &str) -> Result<Self, ConfigError> {
        Self::from_text(json, Format::Json)
    }

    /// Reads the admission configuration from a file: JSON, YAML or TOML by its extension,
    /// the shape of [`AdmissionConfig::from_json`] (`admission: workers: 8 ...` in YAML,
    /// `[admission]` in TOML), with the same errors inside a [`ConfigError::File`] that
    /// names the file.
    ///
    /// ```no_run
    /// use stormguard_core::AdmissionConfig;
    ///
    /// let config = AdmissionConfig::from_path("admission.toml")?;
    /// # Ok::<(), stormguard_core::ConfigError>(())
    /// ```
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        document::read_file(path.as_ref(), read)
    }

    /// [`AdmissionConfig::from_path`] for a document already in memory.
    ///
    /// ```
    /// use stormguard_core::AdmissionConfig;
    /// use stormguard_core::Format;
    ///
    /// let toml = "[admission]\nworkers = 8\nqueue_capacity = 32\nmax_time_queued = \"250ms\"\n";
    /// # #[cfg(feature = "toml")] {
    /// let config = AdmissionConfig::from_text(toml, Format::Toml).unwrap();
    /// assert_eq!(config.queue_capacity, 32);
    /// # }
    /// ```
    pub fn from_text(text: &str, format: Format) -> Result<Self, ConfigError> {
        read(document::parse(text, format)?)
    }
}

#[cfg(test)]
mod tests;
