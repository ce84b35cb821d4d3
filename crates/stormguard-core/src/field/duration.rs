//! Durations as people write them: `"50ms"`, `"10s"`, `"1.5s"`, `"2m"`, `"250us"`, and the
//! proto3 form `"0.1s"`.
//!
//! [`parse_duration`] is the one parser; [`Human`] and [`Proto`] read the two written forms
//! in stormguard's documents and the gRPC service config.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserialize, Deserializer, Unexpected, Visitor};

/// A duration: a non-negative decimal number with a unit, `ns`, `us` (or `µs`), `ms`, `s`,
/// `m` or `h` (`"50ms"`, `"10s"`, `"1.5s"`, `"2m"`, `"250us"`, `".5s"`), exact to the
/// nanosecond; surrounding whitespace is ignored. A proto3 duration (`"0.100s"`) is one
/// of these. `None` for anything else, including a number without a unit.
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::parse_duration;
///
/// assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
/// assert_eq!(parse_duration("10"), None);
/// ```
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (number, nanos_per_unit) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1_000_000)
    } else if let Some(n) = s.strip_suffix("us").or_else(|| s.strip_suffix("µs")) {
        (n, 1_000)
    } else if let Some(n) = s.strip_suffix("ns") {
        (n, 1)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1_000_000_000)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000_000_000)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3_600_000_000_000)
    } else {
        return None;
    };
    decimal(number, nanos_per_unit)
}

/// A proto3 JSON duration, what the gRPC service config holds: decimal seconds with an
/// `s` suffix, up to 9 fractional digits (`"1s"`, `"0.100s"`).
fn parse_proto_duration(s: &str) -> Option<Duration> {
    decimal(s.strip_suffix('s')?, 1_000_000_000)
}

/// Non-negative decimal `number` (digits, optional fraction) times `unit_nanos`, exactly.
fn decimal(number: &str, unit_nanos: u128) -> Option<Duration> {
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if int.len() > 12 || frac.len() > 9 {
        return None;
    }
    let int: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let frac_value: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    let scale = 10u128.pow(frac.len() as u32);
    let nanos = int * unit_nanos + frac_value * unit_nanos / scale;
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    Some(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// A string for `d` that [`parse_duration`] reads back as `d`: whole seconds and the
/// fraction they need (`"10s"`, `"0.05s"`, `"1.000000001s"`).
#[cfg(test)]
fn format_duration(d: Duration) -> String {
    let nanos = d.subsec_nanos();
    if nanos == 0 {
        format!("{}s", d.as_secs())
    } else {
        let fraction = format!("{nanos:09}");
        format!("{}.{}s", d.as_secs(), fraction.trim_end_matches('0'))
    }
}

/// Which of the two written forms a field takes.
#[derive(Clone, Copy)]
enum Form {
    /// [`parse_duration`].
    Human,
    /// [`parse_proto_duration`].
    Proto,
}

impl Visitor<'_> for Form {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Form::Human => r#"a duration with a unit such as "50ms" or "10s""#,
            Form::Proto => r#"a duration in decimal seconds ending in "s" ("0.1s")"#,
        })
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Duration, E> {
        let parsed = match self {
            Form::Human => parse_duration(s),
            Form::Proto => parse_proto_duration(s),
        };
        parsed.ok_or_else(|| E::invalid_value(Unexpected::Str(s), &self))
    }
}

/// A duration in stormguard's own documents ([`parse_duration`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Human(pub(crate) Duration);

impl<'de> Deserialize<'de> for Human {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(Form::Human).map(Human)
    }
}

/// A duration in the gRPC service config (proto3 JSON: `"0.1s"`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Proto(pub(crate) Duration);

impl<'de> Deserialize<'de> for Proto {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(Form::Proto).map(Proto)
    }
}

/// Reads a duration field with [`parse_duration`] (`#[serde(with = "crate::field::duration")]`).
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    Human::deserialize(d).map(|h| h.0)
}

#[cfg(test)]
mod tests;
