//! A deterministic simulator: the real budget state and controller (the same methods the
//! pacer calls with the budget's row) driven on a virtual clock against models of the
//! limiters targets run, by 1 to 3 processes, with no database. Each cell drains 600
//! records and checks the drain time against the ideal (the same limiter fed by an oracle
//! that knows it) and the share of calls refused with 429.

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, VecDeque},
};

use chrono::{DateTime, Utc};

use super::{
    budget::{BudgetState, SliceRequest},
    controller::{PARAMS, Params},
    limits::Limit,
};

/// Microseconds.
type Us = i64;
const SEC: Us = 1_000_000;

/// A limiter model: whether a call arriving at `t` is accepted, else the wait its 429 names.
#[derive(Clone, Debug)]
enum Model {
    /// `quota` per aligned window; Retry-After: the window's end, rounded up to seconds.
    Fixed { quota: f64, window: Us },
    /// `quota` in any window; Retry-After: until the oldest leaves, rounded up.
    Sliding {
        quota: f64,
        window: Us,
        log: VecDeque<Us>,
    },
    /// nginx `limit_req` with no burst: counts in milliseconds; Retry-After: 1.
    Leaky {
        rate: f64,
        excess: f64,
        last: Option<Us>,
    },
    /// A token bucket of `burst` refilled at `rate`.
    Token {
        rate: f64,
        burst: f64,
        tokens: f64,
        last: Us,
    },
    /// Both at once: a burst window and a steady one.
    Both(Box<Model>, Box<Model>),
}

fn ceil_secs(us: Us) -> Us {
    ((us + SEC - 1) / SEC).max(1) * SEC
}

impl Model {
    fn fixed(quota: f64, secs: i64) -> Self {
        Model::Fixed {
            quota,
            window: secs * SEC,
        }
    }
    fn sliding(quota: f64, secs: i64) -> Self {
        Model::Sliding {
            quota,
            window: secs * SEC,
            log: VecDeque::new(),
        }
    }
    fn leaky(rate: f64) -> Self {
        Model::Leaky {
            rate,
            excess: 0.0,
            last: None,
        }
    }
    fn token(rate: f64, burst: f64) -> Self {
        Model::Token {
            rate,
            burst,
            tokens: burst,
            last: 0,
        }
    }

    /// Whether a call at `t` fits with the limit scaled by `scale` (no state change).
    fn check(&mut self, t: Us, scale: f64) -> Result<(), Us> {
        match self {
            Model::Fixed { quota, window } => {
                // Counted by `take`: the count of this window lives in the log of calls.
                let _ = (quota, window);
                unreachable!("fixed windows are checked with their count")
            }
            Model::Sliding { quota, window, log } => {
                while log.front().is_some_and(|&a| a <= t - *window) {
                    log.pop_front();
                }
                if (log.len() as f64) < (*quota * scale).floor() {
                    Ok(())
                } else {
                    Err(ceil_secs(log.front().copied().unwrap_or(t) + *window - t))
                }
            }
            Model::Leaky { rate, excess, last } => {
                // nginx: excess − rate × ms + 1 (in requests) must not pass the burst (0).
                let ms = last.map_or(i64::MAX / 4, |l| (t - l) / 1000);
                let e = *excess - *rate * scale * ms as f64 / 1000.0 + 1.0;
                if e <= 1e-9 { Ok(()) } else { Err(SEC) }
            }
            Model::Token {
                rate,
                burst,
                tokens,
                last,
            } => {
                let now = (*tokens + (t - *last) as f64 / 1e6 * *rate * scale).min(*burst * scale);
                if now >= 1.0 {
                    Ok(())
                } else {
                    Err(ceil_secs(((1.0 - now) / (*rate * scale) * 1e6) as Us))
                }
            }
            Model::Both(a, b) => match (a.check(t, scale), b.check(t, scale)) {
                (Ok(()), Ok(())) => Ok(()),
                (x, y) => Err(x.err().unwrap_or(0).max(y.err().unwrap_or(0))),
            },
        }
    }

