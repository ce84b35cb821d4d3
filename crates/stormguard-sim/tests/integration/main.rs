//! The simulator: hedged calls' decisions (`hedging`), its server against the server
//! layer's gate (`server_parity`) and the shapes of the tables on the `--quick` runs
//! (`tables`), in one binary.

mod hedging;
mod server_parity;
mod tables;
