//! The server's idempotency document, `{"idempotency": {...}}` (see
//! [`IdempotencyConfig`]).

use std::path::Path;

use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use super::document::{self, Build, Format};
use crate::admission::IdempotencyConfig;
use crate::error::ConfigError;
use crate::field::Int;
use crate::field::duration::Human;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "an object with `idempotency`")]
struct IdempotencyFile {
    idempotency: Option<IdempotencyDoc>,
}

/// Every field optional, defaulting as in [`IdempotencyConfig::default`]; unknown fields
/// refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "an object of idempotency settings")]
struct IdempotencyDoc {
    max_entries: Option<Int<usize>>,
    max_bytes: Option<Int<usize>>,
    max_record_bytes: Option<Int<usize>>,
    ttl: Option<Human>,
    in_flight_pushback: Option<Human>,
    max_request_bytes: Option<Int<usize>>,
}

impl Build for IdempotencyDoc {
    type Config = IdempotencyConfig;

    fn build(self) -> Result<IdempotencyConfig, ConfigError> {
        let mut c = IdempotencyConfig::default();
        if let Some(Int(n)) = self.max_entries {
            c.max_entries = n;
        }
        if let Some(Int(n)) = self.max_bytes {
            c.max_bytes = n;
        }
        if let Some(Int(n)) = self.max_record_bytes {
            c.max_record_bytes = n;
        }
        if let Some(Human(d)) = self.ttl {
            c.ttl = d;
        }
        if let Some(Human(d)) = self.in_flight_pushback {
            c.in_flight_pushback = d;
        }
        if let Some(Int(n)) = self.max_request_bytes {
            c.max_request_bytes = n;
        }
        c.validate()?;
        Ok(c)
    }
}

/// Reads a document's root object: the defaults when it has no `idempotency`.
fn read(root: Map<String, Value>) -> Result<IdempotencyConfig, ConfigError> {
    match document::strict::<IdempotencyFile>(root)?.idempotency {
        Some(doc) => doc.build(),
        None => Ok(IdempotencyConfig::default()),
    }
}

/// The fields of the `idempotency` object, validated as [`IdempotencyConfig::from_json`]
/// validates them, so an application can hold them in its own config struct.
impl<'de> Deserialize<'de> for IdempotencyConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        document::built::<IdempotencyDoc, D>(d)
    }
}

impl IdempotencyConfig {
    /// Reads the `idempotency` document from JSON (`{"idempotency": {"ttl": "10m"}}`) and
    /// validates it; an error names the field as the document spells it.
    pub fn from_json(json: &str) -> Result<Self, ConfigError> {
        Self::from_text(json, Format::Json)
    }

    /// Reads the `idempotency` document in `format`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard_core::Format;
    /// use stormguard_core::IdempotencyConfig;
    ///
    /// let toml = "[idempotency]\nmax_entries = 500\nin_flight_pushback = \"50ms\"\n";
    /// # #[cfg(feature = "toml")] {
    /// let config = IdempotencyConfig::from_text(toml, Format::Toml).unwrap();
    /// assert_eq!(config.in_flight_pushback, Duration::from_millis(50));
    /// # }
    /// ```
    pub fn from_text(text: &str, format: Format) -> Result<Self, ConfigError> {
        read(document::parse(text, format)?)
    }

    /// Reads the `idempotency` document from a file: JSON, YAML or TOML by its extension.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        document::read_file(path.as_ref(), read)
    }
}

#[cfg(test)]
mod tests;
