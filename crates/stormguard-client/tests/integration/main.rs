//! The client layer against scripted inner services (`retry_layer`), against the
//! simulator's client (`parity`) and hedged call (`hedge_parity`), and `Replicas` found by
//! DNS against a real DNS server and replicas on loopback (`dns`), and client-side health
//! checks against real tonic-health services (`health`), in one binary.

#[cfg(feature = "dns")]
mod dns;
#[cfg(feature = "dns")]
mod dns_support;
#[cfg(feature = "health")]
mod health;
mod hedge_parity;
mod parity;
mod retry_layer;
mod scripted;
