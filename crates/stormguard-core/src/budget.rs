//! budget (being written)
