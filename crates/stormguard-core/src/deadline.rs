//! deadline (being written)