    /// Counts a call accepted at `t` with the limit scaled by `scale`.
    fn take(&mut self, t: Us, scale: f64) {
        match self {
            Model::Fixed { .. } => {}
            Model::Sliding { log, .. } => log.push_back(t),
            Model::Leaky { rate, excess, last } => {
                let ms = last.map_or(i64::MAX / 4, |l| (t - l) / 1000);
                *excess = (*excess - *rate * scale * ms as f64 / 1000.0 + 1.0).max(0.0);
                *last = Some(t);
            }
            Model::Token {
                rate,
                burst,
                tokens,
                last,
            } => {
                *tokens =
                    (*tokens + (t - *last) as f64 / 1e6 * *rate * scale).min(*burst * scale) - 1.0;
                *last = t;
            }
            Model::Both(a, b) => {
                a.take(t, scale);
                b.take(t, scale);
            }
        }
    }
}

/// A fixed window's count kept beside its model.
#[derive(Clone, Debug)]
struct Limiter {
    model: Model,
    fixed: Vec<(Us, f64, Us, u32)>, // (window, quota, current window index, count)
}

impl Limiter {
    fn new(model: Model) -> Self {
        let mut fixed = Vec::new();
        let model = Self::split(model, &mut fixed);
        Limiter { model, fixed }
    }

    /// Takes fixed windows out of the model (they count by window index).
    fn split(model: Model, fixed: &mut Vec<(Us, f64, Us, u32)>) -> Model {
        match model {
            Model::Fixed { quota, window } => {
                fixed.push((window, quota, -1, 0));
                Model::token(1e12, 1e12) // always room
            }
            Model::Both(a, b) => {
                let a = Self::split(*a, fixed);
                let b = Self::split(*b, fixed);
                Model::Both(Box::new(a), Box::new(b))
            }
            m => m,
        }
    }

    fn arrive(&mut self, t: Us, scale: f64) -> Result<(), Us> {
        let mut wait: Option<Us> = None;
        for (window, quota, idx, count) in &mut self.fixed {
            let i = t / *window;
            if i != *idx {
                *idx = i;
                *count = 0;
            }
            if f64::from(*count) >= (*quota * scale).floor() {
                let w = ceil_secs((i + 1) * *window - t);
                wait = Some(wait.map_or(w, |x| x.max(w)));
            }
        }
        if let Err(w) = self.model.check(t, scale) {
            wait = Some(wait.map_or(w, |x| x.max(w)));
        }
        if let Some(w) = wait {
            return Err(w);
        }
        for (_, _, _, count) in &mut self.fixed {
            *count += 1;
        }
        self.model.take(t, scale);
        Ok(())
    }
}

/// How the real limit moves: its scale at time `t` (from the drain's start).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Schedule {
    Constant,
    /// Halved from 20 s on.
    Drop,
    /// Halved from 20 s to 30 s, then back.
    Dip,
}

impl Schedule {
    fn scale(self, t: Us) -> f64 {
        match self {
            Schedule::Constant => 1.0,
            Schedule::Drop if t >= 20 * SEC => 0.5,
            Schedule::Dip if (20 * SEC..30 * SEC).contains(&t) => 0.5,
            _ => 1.0,
        }
    }
}

/// A cell of the matrix.
#[derive(Clone, Debug)]
struct Cell {
    name: &'static str,
    model: Model,
    /// The limits the connection declares.
    declared: Vec<Limit>,
    schedule: Schedule,
    processes: usize,
    /// Latency one way, and its jitter (uniform, added), microseconds.
    latency: (Us, Us),
    /// The records to drain.
    records: u64,
}

/// What a cell measured.
#[derive(Debug)]
struct Outcome {
    drain: f64,
    ideal: f64,
    calls: u64,
    refused: u64,
    /// Calls accepted in the two seconds before 40 s (the dip's return plus 10 s).
    accepted_38_40: u64,
}

impl Outcome {
    fn ratio(&self) -> f64 {
        self.drain / self.ideal
    }
    /// Drain against the ideal, and the 429s, as a cell's line shows them.
    fn figures(&self) -> String {
        format!(
            "drain {:.1}s ideal {:.1}s = {:.3}×, 429s {}/{} = {:.2}%",
            self.drain,
            self.ideal,
            self.ratio(),
            self.refused,
            self.calls,
            self.share_429() * 100.0
        )
    }

    fn share_429(&self) -> f64 {
        self.refused as f64 / self.calls as f64
    }
}

