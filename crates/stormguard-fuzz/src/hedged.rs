//! Hedged calls driven by the input, as the client's hedged future drives them, and the
//! learned hedge delay fed hostile latencies.
//!
//! A script is a list of events on one or more calls, read byte by byte (any bytes are a
//! script: what is not an event is skipped):
//!
//! | event | what happens |
//! |---|---|
//! | `c` | a new call starts (the current one, if still going, is dropped by its caller) |
//! | `d<ms>` | the call's deadline, `ms` after its start (at its start only) |
//! | `k<value>;` | the call runs in a request whose `x-retry-budget` is `value` |
//! | `+<ms>` | time advances |
//! | `>` | time advances to the next hedge, if one is due later |
//! | `X` | time advances to the call's deadline |
//! | `!` | the channel cannot take another copy ([`CallRetry::stop_hedges`]) |
//! | `~` | the channel is not ready at the next step: a due hedge waits |
//! | `@[^][u][x]<status>[/<pushback>];` | a copy answers (`^`: the newest, else the oldest; `u`: never sent; `x`: `stormguard-unprocessed: 1`); `status` is a `grpc-status` value and `pushback` the `grpc-retry-pushback-ms` values (`,` between repeated headers), read by [`stormguard_core::wire`] |
//! | `T[u]` | the oldest copy's timer fires (`u`: it was never sent) |
//!
//! After every event the call takes one step of the client's poll: a passed deadline
//! cancels every copy; a due hedge is sent ([`CallRetry::start_hedge_at`]) unless the
//! channel is not ready; with no copy in flight and none to follow, the call gives up.
//! Every copy that ends, whichever way, feeds the learned delay its latency.

use std::collections::{BTreeSet, VecDeque};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use stormguard_core::Code;
use stormguard_core::wire::response_pushback;
use stormguard_core::{
    AttemptEnd, AttemptPlan, CallRetry, CallTimes, Failure, HedgeDecision, Refusal, RetryController,
};
use stormguard_core::{BudgetChoice, ClientConfig, Deadline, MethodScope, MethodTable, Unlimited};
use stormguard_core::{HedgeDelay, HedgingPolicy, LearnedDelay, MAX_ATTEMPTS_CAP};
use stormguard_core::{context::RequestScope, context::request_scope};
use stormguard_core::{wire::MAX_ALLOWANCE, wire::is_unprocessed, wire::parse_grpc_status};
use tokio::time::Instant;

/// The paths a hedged config is driven on (those of the targets' seeds, and others that
/// only a default or a whole-service entry reaches).
pub const PATHS: &[&str] = &[
    "/stormguard.demo.v1.Inventory/Reserve",
    "/stormguard.demo.v1.Inventory/Get",
    "/pkg.Svc/Get",
    "/pkg.Search/Find",
    "/other.Service/Call",
];

/// The scripts every accepted config's hedged methods run (the `hedge` target runs the
/// input's own script instead).
pub const SCRIPTS: &[&[u8]] = &[
    b">>>>>",
    b"@14;>@14;>@14;>@14;@14;",
    b"d50>@14/120;>@0;",
    b"d5+4@14/-1;+1@2;",
    b"k0;>@u14;@x13;T",
    b"~>+1!@14;c>>@0;c>@^14/0;@0;",
    b"+1000@14/2147483647;>>X",
];

/// What driving a config's hedged calls came to: the calls' ends, the refusals seen, the
/// most copies one call sent, the hedges granted.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct Summary {
    /// Hedged calls driven.
    pub calls: usize,
    /// How calls ended (`won`, `gave up: …`, `expired`, `dropped`).
    pub ends: BTreeSet<String>,
    /// Why hedges were refused.
    pub refusals: BTreeSet<Refusal>,
    /// The most copies one call sent.
    pub most_copies: u32,
    /// Hedges granted (copies after the first).
    pub granted: u64,
}

