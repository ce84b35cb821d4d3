//! What a config says that will not happen: fields read but not applied, and retry
//! settings under which no answer is ever retried. A layer reports them when it is built
//! (one WARN event); a program can read them from [`ClientConfig::notices`].

use std::fmt;

use super::ClientConfig;

/// The setting that lets a method's answers be retried, in stormguard's shape.
pub const IDEMPOTENT_SETTING: &str = r#"methods."/package.Service/Method".idempotent: true"#;

/// A field of a gRPC service config that was read but is not applied.
///
/// gRPC clients skip fields they do not know, so a service config written for them may
/// hold fields stormguard skips as well; a misspelled field (`retryPolicyy`) is skipped
/// the same way. Neither is an error, and neither goes unreported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotApplied {
    /// Where the field is, as a dotted path (`methodConfig[0].waitForReady`).
    pub path: String,
    /// Why it is not applied.
    pub reason: NotAppliedReason,
}

/// Why a field of a service config is not applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotAppliedReason {
    /// `waitForReady`: whether a call waits for a connection is the channel's to decide;
    /// stormguard's layers do not change it.
    WaitForReady,
    /// `maxRequestMessageBytes` or `maxResponseMessageBytes`: message size limits are set
    /// on the generated client (`max_encoding_message_size`, `max_decoding_message_size`).
    MessageSize,
    /// `loadBalancingConfig` or `loadBalancingPolicy`: the channel balances, not stormguard.
    LoadBalancing,
    /// `healthCheckConfig`: the channel checks health, not stormguard.
    HealthCheck,
    /// A field gRPC's service config does not have there, such as a misspelling.
    Unknown,
}

impl NotApplied {
    /// The field at `path`, skipped by the service-config reader.
    pub(super) fn skipped(path: String) -> Self {
        let (parent, key) = path.rsplit_once('.').unwrap_or(("", &path));
        let in_method_config = parent
            .strip_prefix("methodConfig[")
            .and_then(|rest| rest.strip_suffix(']'))
            .is_some_and(|index| index.bytes().all(|b| b.is_ascii_digit()));
        let reason = match (parent, key) {
            (_, "waitForReady") if in_method_config => NotAppliedReason::WaitForReady,
            (_, "maxRequestMessageBytes" | "maxResponseMessageBytes") if in_method_config => {
                NotAppliedReason::MessageSize
            }
            ("", "loadBalancingConfig" | "loadBalancingPolicy") => NotAppliedReason::LoadBalancing,
            ("", "healthCheckConfig") => NotAppliedReason::HealthCheck,
            _ => NotAppliedReason::Unknown,
        };
        NotApplied { path, reason }
    }
}

impl fmt::Display for NotAppliedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NotAppliedReason::WaitForReady => {
                "stormguard's layers do not act on waitForReady; calls wait for a connection \
                 as the channel decides"
            }
            NotAppliedReason::MessageSize => {
                "stormguard's layers do not limit message sizes; set max_encoding_message_size \
                 and max_decoding_message_size on the generated client"
            }
            NotAppliedReason::LoadBalancing => "load balancing is the channel's, not stormguard's",
            NotAppliedReason::HealthCheck => "health checking is the channel's, not stormguard's",
            NotAppliedReason::Unknown => {
                "the gRPC service config has no such field here (a misspelling?); it is \
                 skipped, as gRPC skips it"
            }
        })
    }
}

impl fmt::Display for NotApplied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` is not applied: {}", self.path, self.reason)
    }
}

/// Something a config says that will not happen. See [`ClientConfig::notices`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Notice {
    /// A service-config field that was read but is not applied.
    NotApplied(NotApplied),
    /// Retries are configured (`max_attempts` above 1) but no method is idempotent (nor
    /// carries an idempotency key), so no
    /// answer is ever retried: only calls that never reached the server (a failed
    /// connection) are. `setting` is what marks a method idempotent.
    NoAnswerRetried {
        /// The most attempts a method is allowed (`max_attempts`, capped at 5 as in A6).
        max_attempts: u32,
        /// The setting that would let a method's answers be retried
        /// ([`IDEMPOTENT_SETTING`]; in code, [`RetryPolicy::idempotent`]).
        ///
        /// [`RetryPolicy::idempotent`]: crate::RetryPolicy::idempotent
        setting: &'static str,
    },
}

impl fmt::Display for Notice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Notice::NotApplied(n) => n.fmt(f),
            Notice::NoAnswerRetried {
                max_attempts,
                setting,
            } => write!(
                f,
                "max_attempts is {max_attempts} but no method is idempotent, so no answer is \
                 retried (only calls that never reached the server are); mark each method \
                 that is safe to repeat with `{setting}` (`retry.idempotent: true` marks \
                 every method)"
            ),
        }
    }
}

/// Every notice about `config`: its fields not applied, then whether any answer can be
/// retried.
pub(super) fn notices(config: &ClientConfig) -> Vec<Notice> {
    let mut notices: Vec<Notice> = config
        .not_applied
        .iter()
        .cloned()
        .map(Notice::NotApplied)
        .collect();
    let max_attempts = config
        .methods
        .policies()
        .map(|p| p.effective_max_attempts())
        .max();
    if let Some(max_attempts) = max_attempts.filter(|n| *n > 1)
        && !config.methods.policies().any(|p| p.idempotent)
        && !config.methods.any_idempotency_key()
    {
        notices.push(Notice::NoAnswerRetried {
            max_attempts,
            setting: IDEMPOTENT_SETTING,
        });
    }
    notices
}