const RECORDS: u64 = 600;

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// A process asks for a slice.
    Lease(usize),
    /// A process's slot (generation, paced rate ×1e6) comes.
    Send(usize, u64, u64),
    /// A call sent at the time given reaches the target.
    Arrive(usize, u64, Us),
    /// Its answer reaches the process: accepted, or the 429's wait.
    Answer(usize, u64, Us, Option<Us>),
}

struct Process {
    generation: u64,
    /// Slots leased and not yet come.
    slots: u64,
    /// A lease is scheduled.
    leasing: bool,
}

fn at(t: Us) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000, 0).unwrap() + chrono::Duration::microseconds(t)
}

/// A small deterministic generator (xorshift).
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: Us) -> Us {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        if n <= 0 { 0 } else { (self.0 % n as u64) as Us }
    }
}

/// The ideal drain: an oracle calling whenever the limiter has room, checked each ms.
fn ideal(cell: &Cell) -> f64 {
    let mut lim = Limiter::new(cell.model.clone());
    let (mut t, mut done) = (0, 0);
    while done < cell.records {
        if lim.arrive(t, cell.schedule.scale(t)).is_ok() {
            done += 1;
        }
        t += 1000;
    }
    (t - 1000) as f64 / 1e6
}

/// One cell's simulation: the target's limiter, the budget's shared state, the processes,
/// and the events still to come, in time order.
struct Sim<'a> {
    cell: &'a Cell,
    params: &'a Params,
    lim: Limiter,
    rng: Rng,
    st: BudgetState,
    procs: Vec<Process>,
    q: BinaryHeap<Reverse<(Us, u64, Ev)>>,
    /// Orders events of one instant by when they were pushed.
    seq: u64,
    delivered: u64,
    in_flight: u64,
    calls: u64,
    refused: u64,
    /// The end of the latest 429's block.
    block_end: Us,
    last_accept: Us,
    accepted_38_40: u64,
}

impl<'a> Sim<'a> {
    /// The cell's processes, each asking for its first slice a few ms after the previous.
    fn new(cell: &'a Cell, params: &'a Params) -> Self {
        let procs = (0..cell.processes)
            .map(|_| Process {
                generation: 0,
                slots: 0,
                leasing: true,
            })
            .collect();
        let mut sim = Sim {
            cell,
            params,
            lim: Limiter::new(cell.model.clone()),
            rng: Rng(0x9e37_79b9_7f4a_7c15),
            st: BudgetState::default(),
            procs,
            q: BinaryHeap::new(),
            seq: 0,
            delivered: 0,
            in_flight: 0,
            calls: 0,
            refused: 0,
            block_end: 0,
            last_accept: 0,
            accepted_38_40: 0,
        };
        for p in 0..cell.processes {
            sim.push(p as Us * 3_000, Ev::Lease(p));
        }
        sim
    }

    fn push(&mut self, t: Us, e: Ev) {
        self.seq += 1;
        self.q.push(Reverse((t, self.seq, e)));
    }

    /// One way's latency: the cell's, plus its jitter.
    fn latency(&mut self) -> Us {
        self.cell.latency.0 + self.rng.below(self.cell.latency.1)
    }

    /// Whether every record is delivered or on its way.
    fn all_sent(&self) -> bool {
        self.delivered + self.in_flight >= self.cell.records
    }

    /// Process `p` leases a slice at `t` (after the block, if one holds) and schedules its
    /// slots and its next lease.
    fn lease(&mut self, p: usize, t: Us) {
        self.procs[p].leasing = false;
        if self.all_sent() {
            return;
        }
        let now = t.max(self.block_end);
        if now > t {
            self.procs[p].leasing = true;
            self.push(now, Ev::Lease(p));
            return;
        }
        let ask = SliceRequest {
            limits: &self.cell.declared,
            reserve: 0,
            n: 50,
            horizon: chrono::Duration::seconds(1),
        };
        let slice = self.st.lease(self.params, at(now), &ask);
        let generation = self.procs[p].generation;
        for s in &slice.slots {
            let s = (*s - at(0)).num_microseconds().unwrap();
            self.push(s, Ev::Send(p, generation, (slice.rate * 1e6) as u64));
        }
        self.procs[p].slots += slice.slots.len() as u64;
        let next = match (slice.slots.last(), slice.spent_until) {
            (Some(last), _) => (*last - at(0)).num_microseconds().unwrap() - 100_000,
            (None, Some(until)) => (until - at(0)).num_microseconds().unwrap(),
            (None, None) => now + 1000,
        };
        self.procs[p].leasing = true;
        self.push(next.max(now + 1), Ev::Lease(p));
    }

