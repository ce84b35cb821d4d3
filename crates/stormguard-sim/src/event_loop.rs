//! The event loop: one scenario, one seeded run, one [`RunStats`].
//!
//! The loop only dispatches: it takes the next event off the [`Agenda`] (virtual time,
//! see [`crate::event`]) and hands it to the side it concerns, the fleet's clients
//! ([`crate::fleet`]) or the servers ([`crate::server`]), which say what it does and
//! schedule what follows.

use stormguard_core::Instant;

use crate::SimError;
use crate::event::{Agenda, Event};
use crate::fleet::Fleet;
use crate::scenario::Scenario;
use crate::server::Servers;
use crate::stats::RunStats;

/// One run: the agenda, the fleet and the servers.
pub(crate) struct Sim<'a> {
    pub(crate) agenda: Agenda,
    pub(crate) fleet: Fleet<'a>,
    pub(crate) servers: Servers<'a>,
    events: u64,
}

/// Runs `scenario` to the end and returns what it measured.
///
/// Reproducible: the same scenario (seed included) gives the same [`RunStats`].
pub fn run(scenario: &Scenario) -> Result<RunStats, SimError> {
    run_from(scenario, Instant::now())
}

/// [`run`] with virtual time starting at `base`.
pub(crate) fn run_from(scenario: &Scenario, base: Instant) -> Result<RunStats, SimError> {
    scenario.validate()?;
    let mut sim = Sim::new(scenario, base)?;
    sim.run();
    Ok(sim.into_stats())
}

impl<'a> Sim<'a> {
    pub(crate) fn new(sc: &'a Scenario, base: Instant) -> Result<Self, SimError> {
        let fleet = Fleet::new(sc)?;
        let servers = Servers::new(sc)?;
        Ok(Sim {
            agenda: Agenda::new(base),
            fleet,
            servers,
            events: 0,
        })
    }

    pub(crate) fn run(&mut self) {
        self.fleet.next_arrival(&mut self.agenda);
        while self.step(u64::MAX) {}
    }

    /// What the run measured.
    pub(crate) fn into_stats(self) -> RunStats {
        RunStats {
            events: self.events,
            ..self.fleet.into_stats()
        }
    }

    /// Runs the next event if it is due at or before `until`; `false` when none is.
    pub(crate) fn step(&mut self, until: u64) -> bool {
        let Some(event) = self.agenda.next_until(until) else {
            return false;
        };
        self.events += 1;
        let Sim {
            agenda,
            fleet,
            servers,
            ..
        } = self;
        match event {
            Event::Arrival => {
                fleet.arrival(agenda);
                fleet.next_arrival(agenda);
            }
            Event::Response { slot, id, outcome } => fleet.response(agenda, slot, id, outcome),
            Event::Timeout { slot, id } => fleet.timeout(agenda, slot, id),
            Event::RetryStart { slot, id } => fleet.retry_start(agenda, slot, id),
            Event::RelayArrive {
                level,
                slot,
                id,
                deadline,
            } => fleet.relay_arrive(agenda, level, slot, id, deadline),
            Event::ServerArrive {
                shard,
                job,
                retry,
                deadline,
            } => servers.arrive(agenda, shard, job, retry, deadline),
            Event::ServiceDone { shard, job } => servers.service_done(agenda, shard, job),
            Event::ServerTimer { shard, job } => servers.timer(agenda, shard, job),
            Event::ServerCut { shard, job } => servers.cut(agenda, shard, job),
            Event::ServerCancel { shard, job } => servers.cancel(agenda, shard, job),
        }
        true
    }
}

#[cfg(test)]
mod tests;
