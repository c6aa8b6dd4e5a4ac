//! The pacing's fixed settings, shared by the budget, the controller and the pacer (none
//! of them owns another's): frozen, measured in BENCHMARKS.md, and documented in
//! docs/pacing.md's table of what is not tuned per connection.

use std::time::Duration;

/// Share of the rate left unused, so that arrival jitter (timers, scheduling, the network)
/// never pushes a limiter that counts on a sliding window over its limit: slots are spaced
/// 2% wider than the rate needs, and long windows count 2% longer.
pub const HEADROOM: f64 = 0.02;
/// A process leases this much of the pace's slots at once: a changed rate (a cut, a
/// probe) shows in every process's calls within it, and processes share the budget in
/// turns of it.
pub const SLICE: Duration = Duration::from_millis(250);
/// The longest pause that is still part of one run of calls: a long window spent, or a
/// target's budget spent, for longer stops the waiting calls (their deliveries stay
/// pending; the chain's next job waits in the queue until there is room), and a budget
/// whose next free slot went unused longer was idle (its sample starts afresh).
pub const SPENT_WAIT: Duration = Duration::from_secs(1);