    /// Process `p`'s slot comes at `t`: it sends a call, unless a 429 since made the slot
    /// stale, a block holds, or every record is delivered or on its way.
    fn send(&mut self, p: usize, t: Us, generation: u64, rate: u64) {
        self.procs[p].slots -= 1;
        if generation != self.procs[p].generation || t < self.block_end || self.all_sent() {
            return;
        }
        self.in_flight += 1;
        self.calls += 1;
        let arrive = t + self.latency();
        self.push(arrive, Ev::Arrive(p, rate, t));
    }

    /// A call sent at `sent` reaches the target at `t`; its answer heads back.
    fn arrive(&mut self, p: usize, t: Us, rate: u64, sent: Us) {
        let answer = self.lim.arrive(t, self.cell.schedule.scale(t));
        if answer.is_ok() {
            self.last_accept = t;
            if (38 * SEC..40 * SEC).contains(&t) {
                self.accepted_38_40 += 1;
            }
        }
        let back = t + self.latency();
        self.push(back, Ev::Answer(p, rate, sent, answer.err()));
    }

    /// Process `p` hears its answer at `t`: a delivery, or a 429 that blocks the budget;
    /// then it asks for a slice again unless it already has.
    fn answer(&mut self, p: usize, t: Us, rate: u64, sent: Us, wait: Option<Us>) {
        self.in_flight -= 1;
        match wait {
            None => {
                self.delivered += 1;
            }
            Some(wait) => self.hear_429(p, t, rate, sent, wait),
        }
        if self.delivered >= self.cell.records {
            return;
        }
        if !self.procs[p].leasing {
            self.procs[p].leasing = true;
            self.push(t.max(self.block_end), Ev::Lease(p));
        }
    }

    /// Process `p` hears at `t` a 429 naming `wait` for a call sent at `sent`: the budget
    /// learns from it and holds until the block ends; the process's slots go stale.
    fn hear_429(&mut self, p: usize, t: Us, rate: u64, sent: Us, wait: Us) {
        self.refused += 1;
        let end = t + wait;
        let cut = self
            .st
            .refused(self.params, rate as f64 / 1e6, at(sent), at(t), at(end));
        if cut {
            self.trace_cut(p, t, rate);
        }
        self.st.hold_until(at(end));
        self.block_end = self.block_end.max(end);
        self.procs[p].generation += 1;
    }

    /// With `SIM_TRACE` set to the start of the cell's name: prints a cut of the learned rate.
    fn trace_cut(&self, p: usize, t: Us, rate: u64) {
        if std::env::var("SIM_TRACE").is_ok_and(|c| self.cell.name.starts_with(&c)) {
            eprintln!(
                "{:7.2}s 429 p{p} paced {:.2} -> {} base {:.2} ceiling {:.2} held {:?}",
                t as f64 / 1e6,
                rate as f64 / 1e6,
                self.st.learned.by,
                self.st.learned.base,
                self.st.learned.ceiling,
                self.st.learned.held.map(|h| h.0)
            );
        }
    }

    fn outcome(&self) -> Outcome {
        Outcome {
            drain: self.last_accept as f64 / 1e6,
            ideal: ideal(self.cell),
            calls: self.calls,
            refused: self.refused,
            accepted_38_40: self.accepted_38_40,
        }
    }
}

fn run(cell: &Cell, params: &Params) -> Outcome {
    let mut sim = Sim::new(cell, params);
    while let Some(Reverse((t, _, ev))) = sim.q.pop() {
        if t > 3_600 * SEC {
            panic!("{}: no drain within an hour", cell.name);
        }
        match ev {
            Ev::Lease(p) => sim.lease(p, t),
            Ev::Send(p, generation, rate) => sim.send(p, t, generation, rate),
            Ev::Arrive(p, rate, sent) => sim.arrive(p, t, rate, sent),
            Ev::Answer(p, rate, sent, wait) => {
                sim.answer(p, t, rate, sent, wait);
                if sim.delivered >= cell.records {
                    break;
                }
            }
        }
    }
    sim.outcome()
}

