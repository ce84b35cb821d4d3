//! The files in `ops/`, on real parts: the Prometheus rules checked and unit-tested by
//! `promtool`, and a real Prometheus server scraping the storm example while its
//! `unguarded` and `stormguard` policies run, with the rules' alerts and the Grafana
//! dashboard's queries read back through its HTTP API. Prometheus and promtool come from
//! Debian's `prometheus` package (`ops/prometheus/setup.sh` installs it).
#![allow(clippy::unwrap_used)]

mod prometheus;
mod rules;

#[path = "../examples/support.rs"]
mod examples_support;
mod live;
