//! apalis wiring: the chain queue's name, its job payload, pushing a job inside the caller's
//! transaction, re-scheduling a running job for later without counting a failure, and how
//! this process consumes the queue:
//!
//! - [`table`]: the chain queue's rows in apalis' table: its name, its payload, push,
//!   snooze, wake, set aside.
//! - [`backend`]: the apalis backend of the chain worker: apalis-postgres' queries behind a
//!   persistence of courier's that sets aside rows it cannot read instead of failing, keeps
//!   its worker through database outages, and pauses before a restart.
//! - [`fetcher`]: what wakes the fetcher (announcements, the poll, each subscription of the
//!   listener) and the bookkeeping that makes a wake never get lost.
//! - [`listener`]: LISTEN on apalis' insert channel, subscribing again when the connection
//!   is lost.

pub mod backend;
pub mod fetcher;
pub mod listener;
pub mod table;

pub use backend::ChainBackend;
pub use fetcher::{Fetcher, Tick};
pub use listener::listen;
pub use table::*;
