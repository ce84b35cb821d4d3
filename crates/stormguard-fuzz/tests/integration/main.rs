//! Every fuzz target on fixed seeds (`fuzz`) and property tests through the same contract
//! checks (`properties`), in one binary.

mod fuzz;
mod properties;
