//! pushback (being written)
