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
    /// use stormguard_core::criticality::CriticalityTable;
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
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::criticality::Criticality;

    #[test]
    fn json_errors_name_the_field() {
        let field = |json: &str| match CriticalityTable::from_json(json).unwrap_err() {
            ConfigError::Invalid { field, .. } => field,
            other => other.to_string(),
        };
        assert_eq!(field(r#"{"criticalty": {}}"#), "criticalty");
        assert_eq!(
            field(r#"{"criticality": {"default": "high"}}"#),
            "criticality.default"
        );
        assert_eq!(
            field(r#"{"criticality": {"methods": {"/a.S/M": 3}}}"#),
            "criticality.methods./a.S/M"
        );
        assert_eq!(
            field(r#"{"criticality": {"methods": {"a.S/M": "critical"}}}"#),
            "criticality.methods.a.S/M"
        );
        assert_eq!(
            field(r#"{"criticality": {"method": {}}}"#),
            "criticality.method"
        );
        assert_eq!(
            CriticalityTable::from_json("{}").unwrap(),
            CriticalityTable::default()
        );
    }

    #[test]
    fn an_application_config_holds_a_table() {
        #[derive(Deserialize)]
        struct Server {
            criticality: CriticalityTable,
        }
        let server: Server = serde_json::from_str(
            r#"{"criticality": {"methods": {"/shop.Cart/Checkout": "critical"}}}"#,
        )
        .unwrap();
        assert_eq!(
            server.criticality.class_for("/shop.Cart/Checkout"),
            Criticality::Critical
        );
        assert_eq!(
            server.criticality.class_for("/shop.Cart/Add"),
            Criticality::Default
        );
        let bad =
            serde_json::from_str::<Server>(r#"{"criticality": {"methods": {"shop": "critical"}}}"#);
        assert!(
            bad.err()
                .unwrap()
                .to_string()
                .contains("criticality.methods.shop")
        );
    }
}
