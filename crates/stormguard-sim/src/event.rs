//! The events of a run, and the agenda they wait in.
//!
//! Time is virtual. Every event sits in a binary heap ordered by (time, sequence number),
//! so two events at the same instant run in the order they were scheduled and a seed fixes
//! the whole run. Instants handed to the core objects are `base + offset`, with `base`
//! taken once per run: the core objects only ever look at differences between instants,
//! so the base does not change any result.
//!
//! The fleet ([`crate::fleet`]) and the servers ([`crate::server`]) schedule events here
//! and say what each does; the event loop ([`crate::event_loop`]) takes them off in order
//! and hands each to its side. Neither side knows the other or the loop: what passes
//! between them is an [`Event`].

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::time::Duration;

use stormguard_core::Instant;
use stormguard_core::retry::Failure;

use crate::scenario::nanos;

/// One attempt at a server: the slot of its call and the attempt's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Job {
    /// The slot of the call (reused once the call ends).
    pub slot: u32,
    /// The attempt, unique in a run.
    pub id: u64,
}

/// What comes back to a client for one attempt.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Outcome {
    Ok,
    Failed(Failure),
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum Event {
    Arrival,
    /// An attempt's answer reaches its client.
    Response {
        slot: u32,
        id: u64,
        outcome: Outcome,
    },
    /// The client's timer for an attempt fires.
    Timeout {
        slot: u32,
        id: u64,
    },
    /// A retry's delay has passed.
    RetryStart {
        slot: u32,
        id: u64,
    },
    /// An attempt reaches a middle tier.
    RelayArrive {
        level: u8,
        slot: u32,
        id: u64,
        deadline: Option<u64>,
    },
    /// An attempt reaches a queueing server.
    ServerArrive {
        shard: u32,
        job: Job,
        retry: bool,
        deadline: Option<u64>,
    },
    /// A worker finishes an attempt.
    ServiceDone {
        shard: u32,
        job: Job,
    },
    /// The expiry timer of a queued attempt fires.
    ServerTimer {
        shard: u32,
        job: Job,
    },
    /// A running attempt reaches the instant a shedding server cuts it
    /// ([`AdmissionConfig::cut_at`](stormguard_core::admission::AdmissionConfig::cut_at)).
    ServerCut {
        shard: u32,
        job: Job,
    },
    /// The client gave up on an attempt: the stream reset reaches the server.
    ServerCancel {
        shard: u32,
        job: Job,
    },
}

#[derive(Debug)]
struct Scheduled {
    at: u64,
    seq: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    /// Reversed: the heap pops the earliest (time, sequence) first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// The virtual clock and the events waiting on it. Times are nanoseconds since the start
/// of the run.
#[derive(Debug)]
pub(crate) struct Agenda {
    base: Instant,
    now: u64,
    seq: u64,
    heap: BinaryHeap<Scheduled>,
}

impl Agenda {
    /// An empty agenda whose time 0 is `base`.
    pub(crate) fn new(base: Instant) -> Self {
        Agenda {
            base,
            now: 0,
            seq: 0,
            heap: BinaryHeap::new(),
        }
    }

    /// The time of the event being run.
    pub(crate) fn now(&self) -> u64 {
        self.now
    }

    /// The instant of time `t`.
    pub(crate) fn at(&self, t: u64) -> Instant {
        self.base + Duration::from_nanos(t)
    }

    /// The instant of the event being run.
    pub(crate) fn instant(&self) -> Instant {
        self.at(self.now)
    }

    /// The time of `instant` (0 before the start).
    pub(crate) fn time_of(&self, instant: Instant) -> u64 {
        nanos(instant.saturating_duration_since(self.base))
    }

    /// Runs `event` at time `at`, after the events already scheduled for then.
    pub(crate) fn schedule(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.heap.push(Scheduled {
            at,
            seq: self.seq,
            event,
        });
    }

    /// The next event, if it is due at or before `until`; the clock moves to its time.
    pub(crate) fn next_until(&mut self, until: u64) -> Option<Event> {
        if self.heap.peek().is_none_or(|next| next.at > until) {
            return None;
        }
        let Scheduled { at, event, .. } = self.heap.pop()?;
        self.now = at;
        Some(event)
    }
}
