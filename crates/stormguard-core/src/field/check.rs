//! The range checks every config's `validate` is made of, each with its one message, so
//! that an error names the field the same way whichever config it comes from.
//!
//! Written so that NaN fails every check on a float.

use std::time::Duration;

use crate::error::ConfigError;

/// `n` is at least 1: "must be at least 1".
pub(crate) fn at_least_one(field: &str, n: u64) -> Result<(), ConfigError> {
    if n == 0 {
        return Err(ConfigError::invalid(field, "must be at least 1"));
    }
    Ok(())
}

/// `d` is within `[lo, hi]`: "must be between {lo:?} and {hi:?}, got {d:?}".
pub(crate) fn within(
    field: &str,
    d: Duration,
    lo: Duration,
    hi: Duration,
) -> Result<(), ConfigError> {
    if d < lo || d > hi {
        return Err(ConfigError::invalid(
            field,
            format!("must be between {lo:?} and {hi:?}, got {d:?}"),
        ));
    }
    Ok(())
}

/// A window of whole seconds, `[lo_secs, hi_secs]`: "must be between 1 s and 600 s, got ..".
pub(crate) fn window_secs(
    field: &str,
    d: Duration,
    lo_secs: u64,
    hi_secs: u64,
) -> Result<(), ConfigError> {
    if d < Duration::from_secs(lo_secs) || d > Duration::from_secs(hi_secs) {
        return Err(ConfigError::invalid(
            field,
            format!("must be between {lo_secs} s and {hi_secs} s, got {d:?}"),
        ));
    }
    Ok(())
}

/// A share in `(0, 1]`, or `[0, 1]` when `zero_ok`: "must be in (0, 1], got {x}".
pub(crate) fn share(field: &str, x: f64, zero_ok: bool) -> Result<(), ConfigError> {
    let ok = x.is_finite() && x <= 1.0 && (x > 0.0 || (zero_ok && x == 0.0));
    if !ok {
        let range = if zero_ok { "[0, 1]" } else { "(0, 1]" };
        return Err(ConfigError::invalid(
            field,
            format!("must be in {range}, got {x}"),
        ));
    }
    Ok(())
}

/// A depth that must fit in the queue: "{depth} is above queue_capacity ({capacity})".
pub(crate) fn within_capacity(
    field: &str,
    depth: Option<usize>,
    capacity: usize,
) -> Result<(), ConfigError> {
    match depth {
        Some(depth) if depth > capacity => Err(ConfigError::invalid(
            field,
            format!("{depth} is above queue_capacity ({capacity})"),
        )),
        _ => Ok(()),
    }
}

/// An optional duration with an upper bound: "{d:?} is above {max:?}".
pub(crate) fn not_above(
    field: &str,
    d: Option<Duration>,
    max: Duration,
) -> Result<(), ConfigError> {
    match d {
        Some(d) if d > max => Err(ConfigError::invalid(
            field,
            format!("{d:?} is above {max:?}"),
        )),
        _ => Ok(()),
    }
}
