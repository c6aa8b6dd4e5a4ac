//! The tooling of the `courier` command line that is more than a call into the engine:
//! the end-to-end [`demo`] and the [`bench`] harness. The binary (`src/main.rs`) parses
//! arguments and hands over to the engine library (`courier`), the local target
//! (`courier_target`) or these modules; they are a library so this crate's tests can run
//! them.

pub mod bench;
pub mod demo;