/// A limiter: its name, model, the limits declared for it, and its latency.
type Target = (&'static str, Model, Vec<Limit>, (Us, Us));

/// The limiters at a real limit of 10/s.
fn models() -> Vec<Target> {
    let loopback = (1_000, 2_000);
    vec![
        (
            "fixed 10/s",
            Model::fixed(10.0, 1),
            vec![Limit::new(10, 1)],
            loopback,
        ),
        (
            "sliding 10/s",
            Model::sliding(10.0, 1),
            vec![Limit::new(10, 1)],
            loopback,
        ),
        (
            "leaky 10/s no burst (nginx)",
            Model::leaky(10.0),
            vec![Limit::new(10, 1)],
            loopback,
        ),
        (
            "token 10/s burst 10",
            Model::token(10.0, 10.0),
            vec![Limit::new(10, 1)],
            loopback,
        ),
        (
            // nginx `limit_req burst=5 nodelay`: five above the rate pass at once.
            "token 10/s burst 6 (nginx burst=5)",
            Model::token(10.0, 6.0),
            vec![Limit::new(10, 1)],
            loopback,
        ),
        (
            "sliding 10/s, 40±20 ms",
            Model::sliding(10.0, 1),
            vec![Limit::new(10, 1)],
            (30_000, 20_000),
        ),
        (
            "fixed 10/s and 300/min",
            Model::Both(
                Box::new(Model::fixed(10.0, 1)),
                Box::new(Model::fixed(300.0, 60)),
            ),
            vec![Limit::new(10, 1), Limit::new(300, 60)],
            loopback,
        ),
    ]
}

fn scaled(limits: &[Limit], ratio: f64) -> Vec<Limit> {
    limits
        .iter()
        .map(|l| Limit {
            quota: (f64::from(l.quota) * ratio).round() as u32,
            window: l.window,
        })
        .collect()
}

/// What a cell must show: drain ÷ ideal, 429 share, calls accepted in 38–40 s.
struct Bounds {
    ratio: f64,
    share: f64,
    accepted_38_40: u64,
}

impl Bounds {
    /// The goals: declared = real 1.05× and 0.5%; declared above (and a limit that
    /// drops) 1.15× and 2%; two windows declared no 429; after a dip, back at 90% of the
    /// limit within 10 s of its return (18 of 20 calls in 38–40 s).
    fn goal(declared: &[Limit], schedule: Schedule, ratio: f64) -> Self {
        let (ratio, share) = match (schedule, ratio) {
            _ if declared.len() > 1 && ratio == 1.0 => (1.05, 0.0),
            (Schedule::Constant, 1.0) => (1.05, 0.005),
            (Schedule::Dip, _) => (f64::MAX, 1.0),
            _ => (1.15, 0.02),
        };
        let accepted_38_40 = if schedule == Schedule::Dip { 18 } else { 0 };
        Bounds {
            ratio,
            share,
            accepted_38_40,
        }
    }

    fn holds(&self, o: &Outcome) -> bool {
        o.ratio() <= self.ratio
            && o.share_429() <= self.share
            && o.accepted_38_40 >= self.accepted_38_40
    }
}

/// The parameters a matrix runs with: [`PARAMS`], or changed by `SIM_PARAMS`
/// (`approach=2,deep_decrease=0.35`: any of [`Params`]' fields), to fit them.
fn params() -> Params {
    let mut p = PARAMS;
    let Ok(changes) = std::env::var("SIM_PARAMS") else {
        return p;
    };
    for change in changes.split(',').filter(|c| !c.trim().is_empty()) {
        let (name, value) = change.split_once('=').unwrap_or((change, ""));
        let value: f64 = value
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("SIM_PARAMS: '{change}' is not name=number"));
        let field = match name.trim() {
            "decrease" => &mut p.decrease,
            "deep_decrease" => &mut p.deep_decrease,
            "approach" => &mut p.approach,
            "probe" => &mut p.probe,
            "hold" => &mut p.hold,
            "floor" => &mut p.floor,
            "min_sample" => {
                p.min_sample = value as u64;
                continue;
            }
            other => panic!("SIM_PARAMS: no parameter '{other}'"),
        };
        *field = value;
    }
    p
}