/// Drives every hedged method of `controller`, built from `config` (on [`PATHS`]), through
/// `script`, checking the hedging invariants after every decision. The config's budget
/// says which budget the controller has: each hedge a
/// [`RetryBudget`](stormguard_core::RetryBudget) grants lowers its balance by one, an A6
/// throttle's grant consumes nothing. `clock` is the time the first call starts; it is
/// moved on to the time the last one ended, so that calls one after the other see time go
/// forward only (a budget reads time as a monotonic clock).
pub fn drive_script(
    controller: &RetryController,
    config: &ClientConfig,
    script: &[u8],
    clock: &mut Instant,
    text: &str,
) -> Summary {
    let mut summary = Summary::default();
    let budget = &config.budget;
    for path in PATHS {
        let Some(policy) = config.methods.lookup_hedging(path) else {
            continue;
        };
        if config.methods.lookup(path).is_some() {
            panic!("{path} has both a retry and a hedging policy: {text}");
        }
        let policy: HedgingPolicy = (**policy).clone();
        for segment in split_calls(script) {
            let mut call = Call::options(segment);
            let run = |call: &mut Call<'_>, summary: &mut Summary, clock: &mut Instant| {
                *clock = call.run(controller, budget, &policy, path, *clock, summary, text);
            };
            match call.allowance.take() {
                Some(value) => {
                    let scope = RequestScope::new()
                        .with_allowance(MAX_ALLOWANCE)
                        .with_peer_allowance(value);
                    // The task-local scope, entered by polling once: the call never waits.
                    let fut = pin!(request_scope(scope, async {
                        run(&mut call, &mut summary, clock);
                    }));
                    let polled = fut.poll(&mut Context::from_waker(Waker::noop()));
                    assert!(polled.is_ready(), "a call that never waits is pending");
                }
                None => run(&mut call, &mut summary, clock),
            }
        }
    }
    summary
}

/// The script's calls: split at `c`.
fn split_calls(script: &[u8]) -> impl Iterator<Item = &[u8]> {
    script.split(|b| *b == b'c')
}

/// A copy in flight.
struct Copy {
    started: Instant,
}

/// One call's script, read from the front.
struct Call<'a> {
    events: &'a [u8],
    deadline: Option<Duration>,
    allowance: Option<&'a [u8]>,
}

/// Reads a decimal number from the front of `bytes`, saturating; `None` without digits.
fn number(bytes: &mut &[u8]) -> Option<u64> {
    let digits = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    let n = bytes[..digits].iter().fold(0u64, |n, b| {
        n.saturating_mul(10).saturating_add(u64::from(b - b'0'))
    });
    *bytes = &bytes[digits..];
    Some(n)
}

/// Takes bytes up to (not including) the next `;`, consuming the `;`.
fn until_semicolon<'a>(bytes: &mut &'a [u8]) -> &'a [u8] {
    let end = bytes.iter().position(|b| *b == b';').unwrap_or(bytes.len());
    let value = &bytes[..end];
    *bytes = bytes.get(end + 1..).unwrap_or(&[]);
    value
}

impl<'a> Call<'a> {
    /// The call's options (`d`, `k`) at the front of its segment.
    fn options(mut events: &'a [u8]) -> Self {
        let mut call = Call {
            events,
            deadline: None,
            allowance: None,
        };
        loop {
            match events.split_first() {
                Some((b'd', rest)) => {
                    events = rest;
                    call.deadline = number(&mut events).map(Duration::from_millis);
                }
                Some((b'k', rest)) => {
                    events = rest;
                    call.allowance = Some(until_semicolon(&mut events));
                }
                _ => break,
            }
        }
        call.events = events;
        call
    }

