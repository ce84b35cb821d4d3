//! The demo crate's own checks: its hand-written ORCA mirror against the published proto
//! (`orca_wire`) and its simulated network under the real layers (`turmoil_net`), in one
//! binary.

mod orca_wire;
mod turmoil_net;
