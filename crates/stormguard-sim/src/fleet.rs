//! The fleet's clients: one real [`RetryController`] per simulated client process (its
//! own budget and breaker, as in production) and per middle-tier process, and every
//! logical call a real [`CallRetry`] driven as stormguard's client layer drives it, at
//! the same moments: `begin_at` when the call starts, `on_success_at` on `OK`,
//! `on_failure_at` on any other answer, `on_attempt_timeout_at` when an attempt runs out
//! of its per-attempt timeout, `on_deadline_passed_at` (final) when the caller's own
//! deadline runs out mid-attempt, and `start_retry_at` when a retry's delay is over. The
//! simulator decides nothing about retries itself: this module only sends the attempts
//! those objects ask for, runs their timers, and passes the answers back. (A simulated
//! answer is a status with no streamed body, so no call commits: `on_commit_at` has no
//! moment here.) A method with a hedging policy is driven as the layer drives a hedged
//! call ([`HedgedCall`]): its copies are attempts of their own at the servers, each
//! cancelled (its stream reset, which frees what it held at a shedding server) when
//! another wins or the deadline passes.

use std::sync::Arc;

use stormguard_core::A6Budget;
use stormguard_core::CallTimes;
use stormguard_core::CircuitBreaker;
use stormguard_core::Code;
use stormguard_core::MethodScope;
use stormguard_core::MethodTable;
use stormguard_core::Pushback;
use stormguard_core::{AttemptPlan, Failure, Refusal, RetryController};
use stormguard_core::{Budget, RetryBudget, Unlimited};

use crate::SimError;
use crate::client::{End, SimCall, Step};
use crate::event::{Agenda, Event, Job, Outcome};
use crate::hedged::{Action, HedgedCall};
use crate::scenario::{BudgetKind, ClientPolicy, PATH, Scenario, ServerKind, mix, nanos};
use crate::stats::{Bin, RunStats, ShardStats};

/// The simulated client layer's state of a call: retried, or hedged.
pub(crate) enum Driver {
    Retried(SimCall),
    Hedged(HedgedCall),
}

/// What a call does first, as its driver decided when it began.
enum First {
    Step(Step),
    Actions,
}

/// One logical call in flight: the fleet's, or one a middle tier makes for an attempt.
pub(crate) struct Call {
    /// The simulated client layer's state of the call.
    pub(crate) sim: Driver,
    /// 0 for the fleet's calls, k for calls made by tier k - 1.
    pub(crate) level: u8,
    /// The attempt this call serves, for calls made by a middle tier.
    pub(crate) parent: Option<(u32, u64)>,
    pub(crate) shard: u32,
    pub(crate) arrived: u64,
    pub(crate) deadline: Option<u64>,
    /// Id of the current attempt (or of the pending retry); for a hedged call, of its
    /// armed timer (0: none).
    pub(crate) id: u64,
    /// A hedged call's copies in flight: their number in the call and attempt id.
    pub(crate) copies: Vec<(u32, u64)>,
    pub(crate) in_flight: bool,
    pub(crate) attempts: u64,
    pub(crate) measured: bool,
}

/// The fleet: its client processes, the middle tiers' processes, the logical calls in
/// flight, and what they measured.
pub(crate) struct Fleet<'a> {
    sc: &'a Scenario,
    /// The run's randomness: arrivals, which process and shard a call goes to, injected
    /// failures.
    rng: fastrand::Rng,
    controllers: Vec<RetryController>,
    /// The clients of each middle tier's processes.
    relays: Vec<Vec<RetryController>>,
    calls: Vec<Option<Call>>,
    free: Vec<u32>,
    next_id: u64,
    stats: RunStats,
    end: u64,
    measure_from: u64,
    bin: u64,
    fleet_rate: f64,
    /// The buffer a hedged call's actions go through (kept for its capacity).
    actions: Vec<Action>,
}

