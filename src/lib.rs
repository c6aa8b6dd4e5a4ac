//! courier delivers records an online shop produces (customers, consents, products, price
//! changes, orders, events) into marketing and CRM targets such as User.com, through a job
//! queue in PostgreSQL.
//!
//! Records are enqueued as **deliveries** (plain SQL, [`enqueue`], or `courier enqueue`).
//! A **rule** delivers one stream of records into one **connection** (one target account).
//! The [dispatcher](dispatcher) starts a **run** for every enabled rule with
//! due deliveries; a run is a **chain** of apalis jobs ([`chain`]). Each job passes the
//! [throttle](chain::throttle) layer (a rate-limit block makes it wait or ends the run), then claims one
//! batch, asks the rule's [`writer`] to deliver it, and records every outcome in the
//! append-only **ledger** ([`ledger`]) as calls answer, before it enqueues the next job.
//! A [`breaker`] per connection, kept in PostgreSQL, stops calling a target that does not
//! answer. ARCHITECTURE.md draws the whole path and says who owns which table.
//!
//! # Layout
//! - [`config`]: the settings tree, read from the environment and validated once.
//! - [`engine`]: the shared context of a worker process.
//! - [`health`]: whether the database answers; outages logged once.
//! - [`clock`]: the engine's notion of "now", injectable so tests control time.
//! - [`db`]: connecting, creating the database, applying courier's and apalis' migrations.
//! - [`model`]: a connection and a rule as given and as stored.
//! - [`invalid`]: why a stated value cannot be used (the field and what is wrong), and
//!   why a target's answer cannot be read as a rule says.
//! - [`profile`]: a rule's typed profile, parsed once per change of the rule (writer kind,
//!   request, answer, job).
//! - [`catalog`]: connections and rules (tables `connections`, `rules`).
//! - [`apply`]: `courier apply`, a catalog file saved in one transaction.
//! - [`enqueue`]: adding deliveries (table `deliveries`, inserts only), NDJSON input.
//! - [`writer`]: the `Writer` trait, its typed errors, the HTTP JSON writer whose targets
//!   are data (request shapes, grouping records by a value, answer maps; User.com is a
//!   preset like every vendor), one record or several per call (`Writer::write_many`);
//!   `JobCalls` for what a writer running a target's jobs does besides.
//! - [`paced`]: one paced call, the way every request to a target goes, and what its
//!   verdict leaves to write (blocks, the breaker's record, the calls made).
//! - [`breaker`]: the circuit breaker per connection (table `circuits`).
//! - [`ratelimit`]: a target's limits in one place: the limits a connection declares, the
//!   budget's shared state (table `budgets`) and the pacer handing out request slots, fair
//!   between rules and shared across processes; the learned rate; what response headers
//!   state; 429 blocks (table `connection_blocks`, kept in memory too).
//! - [`retry`]: a rule's retry policy (attempts, backoff).
//! - [`runs`]: runs and their lifecycle (table `runs`).
//! - [`ledger`]: outcome rows (table `ledger`) and the delivery state they imply.
//! - [`queue`]: apalis wiring: the chain queue, pushing and snoozing jobs.
//! - [`chain`]: one chain job in stages: the throttle layer (wait out a block or
//!   throttle), admit, claim, triage, call, classify, settle.
//! - [`dispatcher`]: starts runs for rules with due deliveries.
//! - [`jobs`]: a target's asynchronous jobs (table `target_jobs`), whose records stay
//!   `accepted` until the job reports; [`poller`] polls each when due, from its own row
//!   and its rule, and settles its records.
//! - [`erasure`]: a person forgotten in every target and in courier: the request, the
//!   gate every claimed batch passes, the eraser telling each target, the purge (tables
//!   `erasures`, `erasure_targets`, `erased_identities`).
//! - [`maintenance`]: the background loops: the heartbeat
//!   (this process's beat), the rescuer (resumes dead processes' work), the reaper
//!   (last-resort staleness), the pruner (old call counts and beats), retention (old
//!   finished rows), the quarantine (apalis rows courier cannot read).
//! - [`worker`]: the worker process: the service stack, apalis worker, loops, shutdown.
//! - [`ops`]: operator actions: pause and resume, retry, unblock, a record's history.
//! - [`presets`]: ready targets (HubSpot, Klaviyo, Brevo, …) as catalog files.
//! - [`status`]: the `courier status` report, as data.
//! - [`workers`]: the worker processes and their beats (table `workers`).
//! - [`metrics`]: Prometheus counters of the process and gauges read from the database.
//!
//! The tooling is not part of this library: the `courier` binary with its demo and
//! benchmarks is `crates/courier-cli`, the local User.com-like target
//! `crates/courier-target` (a dev-dependency of the tests here).

pub mod apply;
pub mod breaker;
pub mod catalog;
pub mod chain;
pub mod clock;
pub mod config;
pub mod db;
pub mod dispatcher;
#[cfg(test)]
mod doc_examples;
pub mod engine;
pub mod enqueue;
pub mod erasure;
pub mod health;
pub mod invalid;
pub mod jobs;
pub mod ledger;
pub mod maintenance;
pub mod metrics;
pub mod model;
pub mod ops;
pub mod paced;
pub mod poller;
pub mod presets;
pub mod profile;
pub mod queue;
pub mod ratelimit;
pub mod retry;
pub mod runs;
pub mod status;
pub mod worker;
pub mod workers;
pub mod writer;
