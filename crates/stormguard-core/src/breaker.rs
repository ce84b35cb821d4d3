//! breaker (being written)
