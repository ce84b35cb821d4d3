//! The servers of queueing shards: workers, a wait queue, and what each answers.
//!
//! A shedding server is stormguard's admission queue itself: a
//! [`stormguard_core::AdmissionQueue`], the type the `ShedLayer` of
//! `stormguard-server` wraps, driven here on the virtual clock. Every decision (admit,
//! queue, shed and the pushback, refuse work too close to its deadline, expire queued
//! work, which waiter a freed worker goes to) is that type's; [`SimServer`] only turns
//! the decisions into [`ServerAction`]s, and the event loop turns those into events. The
//! driving mirrors the tower layer's: a timer per queued call at its expiry, a worker
//! given back when a call finishes or its caller resets the stream, a queued call
//! withdrawn when its caller resets, and a running call with a deadline cut when it
//! reaches [`AdmissionConfig::cut_at`] (its worker given back, its caller answered
//! `DEADLINE_EXCEEDED`). A test in `stormguard-server` runs one script through both and
//! compares every decision.
//!
//! A plain server (the baseline) is a bounded FIFO that refuses calls `UNAVAILABLE` when
//! its queue is full. By default it runs everything it queued, even work whose caller has
//! left (a worker pool, a query already sent to a database); a *cancelling* one
//! ([`SimServer::plain_cancelling`]) drops the work of a caller that reset its stream,
//! queued or running, as a tonic handler waiting for a semaphore is dropped (the storm's
//! default server model).

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use stormguard_core::Code;
use stormguard_core::Failure;
use stormguard_core::Instant;
use stormguard_core::Pushback;
use stormguard_core::wire::AttemptClass;
use stormguard_core::{AdmissionConfig, AdmissionController, CallClass, Shed, ShedPushback};
use stormguard_core::{AdmissionQueue, Arrival, Dispatch, QueuedId};

use crate::SimError;
use crate::event::{Agenda, Event, Job, Outcome};
use crate::scenario::{QueueServer, Scenario, ServerKind, mix, nanos};

/// What a server does about an event, for the event loop to carry out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerAction {
    /// Serve the job on a worker from now on; tell the server when it is
    /// [`done`](SimServer::done).
    Start(Job),
    /// The job waits. If it is still waiting at `expiry`, call [`SimServer::timer`].
    Queued(Job, Instant),
    /// Answer the job at once with the shed status and this pushback.
    Shed(Job, Shed),
    /// Answer the job `DEADLINE_EXCEEDED` without running it: too little time left on
    /// arrival, or its expiry passed while it waited.
    Expired(Job),
    /// Answer the job `UNAVAILABLE` (a plain server's full queue), with no pushback.
    Refused(Job),
}

/// A queueing shard's server: stormguard's admission queue, or a plain FIFO.
#[derive(Debug)]
pub struct SimServer {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Plain {
        workers: usize,
        capacity: usize,
        busy: usize,
        queue: VecDeque<Job>,
        /// The jobs on a worker, for a server that drops the work of callers that reset
        /// (`None`: it runs everything and needs no names).
        running: Option<HashSet<Job>>,
    },
    Shedding(Box<Shedding>),
}

#[derive(Debug)]
struct Shedding {
    queue: AdmissionQueue<Job>,
    /// Waiting jobs, to find their place when their timer fires or they are cancelled.
    queued: HashMap<Job, QueuedId>,
    /// Jobs on a worker, with when they got it.
    running: HashMap<Job, Instant>,
    /// When each waiting or running job with a deadline is cut if it still runs.
    cut_at: HashMap<Job, Instant>,
}

impl SimServer {
    /// A plain FIFO server of `workers` with a wait queue of `capacity`.
    pub fn plain(workers: usize, capacity: usize) -> Self {
        SimServer {
            kind: Kind::Plain {
                workers,
                capacity,
                busy: 0,
                queue: VecDeque::new(),
                running: None,
            },
        }
    }

    /// A plain FIFO server of `workers` with a wait queue of `capacity` that drops the
    /// work of a caller that reset its stream: a waiting job leaves the queue, a running
    /// one gives its worker to the next in line.
    pub fn plain_cancelling(workers: usize, capacity: usize) -> Self {
        SimServer {
            kind: Kind::Plain {
                workers,
                capacity,
                busy: 0,
                queue: VecDeque::new(),
                running: Some(HashSet::new()),
            },
        }
    }

