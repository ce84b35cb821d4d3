//! throttle (being written)
