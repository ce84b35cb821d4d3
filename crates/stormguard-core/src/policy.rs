//! policy (being written)
