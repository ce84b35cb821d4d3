//! The one error type of every configuration check.
//!
//! It lives apart from [`config`](crate::config) so that the policy modules, which validate
//! their own settings, and the config module, which builds those settings from documents,
//! do not import each other.

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
}

impl ConfigError {
    /// An error for `field` with `reason`.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The same error with its field renamed by the first `(from, to)` pair whose `from`
    /// is the field: for a document that spells a field differently from the struct.
    pub(crate) fn renamed(self, names: &[(&str, &str)]) -> Self {
        match self {
            ConfigError::Invalid { field, reason } => {
                let field = names
                    .iter()
                    .find(|(from, _)| *from == field)
                    .map_or(field, |(_, to)| (*to).to_owned());
                ConfigError::Invalid { field, reason }
            }
            malformed => malformed,
        }
    }
}
