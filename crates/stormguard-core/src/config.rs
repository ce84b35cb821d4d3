//! Configuration: typed, validated, with errors that name the field.

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
    /// The document is not well-formed JSON, or not of the expected shape.
    #[error("malformed config: {0}")]
    Malformed(String),
}

impl ConfigError {
    /// An error for `field` with `reason`.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}
