//! retry (being written)
