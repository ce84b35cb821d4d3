//! How one config field is read and checked, whichever config holds it: whole and finite
//! numbers ([`whole`], [`finite`]), durations ([`duration`]) and the range checks every
//! `validate` is made of ([`check`]), each with its one message so that an error names
//! the field the same way everywhere. It knows the error type and nothing of the
//! decisions, so every folder that has settings reads them with it.

pub(crate) mod check;
pub(crate) mod duration;
mod number;

pub(crate) use number::{Finite, Int, finite, whole};
