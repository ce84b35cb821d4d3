//! The one error type of every configuration check.
//!
//! It lives apart from [`config`](crate::config) so that the policy modules, which validate
//! their own settings, and the config module, which builds those settings from documents,
//! do not import each other.

use std::path::PathBuf;

/// An invalid configuration: names the field and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A field holds a value outside its valid range or of the wrong form.
    #[error("invalid `{field}`: {reason}")]
    Invalid {
        /// The field, as a dotted path (`retry.budget.ttl`).
        field: String,
        /// Why the value is refused.
        reason: String,
    },
    /// The document is not well-formed (JSON, YAML or TOML), or not of the expected shape.
    #[error("malformed config: {0}")]
    Malformed(String),
    /// The file could not be read, or its name does not say which format it is in.
    #[error("cannot read config file `{path}`: {reason}")]
    Read {
        /// The file, as given.
        path: String,
        /// Why it could not be read.
        reason: String,
    },
    /// What is wrong inside a config file, with the file's name. The message shows both
    /// (``retry.yaml: invalid `retry.budget.ttl`: ...``), so the inner error is not also
    /// given as [`source`](std::error::Error::source).
    #[error("{}: {error}", path.display())]
    File {
        /// The file, as given.
        path: PathBuf,
        /// The error in its content: [`Invalid`](ConfigError::Invalid),
        /// [`Malformed`](ConfigError::Malformed) or
        /// [`FormatDisabled`](ConfigError::FormatDisabled).
        error: Box<ConfigError>,
    },
    /// The document is in a format this build does not read: its feature of
    /// stormguard-core (`yaml`, `toml`, both on by default) is off.
    #[error(
        "this build reads no {format} config: enable the `{feature}` feature of stormguard-core"
    )]
    FormatDisabled {
        /// `"YAML"` or `"TOML"`.
        format: &'static str,
        /// The feature that reads it.
        feature: &'static str,
    },
}

impl ConfigError {
    /// An error for `field` with `reason`.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The same error with a field `{prefix}.{from}` renamed `{prefix}.{to}` by the first
    /// `(from, to)` pair that matches: for a document that spells a field differently from
    /// the struct whose `validate` named it.
    pub(crate) fn renamed(self, prefix: &str, names: &[(&str, &str)]) -> Self {
        match self {
            ConfigError::Invalid { field, reason } => {
                let name = field
                    .strip_prefix(prefix)
                    .and_then(|rest| rest.strip_prefix('.'));
                let field = names
                    .iter()
                    .find(|(from, _)| name == Some(*from))
                    .map_or(field, |(_, to)| format!("{prefix}.{to}"));
                ConfigError::Invalid { field, reason }
            }
            other => other,
        }
    }
}