    /// A server behind stormguard's admission queue, configured by `config`.
    pub fn shedding(config: AdmissionConfig) -> Result<Self, SimError> {
        Ok(SimServer {
            kind: Kind::Shedding(Box::new(Shedding {
                queue: AdmissionQueue::new(AdmissionController::new(config)?),
                queued: HashMap::new(),
                running: HashMap::new(),
                cut_at: HashMap::new(),
            })),
        })
    }

    /// The status a shed answer with `pushback` carries (`UNAVAILABLE` for a plain
    /// server's refusals), as the `ShedLayer` chooses it
    /// ([`AdmissionConfig::code_for`](stormguard_core::AdmissionConfig::code_for)).
    pub fn shed_code(&self, pushback: ShedPushback) -> Code {
        match &self.kind {
            Kind::Plain { .. } => Code::Unavailable,
            Kind::Shedding(s) => s.queue.policy().config().code_for(pushback),
        }
    }

    /// Jobs on a worker now.
    pub fn running(&self) -> usize {
        match &self.kind {
            Kind::Plain { busy, .. } => *busy,
            Kind::Shedding(s) => s.queue.running(),
        }
    }

    /// Jobs that may run at once now: the configured workers, or where an adaptive
    /// limit stands.
    pub fn worker_limit(&self) -> usize {
        match &self.kind {
            Kind::Plain { workers, .. } => *workers,
            Kind::Shedding(s) => s.queue.worker_limit(),
        }
    }

    /// Jobs waiting now.
    pub fn depth(&self) -> usize {
        match &self.kind {
            Kind::Plain { queue, .. } => queue.len(),
            Kind::Shedding(s) => s.queue.load().depth,
        }
    }

    /// `job`, a first attempt or a retry with its criticality (`class`) and `deadline`,
    /// arrives at `now`.
    pub fn arrive(
        &mut self,
        now: Instant,
        job: Job,
        class: impl Into<CallClass>,
        deadline: Option<Instant>,
        out: &mut Vec<ServerAction>,
    ) {
        match &mut self.kind {
            Kind::Plain {
                workers,
                capacity,
                busy,
                queue,
                running,
            } => {
                if *busy < *workers {
                    *busy += 1;
                    if let Some(running) = running {
                        running.insert(job);
                    }
                    out.push(ServerAction::Start(job));
                } else if queue.len() < *capacity {
                    queue.push_back(job);
                } else {
                    out.push(ServerAction::Refused(job));
                }
            }
            Kind::Shedding(s) => {
                let Shedding {
                    queue,
                    queued,
                    running,
                    cut_at,
                } = &mut **s;
                let arrival = queue.arrive_at(
                    now,
                    class,
                    deadline,
                    job,
                    dispatcher(now, queued, running, cut_at, out),
                );
                if let (Arrival::Run | Arrival::Queued { .. }, Some(deadline)) =
                    (&arrival, deadline)
                {
                    cut_at.insert(job, queue.policy().config().cut_at(deadline));
                }
                out.push(match arrival {
                    Arrival::Run => {
                        running.insert(job, now);
                        ServerAction::Start(job)
                    }
                    Arrival::Queued { id, expiry } => {
                        queued.insert(job, id);
                        ServerAction::Queued(job, expiry)
                    }
                    Arrival::Shed(shed) => ServerAction::Shed(job, shed),
                    Arrival::Expired => ServerAction::Expired(job),
                });
            }
        }
    }

    /// `job`'s service ends at `now`. Returns whether it was still on a worker (and its
    /// answer goes out): a job whose caller reset the stream was dropped already.
    pub fn done(&mut self, now: Instant, job: Job, out: &mut Vec<ServerAction>) -> bool {
        match &mut self.kind {
            Kind::Plain {
                busy,
                queue,
                running,
                ..
            } => {
                // A cancelling server gave the worker of a reset job back already.
                if let Some(running) = running.as_mut()
                    && !running.remove(&job)
                {
                    return false;
                }
                *busy = busy.saturating_sub(1);
                start_next(busy, queue, running.as_mut(), out);
                true
            }
            Kind::Shedding(s) => s.release(now, job, Release::Finished, out),
        }
    }