    /// Runs the call from `start`; when it ended.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        controller: &RetryController,
        budget: &BudgetChoice,
        policy: &HedgingPolicy,
        path: &str,
        start: Instant,
        summary: &mut Summary,
        text: &str,
    ) -> Instant {
        // The script's deadline is the inbound call's; the method's own timeout, if
        // shorter, caps it as it does in the layer. The call says which one it has.
        let times = CallTimes {
            inbound: self.deadline.and_then(|d| start.checked_add(d)),
            ..CallTimes::default()
        };
        let Ok(call) = controller.begin_call_at(path, &times, start) else {
            return start;
        };
        let deadline = call.deadline();
        if let Some(inbound) = times.inbound {
            assert!(
                deadline.is_some_and(|d| d <= inbound),
                "{deadline:?}: not the caller's deadline or earlier: {text}"
            );
        }
        let mut run = Run {
            call,
            controller,
            stormguard_budget: matches!(budget, BudgetChoice::Stormguard(_)),
            // A6: above 5 counts as 5.
            max: policy.max_attempts.min(MAX_ATTEMPTS_CAP),
            copies: VecDeque::new(),
            now: start,
            deadline,
            ready: true,
            granted: 0,
            text,
        };
        assert!(
            run.call.is_hedged(),
            "{path} looks hedged but is not: {text}"
        );
        summary.calls += 1;
        let plan = run.call.first_attempt_at(start);
        assert_eq!(plan.previous_attempts, 0, "the first copy: {text}");
        assert_eq!(run.call.hedges_sent(), 1, "{text}");
        run.check_plan(&plan);
        run.copies.push_back(Copy { started: start });
        run.check_schedule();
        let mut events = self.events;
        let end = loop {
            if let Some(end) = run.step(summary) {
                break end;
            }
            let Some((&event, rest)) = events.split_first() else {
                break "dropped".to_owned();
            };
            events = rest;
            if let Some(end) = run.event(event, &mut events) {
                break end;
            }
        };
        // The call's end: the copies left are cut off and measured.
        run.cancel_all();
        summary.most_copies = summary.most_copies.max(run.call.hedges_sent());
        summary.granted += run.granted;
        summary.ends.insert(end);
        if let Some(why) = run.call.hedges_stopped() {
            summary.refusals.insert(why);
        }
        run.now
    }
}

/// A call in progress.
struct Run<'a> {
    call: CallRetry,
    controller: &'a RetryController,
    stormguard_budget: bool,
    max: u32,
    copies: VecDeque<Copy>,
    now: Instant,
    deadline: Option<Instant>,
    ready: bool,
    granted: u64,
    text: &'a str,
}

