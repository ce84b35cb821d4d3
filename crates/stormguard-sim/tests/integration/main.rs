//! The simulator: hedged calls' decisions (`hedging`) and the shapes of the tables on the
//! `--quick` runs (`tables`), in one binary.

mod hedging;
mod tables;