    /// The expiry timer of queued `job` fires at `now`: if it still waits, it is answered
    /// `DEADLINE_EXCEEDED`.
    pub fn timer(&mut self, now: Instant, job: Job, out: &mut Vec<ServerAction>) {
        if let Kind::Shedding(s) = &mut self.kind
            && let Some(id) = s.queued.remove(&job)
            && s.queue.withdraw_at(now, id).is_some()
        {
            s.cut_at.remove(&job);
            out.push(ServerAction::Expired(job));
        }
    }

    /// When running `job` is cut if it still runs: for a shedding server and a job with a
    /// deadline, [`AdmissionConfig::cut_at`] of it, as the `ShedLayer` arms it once the
    /// call has a worker. `None` for a plain server, a job without a deadline or one not
    /// running.
    pub fn cut_at(&self, job: Job) -> Option<Instant> {
        match &self.kind {
            Kind::Shedding(s) if s.running.contains_key(&job) => s.cut_at.get(&job).copied(),
            _ => None,
        }
    }

    /// `job`'s cut instant ([`cut_at`](Self::cut_at)) is reached at `now`. Returns whether
    /// it was still running and is cut: its work is dropped, its worker given back (to the
    /// next waiter, in `out`) as when its caller leaves, and its caller is answered
    /// `DEADLINE_EXCEEDED`, as the `ShedLayer` cuts a handler that has not answered.
    pub fn cut(&mut self, now: Instant, job: Job, out: &mut Vec<ServerAction>) -> bool {
        match &mut self.kind {
            Kind::Shedding(s) if s.cut_at.get(&job).is_some_and(|at| now >= *at) => {
                s.release(now, job, Release::Abandoned, out)
            }
            _ => false,
        }
    }

    /// `job`'s caller reset its stream at `now`: a waiting job leaves the queue, a running
    /// one gives its worker back (the tower layer drops the handler's future). A plain
    /// server does not notice and runs it anyway, unless it is a cancelling one, which
    /// does the same as the shedding server.
    pub fn cancel(&mut self, now: Instant, job: Job, out: &mut Vec<ServerAction>) {
        let s = match &mut self.kind {
            Kind::Plain {
                busy,
                queue,
                running: Some(running),
                ..
            } => {
                if running.remove(&job) {
                    *busy = busy.saturating_sub(1);
                    start_next(busy, queue, Some(running), out);
                    return;
                }
                if let Some(at) = queue.iter().position(|&j| j == job) {
                    queue.remove(at);
                }
                return;
            }
            Kind::Plain { .. } => return,
            Kind::Shedding(s) => s,
        };
        if let Some(id) = s.queued.remove(&job) {
            s.cut_at.remove(&job);
            s.queue.withdraw_at(now, id);
        } else {
            s.release(now, job, Release::Abandoned, out);
        }
    }
}

/// How a running job gave its worker back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Release {
    /// Its work ended.
    Finished,
    /// Its work was dropped (its caller left, or it was cut): its time on the worker is
    /// only a lower bound on its latency.
    Abandoned,
}

impl Shedding {
    /// Running `job` gives its worker back at `now`, which goes to the next waiter (in
    /// `out`). Returns whether it was running.
    fn release(
        &mut self,
        now: Instant,
        job: Job,
        how: Release,
        out: &mut Vec<ServerAction>,
    ) -> bool {
        let Shedding {
            queue,
            queued,
            running,
            cut_at,
        } = self;
        let Some(started) = running.remove(&job) else {
            return false;
        };
        cut_at.remove(&job);
        let sink = dispatcher(now, queued, running, cut_at, out);
        match how {
            Release::Finished => queue.finish_at(now, started, sink),
            Release::Abandoned => queue.abandon_at(now, started, sink),
        }
        true
    }
}

/// A plain server's freed worker goes to the oldest waiting job (named in `running` for
/// a cancelling server).
fn start_next(
    busy: &mut usize,
    queue: &mut VecDeque<Job>,
    running: Option<&mut HashSet<Job>>,
    out: &mut Vec<ServerAction>,
) {
    if let Some(next) = queue.pop_front() {
        *busy += 1;
        if let Some(running) = running {
            running.insert(next);
        }
        out.push(ServerAction::Start(next));
    }
}

