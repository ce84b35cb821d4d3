//! The criticality table's document, `{"criticality": {"default": CLASS, "methods": {...}}}`
//! (see [`crate::criticality`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};

use super::document::{self, Build, Format};
use crate::criticality::{Criticality, CriticalityTable};
use crate::error::ConfigError;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "an object with `criticality`")]
struct CriticalityFile {
    criticality: Option<CriticalityDoc>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "an object with `default` and `methods`"
)]
struct CriticalityDoc {
    default: Option<Criticality>,
    /// By full method path or service prefix ending in `/`.
    #[serde(default)]
    methods: BTreeMap<String, Criticality>,
}

impl Build for CriticalityDoc {
    type Config = CriticalityTable;

    fn build(self) -> Result<CriticalityTable, ConfigError> {
        let mut table = CriticalityTable::new(self.default.unwrap_or_default());
        for (path, class) in self.methods {
            table = table.with_method(path, class)?;
        }
        Ok(table)
    }
}

/// The `criticality` object (`{"default": ..., "methods": {...}}`), checked as
/// [`CriticalityTable::from_json`] checks it.
impl<'de> Deserialize<'de> for CriticalityTable {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        document::built::<CriticalityDoc, D>(d)
    }
}

impl CriticalityTable {
    /// Reads `{"criticality": {"default": CLASS, "methods": {PATH: CLASS, ...}}}` (both
    /// keys optional; the default class defaults to `default`). An error names the
    /// field as written.
    ///
    /// ```
    /// use stormguard_core::CriticalityTable;
    ///
    /// let bad = CriticalityTable::from_json(r#"{"criticality": {"default": "high"}}"#);
    /// assert!(bad.unwrap_err().to_string().contains("criticality.default"));
    /// ```
    pub fn from_json(json: &str) -> Result<Self, ConfigError> {
        let file: CriticalityFile = document::strict(document::parse(json, Format::Json)?)?;
        match file.criticality {
            Some(doc) => doc.build(),
            None => Ok(CriticalityTable::default()),
        }
    }
}

#[cfg(test)]
mod tests;
