//! The command line's tests, one binary: the `courier` binary and its dashboard driven as
//! a user would, against the real PostgreSQL. Run one module with
//! `cargo test -p courier-cli --test it door::`.

mod common;

mod bulk_crash;
mod cli;
mod dashboard;
mod door;
mod job_crash;
mod metrics;
mod ops;
mod readme;
mod workers;
