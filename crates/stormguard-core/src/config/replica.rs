//! The `replicas` document: [`ReplicaConfig`] from JSON, YAML or TOML.

use std::path::Path;

use serde_json::{Map, Value};

use super::document;
use crate::balance::ReplicaConfig;
use crate::error::ConfigError;

/// The document [`ReplicaConfig::from_text`] reads: `{"replicas": {...}}`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplicaFile {
    #[serde(default)]
    replicas: Option<ReplicaConfig>,
}

impl ReplicaConfig {
    /// Reads a `replicas` document (JSON, YAML or TOML as `format` says: the fields of
    /// this struct under a `replicas` key, durations with their unit) and validates it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard_core::Format;
    /// use stormguard_core::ReplicaConfig;
    ///
    /// let json = r#"{ "replicas": { "ejection": { "consecutive_failures": 3, "base_time": "2s" },
    ///                               "slow_start": { "window": "10s" } } }"#;
    /// let config = ReplicaConfig::from_text(json, Format::Json)?;
    /// assert_eq!(config.ejection.consecutive_failures, 3);
    /// assert_eq!(config.slow_start.window, Duration::from_secs(10));
    /// assert!(ReplicaConfig::from_text(r#"{"replicas":{"ejection":{"jitter":3}}}"#, Format::Json).is_err());
    /// # Ok::<(), stormguard_core::ConfigError>(())
    /// ```
    pub fn from_text(text: &str, format: document::Format) -> Result<Self, ConfigError> {
        read(document::parse(text, format)?)
    }

    /// [`ReplicaConfig::from_text`] for a file, its format from its extension.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        document::read_file(path.as_ref(), read)
    }
}

fn read(root: Map<String, Value>) -> Result<ReplicaConfig, ConfigError> {
    let config = document::strict::<ReplicaFile>(root)?
        .replicas
        .unwrap_or_default();
    config.validate()?;
    Ok(config)
}
