//! How one value is written in a config document: status codes and criticality classes,
//! and fields that may be `null` or whose presence alone matters. Numbers and durations
//! are read by [`crate::field`].

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, SeqAccess, Unexpected, Visitor};

use crate::criticality::Criticality;
use crate::wire::code::{Code, CodeSet};

/// `deserialize_with` for an `Option<Option<T>>` field with `#[serde(default)]`: absent is
/// `None` (the default stays), `null` is `Some(None)` (turned off), a value `Some(Some(v))`.
pub(crate) fn nullable<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// `deserialize_with` for a field whose presence alone matters.
pub(crate) fn present<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    de::IgnoredAny::deserialize(d).map(|_| true)
}

/// A status code: its name in any case (`"UNAVAILABLE"`, `"unavailable"`) or its number.
impl<'de> Deserialize<'de> for Code {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Code;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a gRPC status code (a name such as UNAVAILABLE or a number 0 to 16)")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Code, E> {
                s.parse()
                    .map_err(|_| E::invalid_value(Unexpected::Str(s), &self))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Code, E> {
                i32::try_from(n)
                    .ok()
                    .and_then(Code::from_i32)
                    .ok_or_else(|| E::invalid_value(Unexpected::Unsigned(n), &self))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Code, E> {
                i32::try_from(n)
                    .ok()
                    .and_then(Code::from_i32)
                    .ok_or_else(|| E::invalid_value(Unexpected::Signed(n), &self))
            }
        }
        d.deserialize_any(V)
    }
}

/// A list of status codes (see [`Code`]'s `Deserialize`).
impl<'de> Deserialize<'de> for CodeSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = CodeSet;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of gRPC status codes")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<CodeSet, A::Error> {
                let mut set = CodeSet::EMPTY;
                while let Some(code) = seq.next_element::<Code>()? {
                    set.insert(code);
                }
                Ok(set)
            }
        }
        d.deserialize_seq(V)
    }
}

/// A class by its header value: exactly `"critical"`, `"default"` or `"sheddable"`.
impl<'de> Deserialize<'de> for Criticality {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Criticality;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#""critical", "default" or "sheddable""#)
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Criticality, E> {
                Criticality::from_value(s.as_bytes())
                    .ok_or_else(|| E::invalid_value(Unexpected::Str(s), &self))
            }
        }
        d.deserialize_str(V)
    }
}
