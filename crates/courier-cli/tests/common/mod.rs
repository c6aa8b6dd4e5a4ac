//! Helpers of the command line's tests: the engine's own test helpers (one copy, in the
//! repository's `tests/common`), and the `courier` binary under test.

#![allow(dead_code)]

#[path = "../../../../tests/common/mod.rs"]
mod engine;

pub use engine::*;

/// The `courier` binary cargo built for these tests. Its workers serve no metrics unless
/// a test sets `COURIER_HTTP_ADDR` (tests run in parallel; the default port is one).
pub fn courier() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_courier"));
    command.env("COURIER_HTTP_ADDR", "");
    command
}