impl Run<'_> {
    /// The client's poll, once: deadline, a due hedge, the end when nothing is left.
    fn step(&mut self, summary: &mut Summary) -> Option<String> {
        let text = self.text;
        if self.deadline.is_some_and(|d| self.now >= d) {
            return Some("expired".to_owned());
        }
        let mut readying = false;
        // Hedges due at once (a zero delay) all go in one poll, as the client's timer fires
        // again at once; each grant schedules the next, so this ends by the attempt limit.
        while self.call.next_hedge_at().is_some_and(|at| at <= self.now) {
            if !self.ready {
                readying = true;
                break;
            }
            if let Err(why) = self.send_hedge() {
                summary.refusals.insert(why);
            }
        }
        self.ready = true;
        if self.copies.is_empty() && !readying && self.call.next_hedge_at().is_none() {
            let why = self.call.hedges_stopped().unwrap_or(Refusal::Attempts);
            assert_ne!(why, Refusal::NotRetryable, "{text}");
            return Some(format!("gave up: {why}"));
        }
        None
    }

    /// One event of the script; the call's end, if it ended.
    fn event(&mut self, event: u8, events: &mut &[u8]) -> Option<String> {
        match event {
            b'+' => {
                let ms = number(events).unwrap_or(1);
                if let Some(t) = self.now.checked_add(Duration::from_millis(ms)) {
                    self.now = t;
                }
            }
            b'>' => {
                if let Some(at) = self.call.next_hedge_at() {
                    self.now = self.now.max(at);
                }
            }
            b'X' => {
                if let Some(d) = self.deadline {
                    self.now = self.now.max(d);
                }
            }
            b'!' => {
                let sent = self.call.hedges_sent();
                self.call.stop_hedges(Refusal::Attempts);
                assert_eq!(self.call.next_hedge_at(), None, "{}", self.text);
                assert!(self.call.hedges_stopped().is_some(), "{}", self.text);
                assert_eq!(self.call.hedges_sent(), sent, "{}", self.text);
            }
            b'~' => self.ready = false,
            b'@' => {
                let newest = take(events, b'^');
                let unsent = take(events, b'u');
                let unprocessed = take(events, b'x');
                let answer = until_semicolon(events);
                let (status, pushback) = match answer.iter().position(|b| *b == b'/') {
                    Some(i) => (&answer[..i], Some(&answer[i + 1..])),
                    None => (answer, None),
                };
                let code = parse_grpc_status(status);
                // The answer's `grpc-retry-pushback-ms` values, with no status details.
                let pushback = pushback
                    .and_then(|v| response_pushback(v.split(|b| *b == b','), std::iter::empty()));
                let unprocessed = unprocessed && is_unprocessed([b"1".as_slice()]);
                let failure = Failure {
                    unsent,
                    unprocessed,
                    ..Failure {
                        pushback,
                        ..Failure::status(code)
                    }
                };
                return self.answer(newest, (code != Code::Ok).then_some(failure));
            }
            b'T' => {
                let unsent = take(events, b'u');
                let end = AttemptEnd::TimedOut {
                    replayable: true,
                    unsent,
                };
                return self.end(false, end);
            }
            _ => {}
        }
        None
    }

    /// A copy answered: `OK` (`failure` is `None`) wins, anything else is decided by
    /// [`CallRetry::on_hedge_end_at`].
    fn answer(&mut self, newest: bool, failure: Option<Failure>) -> Option<String> {
        match failure {
            Some(f) => self.end(newest, AttemptEnd::Failed(f)),
            None => {
                let copy = if newest {
                    self.copies.pop_back()
                } else {
                    self.copies.pop_front()
                };
                let copy = copy?;
                self.record(copy.started);
                self.call.on_success_at(self.now);
                Some("won".to_owned())
            }
        }
    }

    /// A copy ended without an `OK`.
    fn end(&mut self, newest: bool, end: AttemptEnd) -> Option<String> {
        let text = self.text;
        let copy = if newest {
            self.copies.pop_back()
        } else {
            self.copies.pop_front()
        };
        let copy = copy?;
        self.record(copy.started);
        let sent = self.call.hedges_sent();
        let decision = self.call.on_hedge_end_at(end, self.copies.len(), self.now);
        assert_eq!(
            self.call.hedges_sent(),
            sent,
            "an answer sends nothing: {text}"
        );
        match decision {
            HedgeDecision::Wait => {
                assert!(
                    !self.copies.is_empty() || self.call.next_hedge_at().is_some(),
                    "waits with nothing in flight and nothing to follow: {text}"
                );
                self.check_schedule();
                None
            }
            HedgeDecision::GiveUp(why) => Some(format!("gave up: {why}")),
            HedgeDecision::Expired => {
                assert!(
                    self.deadline.is_some_and(|d| self.now >= d),
                    "expired before the deadline: {text}"
                );
                Some("expired".to_owned())
            }
        }
    }

    /// Sends the hedge that is due, checking what [`CallRetry::start_hedge_at`] promises.
    fn send_hedge(&mut self) -> Result<(), Refusal> {
        let text = self.text;
        let now = self.now;
        let sent = self.call.hedges_sent();
        let stopped = self.call.hedges_stopped();
        let budget = self.controller.budget();
        let before = budget.balance_at(now);
        let result = self.call.start_hedge_at(now);
        let after = budget.balance_at(now);
        match result {
            Ok(plan) => {
                assert_eq!(stopped, None, "a copy after the hedges stopped: {text}");
                assert_eq!(plan.previous_attempts, sent, "previous attempts: {text}");
                assert_eq!(self.call.hedges_sent(), sent + 1, "{text}");
                assert!(
                    self.call.hedges_sent() <= self.max,
                    "{} copies, at most {}: {text}",
                    self.call.hedges_sent(),
                    self.max
                );
                if self.stormguard_budget {
                    // Balances are whole micro-retries: the difference is one retry, to
                    // within the float's rounding of a large balance.
                    let slack = 1e-9 + before.abs() * 4.0 * f64::EPSILON;
                    assert!(
                        (before - after - 1.0).abs() <= slack,
                        "a granted hedge took {before} -> {after}: {text}"
                    );
                } else {
                    assert_eq!(before, after, "an A6 throttle consumes nothing: {text}");
                }
                self.check_plan(&plan);
                self.copies.push_back(Copy { started: now });
                self.check_schedule();
                self.granted += 1;
                Ok(())
            }
            Err(why) => {
                assert_eq!(self.call.next_hedge_at(), None, "refused {why}: {text}");
                assert!(
                    self.call.hedges_stopped().is_some(),
                    "refused {why}: {text}"
                );
                assert_eq!(self.call.hedges_sent(), sent, "refused {why}: {text}");
                assert_eq!(before, after, "a refused hedge ({why}) took budget: {text}");
                Err(why)
            }
        }
    }

    /// A plan fits the call: no attempt of a hedged call outlives the caller's deadline.
    fn check_plan(&self, plan: &AttemptPlan) {
        let text = self.text;
        if let Some(d) = self.deadline {
            assert!(plan.fire_at.is_some_and(|at| at <= d), "{plan:?}: {text}");
            assert!(
                plan.grpc_timeout
                    .is_none_or(|t| t <= d.saturating_duration_since(self.now)),
                "{plan:?}: {text}"
            );
        }
    }

    /// The next hedge, when one is scheduled: not in the past, and allowed.
    fn check_schedule(&self) {
        let text = self.text;
        if let Some(at) = self.call.next_hedge_at() {
            assert!(at >= self.now, "a hedge scheduled in the past: {text}");
            assert_eq!(self.call.hedges_stopped(), None, "{text}");
            assert!(self.call.hedges_sent() < self.max, "{text}");
        }
    }

    /// A copy that started at `started` ended now: the learned delay hears of it.
    fn record(&self, started: Instant) {
        self.call
            .record_hedge_latency_at(self.now.saturating_duration_since(started), self.now);
    }

    /// Every copy still in flight is cut off now.
    fn cancel_all(&mut self) {
        while let Some(copy) = self.copies.pop_front() {
            self.record(copy.started);
        }
    }
}