/// Turns what the admission queue dispatched into actions, keeping track of who waits
/// and who runs.
fn dispatcher<'a>(
    now: Instant,
    queued: &'a mut HashMap<Job, QueuedId>,
    running: &'a mut HashMap<Job, Instant>,
    cut_at: &'a mut HashMap<Job, Instant>,
    out: &'a mut Vec<ServerAction>,
) -> impl FnMut(Dispatch<Job>) + 'a {
    move |dispatch| match dispatch {
        Dispatch::Run(left) => {
            queued.remove(&left.waiter);
            running.insert(left.waiter, now);
            out.push(ServerAction::Start(left.waiter));
        }
        Dispatch::Expired(left) => {
            queued.remove(&left.waiter);
            cut_at.remove(&left.waiter);
            out.push(ServerAction::Expired(left.waiter));
        }
        Dispatch::Shed(left, shed) => {
            queued.remove(&left.waiter);
            cut_at.remove(&left.waiter);
            out.push(ServerAction::Shed(left.waiter, shed));
        }
    }
}

/// The servers of a run's queueing shards, and what they did about the current event.
pub(crate) struct Servers<'a> {
    sc: &'a Scenario,
    /// The server of each queueing shard (`None` for the others).
    servers: Vec<Option<SimServer>>,
    /// What a server did about the current event (a buffer kept between events).
    actions: Vec<ServerAction>,
}

impl<'a> Servers<'a> {
    /// The servers of `sc`'s shards, each shedding one seeded from the scenario's seed.
    pub(crate) fn new(sc: &'a Scenario) -> Result<Self, SimError> {
        let mut servers = Vec::with_capacity(sc.shards.len());
        for (i, shard) in sc.shards.iter().enumerate() {
            let server = match &shard.server {
                ServerKind::Queue(q) => Some(match &q.shedding {
                    Some(c) => SimServer::shedding(AdmissionConfig {
                        // Without a seed of its own a shard's jitter comes from the run's
                        // seed alone (mixed with the value the default had when it was
                        // fixed, so the published tables stay as they are).
                        seed: Some(mix(
                            sc.seed ^ c.seed.unwrap_or(0x5eed_57a6),
                            1 << 40 | i as u64,
                        )),
                        ..c.clone()
                    })?,
                    None if q.drops_abandoned => {
                        SimServer::plain_cancelling(q.workers, q.queue_capacity)
                    }
                    None => SimServer::plain(q.workers, q.queue_capacity),
                }),
                ServerKind::Unbounded { .. } => None,
            };
            servers.push(server);
        }
        Ok(Servers {
            sc,
            servers,
            actions: Vec::new(),
        })
    }

    /// The server of `shard`, if it is a queueing shard.
    #[cfg(test)]
    pub(crate) fn get(&self, shard: usize) -> Option<&SimServer> {
        self.servers.get(shard).and_then(Option::as_ref)
    }

    /// The queueing server of `shard` (only those get server events).
    fn queue_server(&self, shard: u32) -> Option<&QueueServer> {
        match &self.sc.shards[shard as usize].server {
            ServerKind::Queue(q) => Some(q),
            ServerKind::Unbounded { .. } => None,
        }
    }

    fn service_time(&self, now: u64, shard: u32) -> u64 {
        let Some(q) = self.queue_server(shard) else {
            return 0;
        };
        let base = q.service_time;
        match q.slowdown {
            // `mul_f64` panics past `Duration::MAX`; a service time that long saturates.
            Some((window, factor)) if window.contains(now) => {
                Duration::try_from_secs_f64(base.as_secs_f64() * factor).map_or(u64::MAX, nanos)
            }
            _ => nanos(base),
        }
    }

    fn answer(&self, agenda: &mut Agenda, job: Job, outcome: Outcome) {
        let at = agenda.now().saturating_add(nanos(self.sc.network));
        let Job { slot, id } = job;
        agenda.schedule(at, Event::Response { slot, id, outcome });
    }

    /// Runs `event` on the server of `shard` (if it has one) at the agenda's instant; its
    /// actions wait in `actions` for [`Servers::carry_out`].
    fn on_server<R>(
        &mut self,
        agenda: &Agenda,
        shard: u32,
        event: impl FnOnce(&mut SimServer, Instant, &mut Vec<ServerAction>) -> R,
    ) -> Option<R> {
        let now = agenda.instant();
        let server = self.servers[shard as usize].as_mut()?;
        Some(event(server, now, &mut self.actions))
    }

