//! admission (being written)
