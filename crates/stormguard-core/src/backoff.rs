//! backoff (being written)
