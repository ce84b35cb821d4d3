//! End-to-end tests of the server layer (`ShedLayer`) over real tonic and raw HTTP/2, one
//! module per behaviour, in one binary.
#![allow(clippy::unwrap_used)]

#[path = "../support/server.rs"]
mod server_support;

mod adaptive;
mod bounds;
mod cancel;
mod coop;
mod criticality;
mod deadline;
mod hostile_h2;
mod load_reports;
mod never_shed;
mod pushback;
mod queue_order;
mod readiness;
mod retry_shedding;
mod routes;
mod shed_connection;
mod shutdown;
mod streams;
#[path = "../support/turns.rs"]
mod turns_support;
