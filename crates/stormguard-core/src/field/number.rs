//! Numbers as a config document writes them: whole numbers and finite numbers, each also
//! accepted as a string (proto3 JSON allows `"10"` for `10`), so every format reads them
//! the same way.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, Deserializer, Unexpected, Visitor};

/// A whole-number type a config field holds, with the largest value accepted.
pub(crate) trait Whole: Copy {
    /// The largest value accepted.
    const MAX: u64;
    /// `n`, known to be at most [`Whole::MAX`].
    fn from_u64(n: u64) -> Self;
}

impl Whole for u32 {
    const MAX: u64 = u32::MAX as u64;
    fn from_u64(n: u64) -> Self {
        u32::try_from(n).unwrap_or(u32::MAX)
    }
}

impl Whole for u64 {
    const MAX: u64 = u64::MAX;
    fn from_u64(n: u64) -> Self {
        n
    }
}

/// A count of calls (workers, queue places, a depth): at most `u32::MAX` on every
/// platform, so a config means the same everywhere.
impl Whole for usize {
    const MAX: u64 = u32::MAX as u64;
    fn from_u64(n: u64) -> Self {
        usize::try_from(n).unwrap_or(usize::MAX)
    }
}

/// A whole number from 0 to `T::MAX`, written as a number or a string of digits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Int<T>(pub(crate) T);

impl<'de, T: Whole> Deserialize<'de> for Int<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<T: Whole> V<T> {
            fn check<E: de::Error>(&self, n: u64, unexpected: Unexpected<'_>) -> Result<T, E> {
                if n <= T::MAX {
                    Ok(T::from_u64(n))
                } else {
                    Err(E::invalid_value(unexpected, self))
                }
            }
        }
        impl<T: Whole> Visitor<'_> for V<T> {
            type Value = T;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a whole number from 0 to {}", T::MAX)
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<T, E> {
                self.check(n, Unexpected::Unsigned(n))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<T, E> {
                let unexpected = Unexpected::Signed(n);
                match u64::try_from(n) {
                    Ok(u) => self.check(u, unexpected),
                    Err(_) => Err(E::invalid_value(unexpected, &self)),
                }
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<T, E> {
                match s.trim().parse::<u64>() {
                    Ok(n) => self.check(n, Unexpected::Str(s)),
                    Err(_) => Err(E::invalid_value(Unexpected::Str(s), &self)),
                }
            }
        }
        d.deserialize_any(V(PhantomData)).map(Int)
    }
}

/// A finite number, written as a number or a string.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Finite(pub(crate) f64);

impl<'de> Deserialize<'de> for Finite {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl V {
            fn check<E: de::Error>(&self, n: f64) -> Result<f64, E> {
                if n.is_finite() {
                    Ok(n)
                } else {
                    Err(E::invalid_value(Unexpected::Float(n), self))
                }
            }
        }
        impl Visitor<'_> for V {
            type Value = f64;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a finite number")
            }
            fn visit_f64<E: de::Error>(self, n: f64) -> Result<f64, E> {
                self.check(n)
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<f64, E> {
                Ok(n as f64)
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<f64, E> {
                Ok(n as f64)
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<f64, E> {
                match s.trim().parse::<f64>() {
                    Ok(n) => self.check(n),
                    Err(_) => Err(E::invalid_value(Unexpected::Str(s), &self)),
                }
            }
        }
        d.deserialize_any(V).map(Finite)
    }
}

/// `deserialize_with` for a whole-number field (see [`Int`]).
pub(crate) fn whole<'de, D: Deserializer<'de>, T: Whole>(d: D) -> Result<T, D::Error> {
    Int::deserialize(d).map(|n| n.0)
}

/// `deserialize_with` for a finite-number field (see [`Finite`]).
pub(crate) fn finite<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Finite::deserialize(d).map(|n| n.0)
}
