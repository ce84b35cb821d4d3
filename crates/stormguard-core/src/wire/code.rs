//! gRPC status codes, without a tonic dependency.
//!
//! The policy crate classifies failures by code but must not depend on tonic, so it keeps
//! its own copy of the seventeen canonical codes with their numbers and names. The client
//! and server crates convert to and from `tonic::Code` by number.

use std::fmt;
use std::str::FromStr;

/// A canonical gRPC status code.
///
/// ```
/// use stormguard_core::Code;
///
/// assert_eq!("unavailable".parse::<Code>().unwrap(), Code::Unavailable);
/// assert_eq!("14".parse::<Code>().unwrap(), Code::Unavailable);
/// assert_eq!(Code::Unavailable.name(), "UNAVAILABLE");
/// assert_eq!(Code::from_i32(4), Some(Code::DeadlineExceeded));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Code {
    /// Not an error.
    Ok = 0,
    /// The operation was cancelled, typically by the caller.
    Cancelled = 1,
    /// Unknown error.
    Unknown = 2,
    /// The client specified an invalid argument.
    InvalidArgument = 3,
    /// The deadline expired before the operation could complete.
    DeadlineExceeded = 4,
    /// Some requested entity was not found.
    NotFound = 5,
    /// The entity that a client attempted to create already exists.
    AlreadyExists = 6,
    /// The caller does not have permission.
    PermissionDenied = 7,
    /// Some resource has been exhausted.
    ResourceExhausted = 8,
    /// The system is not in a state required for the operation.
    FailedPrecondition = 9,
    /// The operation was aborted.
    Aborted = 10,
    /// The operation was attempted past the valid range.
    OutOfRange = 11,
    /// The operation is not implemented.
    Unimplemented = 12,
    /// Internal error.
    Internal = 13,
    /// The service is currently unavailable: a transient condition.
    Unavailable = 14,
    /// Unrecoverable data loss or corruption.
    DataLoss = 15,
    /// The request lacks valid authentication credentials.
    Unauthenticated = 16,
}

const ALL: [Code; 17] = [
    Code::Ok,
    Code::Cancelled,
    Code::Unknown,
    Code::InvalidArgument,
    Code::DeadlineExceeded,
    Code::NotFound,
    Code::AlreadyExists,
    Code::PermissionDenied,
    Code::ResourceExhausted,
    Code::FailedPrecondition,
    Code::Aborted,
    Code::OutOfRange,
    Code::Unimplemented,
    Code::Internal,
    Code::Unavailable,
    Code::DataLoss,
    Code::Unauthenticated,
];

impl Code {
    /// Every code, in numeric order.
    pub const ALL: [Code; 17] = ALL;

    /// The code with this number, or `None` outside 0..=16.
    pub fn from_i32(value: i32) -> Option<Code> {
        usize::try_from(value)
            .ok()
            .and_then(|i| ALL.get(i).copied())
    }

    /// The code's number on the wire.
    pub fn as_i32(self) -> i32 {
        self as i32
    }

    /// Whether an answer with this code says the server was overloaded or out of time
    /// rather than that it served the call: `UNAVAILABLE`, `RESOURCE_EXHAUSTED`,
    /// `DEADLINE_EXCEEDED`, `CANCELLED` (a shed, a refusal, an expiry). Such an answer is
    /// never a sign of health: a client's breaker does not count it as a success, and a
    /// server's adaptive worker limit does not read it as a served call's latency
    /// ([`AdmissionQueue::finish_not_served_at`](crate::AdmissionQueue::finish_not_served_at)).
    ///
    /// ```
    /// use stormguard_core::Code;
    ///
    /// assert!(Code::ResourceExhausted.is_overload());
    /// assert!(!Code::NotFound.is_overload());
    /// ```
    pub fn is_overload(self) -> bool {
        matches!(
            self,
            Code::Unavailable | Code::ResourceExhausted | Code::DeadlineExceeded | Code::Cancelled
        )
    }

    /// The canonical upper-case name, as in the gRPC service config (`"UNAVAILABLE"`).
    pub fn name(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::Cancelled => "CANCELLED",
            Code::Unknown => "UNKNOWN",
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Code::NotFound => "NOT_FOUND",
            Code::AlreadyExists => "ALREADY_EXISTS",
            Code::PermissionDenied => "PERMISSION_DENIED",
            Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Code::FailedPrecondition => "FAILED_PRECONDITION",
            Code::Aborted => "ABORTED",
            Code::OutOfRange => "OUT_OF_RANGE",
            Code::Unimplemented => "UNIMPLEMENTED",
            Code::Internal => "INTERNAL",
            Code::Unavailable => "UNAVAILABLE",
            Code::DataLoss => "DATA_LOSS",
            Code::Unauthenticated => "UNAUTHENTICATED",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A string that names no gRPC status code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown gRPC status code {0:?}: expected a name such as UNAVAILABLE or a number 0..=16")]
pub struct UnknownCode(pub String);

impl FromStr for Code {
    type Err = UnknownCode;

    /// Parses a name, case-insensitively (`"unavailable"`, `"UNAVAILABLE"`), or a number
    /// (`"14"`), as the gRPC service config allows both.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let trimmed = s.trim();
        if let Ok(n) = trimmed.parse::<i32>() {
            return Code::from_i32(n).ok_or_else(|| UnknownCode(s.to_owned()));
        }
        ALL.iter()
            .copied()
            .find(|c| c.name().eq_ignore_ascii_case(trimmed))
            .ok_or_else(|| UnknownCode(s.to_owned()))
    }
}

/// A set of codes, as a bit set: copying and testing it costs nothing on the hot path.
///
/// ```
/// use stormguard_core::{Code, CodeSet};
///
/// let set = CodeSet::from_iter([Code::Unavailable, Code::ResourceExhausted]);
/// assert!(set.contains(Code::Unavailable));
/// assert!(!set.contains(Code::Internal));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CodeSet(u32);

impl CodeSet {
    /// The empty set.
    pub const EMPTY: CodeSet = CodeSet(0);

    /// A set holding one code.
    pub const fn single(code: Code) -> CodeSet {
        CodeSet(1 << code as u32)
    }

    /// Adds a code.
    pub fn insert(&mut self, code: Code) {
        self.0 |= 1 << code as u32;
    }

    /// Whether the set holds `code`.
    pub fn contains(self, code: Code) -> bool {
        self.0 & (1 << code as u32) != 0
    }

    /// Whether the set is empty.
    pub(crate) fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The codes in the set, in numeric order.
    pub(crate) fn iter(self) -> impl Iterator<Item = Code> {
        ALL.into_iter().filter(move |c| self.contains(*c))
    }
}

impl FromIterator<Code> for CodeSet {
    fn from_iter<I: IntoIterator<Item = Code>>(iter: I) -> Self {
        let mut set = CodeSet::EMPTY;
        for code in iter {
            set.insert(code);
        }
        set
    }
}

impl fmt::Debug for CodeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests;
