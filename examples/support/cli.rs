//! Value parsers for the flags several examples share (clap's `value_parser = ...`); each
//! example includes this file and uses the ones it needs.
#![allow(dead_code, reason = "each example uses the parsers its flags need")]

use std::time::Duration;

/// A whole number of milliseconds, at least 1 (`--deadline-ms 200`).
pub(crate) fn millis(value: &str) -> Result<Duration, String> {
    let ms: u64 = value
        .parse()
        .map_err(|e| format!("{e} (a whole number of milliseconds)"))?;
    if ms == 0 {
        return Err("must be at least 1 ms".to_owned());
    }
    Ok(Duration::from_millis(ms))
}

/// A finite number above 0 (`--load 0.78`, `--overload 10`).
pub(crate) fn positive(value: &str) -> Result<f64, String> {
    let x: f64 = value.parse().map_err(|e| format!("{e}"))?;
    if !(x.is_finite() && x > 0.0) {
        return Err("must be a number above 0".to_owned());
    }
    Ok(x)
}
