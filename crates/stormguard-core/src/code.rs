//! code (being written)
