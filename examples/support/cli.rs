//! Command-line reading the storm, chain and simulator examples share.

use std::fmt::Display;
use std::str::FromStr;

/// The value after `flag`, parsed; an error names the flag and what it was given.
pub(crate) fn value<T>(flag: &str, args: &mut impl Iterator<Item = String>) -> Result<T, String>
where
    T: FromStr,
    T::Err: Display,
{
    let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
    value.parse().map_err(|e| format!("{flag} {value:?}: {e}"))
}