    /// Turns the actions of the server of `shard` into events.
    fn carry_out(&mut self, agenda: &mut Agenda, shard: u32) {
        let mut actions = std::mem::take(&mut self.actions);
        for action in actions.drain(..) {
            match action {
                ServerAction::Start(job) => {
                    let at = agenda
                        .now()
                        .saturating_add(self.service_time(agenda.now(), shard));
                    agenda.schedule(at, Event::ServiceDone { shard, job });
                    // A shedding server cuts the job at its deadline if it would still be
                    // running then (when both fall at once, the answer goes first).
                    let cut = self.servers[shard as usize]
                        .as_ref()
                        .and_then(|s| s.cut_at(job))
                        .map(|cut| agenda.time_of(cut));
                    if let Some(cut) = cut.filter(|cut| *cut < at) {
                        agenda.schedule(cut, Event::ServerCut { shard, job });
                    }
                }
                ServerAction::Queued(job, expiry) => {
                    let at = agenda.time_of(expiry);
                    agenda.schedule(at, Event::ServerTimer { shard, job });
                }
                ServerAction::Shed(job, shed) => {
                    let shed_code = self.servers[shard as usize]
                        .as_ref()
                        .map_or(Code::Unavailable, |s| s.shed_code(shed.pushback));
                    let pushback = match shed.pushback {
                        ShedPushback::After(d) => Pushback::RetryAfter(d),
                        ShedPushback::DoNotRetry => Pushback::DoNotRetry,
                    };
                    // The shedding layer's own answers say the handler never ran
                    // (`stormguard-unprocessed`): a hedge shed does not fail its call.
                    let failure = Failure {
                        unprocessed: true,
                        ..Failure {
                            pushback: Some(pushback),
                            ..Failure::status(shed_code)
                        }
                    };
                    self.answer(agenda, job, Outcome::Failed(failure));
                }
                ServerAction::Expired(job) => {
                    let failure = Failure {
                        unprocessed: true,
                        ..Failure::status(Code::DeadlineExceeded)
                    };
                    self.answer(agenda, job, Outcome::Failed(failure));
                }
                ServerAction::Refused(job) => {
                    let failure = Failure::status(Code::Unavailable);
                    self.answer(agenda, job, Outcome::Failed(failure));
                }
            }
        }
        // Keep the buffer's capacity for the next event.
        self.actions = actions;
    }

    /// Attempt `job` (a retry or not, with `deadline`) reaches the server of `shard`.
    pub(crate) fn arrive(
        &mut self,
        agenda: &mut Agenda,
        shard: u32,
        job: Job,
        retry: bool,
        deadline: Option<u64>,
    ) {
        let class = if retry {
            AttemptClass::Retry
        } else {
            AttemptClass::First
        };
        let deadline = deadline.map(|d| agenda.at(d));
        self.on_server(agenda, shard, |server, now, out| {
            server.arrive(now, job, class, deadline, out);
        });
        self.carry_out(agenda, shard);
    }

    /// A worker of the server of `shard` finishes `job`.
    pub(crate) fn service_done(&mut self, agenda: &mut Agenda, shard: u32, job: Job) {
        let served = self.on_server(agenda, shard, |server, now, out| server.done(now, job, out));
        if served == Some(true) {
            self.answer(agenda, job, Outcome::Ok);
        }
        self.carry_out(agenda, shard);
    }

    /// The expiry timer of queued `job` fires at the server of `shard`.
    pub(crate) fn timer(&mut self, agenda: &mut Agenda, shard: u32, job: Job) {
        self.on_server(agenda, shard, |server, now, out| {
            server.timer(now, job, out)
        });
        self.carry_out(agenda, shard);
    }

    /// Running `job` reaches the instant the server of `shard` cuts it: if it is still
    /// running, its caller is answered `DEADLINE_EXCEEDED` (the handler ran: not an
    /// unprocessed answer).
    pub(crate) fn cut(&mut self, agenda: &mut Agenda, shard: u32, job: Job) {
        let cut = self.on_server(agenda, shard, |server, now, out| server.cut(now, job, out));
        if cut == Some(true) {
            let failure = Failure::status(Code::DeadlineExceeded);
            self.answer(agenda, job, Outcome::Failed(failure));
        }
        self.carry_out(agenda, shard);
    }

    /// `job`'s caller reset its stream; the reset reaches the server of `shard`.
    pub(crate) fn cancel(&mut self, agenda: &mut Agenda, shard: u32, job: Job) {
        self.on_server(agenda, shard, |server, now, out| {
            server.cancel(now, job, out)
        });
        self.carry_out(agenda, shard);
    }
}

#[cfg(test)]
mod tests;
