//! Helpers of the command line's tests: the engine's own test helpers (one copy, in the
//! repository's `tests/it/common`), and the `courier` binary under test.

#![allow(dead_code)]

#[path = "../../../../../tests/it/common/mod.rs"]
mod engine;

pub use engine::*;

/// The `courier` binary cargo built for these tests. Its workers serve no metrics unless
/// a test sets `COURIER_HTTP_ADDR` (tests run in parallel; the default port is one).
pub fn courier() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_courier"));
    command.env("COURIER_HTTP_ADDR", "");
    command
}

/// The binary on database `url`, its log at the default level (whatever the environment
/// the tests run in sets): the start of nearly every command a test runs.
pub fn courier_on(url: &str) -> std::process::Command {
    let mut command = courier();
    command.env("DATABASE_URL", url).env_remove("COURIER_LOG");
    command
}

/// What a run of the binary gave.
pub struct Ran {
    /// Whether it exited 0.
    pub ok: bool,
    /// Its exit code.
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Ran {
    /// Standard output and standard error, in that order.
    pub fn both(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// Runs `command` to its end.
pub fn ran(command: &mut std::process::Command) -> Ran {
    let out = command.output().expect("the courier binary runs");
    Ran {
        ok: out.status.success(),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs the binary on database `url` with `args`.
pub fn run_on(url: &str, args: &[&str]) -> Ran {
    ran(courier_on(url).args(args))
}