fn build_controller(
    policy: &ClientPolicy,
    seed: u64,
    stream: u64,
) -> Result<RetryController, SimError> {
    let mut methods = match &policy.retry {
        Some(p) => MethodTable::uniform(p.clone()),
        None => MethodTable::none(),
    };
    if let Some(h) = &policy.hedging {
        methods.set_hedging(MethodScope::Default, Some(h.clone()));
    }
    let budget: Arc<dyn Budget> = match &policy.budget {
        BudgetKind::Unlimited => Arc::new(Unlimited),
        BudgetKind::Throttle(c) => Arc::new(A6Budget::new(c.clone())?),
        BudgetKind::Budget(c) => Arc::new(RetryBudget::new(c.clone())?),
        BudgetKind::FleetBudget { config, fleet_size } => {
            Arc::new(RetryBudget::with_fleet_size(config.clone(), *fleet_size)?)
        }
    };
    let breaker = match &policy.breaker {
        Some(c) => Some(CircuitBreaker::new(c.clone(), mix(seed, 2 * stream + 1))?),
        None => None,
    };
    Ok(RetryController::new(
        methods,
        budget,
        breaker,
        mix(seed, 2 * stream),
    )?)
}

impl<'a> Fleet<'a> {
    /// The fleet of `sc`, its controllers seeded from the scenario's seed.
    pub(crate) fn new(sc: &'a Scenario) -> Result<Self, SimError> {
        let per_client = if sc.policy.budget_per_shard {
            sc.shards.len()
        } else {
            1
        };
        let mut controllers = Vec::with_capacity(sc.clients * per_client);
        for i in 0..sc.clients * per_client {
            controllers.push(build_controller(&sc.policy, sc.seed, i as u64 + 1)?);
        }
        let mut relays = Vec::with_capacity(sc.tiers.len());
        let mut stream = controllers.len() as u64 + 1;
        for tier in &sc.tiers {
            let mut processes = Vec::with_capacity(tier.processes);
            for _ in 0..tier.processes {
                processes.push(build_controller(&sc.policy, sc.seed, stream)?);
                stream += 1;
            }
            relays.push(processes);
        }
        let end = nanos(sc.duration);
        let bin = nanos(sc.bin);
        let bins = end.div_ceil(bin) as usize;
        let shard_stats = if sc.tiers.is_empty() {
            sc.shards.len()
        } else {
            0
        };
        let stats = RunStats {
            shards: vec![ShardStats::default(); shard_stats],
            attempts_by_level: vec![0; sc.tiers.len() + 1],
            bins: vec![Bin::default(); bins],
            bin_seconds: sc.bin.as_secs_f64(),
            measured_seconds: (sc.duration - sc.measure_from).as_secs_f64(),
            ..RunStats::default()
        };
        Ok(Fleet {
            sc,
            rng: fastrand::Rng::with_seed(mix(sc.seed, 0)),
            controllers,
            relays,
            calls: Vec::new(),
            free: Vec::new(),
            next_id: 0,
            stats,
            end,
            measure_from: nanos(sc.measure_from),
            bin,
            fleet_rate: sc.rate_per_client * sc.clients as f64,
            actions: Vec::new(),
        })
    }

    /// What the fleet's calls measured.
    pub(crate) fn into_stats(self) -> RunStats {
        self.stats
    }

    fn bin_of(&mut self, t: u64) -> Option<&mut Bin> {
        let i = (t / self.bin) as usize;
        self.stats.bins.get_mut(i)
    }

    /// Schedules the next arrival of a logical call, if it comes before the end.
    pub(crate) fn next_arrival(&mut self, agenda: &mut Agenda) {
        // Exponential gaps: the fleet's arrivals are one Poisson process, each call going
        // to a uniformly chosen process, which is N independent Poisson processes.
        let u = 1.0 - self.rng.f64();
        let gap = (-u.ln() / self.fleet_rate * 1e9) as u64;
        let at = agenda.now().saturating_add(gap.max(1));
        if at < self.end {
            agenda.schedule(at, Event::Arrival);
        }
    }