/// Runs the matrix for `ratios` and schedules; returns each cell's line, the failures and
/// the 429s of all cells.
fn matrix(ratios: &[f64], schedules: &[Schedule]) -> (Vec<String>, Vec<String>, u64) {
    let params = params();
    let (mut lines, mut failures, mut refused) = (Vec::new(), Vec::new(), 0);
    for (name, model, declared, latency) in models() {
        for &schedule in schedules {
            for &ratio in ratios {
                if schedule != Schedule::Constant && (ratio != 1.0 || declared.len() > 1) {
                    continue;
                }
                for processes in 1..=3 {
                    let cell = Cell {
                        name,
                        model: model.clone(),
                        declared: scaled(&declared, ratio),
                        schedule,
                        processes,
                        latency,
                        records: RECORDS,
                    };
                    let o = run(&cell, &params);
                    refused += o.refused;
                    let line = format!(
                        "{name:32} {schedule:?} ×{ratio:<4} {processes}p: {}, 38–40 s {}",
                        o.figures(),
                        o.accepted_38_40
                    );
                    if !Bounds::goal(&declared, schedule, ratio).holds(&o) {
                        failures.push(line.clone());
                    }
                    lines.push(line);
                }
            }
        }
    }
    (lines, failures, refused)
}

fn report(name: &str, ratios: &[f64], schedules: &[Schedule]) {
    let (lines, failures, refused) = matrix(ratios, schedules);
    println!("{name}\n{}", lines.join("\n"));
    println!("{name}: {} cells, {refused} 429s", lines.len());
    assert!(
        failures.is_empty(),
        "{} of {} cells out of bounds:\n{}",
        failures.len(),
        lines.len(),
        failures.join("\n")
    );
}

#[test]
fn declared_equal_to_the_real_limit_drains_at_the_ideal_pace() {
    report("declared = real", &[1.0], &[Schedule::Constant]);
}

#[test]
fn declared_above_the_real_limit_is_learned() {
    report(
        "declared above real",
        &[1.5, 2.0, 5.0, 10.0],
        &[Schedule::Constant],
    );
}

#[test]
fn a_limit_that_drops_or_dips_is_followed() {
    report("drop and dip", &[1.0], &[Schedule::Drop, Schedule::Dip]);
}

/// The fleet at its full budget: the limiters with no burst (a sliding log and nginx's
/// `limit_req`) declared at three times their real rate, drained by one to three processes
/// for five minutes (3,000 records), the probes' steady state included. The goal is that
/// of a declared rate equal to the real one (1.05× the ideal drain, 0.5% 429s) for two
/// and three processes; the rule does not meet it yet (the sliding log about 1.052×,
/// nginx's leaky bucket about 1.08×: three blocks while learning, the pace halfway below
/// the refused one for the quiet, a refused probe's block every 53 s), and each is held to
/// where it stands, so that a change of the rule that loses ground fails here.
#[test]
fn the_fleet_at_three_times_the_declared_rate() {
    let params = params();
    let (mut lines, mut failures) = (Vec::new(), Vec::new());
    for (name, model, declared, latency) in models() {
        let ratio = match name {
            "sliding 10/s" => 1.055,
            "leaky 10/s no burst (nginx)" => 1.085,
            _ => continue,
        };
        for processes in 1..=3 {
            let cell = Cell {
                name,
                model: model.clone(),
                declared: scaled(&declared, 3.0),
                schedule: Schedule::Constant,
                processes,
                latency,
                records: 3_000,
            };
            let o = run(&cell, &params);
            let line = format!("{name:32} ×3 {processes}p 3000: {}", o.figures());
            if processes > 1 && !(o.ratio() <= ratio && o.share_429() <= 0.005) {
                failures.push(line.clone());
            }
            lines.push(line);
        }
    }
    println!("the fleet at ×3\n{}", lines.join("\n"));
    assert!(
        failures.is_empty(),
        "out of bounds:\n{}",
        failures.join("\n")
    );
}
