//! Helpers of the command line's tests: the engine's own test helpers (one copy, in the
//! repository's `tests/common`), and the `courier` binary under test.

#![allow(dead_code)]

#[path = "../../../../tests/common/mod.rs"]
mod engine;

pub use engine::*;

/// The `courier` binary cargo built for these tests.
pub fn courier() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_courier"))
}