    pub(crate) fn arrival(&mut self, agenda: &mut Agenda) {
        let client = self.rng.usize(0..self.sc.clients);
        let shard = self.rng.usize(0..self.sc.shards.len());
        let index = if self.sc.policy.budget_per_shard {
            client * self.sc.shards.len() + shard
        } else {
            client
        };
        let measured = agenda.now() >= self.measure_from;
        if let Some(bin) = self.bin_of(agenda.now()) {
            bin.calls += 1;
        }
        if measured {
            self.stats.calls += 1;
            if let Some(stats) = self.stats.shards.get_mut(shard) {
                stats.calls += 1;
            }
        }
        let deadline = self
            .sc
            .policy
            .deadline
            .map(|d| agenda.now().saturating_add(nanos(d)));
        let now = agenda.instant();
        let times = CallTimes {
            caller: self.sc.policy.deadline,
            per_attempt: self.sc.policy.layer_per_attempt_timeout,
            ..CallTimes::default()
        };
        let begun = self.begin(None, index, &times, now);
        let (sim, first) = match begun {
            Ok(begun) => begun,
            Err(_) => {
                if measured {
                    *self
                        .stats
                        .gave_up
                        .entry("rejected_by_breaker".into())
                        .or_default() += 1;
                }
                return;
            }
        };
        self.start_call(agenda, sim, first, 0, None, shard, deadline, measured);
    }

    /// Begins a call through the client `index` of the fleet (`relay: None`) or of middle
    /// tier `relay`: hedged when the scenario's method has a hedging policy (its first
    /// actions wait in the buffer), else retried.
    fn begin(
        &mut self,
        relay: Option<usize>,
        index: usize,
        times: &CallTimes,
        now: stormguard_core::Instant,
    ) -> Result<(Driver, First), Refusal> {
        let controller = match relay {
            None => &self.controllers[index],
            Some(level) => &self.relays[level][index],
        };
        if self.sc.policy.hedging.is_some() {
            self.actions.clear();
            let call = HedgedCall::begin_at(controller, PATH, times, now, &mut self.actions)?;
            return Ok((Driver::Hedged(call), First::Actions));
        }
        let (call, step) = SimCall::begin_at(controller, PATH, times, now)?;
        Ok((Driver::Retried(call), First::Step(step)))
    }