/// Consumes `byte` at the front of `bytes`; whether it was there.
fn take(bytes: &mut &[u8], byte: u8) -> bool {
    match bytes.split_first() {
        Some((b, rest)) if *b == byte => {
            *bytes = rest;
            true
        }
        _ => false,
    }
}

/// What the `hedge-delay` target made of one input: whether its estimator config was
/// valid, and the delays it read.
///
/// The method's learned delay is driven as the client drives it: every copy's latency
/// through [`CallRetry::record_hedge_latency_at`], and the delay read where the client
/// reads it, as the time of the first hedge a new call schedules
/// ([`CallRetry::next_hedge_at`] after [`CallRetry::first_attempt_at`]).
pub fn learned_delay(input: &[u8]) -> (bool, BTreeSet<u8>) {
    let mut r = Reader(input);
    let learned = LearnedDelay {
        percentile: f64::from(r.u16()) / f64::from(u16::MAX),
        floor: r.duration(),
        ceiling: r.duration(),
        min_samples: match r.u8() % 6 {
            0 => 0,
            1 => 1,
            2 => 16,
            3 => u32::MAX,
            4 => u32::from(r.u16()),
            _ => u32::from(r.u8()),
        },
        window: r.duration(),
    };
    let policy = HedgingPolicy {
        delay: HedgeDelay::Learned(learned.clone()),
        ..HedgingPolicy::default()
    };
    let mut methods = MethodTable::none();
    methods.set_hedging(MethodScope::Default, Some(policy));
    // A learned delay out of range is refused by the controller, as by a config file.
    let Ok(controller) = RetryController::new(methods, Arc::new(Unlimited), None, 7) else {
        return (false, BTreeSet::new());
    };
    let begin = |now| match controller.begin_call_at(PATHS[0], &CallTimes::default(), now) {
        Ok(call) => call,
        Err(why) => panic!("a controller without a breaker refused a call: {why}"),
    };
    let start = Instant::now();
    let mut now = start;
    // The copies' latencies are recorded on one call: the estimator is the method's.
    let recorder = begin(now);
    let mut recorded: u64 = 0;
    let mut seen = BTreeSet::new();
    // The most samples one input records (a count of 2^14 per event at most).
    const MAX_RECORDS: u64 = 50_000;
    while !r.0.is_empty() {
        let op = r.u8();
        match op % 4 {
            0 => {
                let elapsed = r.duration();
                let count = (1u64 << (op >> 4).min(14)).min(MAX_RECORDS - recorded);
                for _ in 0..count {
                    recorder.record_hedge_latency_at(elapsed, now);
                }
                recorded += count;
            }
            // The clock moves on by hostile amounts, up to `MAX_CLOCK` past the start: a
            // call started later could not place its deadlines on the clock.
            1 => {
                if let Some(t) = now.checked_add(r.duration())
                    && t.saturating_duration_since(start) <= MAX_CLOCK
                {
                    now = t;
                }
            }
            // A clock that goes back (a sample recorded late, by another thread).
            2 => {
                if let Some(t) = now.checked_sub(r.duration()) {
                    now = t;
                }
            }
            _ => {}
        }
        // The first hedge of a call started now is due the learned delay later, or not at
        // all while the delay is unknown. A delay past the clock's range is placed as a
        // deadline is: at the furthest a deadline goes (`Deadline::after_at` of
        // `Duration::MAX`).
        let mut call = begin(now);
        call.first_attempt_at(now);
        let furthest = Deadline::after_at(now, Duration::MAX).instant();
        let within = |d: Duration| d >= learned.floor && d <= learned.ceiling;
        match call.next_hedge_at() {
            Some(at) => {
                let d = at.saturating_duration_since(now);
                let past_the_clock = at == furthest && now.checked_add(learned.ceiling).is_none();
                assert!(
                    within(d) || past_the_clock,
                    "{d:?} outside [{:?}, {:?}]",
                    learned.floor,
                    learned.ceiling
                );
                assert!(
                    recorded >= u64::from(learned.min_samples.max(1)),
                    "a delay after {recorded} samples, {} needed",
                    learned.min_samples
                );
                seen.insert(match within(d) {
                    true => u8::from(d == learned.floor) + 2 * u8::from(d == learned.ceiling),
                    false => 5,
                });
            }
            None => {
                seen.insert(4);
            }
        }
        if recorded >= MAX_RECORDS {
            break;
        }
    }
    (true, seen)
}

/// How far the `hedge-delay` target moves its clock from where it started: about 35 000
/// years, where a deadline a century later is still on the clock.
const MAX_CLOCK: Duration = Duration::from_secs(1 << 40);

/// Reads numbers from the front of an input (zeros once it runs out).
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// A duration, often a hostile one.
    fn duration(&mut self) -> Duration {
        match self.u8() % 8 {
            0 => Duration::ZERO,
            1 => Duration::from_nanos(1),
            2 => Duration::MAX,
            3 => Duration::from_millis(u64::from(self.u16())),
            4 => Duration::from_micros(u64::from(self.u32())),
            5 => Duration::from_secs(u64::from(self.u32()) << 32 | u64::from(self.u32())),
            6 => Duration::from_millis(1),
            _ => Duration::from_secs(3600 * u64::from(self.u16())),
        }
    }
}