    /// Starts a call at `level` (see [`Call`]) arriving now, and takes its first step.
    #[allow(clippy::too_many_arguments)]
    fn start_call(
        &mut self,
        agenda: &mut Agenda,
        sim: Driver,
        first: First,
        level: u8,
        parent: Option<(u32, u64)>,
        shard: usize,
        deadline: Option<u64>,
        measured: bool,
    ) {
        let call = Call {
            sim,
            level,
            parent,
            shard: shard as u32,
            arrived: agenda.now(),
            deadline,
            id: 0,
            copies: Vec::new(),
            in_flight: false,
            attempts: 0,
            measured,
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.calls[slot as usize] = Some(call);
                slot
            }
            None => {
                self.calls.push(Some(call));
                (self.calls.len() - 1) as u32
            }
        };
        match first {
            First::Step(step) => self.take_step(agenda, slot, step),
            First::Actions => self.carry_out(agenda, slot),
        }
    }

    /// Carries out the actions of the hedged call in `slot` waiting in the buffer.
    fn carry_out(&mut self, agenda: &mut Agenda, slot: u32) {
        let mut actions = std::mem::take(&mut self.actions);
        for action in actions.drain(..) {
            match action {
                Action::Send { copy, plan } => {
                    self.next_id += 1;
                    let id = self.next_id;
                    if let Some(call) = self.calls[slot as usize].as_mut() {
                        call.copies.push((copy, id));
                    }
                    self.send(agenda, slot, id, plan, copy > 0);
                }
                Action::Cancel { copy } => {
                    let Some(call) = self.calls[slot as usize].as_mut() else {
                        continue;
                    };
                    let Some(i) = call.copies.iter().position(|(c, _)| *c == copy) else {
                        continue;
                    };
                    let (_, id) = call.copies.swap_remove(i);
                    self.reset(agenda, slot, id);
                }
                Action::Arm(at) => {
                    self.next_id += 1;
                    let id = self.next_id;
                    let Some(call) = self.calls[slot as usize].as_mut() else {
                        continue;
                    };
                    // A new id makes the timer armed before it stale.
                    call.id = at.map_or(0, |_| id);
                    if let Some(at) = at {
                        agenda.schedule(agenda.time_of(at), Event::Timeout { slot, id });
                    }
                }
                Action::End(end) => {
                    let won_by_hedge = self.calls[slot as usize].as_ref().is_some_and(|c| {
                        c.measured
                            && c.level == 0
                            && matches!(&c.sim, Driver::Hedged(h) if h.won_by().is_some_and(|n| n > 0))
                    });
                    if won_by_hedge {
                        self.stats.hedges_won += 1;
                    }
                    self.finish(agenda, slot, end);
                }
            }
        }
        self.actions = actions;
    }

    /// The client reset attempt `id` of `slot`: a queueing server at the bottom hears of
    /// it one network delay later (and frees what the attempt held there).
    fn reset(&mut self, agenda: &mut Agenda, slot: u32, id: u64) {
        if let Some(call) = self.calls[slot as usize].as_ref()
            && self.sc.tiers.len() == call.level as usize
            && matches!(
                self.sc.shards[call.shard as usize].server,
                ServerKind::Queue(_)
            )
        {
            let shard = call.shard;
            let at = agenda.now().saturating_add(nanos(self.sc.network));
            let job = Job { slot, id };
            agenda.schedule(at, Event::ServerCancel { shard, job });
        }
    }

    /// Carries out what the simulated client layer decided for the call in `slot`.
    fn take_step(&mut self, agenda: &mut Agenda, slot: u32, step: Step) {
        match step {
            Step::Send(plan) => self.send_attempt(agenda, slot, plan),
            Step::Wait(delay) => {
                let Some(call) = self.calls[slot as usize].as_ref() else {
                    return;
                };
                let id = call.id;
                let at = agenda.now().saturating_add(nanos(delay));
                agenda.schedule(at, Event::RetryStart { slot, id });
            }
            Step::End(end) => self.finish(agenda, slot, end),
        }
    }

    /// Sends the attempt `plan` describes (its timer is the client layer's, as the policy
    /// crate sets it for the layer too).
    fn send_attempt(&mut self, agenda: &mut Agenda, slot: u32, plan: AttemptPlan) {
        self.next_id += 1;
        let id = self.next_id;
        let Some(call) = self.calls[slot as usize].as_mut() else {
            return;
        };
        call.id = id;
        call.in_flight = true;
        if let Some(at) = plan.fire_at {
            agenda.schedule(agenda.time_of(at), Event::Timeout { slot, id });
        }
        self.send(agenda, slot, id, plan, false);
    }

    /// Sends attempt `id` of `slot` to the next tier or to its shard, with the plan's
    /// deadline (`hedge`: a copy of a hedged call after its first). The client's timer is
    /// the caller's to arm.
    fn send(&mut self, agenda: &mut Agenda, slot: u32, id: u64, plan: AttemptPlan, hedge: bool) {
        let now = agenda.now();
        let Some(call) = self.calls[slot as usize].as_mut() else {
            return;
        };
        call.attempts += 1;
        // A hedge carries `grpc-previous-rpc-attempts`: a server classes it as a retry.
        let again = plan.previous_attempts > 0;
        let retry = again && !hedge;
        let shard_index = call.shard;
        let measured = call.measured;
        let level = call.level;
        let timer = plan.fire_at.map(|at| agenda.time_of(at));
        self.count_attempt(now, (level, shard_index), measured, (retry, hedge));
        if let Some(tier) = self.sc.tiers.get(level as usize) {
            let at = now.saturating_add(nanos(tier.latency) / 2);
            let deadline = timer;
            agenda.schedule(
                at,
                Event::RelayArrive {
                    level,
                    slot,
                    id,
                    deadline,
                },
            );
            return;
        }
        self.reach_shard(agenda, shard_index, Job { slot, id }, again, timer);
    }

    /// Counts an attempt sent at `now` by a call at `level` to shard `shard_index`: in
    /// its bin and, if the call is `measured`, in the run's figures (a `retry`, a `hedge`).
    fn count_attempt(
        &mut self,
        now: u64,
        (level, shard_index): (u8, u32),
        measured: bool,
        (retry, hedge): (bool, bool),
    ) {
        if measured {
            self.stats.attempts_by_level[level as usize] += 1;
        }
        if level == 0 {
            if let Some(bin) = self.bin_of(now) {
                bin.attempts += 1;
                bin.retries += u64::from(retry);
                bin.hedges += u64::from(hedge);
            }
            if measured {
                self.stats.attempts += 1;
                if let Some(stats) = self.stats.shards.get_mut(shard_index as usize) {
                    stats.attempts += 1;
                }
                self.stats.retries += u64::from(retry);
                self.stats.hedges += u64::from(hedge);
            }
        }
    }

    /// Attempt `job` reaches shard `shard_index` (`again`: it carries
    /// `grpc-previous-rpc-attempts`; `timer`: the client's deadline for it), which fails it
    /// (down, or at its failure rate) or serves it.
    fn reach_shard(
        &mut self,
        agenda: &mut Agenda,
        shard_index: u32,
        Job { slot, id }: Job,
        again: bool,
        timer: Option<u64>,
    ) {
        let now = agenda.now();
        let shard = &self.sc.shards[shard_index as usize];
        let down = shard.outage.is_some_and(|w| w.contains(now));
        let fails = down || (shard.failure_rate > 0.0 && self.rng.f64() < shard.failure_rate);
        match &shard.server {
            ServerKind::Unbounded { latency } => {
                let outcome = if fails {
                    Outcome::Failed(Failure::status(Code::Unavailable))
                } else {
                    Outcome::Ok
                };
                agenda.schedule(
                    now.saturating_add(nanos(*latency)),
                    Event::Response { slot, id, outcome },
                );
            }
            ServerKind::Queue(_) => {
                let net = nanos(self.sc.network);
                if fails {
                    let outcome = Outcome::Failed(Failure::status(Code::Unavailable));
                    agenda.schedule(
                        now.saturating_add(net.saturating_mul(2)),
                        Event::Response { slot, id, outcome },
                    );
                } else {
                    agenda.schedule(
                        now.saturating_add(net),
                        Event::ServerArrive {
                            shard: shard_index,
                            job: Job { slot, id },
                            retry: again,
                            deadline: timer,
                        },
                    );
                }
            }
        }
    }

    /// The current attempt of `slot`, if `id` is still it and it is still in flight.
    fn live(&mut self, slot: u32, id: u64) -> bool {
        self.calls
            .get(slot as usize)
            .and_then(Option::as_ref)
            .is_some_and(|c| c.id == id && c.in_flight)
    }

    pub(crate) fn response(&mut self, agenda: &mut Agenda, slot: u32, id: u64, outcome: Outcome) {
        let failure = match outcome {
            Outcome::Ok => None,
            Outcome::Failed(failure) => Some(failure),
        };
        if self.hedged(slot, agenda, |call, now, out| {
            if let Some(&(copy, _)) = call.copies.iter().find(|(_, i)| *i == id)
                && let Driver::Hedged(h) = &mut call.sim
            {
                call.copies.retain(|(_, i)| *i != id);
                h.answered_at(copy, failure, now, out);
            }
        }) {
            return;
        }
        if !self.live(slot, id) {
            return; // the caller gave up on this attempt already
        }
        match outcome {
            Outcome::Ok => self.answered(agenda, slot, None),
            // The attempt's timer is scheduled before any answer to it and wins a tie, so a
            // live answer always comes before the attempt's timeout and the caller's
            // deadline: unlike the layer, whose channel may report an expiry first, the
            // simulator sees every expiry through `timeout`.
            Outcome::Failed(failure) => self.answered(agenda, slot, Some(failure)),
        }
    }

    /// Runs `f` on the call in `slot` if it is hedged, then carries out its actions;
    /// whether it was hedged.
    fn hedged(
        &mut self,
        slot: u32,
        agenda: &mut Agenda,
        f: impl FnOnce(&mut Call, stormguard_core::Instant, &mut Vec<Action>),
    ) -> bool {
        let now = agenda.instant();
        let Some(call) = self.calls.get_mut(slot as usize).and_then(Option::as_mut) else {
            return false;
        };
        if !matches!(call.sim, Driver::Hedged(_)) {
            return false;
        }
        self.actions.clear();
        f(call, now, &mut self.actions);
        self.carry_out(agenda, slot);
        true
    }

    pub(crate) fn timeout(&mut self, agenda: &mut Agenda, slot: u32, id: u64) {
        if self.hedged(slot, agenda, |call, now, out| {
            if call.id == id
                && let Driver::Hedged(h) = &mut call.sim
            {
                call.id = 0;
                h.timer_at(now, out);
            }
        }) {
            return;
        }
        if !self.live(slot, id) {
            return;
        }
        // The client resets the attempt's stream; a queueing server hears of it one
        // network delay later (and frees what the attempt held there).
        self.reset(agenda, slot, id);
        let now = agenda.instant();
        let Some(call) = self.calls[slot as usize].as_mut() else {
            return;
        };
        // The layer's timer fired: the caller's deadline or the attempt's own timeout,
        // which the call's retry state tells apart.
        call.in_flight = false;
        let Driver::Retried(sim) = &mut call.sim else {
            return;
        };
        let step = sim.timer_at(now);
        self.take_step(agenda, slot, step);
    }

    /// The attempt in flight was answered (`None`: `OK`).
    fn answered(&mut self, agenda: &mut Agenda, slot: u32, failure: Option<Failure>) {
        let now = agenda.instant();
        let Some(call) = self.calls[slot as usize].as_mut() else {
            return;
        };
        call.in_flight = false;
        let Driver::Retried(sim) = &mut call.sim else {
            return;
        };
        let step = sim.answered_at(failure, now);
        self.take_step(agenda, slot, step);
    }

    pub(crate) fn retry_start(&mut self, agenda: &mut Agenda, slot: u32, id: u64) {
        let now = agenda.instant();
        let Some(call) = self.calls[slot as usize].as_mut() else {
            return;
        };
        if call.id != id || call.in_flight {
            return;
        }
        let Driver::Retried(sim) = &mut call.sim else {
            return;
        };
        let step = sim.retry_due(now);
        self.take_step(agenda, slot, step);
    }

    /// Ends a logical call as `end` says.
    fn finish(&mut self, agenda: &mut Agenda, slot: u32, end: End) {
        let Some(call) = self.calls[slot as usize].take() else {
            return;
        };
        self.free.push(slot);
        if let Some((parent, parent_id)) = call.parent {
            self.answer_parent(agenda, &call, parent, parent_id, end);
            return;
        }
        let success = matches!(end, End::Ok) && call.deadline.is_none_or(|d| agenda.now() <= d);
        if success && let Some(bin) = self.bin_of(call.arrived) {
            bin.successes += 1;
        }
        if !call.measured {
            return;
        }
        if success {
            self.stats.successes += 1;
            if let Some(stats) = self.stats.shards.get_mut(call.shard as usize) {
                stats.successes += 1;
            }
        } else {
            let name = match end {
                End::Ok => "late",
                End::GaveUp(refusal, _) | End::TimedOut(refusal) => refusal.as_str(),
                End::Expired => Refusal::Deadline.as_str(),
            };
            *self.stats.gave_up.entry(name.to_owned()).or_default() += 1;
        }
    }

    /// A middle tier's call ended: its process answers the attempt it was serving.
    fn answer_parent(
        &self,
        agenda: &mut Agenda,
        call: &Call,
        parent: u32,
        parent_id: u64,
        end: End,
    ) {
        let outcome = match end {
            End::Ok => Outcome::Ok,
            end => Outcome::Failed(self.upstream_failure(end)),
        };
        let tier = &self.sc.tiers[call.level as usize - 1];
        let at = agenda.now().saturating_add(nanos(tier.latency) / 2);
        agenda.schedule(
            at,
            Event::Response {
                slot: parent,
                id: parent_id,
                outcome,
            },
        );
    }

    /// What a middle tier answers when its own call failed, as the client layer returns it:
    /// the last answer when the call gave up on it, `DEADLINE_EXCEEDED` when an attempt
    /// timed out and was not retried, and when the caller's deadline ran out. With
    /// stormguard's client (`pushback_on_give_up`) the answer is marked "do not retry" when
    /// the client refused a retryable failure (budget, breaker, attempts, deadline) or an
    /// attempt timed out, and otherwise keeps the pushback it came with; a standard client
    /// passes the status up without either.
    fn upstream_failure(&self, end: End) -> Failure {
        let (code, refused, came_with) = match end {
            End::GaveUp(refusal, last) => {
                (last.code, refusal.is_retryable_but_refused(), last.pushback)
            }
            End::TimedOut(_) => (Code::DeadlineExceeded, true, None),
            End::Expired | End::Ok => (Code::DeadlineExceeded, false, None),
        };
        let pushback = match (self.sc.policy.pushback_on_give_up, refused) {
            (false, _) => None,
            (true, true) => Some(Pushback::DoNotRetry),
            (true, false) => came_with,
        };
        Failure {
            pushback,
            ..Failure::status(code)
        }
    }

    /// An attempt reaches middle tier `level`: one of its processes starts its own call
    /// to the next level, with the attempt's deadline.
    pub(crate) fn relay_arrive(
        &mut self,
        agenda: &mut Agenda,
        level: u8,
        slot: u32,
        id: u64,
        deadline: Option<u64>,
    ) {
        let Some(parent) = self.calls.get(slot as usize).and_then(Option::as_ref) else {
            return;
        };
        let measured = parent.measured;
        let processes = &self.relays[level as usize];
        let process = self.rng.usize(0..processes.len());
        let shard = self.rng.usize(0..self.sc.shards.len());
        let now = agenda.instant();
        let times = CallTimes {
            inbound: deadline.map(|d| agenda.at(d)),
            per_attempt: self.sc.policy.layer_per_attempt_timeout,
            ..CallTimes::default()
        };
        let begun = self.begin(Some(level as usize), process, &times, now);
        match begun {
            Ok((sim, first)) => self.start_call(
                agenda,
                sim,
                first,
                level + 1,
                Some((slot, id)),
                shard,
                deadline,
                measured,
            ),
            Err(refusal) => {
                // Only an open breaker refuses a first attempt: the layer fails the call at
                // once with `UNAVAILABLE`.
                let end = End::GaveUp(refusal, Failure::status(Code::Unavailable));
                let failure = self.upstream_failure(end);
                let tier = &self.sc.tiers[level as usize];
                let at = agenda.now().saturating_add(nanos(tier.latency) / 2);
                let outcome = Outcome::Failed(failure);
                agenda.schedule(at, Event::Response { slot, id, outcome });
            }
        }
    }
}
